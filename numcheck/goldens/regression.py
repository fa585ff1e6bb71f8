"""Golden regression (DESIGN rule 7): a current row against its stored golden row.

The absolute and baseline rules (``policy``) stand on their own; this gate adds "no worse than
last time". Slack is measured in units of rounding noise, never as a fixed percentage of the
golden: a benign rewrite of a kernel (another fp32 summation order, a blocked GEMM, an online
softmax, Welford) changes the rounding pattern, so its error moves by a fraction of the
baseline's error and by the sampling spread of an RMS over n elements, while a lost quarter or
half bit grows the error by 19% or 41% of itself. Calibration: docs/golden-slack-calibration.md
(bench/calibrate_golden_slack.py).

    error metric (rel_l2 == SQNR, one statistic; the worst block the same way):
        regressed when  new > old + max(S_E * E, Z * old / sqrt(2 n), F * u)
        E = max(old kernel error, old baseline error): the baseline's error is the yardstick;
        S_E = 0.1 for bf16/fp16 results, 2.0 for fp32 (summation order alone moves fp32 error)
    non-finite: any NaN/inf beyond the golden's, or a new class mismatch
    max ULP (ops whose policy gates ULPs): may grow by max(1, ceil(old / 4))
    |mean ULP toward larger magnitude| (rows gated for truncation): max(0.1, 4 / sqrt(n))
    on a platform outside the golden's envelope (golden.platform_of): the error metrics, max
        ULP and the bias may exceed that by the cross-platform slack (CROSS_*): "drift",
        reported and never failing
    plus each family's own golden rules (numcheck.verdicts.judge: curves leaving their band)

Changed inputs (digest differs) are reported as such, never as a regression or improvement.

The common rules above are written once, over columns (``_common_rules``): ``numcheck compare``
runs them on two joined tables (``compare_kinds``), ``compare_row`` on one pair of rows (``_Row``:
numpy scalars, no table) and words what they found; a family's own rules stay row-wise.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from numcheck.goldens import store as golden
from numcheck.verdicts import families
from numcheck.goldens.store import KEY, PLATFORM_SEP, platform_difference, platforms_of

# Constants measured in docs/golden-slack-calibration.md (bench/calibrate_golden_slack.py,
# 4710 benign rows: reordered/blocked fp32 sums, Welford, online softmax, split-K GEMM, ...):
# bf16/fp16 results (u >= 2^-11): benign excess <= 0.012 E on 11 of 13 ops -> 0.1 (8x margin);
# a lost half bit (x 1.41) is caught while E < 4 x the kernel's own error.
S_E_LOW = 0.1
# fp32 results: another summation order alone moves fp32 error by up to 1.08 E (l2) and
# 1.76 E (worst block, Welford on zero blocks) -> 2.0; fp32 relies on the absolute rules for
# fractions of a bit, the golden catches losses of about 1.6 bits and more.
S_E_FP32 = 2.0
# Sampling spread of an RMS over n roughly independent errors is rms / sqrt(2 n); benign
# bf16/fp16 rewrites reached 6.2 of these units (fp16 layer_norm Welford, large_mean) -> 8.
Z = 8.0
# Exact or nearly exact results: growth below 5% of the unit roundoff is not a change (a
# correctly rounded output has rel ~0.3-0.4 u, so a lost half bit still shows above 0.12 u).
F = 0.05
# max ULP (ops that gate ULPs): benign rewrites moved it by <= 4 with ratio <= 2 (silu, swiglu,
# gelu, softmax); never beyond g + max(1, ceil(g / 4)) (0 of 332 rows).
ULP_SLACK_MIN, ULP_SLACK_FRAC = 1, 0.25
# |mean ULP toward larger magnitude| (truncation gives 0.5): benign rows rose by > 0.1 in
# 11 of 332, truncation in 55 of 100; plus 4 standard errors of RNE noise, 0.29 ulp / sqrt(n).
BIAS_SLACK = 0.1
# Another platform of the device class (CPU vendor or ATen ISA tier; GPU, CUDA, cuBLAS, cuDNN):
# another vector width reorders sums and swaps vectorized math for scalar math. Measured in
# docs/golden-slack-calibration.md ("Across platforms"), the shipped AVX512 goldens against AVX2
# and DEFAULT runs of the quick ops and quant suites on one AMD EPYC (1650 rows each), in units
# of E beyond the same-platform slack:
# bf16/fp16 results: none needed any (the largest excess was 0.093 E *below* the slack) -> 0.1:
# a lost half bit (0.41 E) still regresses on any platform.
CROSS_E_LOW = 0.1
# fp32 results: up to 2.11 E (worst block; compiled adaln_modulate / rms_norm on wide_range rows
# under DEFAULT: scalar code sums rows sequentially), 0.84 E for the Intel-AMX
# flex_attention flip -> 4 (about 2x the largest).
CROSS_E_FP32 = 4.0
# Rows the golden's platform computed (nearly) exactly, E < u / 8 (a representable result or a
# complete cancellation: constant rows through layer_norm and adaln_modulate): whether another
# platform's summation order lands on it is one rounding, so up to one u of it. Measured: 0
# under DEFAULT, 0.14 u (bf16) and 0.56 u (fp16) under AVX2 for the same rows.
CROSS_EXACT_BELOW = 0.125
CROSS_EXACT_U = 1.0
# |mean ULP toward larger magnitude| on another platform: up to the absolute truncation gate's
# 0.25 (policy.TRUNCATION_ULP; truncation gives 0.5 on any platform). Measured: fp16 constant
# rows through layer_norm, 0.000 under DEFAULT, 0.220 under AVX2 (a row's mean off by one
# rounding shifts every element of the row the same way).
CROSS_BIAS = 0.25
# max ULP: no ULP-gated row moved across tiers (54 bf16, 26 fp32 rows; all exact ops) -> one
# ULP beyond the same-platform slack.
CROSS_ULP = 1


@dataclass
class Change:
    """The golden verdict of one row: ``kind`` is same | improved | regressed | new |
    inputs_changed | missing (strict run, no golden) and ``messages`` say why."""

    key: tuple
    kind: str
    messages: list[str] = field(default_factory=list)
    old: dict | None = None
    new: dict | None = None

    @property
    def regressed(self) -> bool:
        return self.kind == "regressed"

    def metrics_line(self) -> str:
        """old -> new for the key metrics (what refresh prints)."""
        parts = []
        for col, label in (("kernel_sqnr_db", "SQNR dB"), ("kernel_min_block_sqnr_db",
                                                          "worst block dB"),
                           ("kernel_max_ulp", "max ULP"), ("kernel_rel_l2", "rel_l2")):
            a = None if self.old is None else self.old.get(col)
            b = None if self.new is None else self.new.get(col)
            if a != b and not (_nan(a) and _nan(b)):
                parts.append(f"{label} {_fmt(a)} -> {_fmt(b)}")
        for obj, tag in ((self.old, "old"), (self.new, "new")):
            if obj is not None and obj.get("series"):
                s = obj["series"]
                parts.append(f"{tag} curve: {len(s)} steps, final loss - fp32 {s[-1]:+.4g}")
        parts += _metrics_changes(self.old, self.new)
        if self.new and self.old and self.new.get("status") != self.old.get("status"):
            parts.append(f"status {self.old.get('status')} -> {self.new.get('status')}")
        return ", ".join(parts) or "no metric changed"


def _metrics_changes(old: dict | None, new: dict | None) -> list[str]:
    """``name old -> new`` for the family metrics (fingerprints, telemetry floors) that differ."""
    def load(row):
        m = None if row is None else row.get("metrics")
        return json.loads(m) if isinstance(m, str) else (m or {})
    if new is None:
        return []
    a, b = load(old), load(new)
    return [f"{k} {_fmt(a.get(k))} -> {_fmt(b.get(k))}" for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k) and not (_nan(a.get(k)) and _nan(b.get(k)))]


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def compare_row(old: dict | None, new: dict, family: str | None = None) -> Change:
    """The golden verdict of ``new`` (a golden-schema row) against ``old`` (None: no golden):
    the common statistics rules (``_common_rules``, run on the pair as a one-row table) plus the
    family's own golden rules (``family``: whose rules, default from the row)."""
    if old is None:
        return Change(golden.key_of(new), "new", ["no golden row for this case"], None, new)
    with np.errstate(all="ignore"):  # NaN and inf propagate as in Python's float maths
        inputs_changed, rules, values = _common_rules(_Row(old, new))
    return _change(old, new, family, inputs_changed, rules, values)


