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

Where both runs recorded digests (``watch(..., digests=True)``: numcheck/telemetry/digest.py),
each aligned row's digest is compared too, exactly: the first row whose bits differ is
``first_digest``, however small the change (a change below the band: statistics cannot see
it). Digests that differ between the repeats of A (another seed, a non-deterministic kernel)
are not compared (``unstable``: how many rows).

The band is measured where repeated runs of the first configuration are given (``a`` a list:
the same program from other seeds, or on other machines): per row and statistic, ``MARGIN``
times the largest deviation of a repeat from the first run that the same tensor shows over all
steps, plus a floor (``_measured``). Without
repeats it is ``RTOL`` relative (the zero fraction: ``RTOL`` of the elements): two runs of one
program on the same inputs agree to the last bit, and a reassociated bf16 computation moves a
statistic by about one bf16 rounding; a change below it needs the tensors' digests.

How: columns, not rows (two 1M-row files in about a second, the command whole:
docs/telemetry.md). Each run is read with pyarrow (its string columns as dictionaries, unified
across the runs), its ALIGN columns packed into one int64 key, aligned to A's by a sorted
search, and every statistic compared as a numpy array; a Divergence object is made for the
rows that are shown.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

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
    has the row, "digest" where its bits differ), ``a`` / ``b`` its values (NaN where the run
    has no such row), ``band`` the noise band it was judged with, ``excess`` |b - a| / band
    (inf for a count, a digest or a missing row)."""
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


# the order of a row's divergences: its structure, its bits, then STATS
_KINDS = ("row", "digest") + tuple(s for s, _ in STATS)


@dataclass
class Difference:
    """``nc.telemetry.diff``'s answer: false when the runs agree within the band.
    ``divergences``: every diverging (row, statistic) in execution order (the first ones
    first); ``rows``: the aligned rows compared; ``band``: how the band was set; ``digests``:
    aligned rows whose digests were compared; ``unstable``: rows with digests in both runs
    that vary between the repeats of A (not compared)."""
    rows: int
    band: str
    digests: int = 0
    unstable: int = 0
    # the divergences as columns, in order: kind (index of _KINDS), a, b, band, excess,
    # merged, and where (the run and row their labels are read from)
    _cols: dict = field(default_factory=dict, repr=False)
    _labels: list = field(default_factory=list, repr=False)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __len__(self) -> int:
        return len(self._cols.get("kind", ()))

    def _make(self, i: int) -> Divergence:
        c = self._cols
        run, row = int(c["run"][i]), int(c["row"][i])
        lab = self._labels[run]
        return Divergence(int(lab["step"][row]), int(lab["rank"][row]), str(lab["module"][row]),
                          str(lab["op"][row]), str(lab["role"][row]), str(lab["pass"][row]),
                          str(lab["recipe"][row] or ""), bool(lab["what_if"][row]),
                          _KINDS[int(c["kind"][i])], float(c["a"][i]), float(c["b"][i]),
                          float(c["band"][i]), float(c["excess"][i]), bool(c["merged"][i]))

    @cached_property
    def divergences(self) -> list[Divergence]:
        return [self._make(i) for i in range(len(self))]

    def _first(self, digest: bool) -> Divergence | None:
        c = self._cols
        if not len(self):
            return None
        pick = np.flatnonzero((c["kind"] == 1) == digest)
        if not pick.size:
            return None
        step = c["step"][pick[0]]
        single = pick[(c["step"][pick] == step) & ~c["merged"][pick]]
        return self._make(int(single[0] if single.size else pick[0]))

    @property
    def first(self) -> Divergence | None:
        """The first divergence of statistics (or of a row only one run has) in execution
        order, passing over rows that merge several calls of their module in that step (a
        residual add before and after the changed layer sits at its first call) while a row of
        a single call diverges in the same step."""
        return self._first(digest=False)

    @property
    def first_digest(self) -> Divergence | None:
        """The first row whose digests differ (None: none, or no digests in both runs), with
        the same rule for rows of several calls."""
        return self._first(digest=True)

    def summary(self, first: int = 10) -> str:
        stats, bits = self.first, self.first_digest
        head = f"{self.rows} rows aligned, band: {self.band}; "
        if stats is not None:
            head += (f"{int((self._cols['kind'] != 1).sum())} diverging statistic(s), the "
                     f"first at {stats.where()}")
        else:
            head += "no divergence beyond the band"
        if self.digests:
            head += (f"; digests of {self.digests} rows compared: " +
                     (f"the first that differs at {bits.where()}" if bits else "all equal"))
            if self.unstable:
                head += f" ({self.unstable} rows not compared: their digests vary across A)"
        lines = [head]
        for i in range(min(first, len(self))):
            d = self._make(i)
            if d.stat == "digest":
                lines.append(f"  {d.where()}: digest {int(d.a):012x} -> {int(d.b):012x}")
                continue
            lines.append(f"  {d.where()}: {d.stat} {d.a:.6g} -> {d.b:.6g} "
                         f"(band {d.band:.3g}, {d.excess:.3g}x)")
        if len(self) > first:
            lines.append(f"  ... and {len(self) - first} more")
        return "\n".join(lines)


_STRINGS = ("module", "op", "role", "pass", "recipe")
_NEEDED = ALIGN + ("calls", "n", "n_nan", "n_inf", "n_zero", "amax", "sum_sq")


def _table(x, what: str):
    """A pyarrow table of the columns diff reads, from a frame or a parquet path (UsageError
    naming it otherwise)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    if isinstance(x, pd.DataFrame):
        names = list(x.columns)
    else:
        path = Path(x)
        if not path.is_file():
            raise UsageError(f"telemetry diff: {what} {str(path)!r}: no such file (give "
                             "telemetry parquet files: Telemetry.to_parquet, numcheck inspect)")
        try:
            names = pq.read_schema(path).names
        except Exception as e:  # noqa: BLE001 - pyarrow's many errors: one message
            raise UsageError(f"telemetry diff: {what} {str(path)!r} is not a parquet file "
                             f"({type(e).__name__}: {e})") from e
    missing = [c for c in _NEEDED if c not in names]
    if missing:
        raise UsageError(f"telemetry diff: {what} has no column(s) {', '.join(missing)}: not "
                         "a telemetry frame (Telemetry.records())")
    cols = list(_NEEDED) + (["digest"] if "digest" in names else [])
    if isinstance(x, pd.DataFrame):
        return pa.Table.from_pandas(x[cols], preserve_index=False)
    try:
        return pq.read_table(path, columns=cols, read_dictionary=list(_STRINGS))
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"telemetry diff: {what} {str(path)!r} could not be read "
                         f"({type(e).__name__}: {e})") from e


