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
    plus each family's own golden rules (numcheck.verdict: curves leaving their band)

Changed inputs (digest differs) are reported as such, never as a regression or improvement.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import golden, verdict
from .golden import PLATFORM_SEP, platform_difference, platforms_of
from .records import family_of_row

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


def s_e(u: float) -> float:
    """Slack in units of E for results whose verdict unit roundoff is ``u``."""
    return S_E_LOW if u >= 2.0 ** -11 else S_E_FP32


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
        if self.new and self.old and self.new.get("status") != self.old.get("status"):
            parts.append(f"status {self.old.get('status')} -> {self.new.get('status')}")
        return ", ".join(parts) or "no metric changed"


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def _block_rel(db: float | None) -> float:
    if db is None or _nan(db):
        return math.nan
    return 0.0 if db == math.inf else 10.0 ** (-db / 20.0)


def error_slack(old: float, yardstick: float, n: int, u: float) -> float:
    """Allowed growth of an error metric (rel_l2 or a block's rel) over its golden value."""
    spread = Z * old / math.sqrt(2 * max(n, 1))
    return max(s_e(u or 0.0) * yardstick, spread, F * (u or 0.0))


def cross_slack(yardstick: float, u: float) -> float:
    """Allowed growth of an error metric beyond the same-platform slack, on a platform the
    golden was not recorded on."""
    u = u or 0.0
    if yardstick < CROSS_EXACT_BELOW * u:  # the golden platform computed it (nearly) exactly
        return CROSS_EXACT_U * u
    return (CROSS_E_LOW if u >= 2.0 ** -11 else CROSS_E_FP32) * yardstick


def _foreign(old: dict, new: dict) -> bool:
    """Does ``new`` come from a platform outside ``old``'s envelope? (Rows without platforms
    are compared as same-platform rows: the strict side.)"""
    here, seen = platforms_of(new), platforms_of(old)
    return bool(here and seen) and not set(here) <= set(seen)


def _nonfinite(row: dict) -> tuple[int, int]:
    return ((row.get("kernel_n_nan") or 0) + (row.get("kernel_n_inf") or 0),
            row.get("kernel_nonfinite_mismatch") or 0)