def _change(old: dict, new: dict, family: str | None, inputs_changed, rules: dict[str, _Found],
            values: dict) -> Change:
    """The Change of one row pair from what the common rules found for it (one row's values:
    compare_row's, or one row of compare_tables' columns) and the family's own golden rules."""
    key = golden.key_of(new)
    if inputs_changed:
        return Change(key, "inputs_changed", [
            f"input digest {old['input_digest']} -> {new['input_digest']}: the case's inputs "
            "changed (generator, distribution or op input builder); refresh the golden"], old, new)
    family_rules = _family_rules(family, new)
    foreign = _foreign(old, new)
    worse, better, drift = family_rules.golden(old, new, foreign) if family_rules.golden \
        else ([], [], [])
    if worse and family_rules.platform_bound and foreign:
        # values that belong to the platform they were measured on (fingerprints): another
        # platform's differ by design, reported as drift, never as a regression
        return Change(key, "drift", worse + drift + [_recorded_on(old, new)], old, new)
    for name, found in rules.items():  # each rule finds a row worse, drifted, better or none
        for side, into in (("worse", worse), ("drift", drift), ("better", better)):
            if getattr(found, side):
                into.append(_message(name, side, found, values, old, new))
    if drift and not worse:
        drift.append(_recorded_on(old, new))
        return Change(key, "drift", drift, old, new)
    return _verdict(key, worse, better, old, new)