class _Run:
    """One run's rows as numpy columns, in its (execution) order: ``key`` the ALIGN columns
    packed into one int64 (codes shared by all runs of a diff), ``key4`` (step, rank, module,
    op) alone, the statistics, ``digest`` (NaN: none), ``merged``; ``codes`` also names the
    string codes, decoded only for the rows shown (``_labels``)."""

    def __init__(self, table, codes: dict) -> None:
        c = {k: np.asarray(codes[k]) if k in codes else
             table.column(k).to_numpy(zero_copy_only=False) for k in ALIGN}
        self.codes = c
        num = {k: table.column(k).to_numpy(zero_copy_only=False).astype(np.float64)
               for k in _NEEDED[len(ALIGN):]}
        n, nan, inf = num["n"], num["n_nan"], num["n_inf"]
        with np.errstate(invalid="ignore"):
            self.stats = {"n": n, "nonfinite": nan + inf, "amax": num["amax"],
                          "rms": np.sqrt(np.maximum(num["sum_sq"], 0.0)
                                         / np.maximum(n - nan - inf, 1.0)),
                          "zero_frac": num["n_zero"] / np.maximum(n, 1.0)}
        self.digest = (table.column("digest").to_numpy(zero_copy_only=False).astype(np.float64)
                       if "digest" in table.column_names else np.full(len(n), np.nan))
        self.calls = num["calls"]

    def pack(self, sizes: dict, lows: dict, output: int) -> None:
        """The keys, packed; ``output``: the code of role "output" (-2: none)."""
        self.key = _packed(self.codes, ALIGN, sizes, lows)
        self.key4 = _packed(self.codes, ALIGN[:4], sizes, lows)
        self.tensor = _packed(self.codes, ALIGN[1:], sizes, lows)   # the key without its step
        several = np.unique(self.key4[(self.codes["role"] == output) & (self.calls > 1)])
        self.merged = np.isin(self.key4, several)


def _packed(codes: dict, names: tuple, sizes: dict, lows: dict) -> np.ndarray:
    key = np.zeros(len(codes[names[0]]), dtype=np.int64)
    for k in names:
        key = key * sizes[k] + (codes[k].astype(np.int64) - lows[k])
    return key


