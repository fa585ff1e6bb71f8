"""Where two telemetry runs part ways (``nc.telemetry.diff``, ``numcheck diff``;
docs/telemetry.md, "Where two runs part ways").

Two runs' rows (``Telemetry.records()`` frames or their parquet files) are aligned by
``ALIGN`` (step, rank, module, op, role, pass, recipe, what_if) in the first run's execution
order (a step's rows are in the order their tensors were first seen: the forward, then the
backward), and each aligned row's statistics are compared (``STATS``): element and
non-finite counts exactly, the largest magnitude, the root mean square and the zero fraction
within a noise band. A row that only one run has is a divergence of the run's structure. The
first divergences in execution order come back as a table (a per (module, step) picture in the
HTML report is not built yet). A row holds all of a module's calls in a
step and sits at the first: a module called before and after the change (a residual add, a
shared layer) is listed where it first ran, so ``first`` passes over such rows (marked
"several calls") when a row of a single call diverges in the same step.

The band is measured where repeated runs of the first configuration are given (``a`` a list:
the same program from other seeds, or on other machines): per row and statistic, ``MARGIN``
times the largest deviation of a repeat from the first run that the same tensor shows over all
steps, plus a floor (``_measured``). Without
repeats it is ``RTOL`` relative: two runs of one program on the same inputs agree to the last
bit, and a reassociated bf16 computation moves a statistic by about one bf16 rounding; a change
below it needs the tensors' digests (not recorded yet).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from numcheck.errors import UsageError

ALIGN = ("step", "rank", "module", "op", "role", "pass", "recipe", "what_if")
# (statistic, compared exactly): what each row's tensors hold, read off the raw fields
STATS = (("n", True), ("nonfinite", True), ("amax", False), ("rms", False),
         ("zero_frac", False))
# one bf16 rounding relative (2^-8: bf16 keeps 8 significant bits): the default band
RTOL = 2.0 ** -8
# a measured band: MARGIN times the largest relative deviation the repeats showed for the
# tensor over all steps, plus FLOOR relative (a tensor nearly independent of the seed, such as
# a zero-initialized adaLN weight after a few steps, moved 3.5e-5 between seeds on tiny_dit
# where its first three seeds agreed to 1e-5). docs/telemetry.md gives the false divergences
# measured with 5 repeats on the tiny models.
MARGIN = 6.0
FLOOR = 2.0 ** -10
# the zero fraction's floor between seeds: a few of tiny_lm's 64 token rows more or less in the
# embedding gradient moved it by up to 0.047 where 5 repeats all had 0
ZERO_FLOOR = 2.0 ** -4


@dataclass(frozen=True)
class Divergence:
    """One row where the runs part ways: ``stat`` is the statistic ("row" where only one run
    has the row), ``a`` / ``b`` its values (NaN where the run has no such row), ``band`` the
    noise band it was judged with, ``excess`` |b - a| / band (inf for a count or a missing
    row)."""
    step: int
    rank: int
    module: str
    op: str
    role: str
    pass_: str
    recipe: str
    what_if: bool
    stat: str
    a: float
    b: float
    band: float
    excess: float
    merged: bool = False   # the module ran several times in the step: one row for all calls

    def where(self) -> str:
        tag = f" [{self.recipe}{' what-if' if self.what_if else ''}]" if self.recipe else ""
        several = " (several calls)" if self.merged else ""
        return f"step {self.step} {self.module} ({self.op}) {self.role} {self.pass_}{tag}{several}"


@dataclass
class Difference:
    """``nc.telemetry.diff``'s answer: false when the runs agree within the band.
    ``divergences``: every diverging (row, statistic) in execution order (the first ones
    first); ``rows``: the aligned rows compared; ``band``: how the band was set."""
    divergences: list[Divergence]
    rows: int
    band: str

    def __bool__(self) -> bool:
        return bool(self.divergences)

    @property
    def first(self) -> Divergence | None:
        """The first divergence in execution order, passing over rows that merge several
        calls of their module in that step (a residual add before and after the changed layer
        sits at its first call) while a row of a single call diverges in the same step."""
        if not self.divergences:
            return None
        step = self.divergences[0].step
        return next((d for d in self.divergences if d.step == step and not d.merged),
                    self.divergences[0])

    def summary(self, first: int = 10) -> str:
        head = (f"{self.rows} rows aligned, band: {self.band}; " +
                (f"{len(self.divergences)} diverging statistic(s), the first at "
                 f"{self.first.where()}" if self else "no divergence beyond the band"))
        lines = [head]
        for d in self.divergences[:first]:
            lines.append(f"  {d.where()}: {d.stat} {d.a:.6g} -> {d.b:.6g} "
                         f"(band {d.band:.3g}, {d.excess:.3g}x)")
        if len(self.divergences) > first:
            lines.append(f"  ... and {len(self.divergences) - first} more")
        return "\n".join(lines)


def _frame(x, what: str):
    """A telemetry frame from a frame or a parquet path (UsageError naming it otherwise)."""
    import pandas as pd
    if isinstance(x, pd.DataFrame):
        df = x
    else:
        path = Path(x)
        if not path.is_file():
            raise UsageError(f"telemetry diff: {what} {str(path)!r}: no such file (give "
                             "telemetry parquet files: Telemetry.to_parquet, numcheck inspect)")
        try:
            df = pd.read_parquet(path)
        except Exception as e:  # noqa: BLE001 - pyarrow's many errors: one message
            raise UsageError(f"telemetry diff: {what} {str(path)!r} is not a parquet file "
                             f"({type(e).__name__}: {e})") from e
    missing = [c for c in ALIGN + ("calls", "n", "n_nan", "n_inf", "n_zero", "amax", "sum_sq")
               if c not in df.columns]
    if missing:
        raise UsageError(f"telemetry diff: {what} has no column(s) {', '.join(missing)}: not "
                         "a telemetry frame (Telemetry.records())")
    return df


def _rows(df) -> dict[tuple, dict[str, float]]:
    """Aligned key -> the row's statistics, in the frame's (execution) order; "merged": its
    module's forward output row holds several calls (step, rank, module, op)."""
    out: dict[tuple, dict[str, float]] = {}
    cols = {c: df[c].tolist() for c in ALIGN + ("calls", "n", "n_nan", "n_inf", "n_zero",
                                                "amax", "sum_sq")}
    several = {tuple(cols[c][i] for c in ("step", "rank", "module", "op"))
               for i in range(len(df)) if cols["role"][i] == "output" and cols["calls"][i] > 1}
    for i in range(len(df)):
        key = tuple(cols[c][i] for c in ALIGN)
        n, nan, inf = (float(cols[c][i]) for c in ("n", "n_nan", "n_inf"))
        finite = max(n - nan - inf, 1.0)
        out[key] = {"n": n, "nonfinite": nan + inf, "amax": float(cols["amax"][i]),
                    "rms": math.sqrt(max(float(cols["sum_sq"][i]), 0.0) / finite),
                    "zero_frac": float(cols["n_zero"][i]) / max(n, 1.0),
                    "merged": key[:4] in several}
    return out