def _message(rule: str, side: str, found: _Found, v: dict, old: dict, new: dict) -> str:
    """What compare_row says of a common rule that found the row worse, better or drifted
    (``side``); ``v``: the values the rules computed."""
    if rule == "status_error":
        return f"the kernel now fails to run ({old.get('status')} -> error)"
    if rule == "runs_again":
        return "the kernel runs again (error -> " + str(new.get("status")) + ")"
    if rule == "absolute":
        return f"absolute rules: passed -> {new.get('status')}"
    if rule == "nonfinite":
        o_nf, o_mm, n_nf, n_mm = (int(v[k]) for k in ("o_nf", "o_mm", "n_nf", "n_mm"))
        if side == "worse":
            return (f"non-finite: {n_nf} NaN/inf ({n_mm} unlike the reference), golden "
                    f"{o_nf} ({o_mm})")
        return f"non-finite: {o_nf} -> {n_nf}"
    slack = found.slack
    if rule == "bias":
        label = (f"|mean ULP toward larger magnitude| {v['o_m']:.3f} -> {v['n_m']:.3f} (slack "
                 f"{slack:.3f}; truncation gives 0.5)")
        return label if side == "worse" else \
            f"{label}: within the cross-platform bound {CROSS_BIAS}"
    if rule == "rel_l2":
        label = (f"rel_l2 {v['o_rel']:.4g} -> {v['n_rel']:.4g} (SQNR {old.get('kernel_sqnr_db')} "
                 f"-> {new.get('kernel_sqnr_db')} dB)")
    elif rule == "block":
        label = (f"worst block SQNR {old.get('kernel_min_block_sqnr_db')} -> "
                 f"{new.get('kernel_min_block_sqnr_db')} dB (rel {v['o_b']:.3g} -> "
                 f"{v['n_b']:.3g})")
    else:  # max_ulp: the values as the rows hold them (integers)
        label = f"max ULP {old['kernel_max_ulp']} -> {new.get('kernel_max_ulp')}"
    return {"worse": f"{label} (slack {slack:.2g})",
            "drift": f"{label}: within the cross-platform slack {found.cross:.2g}",
            "better": f"{label} (beyond slack {slack:.2g})"}[side]


def _recorded_on(old: dict, new: dict) -> str:
    here = (platforms_of(new) or ["this machine"])[0]
    recorded = platforms_of(old)
    return (f"golden recorded on {PLATFORM_SEP.join(recorded) or 'an unknown platform'}; here "
            f"{here}" + (f" ({platform_difference(recorded[0], here)})" if recorded else ""))


def _verdict(key, worse, better, old, new) -> Change:
    if worse:
        return Change(key, "regressed", worse, old, new)
    if better:
        return Change(key, "improved", better, old, new)
    return Change(key, "same", [], old, new)


def _family_rules(family: str | None, row: dict):
    """The Family of ``family`` (None: the row's family): where this module looks families up."""
    return families.get(family) if family else families.of_row(row)


# --- the common statistics rules, written once over columns -------------------------------------
# Columns of two joined tables (_Columns: numcheck compare) or of one row pair (_Row: compare_row);
# numpy's float64 maths is Python's (IEEE double, correctly rounded +-*/ and sqrt) except ``**``,
# which runs in Python (_block_rel, once per distinct value).