def _runs(tables: list) -> list[_Run]:
    """The runs with shared string codes and one packing of their keys."""
    import pyarrow as pa
    codes: list[dict] = [{} for _ in tables]
    dicts = {}
    for k in _STRINGS:
        arrays = []
        for t in tables:
            col = t.column(k).combine_chunks()
            if not pa.types.is_dictionary(col.type):
                col = col.dictionary_encode()
            arrays.append(col.cast(pa.dictionary(pa.int32(), pa.string())))
        unified = pa.chunked_array(arrays).unify_dictionaries()
        dicts[k] = unified.chunk(0).dictionary.to_pylist()
        for i, ch in enumerate(unified.chunks):
            codes[i][k] = ch.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    output = dicts["role"].index("output") if "output" in dicts["role"] else -2
    runs = [_Run(t, c) for t, c in zip(tables, codes, strict=True)]
    lows, sizes = {}, {}
    for k in ALIGN:
        vals = [r.codes[k].astype(np.int64) for r in runs if len(r.codes[k])]
        lo = min((int(v.min()) for v in vals), default=0)
        hi = max((int(v.max()) for v in vals), default=0)
        lows[k], sizes[k] = lo, hi - lo + 1
    if math.prod(sizes.values()) >= 2 ** 62:
        raise UsageError("telemetry diff: too many distinct (step, rank, module, op, role, "
                         "pass, recipe) values to align (more than 2^62 combinations)")
    for r in runs:
        r.pack(sizes, lows, output)
    for k in _STRINGS:   # labels for the rows shown
        for r in runs:
            r.codes[f"{k}_names"] = dicts[k]
    return runs


def _align(a: _Run, b: _Run) -> np.ndarray:
    """For each row of a, its row in b (-1: b has no such row)."""
    if not len(b.key):
        return np.full(len(a.key), -1, dtype=np.int64)
    order = np.argsort(b.key, kind="stable")
    sk = b.key[order]
    pos = np.minimum(np.searchsorted(sk, a.key), len(sk) - 1)
    return np.where(sk[pos] == a.key, order[pos], -1)


def diff(a, b, *, rtol: float = RTOL) -> Difference:
    """Where run ``b`` parts from run ``a``. ``a``: a telemetry frame or parquet path, or a
    list of them (repeats of the first configuration: the band is measured from them, and the
    first is the reference whose order is followed); ``b``: a frame or path. ``rtol``: the
    relative band without repeats."""
    given = a if isinstance(a, (list, tuple)) else [a]
    if not given:
        raise UsageError("telemetry diff: give at least one run A")
    tables = [_table(x, f"run A{i + 1}") for i, x in enumerate(given)] + [_table(b, "run B")]
    *reps, rb = _runs(tables)
    ra = reps[0]
    ib = _align(ra, rb)
    in_b = ib >= 0
    both = np.flatnonzero(in_b)
    j = ib[both]
    rep_rows = [_align(ra, r) for r in reps[1:]]
    band_of = _measured(ra, reps[1:], rep_rows) if len(reps) > 1 else None

    parts = []   # (A's order position, kind, a, b, band, excess, merged, run, row)

    def add(pos, kind, u, v, band, excess, merged, run, row):
        parts.append((np.asarray(pos, np.float64), np.full(len(pos), kind), u, v, band, excess,
                      merged, np.full(len(pos), run), row))

    # rows only one run has: A's where A has them, B's after A's rows
    only_a = np.flatnonzero(~in_b)
    nan_a = np.full(len(only_a), np.nan)
    add(only_a, 0, np.ones(len(only_a)), nan_a, np.zeros(len(only_a)),
        np.full(len(only_a), np.inf), ra.merged[only_a], 0, only_a)
    seen = np.zeros(len(rb.key), dtype=bool)
    seen[j] = True
    only_b = np.flatnonzero(~seen)
    add(len(ra.key) + np.arange(len(only_b)), 0, np.full(len(only_b), np.nan),
        np.ones(len(only_b)), np.zeros(len(only_b)), np.full(len(only_b), np.inf),
        rb.merged[only_b], len(reps), only_b)
    # digests: where both runs have them and the repeats of A agree
    da, db = ra.digest[both], rb.digest[j]
    has = ~np.isnan(da) & ~np.isnan(db)
    stable = np.ones(len(both), dtype=bool)
    for r, rows in zip(reps[1:], rep_rows, strict=True):
        at = rows[both]
        present = at >= 0
        other = np.where(present, r.digest[np.maximum(at, 0)], da)
        stable &= ~present | (other == da)
    compared = has & stable
    diverged = compared & (da != db)
    pick = both[diverged]
    add(pick, 1, da[diverged], db[diverged], np.zeros(pick.size), np.full(pick.size, np.inf),
        ra.merged[pick], 0, pick)
    # statistics
    for kind, (stat, exact) in enumerate(STATS, start=2):
        u, v = ra.stats[stat][both], rb.stats[stat][j]
        same = (u == v) | (np.isnan(u) & np.isnan(v))
        if exact:
            band = np.zeros(len(u))
            excess = np.full(len(u), np.inf)
            bad = ~same
        else:
            # NaN on one side: the other's magnitude. The zero fraction counts discrete events,
            # absolute: avx2 and avx512 runs of tiny_lm differ by one exact zero among 16384
            # gradient elements at step 3 (0 -> 6e-5: 256x a relative band)
            default = (np.full(len(u), rtol) if stat == "zero_frac" else
                       rtol * np.fmax(np.abs(u), np.abs(v)))
            band = default if band_of is None else np.where(
                np.isnan(band_of[stat][both]), default, band_of[stat][both])
            with np.errstate(invalid="ignore", over="ignore"):
                gap = np.abs(v - u)
                finite = np.isfinite(gap)
                bad = ~same & (~finite | (gap > band))
                excess = np.where(finite & (band > 0), gap / np.where(band > 0, band, 1.0),
                                  np.inf)
        add(both[bad], kind, u[bad], v[bad], band[bad], excess[bad], ra.merged[both[bad]], 0,
            both[bad])
    cols = {k: np.concatenate([p[i] for p in parts]) for i, k in enumerate(
        ("pos", "kind", "a", "b", "band", "excess", "merged", "run", "row"))}
    order = np.lexsort((cols["kind"], cols["pos"]))
    cols = {k: v[order] for k, v in cols.items()}
    runs = reps + [rb]
    cols["row"] = cols["row"].astype(np.int64)
    cols["merged"] = cols["merged"].astype(bool)
    cols["step"] = np.zeros(len(cols["row"]), dtype=np.int64)
    for k, r in enumerate(runs):
        m = cols["run"] == k
        cols["step"][m] = r.codes["step"][cols["row"][m]]
    how = (f"measured from {len(reps)} runs of A ({MARGIN:g}x their largest relative "
           f"deviation per tensor + {FLOOR:g})"
           if band_of else f"{rtol:g} relative (no repeats of A given)")
    labels = [_labels(r) for r in reps] + [_labels(rb)]
    return Difference(int(in_b.sum()), how, int(compared.sum()),
                      int((has & ~stable).sum()), cols, labels)


