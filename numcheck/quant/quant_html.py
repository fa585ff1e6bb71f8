"""The quant family's section of the HTML report: SQNR heatmaps, worst case per quantization
path x input distribution (numcheck.report.html draws it; docs/report.md)."""
from __future__ import annotations

import math

from numcheck.records import Record, failing
from numcheck.report.htmlkit import (Section, e as _e, heat_colour as _heat_colour,
                                     num as _num)


# op of the quant family -> (what a row is, what the SQNR is measured against, the baseline row)
_QUANT_GRIDS = {
    "roundtrip": ("quantization path", "round trip vs the fp32 input",
                  "bf16 (the input rounded once)"),
    "gemm": ("recipe", "quantized GEMM vs the FP64 product", "bf16 GEMM"),
}


def heatmaps_section(records: list[Record], mode: str) -> Section | None:
    quant = [r for r in records if r.family == "quant" and r.kernel_stats is not None]
    grids = [_heatmap(op, [r for r in quant if r.op == op], mode)
             for op in sorted({r.op for r in quant})]
    if not grids:
        return None
    return ("quant", "Quantization: SQNR (dB) by format x input distribution",
            "<p>A cell holds every record of its quantization path on that distribution (seeds, "
            "shapes, axes) and shows their lowest SQNR: the worst case. Cell colour: red = lowest "
            "SQNR of the grid, green = highest; a red outline and FAIL mark a cell where any "
            "record fails the run. Bottom row: the BF16 yardstick on the same inputs (its lowest "
            "SQNR).</p>" + "".join(grids))


# Case params that place a quantizer (the axis it scales along) without changing its format:
# records that differ only in them are one quantization path.
PLACEMENT_PARAMS = {"dim"}


def _path_of(r: Record) -> str:
    """A heatmap row: the kernel and the params that define the quantization format. One kernel
    may run every format (an op's torch kernel: fmt=e4m3,granularity=row, ...): without them
    its formats would share a cell. A param that repeats the kernel (path=<kernel>) adds
    nothing."""
    own = [p for p in (r.params or "").split(",")
           if p and p.partition("=")[0] not in PLACEMENT_PARAMS and p.partition("=")[2] != r.kernel]
    return " ".join([r.kernel, ",".join(own)]) if own else r.kernel


def _lowest_db(stats) -> float:
    """The lowest SQNR of these ErrorStats (None for a missing side); NaN where none has one."""
    dbs = [s.sqnr_db for s in stats if s is not None and s.sqnr_db is not None]
    return min((v for v in dbs if v == v), default=math.nan)


def _heatmap(op: str, records: list[Record], mode: str) -> str:
    what, against, yardstick = _QUANT_GRIDS.get(op, ("kernel", op, "baseline"))
    dists = sorted({r.dist for r in records})
    cells: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        cells.setdefault((_path_of(r), r.dist), []).append(r)
    worst = {key: _lowest_db(r.kernel_stats for r in rs) for key, rs in cells.items()}
    finite = [v for v in worst.values() if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    rows = []
    for path in sorted({p for p, _ in cells}):
        row = [f"<th>{_e(path)}</th>"]
        for d in dists:
            rs = cells.get((path, d))
            if rs is None:
                row.append('<td class="heat"></td>')
                continue
            v, n_fail = worst[path, d], sum(failing(r, mode) for r in rs)
            row.append(f'<td class="heat{" fail" if n_fail else ""}" data-db="{v!r}" '
                       f'data-records="{len(rs)}" style="background:{_heat_colour(v, lo, hi)}" '
                       f'title="{_e(path)} on {_e(d)}: {len(rs)} record(s), {n_fail} failing; '
                       f'lowest SQNR {_num(v, ".2f")} dB">{_num(v)}'
                       f'{" FAIL" if n_fail else ""}</td>')
        rows.append("".join(row))
    yard = [_lowest_db(r.baseline_stats for r in records if r.dist == d) for d in dists]
    rows.append(f"<th>{yardstick}</th>" + "".join(f'<td class="num">{_num(v)}</td>' for v in yard))
    head = "".join(f"<th>{_e(d)}</th>" for d in dists)
    return (f"<h3>{_e(op)}: {_e(against)}</h3>"
            f'<table class="heatmap" data-op="{_e(op)}"><thead><tr><th>{_e(what)}</th>{head}'
            f"</tr></thead><tbody>" + "".join(f"<tr>{r}</tr>" for r in rows) +
            f'</tbody></table><p>{_num(lo)} dB <span class="scale"></span> {_num(hi)} dB</p>')