def _close(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def diff(a, b, *, rtol: float = RTOL) -> Difference:
    """Where run ``b`` parts from run ``a``. ``a``: a telemetry frame or parquet path, or a
    list of them (repeats of the first configuration: the band is measured from them, and the
    first is the reference whose order is followed); ``b``: a frame or path. ``rtol``: the
    relative band without repeats."""
    reps = [_rows(_frame(x, f"run A{i + 1}")) for i, x in
            enumerate(a if isinstance(a, (list, tuple)) else [a])]
    if not reps:
        raise UsageError("telemetry diff: give at least one run A")
    rb = _rows(_frame(b, "run B"))
    ra = reps[0]
    band_of = _measured(reps) if len(reps) > 1 else None
    out: list[Divergence] = []
    order = list(ra) + [k for k in rb if k not in ra]
    for key in order:
        x, y = ra.get(key), rb.get(key)
        if x is None or y is None:
            out.append(_div(key, "row", math.nan if x is None else 1.0,
                            math.nan if y is None else 1.0, 0.0, math.inf,
                            (x or y)["merged"]))
            continue
        for stat, exact in STATS:
            u, v = x[stat], y[stat]
            if _close(u, v):
                continue
            if exact:
                band, excess = 0.0, math.inf
            else:
                band = band_of[key][stat] if band_of and key in band_of else rtol * max(abs(u),
                                                                                         abs(v))
                gap = abs(v - u)
                if not math.isfinite(gap) or gap > band:
                    excess = gap / band if band > 0 and math.isfinite(gap) else math.inf
                else:
                    continue
            out.append(_div(key, stat, u, v, band, excess, x["merged"]))
    how = (f"measured from {len(reps)} runs of A ({MARGIN:g}x their largest relative "
           f"deviation per tensor + {FLOOR:g})"
           if band_of else f"{rtol:g} relative (no repeats of A given)")
    return Difference(out, sum(1 for k in ra if k in rb), how)


def _measured(reps: list[dict]) -> dict[tuple, dict[str, float]]:
    """Per aligned row and statistic, from the repeats' deviations from the first run, pooled
    over steps for the same tensor (the row's key without its step: a few repeats of one row
    would give a band as noisy as the row itself): amax and rms MARGIN times the largest
    relative deviation plus FLOOR, times the row's magnitude; the zero fraction, a count of
    discrete events (an embedding's rows that no token of the batch hit), MARGIN times the
    largest absolute deviation plus ZERO_FLOOR."""
    dev: dict[tuple, dict[str, float]] = {}
    for key, first in reps[0].items():
        rows = [r.get(key) for r in reps[1:]]
        if any(r is None for r in rows):
            continue
        tensor = dev.setdefault(key[1:], {s: 0.0 for s, _ in STATS})
        for stat, _ in STATS:
            for r in rows:
                u, v = first[stat], r[stat]
                if math.isfinite(u) and math.isfinite(v) and u != v:
                    d = abs(v - u) if stat == "zero_frac" else abs(v - u) / max(abs(u), abs(v))
                    tensor[stat] = max(tensor[stat], d)
    out = {}
    for key, first in reps[0].items():
        tensor = dev.get(key[1:])
        if tensor is not None:
            out[key] = {s: (MARGIN * tensor[s] + FLOOR) * abs(first[s]) for s, _ in STATS}
            out[key]["zero_frac"] = MARGIN * tensor["zero_frac"] + ZERO_FLOOR
    return out


def _div(key: tuple, stat: str, a: float, b: float, band: float, excess: float,
         merged: bool) -> Divergence:
    step, rank, module, op, role, pass_, recipe, what_if = key
    return Divergence(int(step), int(rank), str(module), str(op), str(role), str(pass_),
                      str(recipe or ""), bool(what_if), stat, float(a), float(b), float(band),
                      float(excess), merged)