def _labels(r: _Run) -> dict:
    """Row -> label readers for Divergence (the codes decoded on demand)."""
    c = r.codes

    class _Names:
        def __init__(self, k):
            self.k = k

        def __getitem__(self, i):
            code = int(c[self.k][i])
            return c[f"{self.k}_names"][code] if code >= 0 else ""

    return {"step": c["step"], "rank": c["rank"], "what_if": c["what_if"],
            **{k: _Names(k) for k in _STRINGS}}


def _measured(ra: _Run, others: list[_Run], rows: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Per row of A and statistic, the band from the repeats' deviations from A, pooled over
    steps for the same tensor (the row's key without its step: a few repeats of one row would
    give a band as noisy as the row itself), from the rows every repeat has: amax and rms
    MARGIN times the largest relative deviation plus FLOOR, times the row's magnitude; the
    zero fraction, a count of discrete events (an embedding's rows that no token of the batch
    hit), MARGIN times the largest absolute deviation plus ZERO_FLOOR. NaN: no band (the
    tensor is in no row every repeat has)."""
    everywhere = np.all(np.stack([r >= 0 for r in rows]), axis=0)
    tensors, inverse = np.unique(ra.tensor, return_inverse=True)
    known = np.zeros(len(tensors), dtype=bool)
    known[inverse[everywhere]] = True
    out = {}
    for stat, _ in STATS:
        dev = np.zeros(len(tensors))
        u = ra.stats[stat]
        for r, at in zip(others, rows, strict=True):
            v = np.where(at >= 0, r.stats[stat][np.maximum(at, 0)], np.nan)
            with np.errstate(invalid="ignore", divide="ignore"):
                ok = everywhere & np.isfinite(u) & np.isfinite(v) & (u != v)
                d = np.abs(v - u) if stat == "zero_frac" else \
                    np.abs(v - u) / np.maximum(np.abs(u), np.abs(v))
            np.maximum.at(dev, inverse[ok], d[ok])
        per_row = dev[inverse]
        band = MARGIN * per_row + ZERO_FLOOR if stat == "zero_frac" else \
            (MARGIN * per_row + FLOOR) * np.abs(u)
        out[stat] = np.where(known[inverse], band, np.nan)
    return out