def compare_row(old: dict | None, new: dict, family: str | None = None) -> Change:
    """The golden verdict of ``new`` (a golden-schema row) against ``old`` (None: no golden):
    the common statistics rules below plus the family's own golden rules (``family``: whose
    rules, default from the row: ``numcheck.records.family_of_row``)."""
    key = golden.key_of(new)
    if old is None:
        return Change(key, "new", ["no golden row for this case"], None, new)
    if old.get("input_digest") and new.get("input_digest") and \
            old["input_digest"] != new["input_digest"]:
        return Change(key, "inputs_changed", [
            f"input digest {old['input_digest']} -> {new['input_digest']}: the case's inputs "
            "changed (generator, distribution or op input builder); refresh the golden"], old, new)
    worse, better = verdict.rules(family or family_of_row(new)).golden(old, new)
    if new.get("status") == "error" and old.get("status") != "error":
        worse.append(f"the kernel now fails to run ({old.get('status')} -> error)")
    if new.get("kernel_n") is None or old.get("kernel_n") is None:
        if old.get("status") == "error" and new.get("status") not in (None, "error"):
            better.append("the kernel runs again (error -> " + str(new.get("status")) + ")")
        return _verdict(key, worse, better, old, new)

    (o_nf, o_mm), (n_nf, n_mm) = _nonfinite(old), _nonfinite(new)
    if n_nf > o_nf or n_mm > o_mm:
        worse.append(f"non-finite: {n_nf} NaN/inf ({n_mm} unlike the reference), golden "
                     f"{o_nf} ({o_mm})")
    elif n_nf < o_nf or n_mm < o_mm:
        better.append(f"non-finite: {o_nf} -> {n_nf}")

    # Another platform than the envelope's: the cross-platform slack on top (never for
    # non-finite values or the absolute rules: those hold on every machine).
    foreign = _foreign(old, new)
    drift: list[str] = []

    def judge(label: str, o: float, n_: float, slack: float, cross: float) -> None:
        if not n_ <= o + slack:  # NaN is worse
            msg = f"{label} (slack {slack:.2g})"
            if foreign and n_ <= o + slack + cross:
                drift.append(f"{label}: within the cross-platform slack {cross:.2g}")
            else:
                worse.append(msg)
        elif n_ < o - slack:
            better.append(f"{label} (beyond slack {slack:.2g})")

    u = old.get("u") or 0.0
    n = int(old.get("kernel_n_compared") or old.get("kernel_n") or 1)
    o_rel, n_rel = old.get("kernel_rel_l2"), new.get("kernel_rel_l2")
    yard = max(o_rel or 0.0, old.get("baseline_rel_l2") or 0.0)
    if o_rel is not None and n_rel is not None and math.isfinite(o_rel):
        judge(f"rel_l2 {o_rel:.4g} -> {n_rel:.4g} (SQNR {old.get('kernel_sqnr_db')} -> "
              f"{new.get('kernel_sqnr_db')} dB)", o_rel, n_rel,
              error_slack(o_rel, yard, n, u), cross_slack(yard, u))

    nb = max(1, n // max(1, int(old.get("kernel_n_blocks") or 1)))
    o_b, n_b = (_block_rel(old.get("kernel_min_block_sqnr_db")),
                _block_rel(new.get("kernel_min_block_sqnr_db")))
    b_yard = max(o_b, _block_rel(old.get("baseline_min_block_sqnr_db")))
    if math.isfinite(o_b) and not _nan(b_yard):
        judge(f"worst block SQNR {old.get('kernel_min_block_sqnr_db')} -> "
              f"{new.get('kernel_min_block_sqnr_db')} dB (rel {o_b:.3g} -> {n_b:.3g})",
              o_b, n_b, error_slack(o_b, b_yard, nb, u), cross_slack(b_yard, u))

    if old.get("gate_ulp") and old.get("kernel_max_ulp") is not None:
        o_u, n_u = old["kernel_max_ulp"], new.get("kernel_max_ulp")
        slack = max(ULP_SLACK_MIN, math.ceil(ULP_SLACK_FRAC * o_u))
        judge(f"max ULP {o_u} -> {n_u}", o_u, math.nan if n_u is None else n_u, slack,
              CROSS_ULP)
    if old.get("gate_bias") and old.get("kernel_mag_bias_ulp") is not None:
        o_m = abs(old["kernel_mag_bias_ulp"])
        n_m = abs(new.get("kernel_mag_bias_ulp") if new.get("kernel_mag_bias_ulp") is not None
                  else math.nan)
        slack = max(BIAS_SLACK, 4 / math.sqrt(n))
        label = (f"|mean ULP toward larger magnitude| {o_m:.3f} -> {n_m:.3f} (slack "
                 f"{slack:.3f}; truncation gives 0.5)")
        if foreign and n_m <= max(o_m + slack, CROSS_BIAS):
            if not n_m <= o_m + slack:
                drift.append(f"{label}: within the cross-platform bound {CROSS_BIAS}")
        elif not n_m <= o_m + slack:
            worse.append(label)
    if old.get("status") == "passed" and new.get("status") in ("failed", "error"):
        worse.append(f"absolute rules: passed -> {new.get('status')}")
    if drift and not worse:
        here = (platforms_of(new) or ["this machine"])[0]
        recorded = platforms_of(old)
        drift.append(f"golden recorded on {PLATFORM_SEP.join(recorded) or 'an unknown platform'}"
                     f"; here {here}" + (f" ({platform_difference(recorded[0], here)})"
                                         if recorded else ""))
        return Change(key, "drift", drift, old, new)
    return _verdict(key, worse, better, old, new)


def _verdict(key, worse, better, old, new) -> Change:
    if worse:
        return Change(key, "regressed", worse, old, new)
    if better:
        return Change(key, "improved", better, old, new)
    return Change(key, "same", [], old, new)