class _Found(NamedTuple):
    """Where one common rule finds a row worse, better or drifted (within the cross-platform
    slack; never two of them for one row), and the slacks it allowed, per row (arrays; numpy
    scalars for compare_row's one row)."""

    worse: np.ndarray
    better: np.ndarray
    drift: np.ndarray
    slack: np.ndarray | float | None = None
    cross: np.ndarray | float | None = None


def _common_rules(col: _Columns | _Row) -> tuple[np.ndarray, dict[str, _Found], dict[str,
                                                                                     np.ndarray]]:
    """The common statistics rules, per row of ``col``: (inputs changed, what each rule found in
    the order of compare_row's messages, the values the messages name)."""
    # both rows carry an input digest (not None, not empty) and the digests differ
    inputs_changed = col.nonempty("old:input_digest") & col.nonempty("new:input_digest") & \
        col.differ("input_digest")
    o_status, n_status = col.strings("old:status"), col.strings("new:status")
    # without statistics on both sides only the status rules apply
    stats = col.floats("old:kernel_n")[1] & col.floats("new:kernel_n")[1]
    none = np.zeros_like(stats)
    found = {"status_error": _Found((n_status == "error") & (o_status != "error"), none, none),
             "runs_again": _Found(none, ~stats & (o_status == "error") & np.not_equal(
                 n_status, None) & (n_status != "error"), none)}
    zero = col.zero_if_null  # `row.get(name) or 0`

    o_nf = zero("old:kernel_n_nan") + zero("old:kernel_n_inf")
    n_nf = zero("new:kernel_n_nan") + zero("new:kernel_n_inf")
    o_mm, n_mm = zero("old:kernel_nonfinite_mismatch"), zero("new:kernel_nonfinite_mismatch")
    worse = (n_nf > o_nf) | (n_mm > o_mm)
    found["nonfinite"] = _Found(stats & worse, stats & ~worse & ((n_nf < o_nf) | (n_mm < o_mm)),
                                none)
    # Another platform than the envelope's: the cross-platform slack on top (never for
    # non-finite values or the absolute rules: those hold on every machine).
    foreign = col.per_distinct(lambda a, b: _foreign({"platforms": a}, {"platforms": b}), bool,
                               "old:platforms", "new:platforms")

    def against(applies, o, n_, slack, cross) -> _Found:
        exceeds = applies & ~(n_ <= o + slack)  # NaN is worse
        drifts = exceeds & foreign & (n_ <= o + slack + cross)
        return _Found(stats & exceeds & ~drifts, stats & applies & ~exceeds & (n_ < o - slack),
                      stats & drifts, slack, cross)

    u = zero("old:u")
    kc, kn = zero("old:kernel_n_compared"), zero("old:kernel_n")
    n = _where(kc != 0, kc, _where(kn != 0, kn, 1.0))
    (o_rel, o_rel_ok), (n_rel, n_rel_ok) = col.floats("old:kernel_rel_l2"), col.floats(
        "new:kernel_rel_l2")
    yard = _max(zero("old:kernel_rel_l2"), zero("old:baseline_rel_l2"))
    found["rel_l2"] = against(o_rel_ok & n_rel_ok & np.isfinite(o_rel), o_rel, n_rel,
                              error_slack(o_rel, yard, n, u), cross_slack(yard, u))

    n_blocks = zero("old:kernel_n_blocks")
    nb = np.maximum(1.0, n // np.maximum(1.0, _where(n_blocks != 0, n_blocks, 1.0)))
    o_b = col.per_distinct(_block_rel, np.float64, "old:kernel_min_block_sqnr_db")
    n_b = col.per_distinct(_block_rel, np.float64, "new:kernel_min_block_sqnr_db")
    b_yard = _max(o_b, col.per_distinct(_block_rel, np.float64, "old:baseline_min_block_sqnr_db"))
    found["block"] = against(np.isfinite(o_b) & ~np.isnan(b_yard), o_b, n_b,
                             error_slack(o_b, b_yard, nb, u), cross_slack(b_yard, u))

    o_u, o_u_ok = col.floats("old:kernel_max_ulp")
    n_u = col.floats("new:kernel_max_ulp")[0]  # NaN where None: worse
    found["max_ulp"] = against(col.flags("old:gate_ulp") & o_u_ok, o_u, n_u,
                               np.maximum(ULP_SLACK_MIN, np.ceil(ULP_SLACK_FRAC * o_u)), CROSS_ULP)

    o_m, o_m_ok = col.floats("old:kernel_mag_bias_ulp")
    o_m, n_m = abs(o_m), abs(col.floats("new:kernel_mag_bias_ulp")[0])
    slack = _max(BIAS_SLACK, 4 / np.sqrt(n))
    exceeds = col.flags("old:gate_bias") & o_m_ok & ~(n_m <= o_m + slack)
    # another platform: up to the absolute truncation gate, whatever the golden's bias
    within_cross = foreign & (n_m <= _max(o_m + slack, CROSS_BIAS))
    found["bias"] = _Found(stats & exceeds & ~within_cross, none, stats & exceeds & within_cross,
                           slack)
    found["absolute"] = _Found(stats & (o_status == "passed") & (
        (n_status == "failed") | (n_status == "error")), none, none)
    values = {"o_nf": o_nf, "o_mm": o_mm, "n_nf": n_nf, "n_mm": n_mm, "o_rel": o_rel,
              "n_rel": n_rel, "o_b": o_b, "n_b": n_b, "o_m": o_m, "n_m": n_m}
    return inputs_changed, found, values


def s_e(u):
    """Slack in units of E for results whose verdict unit roundoff is ``u`` (floats or arrays)."""
    return _where(u >= 2.0 ** -11, S_E_LOW, S_E_FP32)


def error_slack(old, yardstick, n, u):
    """Allowed growth of an error metric (rel_l2 or a block's rel) over its golden value (floats
    or arrays of them: an array)."""
    spread = Z * old / np.sqrt(2 * np.maximum(n, 1))
    return _max(_max(s_e(u) * yardstick, spread), F * u)


def cross_slack(yardstick, u):
    """Allowed growth of an error metric beyond the same-platform slack, on a platform the
    golden was not recorded on (floats or arrays of them: an array)."""
    per_e = _where(u >= 2.0 ** -11, CROSS_E_LOW, CROSS_E_FP32) * yardstick
    # the golden platform computed it (nearly) exactly: one rounding elsewhere
    return _where(yardstick < CROSS_EXACT_BELOW * u, CROSS_EXACT_U * u, per_e)


def _max(a, b):
    """Python's max(a, b) elementwise, NaN included: b only where b > a."""
    return _where(b > a, b, a)


def _where(cond, a, b):
    """np.where; on scalars (compare_row's one row) Python's conditional (np.where takes
    about 1.3 us a call on scalars, 50 ns this way; a row makes about 15 of them)."""
    return np.where(cond, a, b) if isinstance(cond, np.ndarray) else a if cond else b


def _block_rel(db: float | None) -> float:
    if db is None or _nan(db):
        return math.nan
    try:
        return 0.0 if db == math.inf else 10.0 ** (-db / 20.0)
    except OverflowError:  # below -6165 dB: an error beyond the largest float
        return math.inf


def _foreign(old: dict, new: dict) -> bool:
    """Does ``new`` come from a platform outside ``old``'s envelope? (Rows without platforms
    are compared as same-platform rows: the strict side.)"""
    here, seen = platforms_of(new), platforms_of(old)
    return bool(here and seen) and not set(here) <= set(seen)


class _Row:
    """One pair of rows (dicts) as the rules' columns, by ``"old:<column>"`` / ``"new:<column>"``:
    what compare_row feeds them. Numbers and truths as numpy scalars (``~`` negates, as on
    arrays; a Python bool's ``~`` would not), strings as the rows hold them (their comparisons
    are Python bools: the rules combine them with ``&`` and ``|`` only). No arrow table, no
    arrays: a one-row table costs milliseconds, this tens of microseconds."""

    def __init__(self, old: dict, new: dict):
        self._rows = {"old": old, "new": new}

    def _get(self, key: str):
        return self._rows[key[:3]].get(key[4:])  # "old:" or "new:"

    def floats(self, key: str) -> tuple[np.float64, np.bool_]:
        v = self._get(key)
        return np.float64(math.nan if v is None else v), np.bool_(v is not None)

    def zero_if_null(self, key: str) -> np.float64:
        return np.float64(self._get(key) or 0.0)

    def flags(self, key: str) -> np.bool_:
        return np.bool_(bool(self._get(key)))

    def strings(self, key: str) -> str | None:
        return self._get(key)

    def nonempty(self, key: str) -> np.bool_:
        return np.bool_(bool(self._get(key)))

    def differ(self, name: str) -> np.bool_:
        return np.bool_(self._rows["old"].get(name) != self._rows["new"].get(name))

    def per_distinct(self, fn: Callable, dtype: type, *keys: str):
        return np.dtype(dtype).type(fn(*map(self._get, keys)))


# --- whole tables at once (numcheck compare) ----------------------------------------------------

def compare_tables(old: pa.Table, new: pa.Table, *, same: bool = False
                   ) -> tuple[list[Change], int]:
    """``numcheck compare``: the Changes of the rows that changed (every row with ``same``), and
    the number of unchanged rows left out. A row of ``new`` is compared with ``old``'s row of its
    key; a key only ``old`` has is a Change of kind "removed". The verdicts and the listed rows'
    messages come from the same column-wise rules as ``compare_kinds`` (``_change``: what
    ``compare_row`` says of a row)."""
    o, n, kinds, found = _compare(old, new)
    listed = np.arange(len(kinds)) if same else np.flatnonzero(kinds != "same")
    inputs_changed, rules, values = found
    changes = []
    for i, a, b in zip(listed, _dicts(old, o[listed]), _dicts(new, n[listed])):
        if b is None:
            c = Change(golden.key_of(a), "removed", ["row not in NEW"], a, None)
        elif a is None:
            c = compare_row(None, b)
        else:  # the listed row's share of the columns' findings: compare_row's, without its cost
            c = _change(a, b, b.get("family"), inputs_changed[i],
                        {k: _Found(*(_at(x, i) for x in f)) for k, f in rules.items()},
                        {k: v[i] for k, v in values.items()})
        if same or c.kind != "same":  # (rows whose family judges them may be the same)
            changes.append(c)
    return changes, len(kinds) - len(changes)


def _at(x, i):
    """Row ``i`` of a rule's per-row array (a slack may be one number for every row)."""
    return x[i] if isinstance(x, np.ndarray) else x


def compare_kinds(old: pa.Table, new: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The golden verdict of every key of two golden (or results) tables, on whole columns:
    ``(row of old, row of new, kind)`` per key, row -1 where that side has none (of several rows
    with one key the last counts, as in ``golden.read``). ``kind`` is ``compare_row(old row, new
    row).kind``, "removed" for a key only ``old`` has, and None where the row's family has golden
    rules of its own (``Family.golden``; ``compare_row`` judges those rows). The rules are
    ``compare_row``'s own (``_common_rules``), here on whole columns."""
    o, n, kinds, _ = _compare(old, new)
    return o, n, kinds


def _compare(old: pa.Table, new: pa.Table):
    """compare_kinds, and what the common rules found per row (for compare_tables' messages)."""
    o, n = _outer_join(old, new)
    col = _Columns(old, o, new, n)
    with np.errstate(all="ignore"):  # NaN and inf propagate as in Python's float maths
        inputs_changed, rules, values = _common_rules(col)
    worse, better, drift = (np.logical_or.reduce([getattr(f, side) for f in rules.values()])
                            for side in ("worse", "better", "drift"))
    kinds = np.array(["same", "improved", "drift", "regressed"], dtype=object)[
        np.where(worse, 3, np.where(drift, 2, np.where(better, 1, 0)))]
    own_rules = _per_distinct(lambda *v: _family_rules(None, dict(zip(
        ("family", "series", "suite", "op", "output"), v))).golden is not None, bool,
        col.codes("new:family"), col.present("new:series"), col.codes("new:suite"),
        col.codes("new:op"), col.codes("new:output"))
    kinds[own_rules] = None
    kinds[inputs_changed] = "inputs_changed"
    kinds[o < 0] = "new"
    kinds[n < 0] = "removed"
    return o, n, kinds, (inputs_changed, rules, values)


def _outer_join(old: pa.Table, new: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Rows of old and new with equal keys (golden.KEY), one pair per key, -1 where a side has
    no row; of several rows with one key the last counts. Keys of new first, in its order."""
    if _same_keys_once(old, new):  # a golden against its refresh: no hashing of the keys
        rows = np.arange(new.num_rows)
        return rows, rows
    ids, groups = _dense(_combined([_encode(old, new, name) for name in KEY])[0])
    last = np.full((2, groups), -1, dtype=np.int64)
    np.maximum.at(last[0], ids[:old.num_rows], np.arange(old.num_rows))
    np.maximum.at(last[1], ids[old.num_rows:], np.arange(new.num_rows))
    in_new = np.sort(last[1][last[1] >= 0])
    gone = np.sort(last[0][(last[0] >= 0) & (last[1] < 0)])
    return (np.concatenate([last[0][ids[old.num_rows:][in_new]], gone]),
            np.concatenate([in_new, np.full(len(gone), -1, dtype=np.int64)]))


def _same_keys_once(old: pa.Table, new: pa.Table) -> bool:
    """Do old and new hold the same keys in the same rows, each key once? Checked as row by
    row equal and strictly increasing (golden.write and write_results sort rows by key)."""
    if old.num_rows != new.num_rows:
        return False
    increasing = np.zeros(max(new.num_rows - 1, 0), dtype=bool)
    tied = ~increasing
    for name in KEY:
        a, b = old.column(name).combine_chunks(), new.column(name).combine_chunks()
        if a.null_count or b.null_count or a.type != b.type or \
                not _values(pc.equal(a, b)).all():
            return False
        if len(b) > 1:
            before, after = b.slice(0, len(b) - 1), b.slice(1)
            increasing |= tied & _values(pc.less(before, after))
            tied &= _values(pc.equal(before, after))
    return bool(increasing.all())


def _combined(columns: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
    """One integer below ``size`` per row of coded columns ``(codes, how many codes)``, equal
    where the rows' codes are: mixed radix, renumbered before it would overflow."""
    ids, size = np.zeros(len(columns[0][0]), dtype=np.int64), 1
    for codes, count in columns:
        if size * count >= 2 ** 62:
            ids, size = _dense(ids)
        ids, size = ids * count + codes, size * count
    return ids, size


def _dense(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Integers renumbered 0, 1, ... (equal stays equal) and how many."""
    distinct, ids = np.unique(ids, return_inverse=True)
    return ids.reshape(-1), len(distinct)


def _encode(old: pa.Table, new: pa.Table, name: str) -> tuple[np.ndarray, int]:
    """Codes of column ``name`` over old's rows then new's (equal values, equal codes; None is a
    value of its own) and how many distinct values."""
    column = pa.concat_arrays([old.column(name).combine_chunks(), new.column(name).combine_chunks(
        ).cast(old.schema.field(name).type)]).dictionary_encode(null_encoding="encode")
    return _values(column.indices).astype(np.int64), len(column.dictionary)


def _per_distinct(fn: Callable, dtype: type, *columns: tuple[np.ndarray, list]) -> np.ndarray:
    """``fn(*values)`` per row of coded columns (``_Columns.codes``), evaluated once per
    distinct combination of values, as an array of ``dtype``."""
    ids, size = _combined([(codes, len(values)) for codes, values in columns])
    if size > 2 * len(ids) + 1024:  # more combinations than rows: number those that occur
        ids, size = _dense(ids)
    row = np.full(size, -1, dtype=np.int64)
    row[ids] = np.arange(len(ids))  # a row of each combination (any: they are alike)
    out = np.zeros(size, dtype=dtype)
    for i in np.flatnonzero(row >= 0):
        out[i] = fn(*(values[codes[row[i]]] for codes, values in columns))
    return out[ids]


class _Columns:
    """The columns of old and new at the joined rows, by ``"old:<column>"`` / ``"new:<column>"``;
    row -1 and a column the table lacks (``family`` in goldens) read as null."""

    def __init__(self, old: pa.Table, o: np.ndarray, new: pa.Table, n: np.ndarray):
        self._tables, self._rows = {"old": old, "new": new}, {"old": o, "new": n}
        self._floats: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # the rules reread some
        self._arrow: dict[str, pa.Array | None] = {}

    def _get(self, key: str) -> tuple[pa.ChunkedArray | None, np.ndarray]:
        side, name = key.split(":")
        table = self._tables[side]
        return (table.column(name) if name in table.column_names else None), self._rows[side]

    def floats(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Values as float64 (NaN where null) and where they are not null."""
        if key not in self._floats:
            c, rows = self._get(key)
            if c is None:
                self._floats[key] = np.full(len(rows), np.nan), np.zeros(len(rows), dtype=bool)
            else:
                c = c.combine_chunks().cast(pa.float64())
                ok = np.append(_valid(c), False)[rows]
                self._floats[key] = np.where(ok, np.append(_values(c), np.nan)[rows], np.nan), ok
        return self._floats[key]

    def zero_if_null(self, key: str) -> np.ndarray:
        """``row.get(name) or 0``: a number, 0 where null."""
        v, ok = self.floats(key)
        return np.where(ok, v, 0.0)

    def flags(self, key: str) -> np.ndarray:
        """A boolean column's truth (null is false)."""
        c, rows = self._get(key)
        if c is None:
            return np.zeros(len(rows), dtype=bool)
        c = c.combine_chunks()
        return np.append(_values(c) & _valid(c), False)[rows]

    def codes(self, key: str) -> tuple[np.ndarray, list]:
        """Dictionary codes per row and the values they stand for (None: null, or no row)."""
        c, rows = self._get(key)
        if c is None:
            return np.zeros(len(rows), dtype=np.int64), [None]
        enc = c.combine_chunks().dictionary_encode(null_encoding="encode")
        values = enc.dictionary.to_pylist() + [None]
        return np.append(_values(enc.indices), len(values) - 1)[rows], values

    def present(self, key: str) -> tuple[np.ndarray, list]:
        """Codes of whether a row has a value (a curve stands in as []: ``family_of_row`` asks
        only whether there is one)."""
        c, rows = self._get(key)
        if c is None:
            return np.zeros(len(rows), dtype=np.int64), [None]
        return np.append(_valid(c.combine_chunks()), False)[rows].astype(np.int64), [None, []]

    def strings(self, key: str) -> np.ndarray:
        """Values as an object array (None where null)."""
        codes, values = self.codes(key)
        return np.array(values, dtype=object)[codes]

    def per_distinct(self, fn: Callable, dtype: type, *keys: str) -> np.ndarray:
        """``fn(*values)`` per row of columns (None where null), evaluated once per distinct
        combination of values: Python's maths, where numpy's may differ in the last bit (``**``)."""
        return _per_distinct(fn, dtype, *map(self.codes, keys))

    def _taken(self, key: str) -> pa.Array | None:
        """The column at the joined rows as arrow (null at row -1; None: no such column)."""
        if key not in self._arrow:
            c, rows = self._get(key)
            self._arrow[key] = None if c is None else c.combine_chunks().take(_indices(rows))
        return self._arrow[key]

    def nonempty(self, key: str) -> np.ndarray:
        """``bool(row.get(name))`` of a string column: neither null nor empty."""
        a = self._taken(key)
        if a is None:
            return np.zeros(len(self._rows["old"]), dtype=bool)
        length = pc.binary_length(a)
        return _valid(length) & (_values(length) > 0)

    def differ(self, name: str) -> np.ndarray:
        """Where old's and new's values of a column differ (whatever, where either is null)."""
        a, b = self._taken(f"old:{name}"), self._taken(f"new:{name}")
        if a is None or b is None:
            return np.zeros(len(self._rows["old"]), dtype=bool)
        return _values(pc.not_equal(a, b))


# Arrow to numpy and back through buffers: Array.to_numpy, pa.array and Python scalars as compute
# arguments import pandas where it is installed (arrow's conversion layer), half a second of
# numcheck compare.
_NUMPY = {pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}


def _bits(buffer: pa.Buffer, a: pa.Array) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")
    return bits[a.offset:a.offset + len(a)].astype(bool)


def _valid(a: pa.Array) -> np.ndarray:
    """Where the array is not null."""
    validity = a.buffers()[0]
    return np.ones(len(a), dtype=bool) if validity is None or not len(a) else _bits(validity, a)


def _values(a: pa.Array) -> np.ndarray:
    """A boolean, int32, int64 or float64 array's values (whatever lies under its nulls)."""
    if pa.types.is_boolean(a.type):
        return _bits(a.buffers()[1], a) if len(a) else np.zeros(0, dtype=bool)
    dtype = np.dtype(_NUMPY[a.type])
    if not len(a):
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(a.buffers()[1], dtype, len(a), a.offset * dtype.itemsize)


def _indices(rows: np.ndarray) -> pa.Array:
    """Row numbers as an arrow array for ``take``, null at row -1."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(rows), [
        pa.py_buffer(np.packbits(rows >= 0, bitorder="little")), pa.py_buffer(rows)])


def _dicts(table: pa.Table, rows: np.ndarray) -> list[dict | None]:
    """The rows of ``table`` as dicts (as golden.read gives them), None for row -1."""
    got = iter(table.take(_indices(rows[rows >= 0])).to_pylist())
    return [next(got) if r >= 0 else None for r in rows]
