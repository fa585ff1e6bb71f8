"""The HTML report of a results file: one self-contained page (inline CSS and SVG; no script, no
font, no image or anything else fetched), readable offline and attachable to a CI run.

Sections: summary (counts by status and golden verdict, provenance, case sets), failures (every
record that fails the run in the results file's golden mode, with its reasons, repro command and
error histogram; past FULL_FAILURES one table row each), worst cases per op, quantization SQNR
heatmaps (worst case per path x distribution), convergence curves, kernel
fingerprints and telemetry. A section without data is left out; failures says "none".
Torch-free, like every reader of results files. docs/report.md shows what each section holds.

``telemetry_html`` makes the same kind of page of a numcheck.telemetry records() frame: per
layer x step heatmaps (docs/telemetry.md).
"""
from __future__ import annotations

import math
from collections import Counter
from html import escape

from numcheck.forensics.fingerprint_rules import PROPERTIES
from numcheck.records import Golden, Record, Status, failing
from numcheck.report.markdown import worst_cases

__all__ = ["html_report", "telemetry_html"]

WORST_PER_OP = 3
# Failing records shown in full; past these, one table row each: a first strict run on a new
# device class fails every record as "missing", thousands of them.
FULL_FAILURES = 200
REASON_CHARS = 200  # a reason in that table is cut here
# Line colours of the convergence curves (matplotlib's tab10: distinct, print-safe); past ten
# recipes the colours repeat dashed.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 76em;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; margin-top: 1.8em; }
h3 { font-size: 1.05em; margin: 1.2em 0 .4em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: .5em 0 1em; }
th, td { border: 1px solid #ddd; padding: 2px 7px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font: 12.5px ui-monospace, monospace; }
pre { background: #f5f5f5; border: 1px solid #ddd; padding: .5em; overflow-x: auto;
      white-space: pre-wrap; word-break: break-all; }
pre.repro { user-select: all; }  /* one click selects the whole command */
.st { padding: 0 .4em; border-radius: 3px; color: #fff; background: #777; }
.st-passed { background: #2a7d2e; } .st-failed, .st-regressed, .st-missing { background: #c62828; }
.st-error { background: #8e24aa; } .st-known, .st-drift { background: #ef6c00; }
.failure { border-left: 4px solid #c62828; padding: .1em 1em; margin: 1em 0; background: #fffafa; }
dl { display: grid; grid-template-columns: max-content auto; gap: .15em 1em; margin: .4em 0; }
dt { font-weight: 600; } dd { margin: 0; }
.note { color: #666; font-style: italic; }
td.heat { text-align: right; min-width: 3.5em; }
td.heat.fail { outline: 2px solid #c62828; font-weight: 700; }
.scale { display: inline-block; width: 12em; height: .8em; vertical-align: middle;
         background: linear-gradient(to right, hsl(0,70%,78%), hsl(60,70%,78%), hsl(120,70%,78%)); }
.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: .2em 1.2em; }
.swatch { display: inline-block; width: 1.6em; vertical-align: middle; margin-right: .3em; }
svg text { font: 10px system-ui, sans-serif; fill: #333; }
.scale.down { background: linear-gradient(to right, hsl(120,70%,78%), hsl(60,70%,78%),
              hsl(0,70%,78%)); }
.scale.log { background: linear-gradient(to right, hsl(210,60%,95%), hsl(210,60%,60%)); }
.wide { overflow-x: auto; }
table.heatmap th .note { font-weight: normal; }
"""


def _e(x) -> str:
    return escape(str(x))


def _num(x, fmt: str = ".1f") -> str:
    """A statistic as shown: a dash where it was not measured (None: a field a producer or an
    older results file leaves empty) or is NaN."""
    if x is None or x != x:  # NaN: the one value unequal to itself
        return "\u2014"  # an em dash
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, fmt)


def _badge(value) -> str:
    return f'<span class="st st-{_e(value)}">{_e(value)}</span>'


def _table(head: list[str], rows: list[list[str]]) -> str:
    """A table of already-escaped cells (a cell starting with "<td" is taken as it is)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in r)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


# A section: (id, heading, body HTML); a section builder returns None where it has no data.
Section = tuple[str, str, str]


# --- summary ------------------------------------------------------------------------------------

def _summary(records: list[Record], prov: dict, mode: str) -> Section:
    status = Counter(r.status for r in records)
    gold = Counter(r.golden for r in records)
    n_failing = sum(failing(r, mode) for r in records)
    shown = [s for s in Status if s != Status.PENDING or status[s]]
    verdicts = [g for g in Golden if gold[g]]
    head = (f"<p>{len(records)} records on <b>{_e(prov.get('device_class', '?'))}</b> "
            f"({_e(prov.get('device_name', '?'))}), numcheck {_e(prov.get('numcheck', '?'))}, "
            f"torch {_e(prov.get('torch', '?'))}, {_e(prov.get('date', ''))}; golden mode "
            f"<code>{_e(mode)}</code>: <b>{n_failing}</b> failing the run.</p>")
    counts = _table([_badge(s) for s in shown], [[_count(status[s]) for s in shown]])
    golden = _table([_badge(g) for g in verdicts] + ["not compared"],
                    [[_count(gold[g]) for g in verdicts] + [_count(gold[None])]])
    sets = Counter((r.suite, r.case_set or "-") for r in records)
    case_sets = _table(["suite", "case set", "records"],
                       [[_e(s), _e(c), _count(n)] for (s, c), n in sorted(sets.items())])
    provenance = _table(["provenance", "value"],
                        [[_e(k), _e(v)] for k, v in sorted(prov.items())])
    return ("summary", "Summary",
            f"{head}<h3>Status</h3>{counts}<h3>Golden verdicts</h3>{golden}"
            f"<h3>Case sets</h3>{case_sets}<h3>Provenance</h3>{provenance}")


def _count(n: int) -> str:
    return f'<td class="num">{n}</td>'


# --- failures -----------------------------------------------------------------------------------

def _failures(records: list[Record], mode: str) -> Section:
    bad = sorted((r for r in records if failing(r, mode)),
                 key=lambda r: (r.golden != Golden.REGRESSED, r.op, r.kernel, r.case_id, r.output))
    if not bad:
        return "failures", "Failures", \
            '<p class="note">None: no failures and no golden regressions.</p>'
    full, rest = bad[:FULL_FAILURES], bad[FULL_FAILURES:]
    body = "\n".join(map(_failure, full))
    if rest:
        rows = [[_label(r), _badge(r.status), _badge(r.golden) if r.golden else "",
                 _e(_clip(" | ".join(filter(None, (r.reason, r.golden_reason)))))]
                for r in rest]
        body = (f"<p>{len(bad)} failing records: the first {len(full)} in full, the other "
                f"{len(rest)} one row each below.</p>{body}<h3>The other {len(rest)}</h3>"
                + _table(["record", "status", "golden", "reason"], rows))
    return "failures", f"Failures ({len(bad)})", body


def _label(r: Record) -> str:
    return f"{_e(r.op)}/{_e(r.kernel)} <code>{_e(r.case_id)}</code> {_e(r.output)}"


def _clip(text: str, n: int = REASON_CHARS) -> str:
    return text if len(text) <= n else text[:n - 1] + "\u2026"  # an ellipsis


def _failure(r: Record) -> str:
    k, b = r.kernel_stats, r.baseline_stats
    items = [("reason", r.reason)]
    if r.golden not in (None, Golden.SAME):
        items.append(("golden", f"{r.golden}: {r.golden_reason}" if r.golden_reason
                      else str(r.golden)))
    if k is not None:
        items.append(("error", f"SQNR {_num(k.sqnr_db)} dB (baseline "
                               f"{_num(b.sqnr_db if b else None)} dB), worst block "
                               f"{_num(k.min_block_sqnr_db)} dB, max {_num(k.max_ulp, '.0f')} "
                               f"ULP, p99 {_num(k.p99_ulp, '.0f')} ULP of {k.fmt}"))
    items += [("worst elements", r.worst_elements), ("numerics", r.numerics),
              ("inputs saved", r.saved_inputs)]
    dl = "".join(f"<dt>{name}</dt><dd>{_e(v)}</dd>" for name, v in items if v)
    repro = (f'<pre class="repro"><code>{_e(r.repro)}</code></pre>' if r.repro
             else '<p class="note">No repro command recorded.</p>')
    tb = (f"<details><summary>traceback</summary><pre>{_e(r.traceback)}</pre></details>"
          if r.traceback else "")
    return (f'<article class="failure"><h3>{_label(r)} {_badge(r.status)}</h3><dl>{dl}</dl>'
            f"{repro}{_histogram(r)}{tb}</article>")


def _histogram(r: Record) -> str:
    k = r.kernel_stats
    if r.ulp_hist is None or k is None:
        return f'<p class="note">No error histogram: {_no_histogram_reason(r)}.</p>'
    mismatch = k.nonfinite_mismatch if isinstance(k.nonfinite_mismatch, int) else 0
    return (f'<figure class="hist">{_histogram_svg(r.ulp_hist, mismatch)}<figcaption>'
            f"Elements per |error| in ULPs of {_e(k.fmt)} (bar heights log-scaled): "
            f"{_num(k.n_compared, '.0f')} compared, {_num(mismatch, '.0f')} non-finite "
            f"mismatches.</figcaption></figure>")


def _no_histogram_reason(r: Record) -> str:
    if r.status == Status.ERROR:
        return "the kernel gave no output to measure"
    if r.series is not None:
        return "a convergence record holds a loss curve, not element errors"
    if r.family == "telemetry":
        return "a telemetry record holds per-layer statistics, not element errors"
    if r.family == "fingerprint":
        return "a fingerprint record holds a kernel's properties, not element errors"
    if r.status == Status.PASSED:  # failing on its golden alone
        rerun = "rerun its repro" if r.repro else "rerun the case"
        return (f"the case passed its rules and fails on its golden ({_e(r.golden)}); "
                f"{rerun} to see the errors (histograms are recorded where a rule fails)")
    return "none recorded (a results file from an older numcheck, or a producer that records none)"


def _bucket(k: int) -> tuple[str, str]:
    """A histogram bucket's short label and its ULP range."""
    if k == 0:
        return "0", "0 ULP (exact)"
    lo = 1 << (k - 1)
    short = str(lo) if k <= 10 else f"2^{k - 1}"
    return short, f"{lo} to {2 * lo - 1} ULP"


def _compact(n: int) -> str:
    for unit, size in (("G", 10 ** 9), ("M", 10 ** 6), ("k", 10 ** 3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _histogram_svg(hist: list[int], mismatch: int) -> str:
    bars = [(*_bucket(k), c, "#4a7fb5") for k, c in enumerate(hist)]
    if mismatch:
        bars.append(("NaN/inf", "non-finite mismatch", mismatch, "#c62828"))
    step, height, top, bottom = 30, 90, 14, 30
    width = 40 + step * len(bars)
    scale = math.log1p(max(c for *_, c, _ in bars) or 1)
    parts = [f'<svg class="hist" width="{width}" height="{top + height + bottom}" '
             f'viewBox="0 0 {width} {top + height + bottom}" role="img">',
             f'<line x1="30" y1="{top + height}" x2="{width - 5}" y2="{top + height}" '
             f'stroke="#888"/>']
    for i, (short, span, c, colour) in enumerate(bars):
        h = height * math.log1p(c) / scale
        x = 34 + step * i
        parts.append(f'<rect x="{x}" y="{top + height - h:.1f}" width="{step - 6}" '
                     f'height="{h:.1f}" fill="{colour}" data-count="{c}">'
                     f"<title>{span}: {c} elements</title></rect>")
        if c:
            parts.append(f'<text x="{x + (step - 6) / 2}" y="{top + height - h - 3:.1f}" '
                         f'text-anchor="middle">{_compact(c)}</text>')
        parts.append(f'<text x="{x + (step - 6) / 2}" y="{top + height + 12}" '
                     f'text-anchor="middle">{short}</text>')
    parts.append(f'<text x="30" y="{top + height + 26}">ULP (bucket from)</text></svg>')
    return "".join(parts)


# --- worst cases per op -------------------------------------------------------------------------

def _worst(records: list[Record]) -> Section | None:
    """As the markdown report ranks them: kernel error over the baseline's (rel_l2 ratio)."""
    # worst_cases takes a kernel rel_l2 for a number: one not measured (None) has no ratio
    worst = worst_cases([r for r in records if r.kernel_stats is None or
                         r.kernel_stats.rel_l2 is not None], WORST_PER_OP)
    if not worst:
        return None
    rows = []
    for op, cases in worst.items():
        for ratio, r in cases:
            k, b = r.kernel_stats, r.baseline_stats
            rows.append([_e(op), _e(r.kernel), f"<code>{_e(r.case_id)}</code>", _e(r.output),
                         _badge(r.status), *(f'<td class="num">{v}</td>' for v in (
                             _num(k.sqnr_db), _num(b.sqnr_db), _num(k.min_block_sqnr_db),
                             _num(k.max_ulp, ".0f"), f"{ratio:.2f}"))])
    note = ("<p>The worst cases of each op: kernel error over the same-precision baseline's "
            "(rel_l2 ratio; 1 = as good as the naive baseline, the absolute gate is 2x + "
            "floor).</p>")
    return "worst", "Worst cases per op", note + _table(
        ["op", "kernel", "case", "output", "status", "SQNR dB", "baseline dB",
         "worst block dB", "max ULP", "ratio"], rows)


# --- quantization heatmaps ----------------------------------------------------------------------

# op of the quant family -> (what a row is, what the SQNR is measured against, the baseline row)
_QUANT_GRIDS = {
    "roundtrip": ("quantization path", "round trip vs the fp32 input",
                  "bf16 (the input rounded once)"),
    "gemm": ("recipe", "quantized GEMM vs the FP64 product", "bf16 GEMM"),
}


def _quant(records: list[Record], mode: str) -> Section | None:
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


def _heat_colour(v: float, lo: float, hi: float) -> str:
    if math.isnan(v):
        return "#eee"
    t = 1.0 if v >= hi else 0.0 if v <= lo else (v - lo) / (hi - lo)
    return f"hsl({120 * t:.0f},70%,78%)"


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


# --- convergence curves -------------------------------------------------------------------------

def _convergence(records: list[Record]) -> Section | None:
    curves = [r for r in records if r.family == "convergence"]
    if not curves:
        return None
    body = ["<p>Per model, each recipe's loss minus the fp32 reference's loss at every step "
            "(mean over the paired seeds; the shaded band is the seeds' spread). The results "
            "file holds these paired differences, not the absolute losses.</p>"]
    # one style per recipe across all models, so that a recipe reads the same in every chart
    styles = {k: (PALETTE[i % len(PALETTE)], i >= len(PALETTE))
              for i, k in enumerate(sorted({r.kernel for r in curves}))}
    for model in sorted({r.op for r in curves}):
        rs = sorted((r for r in curves if r.op == model), key=lambda r: r.kernel)
        body.append(f"<h3>{_e(model)}</h3>{_curves_svg(rs, styles)}")
        body.append('<ul class="legend">' + "".join(
            f'<li><span class="swatch" style="border-top:3px '
            f'{"dashed" if styles[r.kernel][1] else "solid"} {styles[r.kernel][0]}"></span>'
            f"{_e(r.kernel)} {_badge(r.status)}"
            f"{'' if r.series else ' <span class=note>(no curve)</span>'}</li>"
            for r in rs) + "</ul>")
    return "convergence", "Convergence curves", "".join(body)


def _finite_runs(points: list[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    """Runs of consecutive finite points: a NaN or inf step (a diverged run) breaks the line."""
    runs: list[list[tuple[int, float]]] = [[]]
    for p in points:
        if math.isfinite(p[1]):
            runs[-1].append(p)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _curves_svg(records: list[Record], styles: dict[str, tuple[str, bool]]) -> str:
    width, height, left, right, top, bottom = 640, 240, 64, 12, 10, 28
    lines = []  # (record, series, band: zeros where the record has none)
    for r in records:
        s = list(r.series or [])
        band = list(r.series_band or [])
        lines.append((r, s, band if len(band) == len(s) else [0.0] * len(s)))
    values = [0.0] + [x for _, s, band in lines for v, w in zip(s, band)
                      for x in (v - w, v + w) if math.isfinite(x)]
    lo, hi = min(values), max(values)
    hi = hi if hi > lo else lo + 1.0
    n = max((len(s) for _, s, _ in lines), default=1)

    def x_of(i: int) -> float:
        return left + (width - left - right) * i / max(n - 1, 1)

    def y_of(v: float) -> float:
        return top + (height - top - bottom) * (hi - v) / (hi - lo)

    def xy(i: int, v: float) -> str:
        return f"{x_of(i):.1f},{y_of(v):.1f}"

    parts = [f'<svg class="curves" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img">',
             f'<rect x="{left}" y="{top}" width="{width - left - right}" '
             f'height="{height - top - bottom}" fill="none" stroke="#bbb"/>']
    for v in sorted({lo, 0.0, hi}):
        y = y_of(v)
        if v != 0.0 and abs(y - y_of(0.0)) < 12:  # its label would overprint 0's
            continue
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="{"#555" if v == 0 else "#eee"}"/>'
                     f'<text x="{left - 4}" y="{y:.1f}" text-anchor="end" '
                     f'dominant-baseline="middle">{v:.3g}</text>')
    for i, label, anchor in ((0, "step 0", "start"), (n - 1, f"step {n - 1}", "end")):
        parts.append(f'<text x="{x_of(i):.1f}" y="{height - 8}" '
                     f'text-anchor="{anchor}">{label}</text>')
    for r, s, band in lines:
        colour, dashed = styles[r.kernel]
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        banded = [(j, v if math.isfinite(band[j]) and band[j] > 0 else math.nan)
                  for j, v in enumerate(s)]
        for run in _finite_runs(banded):
            upper = [xy(j, v + band[j]) for j, v in run]
            lower = [xy(j, v - band[j]) for j, v in reversed(run)]
            parts.append(f'<polygon points="{" ".join(upper + lower)}" fill="{colour}" '
                         f'fill-opacity="0.15" stroke="none"/>')
        for run in _finite_runs(list(enumerate(s))):
            parts.append(f'<polyline points="{" ".join(xy(j, v) for j, v in run)}" '
                         f'fill="none" stroke="{colour}" stroke-width="1.3"{dash}>'
                         f"<title>{_e(r.kernel)}</title></polyline>")
    return "".join(parts) + "</svg>"


# --- fingerprints and telemetry -----------------------------------------------------------------

def _show(v) -> str:
    """A metric as read: integral floats (bit counts, block sizes) as integers."""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    return _e(v)


def _fingerprints(records: list[Record]) -> Section | None:
    fps = [r for r in records if r.family == "fingerprint" and r.metrics]
    if not fps:
        return None
    body = []
    for dev in sorted({r.device_class for r in fps}):
        rows = [[_e(r.op), _e(r.kernel), _e(r.dtype)] + [_show(r.metric(p)) for p in PROPERTIES]
                for r in sorted((r for r in fps if r.device_class == dev),
                                key=lambda r: (r.op, r.kernel, r.dtype))]
        body.append(f"<h3>{_e(dev)}</h3>" + _table(["op", "kernel", "dtype", *PROPERTIES], rows))
    return "fingerprints", "Kernel fingerprints", "".join(body)


def _telemetry(records: list[Record], mode: str) -> Section | None:
    """Telemetry goldens' records (numcheck.telemetry.floors): per (model, recipe), a heatmap
    of layer (module, op, role) x gated statistic, coloured per column from worst to best,
    failing records outlined; then every record in a table, folded."""
    from numcheck.telemetry.telemetry_rules import BY_KEY, case_parts
    rows = [r for r in records if "telemetry" in (r.family, r.suite)]
    if not rows:
        return None
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in rows:
        model, recipe, _ = case_parts(r.case_id)
        groups.setdefault((model, recipe), []).append(r)
    body = []
    for (model, recipe), rs in groups.items():
        keys = [k for k in BY_KEY if any(isinstance(r.metric(k), (int, float)) for r in rs)]
        if not keys:  # no gated statistic (an errored test, a user's own record): table only
            continue
        what_if = any("what_if=True" in (r.params or "") for r in rs)
        cols = {}
        for k in keys:
            vals = [float(r.metric(k)) for r in rs if isinstance(r.metric(k), (int, float))
                    and math.isfinite(float(r.metric(k)))]
            cols[k] = (min(vals), max(vals)) if vals else (0.0, 0.0)
        trs = []
        for r in rs:
            bad = failing(r, mode)
            layer = case_parts(r.case_id)[2]
            tds = []
            for k in keys:
                v, (lo, hi) = r.metric(k), cols[k]
                v = float(v) if isinstance(v, (int, float)) else math.nan
                floor = BY_KEY[k].kind == "floor"
                colour = _heat_colour(v, lo, hi) if floor else _heat_colour(-v, -hi, -lo)
                tip = f"{layer} {BY_KEY[k].label}: {_num(v, '.4g')} {BY_KEY[k].unit}"
                if bad:
                    tip += f" | {r.golden_reason or r.reason}"
                tds.append(f'<td class="heat{" fail" if bad else ""}" data-key="{_e(k)}" '
                           f'style="background:{colour}" title="{_e(tip)}">'
                           f"{_num(v, '.4g')}{' FAIL' if bad else ''}</td>")
            trs.append(f'<tr data-case="{_e(r.case_id)}"><th>{_e(layer)} <span class="note">'
                       f'({_e(r.kernel)})</span></th>{"".join(tds)}</tr>')
        head = "".join(f"<th>{_e(BY_KEY[k].label)}{f' ({BY_KEY[k].unit})' if BY_KEY[k].unit else ''}"
                       "</th>" for k in keys)
        body.append(f"<h3>{_e(model)}: {_e(recipe)}{' (what-if)' if what_if else ''}</h3>"
                    f'<div class="wide"><table class="heatmap" data-model="{_e(model)}" '
                    f'data-recipe="{_e(recipe)}"><thead><tr><th>layer (op)</th>{head}</tr>'
                    f"</thead><tbody>{''.join(trs)}</tbody></table></div>")
        body.append(_telemetry_steps(rs, keys, recipe))
    keys = sorted({k for r in rows for k in (r.metrics or {})})
    table = _table(["op", "kernel", "case", "output", "device class", "status",
                    *map(_e, keys), "reason"],
                   [[_e(r.op), _e(r.kernel), _e(r.case_id), _e(r.output), _e(r.device_class),
                     _badge(r.status), *(_show(r.metric(k, "")) for k in keys), _e(r.reason)]
                    for r in rows])
    body.append('<p class="note">Each cell: the statistic over the run\'s steps (floors: the '
                "minimum, ceilings: the maximum; docs/telemetry.md), green the column's best, "
                "red its worst; under each table, folded, the same statistics per layer and "
                "step. Every recorded statistic per step: <code>numcheck inspect</code> "
                "(each record's repro command).</p>"
                f"<details><summary>All {len(rows)} telemetry records</summary>{table}</details>")
    return "telemetry", "Telemetry", "".join(body)


def _telemetry_steps(rs: list[Record], keys: list[str], recipe: str) -> str:
    """Per gated statistic of one (model, recipe): a layer x step heatmap of the records'
    ``per_step`` values (numcheck.telemetry.floors), steps with non-finite elements outlined
    (their own table only where there are any); folded. Records without per-step values
    (results written before they were recorded) are left out."""
    from numcheck.telemetry.telemetry_rules import BY_KEY, case_parts, worse
    rs = [r for r in rs if isinstance(r.per_step, dict) and r.per_step.get("step")]
    if not rs:
        return ""
    order: dict = {}
    per_key: dict[str, Cells] = {k: {} for k in keys}
    for r in rs:
        module, _, role = case_parts(r.case_id)[2].rpartition("/")
        layer = (module, r.kernel, role)
        order.setdefault(layer, (len(order), 0))
        for k in keys:
            vals = _per_step(r, k)
            if vals is None:
                continue
            row = per_key[k].setdefault(layer, {})
            for step, v in vals:   # two records of one layer: the worse value
                row[step] = worse(BY_KEY[k].kind, row.get(step), v)
    for cells in per_key.values():
        for row in cells.values():
            for step, v in row.items():
                row[step] = math.nan if v is None else v   # shown as a dash
    flags = per_key.get("nonfinite_ceiling")
    bad_steps = {step for row in (flags or {}).values() for step, v in row.items() if v > 0}
    steps = _shown_steps(sorted({step for cells in per_key.values() for row in cells.values()
                                 for step in row}), bad_steps)
    maps = []
    if flags and not bad_steps:
        per_key["nonfinite_ceiling"] = {}  # all zero: a table of zeros says nothing
    for k in keys:
        if not per_key[k]:
            continue
        s = BY_KEY[k]
        fmt = ".1f" if s.unit == "dB" else ".2f" if s.unit == "%" else ".4g"
        spec = (s.column, f"{s.label.removesuffix(' floor').removesuffix(' ceiling')}"
                f"{f' ({s.unit})' if s.unit else ''} per step", fmt,
                "up" if s.kind == "floor" else "down")
        maps.append(_step_heatmap(per_key[k], order, steps, spec, recipe, flags))
    return (f"<details><summary>Per step ({len(steps)} step(s)): "
            f"{', '.join(_e(BY_KEY[k].label) for k in keys if per_key[k])}</summary>"
            f"{''.join(maps)}</details>") if maps else ""


def _per_step(r: Record, key: str) -> list[tuple[int, float | None]] | None:
    """(step, value) of a record's ``per_step[key]``; None where it has none or the file is
    malformed (a list of another length than the steps, a value that is not a number)."""
    steps, vals = r.per_step.get("step"), r.per_step.get(key)
    if not isinstance(vals, list) or not isinstance(steps, list) or len(vals) != len(steps):
        return None
    try:
        return [(int(s), None if v is None else float(v)) for s, v in zip(steps, vals)]
    except (TypeError, ValueError, OverflowError):
        return None


# --- the page -----------------------------------------------------------------------------------

def html_report(records: list[Record], provenance: dict, *, title: str | None = None) -> str:
    """One complete, self-contained HTML document reporting ``records`` (a results file's,
    ``numcheck.goldens.store.read_results``). Failing means ``failing`` in the results file's golden
    mode (provenance ``golden_mode``; strict when unknown, as the markdown report)."""
    mode = provenance.get("golden_mode", "strict")
    title = title or f"numcheck report: {provenance.get('device_class', '?')} " \
                     f"{provenance.get('date', '')}".rstrip()
    sections = [s for s in (_summary(records, provenance, mode), _failures(records, mode),
                            _worst(records), _quant(records, mode), _convergence(records),
                            _fingerprints(records), _telemetry(records, mode)) if s]
    return _page(title, sections)


def _page(title: str, sections: list[Section]) -> str:
    """The document: title, links to the sections, the sections."""
    nav = " ".join(f'<a href="#{sid}">{_e(heading)}</a>' for sid, heading, _ in sections)
    body = "\n".join(f'<section id="{sid}"><h2>{_e(heading)}</h2>\n{html}\n</section>'
                     for sid, heading, html in sections)
    # ASCII, non-ASCII as character references: the CLI writes the page in the locale's encoding
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body><h1>{_e(title)}</h1>"
            f"<nav>{nav}</nav>\n{body}\n</body></html>\n").encode(
                "ascii", "xmlcharrefreplace").decode("ascii")


# --- telemetry: per layer x step heatmaps of a numcheck.telemetry records() frame --------------

# A heatmap: (column, what it shows, number format, colour: "up" = higher is better (red to
# green), "down" = lower is better, "log" = a neutral log-scale ramp).
_QUANT_MAPS = (("sqnr_db", "SQNR (dB): the quantized tensor vs its source", ".1f", "up"),
               ("worst_block_sqnr_db", "worst block's SQNR (dB)", ".1f", "up"),
               ("underflow_pct", "underflow: % of the non-zero elements quantized to zero",
                ".2f", "down"),
               ("saturation_pct", "saturation: % of the elements clipped", ".2f", "down"))
_SHADOW_MAPS = (("shadow_sqnr_db", "the layer's own error: output SQNR (dB) vs the layer run in "
                 "float64 on the same inputs", ".1f", "up"),
                ("e2e_sqnr_db", "accumulated error: output SQNR (dB) vs a float64 copy of the "
                 "whole model", ".1f", "up"))
_AMAX = ("amax", "amax: max |x| over the finite elements of each output (colour: log scale)",
         ".3g", "log")
# Steps shown at most: past these, evenly spaced ones (the first and the last among them).
MAX_STEPS = 60

Cells = dict[tuple[str, str, str], dict[int, float]]  # (module, op, role) -> step -> value


def _cells(sub, column: str, merge) -> Cells:
    """Per (module, op, role) and step, the rows' ``column`` merged with ``merge`` (several
    ranks, or a frame holding both passes): NaN only where every row is NaN."""
    cells: Cells = {}
    for m, o, r, step, v in zip(sub["module"], sub["op"], sub["role"], sub["step"], sub[column]):
        v, row = float(v), cells.setdefault((str(m), str(o), str(r)), {})
        old = row.get(int(step), math.nan)
        row[int(step)] = v if old != old else old if v != v else merge(old, v)
    return cells


def _colour(v: float, lo: float, hi: float, scale: str) -> str:
    if scale == "up":
        return _heat_colour(v, lo, hi)
    if scale == "down":
        return _heat_colour(-v, -hi, -lo)
    if not (v > 0 and math.isfinite(v)):
        return "#eee"
    x = math.log10(v)
    t = 0.5 if hi <= lo else min(max((x - lo) / (hi - lo), 0.0), 1.0)
    return f"hsl(210,60%,{95 - 35 * t:.0f}%)"


def _step_heatmap(cells: Cells, order: dict, steps: list[int], spec: tuple, recipe: str,
                  flags: Cells | None = None) -> str:
    """One per-layer x step table; ``flags``: cells to outline and mark NaN/Inf."""
    column, what, fmt, scale = spec
    finite = [v for row in cells.values() for v in row.values() if math.isfinite(v)]
    if scale == "log":
        finite = [math.log10(v) for v in finite if v > 0]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    body = []
    for key in sorted(cells, key=order.__getitem__):
        m, o, r = map(_e, key)
        tds = []
        for step in steps:
            v = cells[key].get(step, math.nan)
            bad = bool(flags and flags.get(key, {}).get(step, 0) > 0)
            shown = _num(v, fmt) + (" NaN/Inf" if bad else "")
            tds.append(f'<td class="heat{" fail" if bad else ""}" data-step="{step}" '
                       f'data-value="{v!r}" style="background:{_colour(v, lo, hi, scale)}" '
                       f'title="{m} ({o}, {r}), step {step}: {column} {shown}">{shown}</td>')
        body.append(f'<tr data-module="{m}" data-op="{o}" data-role="{r}"><th>{m} '
                    f'<span class="note">({o}, {r})</span></th>{"".join(tds)}</tr>')
    head = "".join(f"<th>{s}</th>" for s in steps)
    if scale == "log":
        ends = f"{10 ** lo:.3g}" if finite else "\u2014", f"{10 ** hi:.3g}" if finite else "\u2014"
    else:
        ends = (_num(lo, fmt), _num(hi, fmt)) if scale == "up" else (_num(hi, fmt), _num(lo, fmt))
    css = {"up": "scale", "down": "scale down", "log": "scale log"}[scale]
    return (f"<h3>{_e(what)}</h3>"
            f'<div class="wide"><table class="heatmap" data-column="{_e(column)}" '
            f'data-recipe="{_e(recipe)}"><thead><tr><th>module (op, role) / step</th>{head}'
            f"</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
            f'<p>{ends[0]} <span class="{css}"></span> {ends[1]}</p>')


def _shown_steps(steps: list[int], keep=()) -> list[int]:
    """The steps a heatmap shows: all of them up to MAX_STEPS, else evenly spaced ones and
    each step of ``keep`` (the steps with a NaN or Inf) that follows one not in it: where a
    run went non-finite is never sampled away, a run that stays non-finite adds no columns
    (at most MAX_STEPS such onsets)."""
    if len(steps) <= MAX_STEPS:
        return steps
    keep = set(keep)
    onsets = [s for prev, s in zip([None, *steps], steps) if s in keep and prev not in keep]
    return sorted({steps[round(i * (len(steps) - 1) / (MAX_STEPS - 1))]
                   for i in range(MAX_STEPS)} | set(onsets[:MAX_STEPS]))


def _present(sub, column: str) -> bool:
    return column in sub.columns and bool(sub[column].notna().any())


def telemetry_html(frame, *, title: str | None = None, producer: str | None = None) -> str:
    """One self-contained HTML page (as ``html_report``: inline CSS, no script, nothing
    fetched) of a numcheck.telemetry ``records()`` frame (or a merged one): a summary
    (``producer``: the first non-finite producer line, shown there when given) and per-layer x
    step heatmaps. Per recipe, the observed one first, then each what-if recipe: SQNR,
    worst-block SQNR, underflow and saturation of the quantized operands (where measured);
    the outputs' shadow and end-to-end SQNR (where measured); the outputs' amax, always. Rows:
    (module, op, role) in the frame's order of first appearance, a module's rows together;
    columns: steps. A cell merges the rows of its key (ranks): the worst value."""
    title = title or "numcheck telemetry"
    cols = set(frame.columns)
    flagged = frame["what_if"].astype(bool) if "what_if" in cols else None
    observed = frame[~flagged] if flagged is not None else frame
    what_ifs = frame[flagged] if flagged is not None else frame.iloc[0:0]
    steps = sorted({int(s) for s in frame["step"]}) if len(frame) else []
    shown = _shown_steps(steps, {int(x) for x in frame.loc[frame["nonfinite"] > 0, "step"]}
                         if "nonfinite" in cols and len(frame) else ())
    modules = list(dict.fromkeys(str(m) for m in frame["module"])) if len(frame) else []
    at = {m: i for i, m in enumerate(modules)}
    keys = list(dict.fromkeys(zip(map(str, frame["module"]), map(str, frame["op"]),
                                  map(str, frame["role"])))) if len(frame) else []
    order = {k: (at[k[0]], i) for i, k in enumerate(keys)}

    recipes = []  # (what_if, recipe, its rows), the observed recipe(s) first
    for what_if, part in ((False, observed), (True, what_ifs)):
        named = part["recipe"].astype(str) if "recipe" in cols else None
        for rec in dict.fromkeys(named) if named is not None else ():
            if rec:
                recipes.append((what_if, rec, part[named == rec]))

    summary = [f"<p>{len(frame)} rows: {len(steps)} step(s)"
               + (f" ({steps[0]} to {steps[-1]})" if steps else "")
               + f", {len(modules)} module(s)"
               + (f", ranks {', '.join(_e(r) for r in sorted(set(frame['rank'])))}"
                  if "rank" in cols and len(frame) else "") + ".</p>"]
    if recipes:
        summary.append("<p>Recipes measured (never applied to the run): " + ", ".join(
            f"<code>{_e(rec)}</code>{' (what-if)' if what_if else ''}"
            for what_if, rec, _ in recipes) + ".</p>")
    else:
        summary.append('<p class="note">No recipe measured: no quantization statistics.</p>')
    if "nonfinite" in cols and len(observed):
        bad = observed[observed["nonfinite"] > 0]
        masks = int(((bad["op"] == "softmax") & (bad["role"] == "input")).sum())
        summary.append(f"<p>{len(bad)} row(s) hold a NaN or Inf"
                       + (f", the first at step {int(bad['step'].min())}" if len(bad) else "")
                       + (f" ({masks} of them softmax inputs, where -inf is an attention mask)"
                          if masks else "") + ".</p>")
    if producer:
        summary.append(f'<p class="producer"><code>{_e(producer)}</code></p>')
    if len(shown) < len(steps):
        summary.append(f'<p class="note">The heatmaps show {len(shown)} of the {len(steps)} '
                       f"steps, evenly spaced; the parquet file holds them all.</p>")
    if not len(frame):
        summary.append('<p class="note">No records.</p>')
    sections: list[Section] = [("summary", "Summary", "".join(summary))]

    def maps(sub, specs, recipe: str, flags: Cells | None = None) -> list[str]:
        out = []
        for spec in specs:
            column, _, _, scale = spec
            if scale == "log" and column in sub.columns or _present(sub, column):
                rows = sub[sub[column].notna()] if scale != "log" else sub
                worst = max if scale in ("down", "log") else min
                out.append(_step_heatmap(_cells(rows, column, worst), order, shown, spec,
                                         recipe, flags))
        return out

    for i, (what_if, rec, sub) in enumerate(recipes):
        body = maps(sub, _QUANT_MAPS, rec)
        if body:
            sections.append((f"recipe-{i}", f"{'What-if recipe' if what_if else 'Recipe'} "
                             f"{rec}: its quantized operands", "".join(body)))
    outputs = observed[observed["role"] == "output"] if len(observed) else observed
    shadow = maps(outputs, _SHADOW_MAPS, "")
    if shadow:
        sections.append(("shadow", "Shadow SQNR of the outputs", "".join(shadow)))
    if len(outputs) and "amax" in cols:
        amax = outputs.assign(amax=outputs["amax"].where(outputs["amax"] > -math.inf))
        flags = _cells(outputs, "nonfinite", lambda a, b: a + b) if "nonfinite" in cols \
            else None
        sections.append(("amax", "Output amax", "".join(maps(amax, (_AMAX,), "", flags))))
    return _page(title, sections)
