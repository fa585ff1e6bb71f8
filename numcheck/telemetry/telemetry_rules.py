"""The telemetry family's rules (its ``Family`` is numcheck.telemetry.telemetry_family): per-layer floors and ceilings of a model's telemetry
(``numcheck.telemetry.floors`` makes the records) judged against their goldens.

A telemetry record is one (model, recipe, module, op, role) of a ``watch`` run; its
``metrics`` hold, over the run's steps, the floors of the statistics where higher is better
(SQNR: the minimum over steps) and the ceilings of those where lower is better (underflow,
saturation, non-finite elements: the maximum). Rules:

* absolute: a statistic that is NaN, or infinitely bad (a floor of -inf, a ceiling of +inf),
  fails (never passes, never baked into a golden: a refresh refuses it, ``unbakeable``);
* golden: a floor below the golden's by more than its slack, a ceiling above it by more than
  its slack, more non-finite elements than the golden's, or a statistic the golden has and the
  run no longer measures, is a regression; the other direction beyond the slack an
  improvement. The slacks are one for every platform of the device class (calibrated on the
  ATen ISA tiers, below), so a cross-tier run is "same"; the shadow floors (fp32 against
  float64, which another CPU's GEMM moves more) have a cross-platform slack on top, within
  which a run on a platform outside the golden's envelope is "drift";
* a refresh on another platform merges the rows into their envelope (``merge_metrics``: the
  lower floor, the higher ceiling).

Reads golden and results rows only: no torch (numcheck compare / report load it).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from numcheck.records import Record

FAMILY = "telemetry"
OUTPUT = "telemetry"  # the output column of every telemetry row (telemetry_family: holds)


@dataclass(frozen=True)
class Stat:
    """One gated statistic: its metrics key, the records() column it comes from, floor or
    ceiling, its slack (dB for SQNRs, percentage points for percentages, elements) and a
    label for messages."""

    key: str
    column: str
    kind: str  # "floor" (min over steps; lower is worse) or "ceiling" (max; higher is worse)
    slack: float
    unit: str
    label: str
    # on top of ``slack`` where the run's platform is outside the golden's envelope: drift
    cross: float = 0.0


# Slacks, calibrated with bench/calibrate_telemetry_slack.py (docs/telemetry.md, "Telemetry
# goldens"): the built-in suite's models (mlp, tiny_lm, tiny_dit; 4 fp32 AdamW steps, seed 0,
# one thread; mxfp8 observed, nvfp4 fp8_tensor mxfp6 mxfp4 fp8_block int8 what-if; shadows) run
# natively (AVX512) and under ATEN_CPU_CAPABILITY=avx2 and =default, each with its own inductor
# cache: the largest |difference| of each statistic between two tiers over all 614 records
# ("spread"), against planted faults in the observed recipe (numcheck.ops.variants.planted_mx_recipe;
# mxfp8 elements keeping one mantissa bit less: -0.03 to -9.0 dB, -0.03 where clipping dominates
# the error; block scales one binade low: SQNR -14 to -24 dB, saturation +6 to +100 points; one
# binade high *improves* mxfp8's floor-mode clipping, up to +16 dB).
#
# Quantized tensors' SQNR floor: spread 0.00025 dB -> 0.25 dB (1000x); a lost quarter bit
# (-1.5 dB) fails, the lost mantissa bit failed 86 of 87 records.
SQNR_SLACK_DB = 0.25
# Worst-block SQNR floor (one 32- or 16-element block: one element's flip moves it more):
# spread 0.00088 dB -> 0.5 dB (570x); a lost half bit (-3 dB) fails (lost bit: 85 of 87).
BLOCK_SQNR_SLACK_DB = 0.5
# Shadow SQNRs (the layer's own fp32 error against float64, and the accumulated one): another
# vector width reorders fp32 sums, which moves an fp32 error's SQNR: spread 0.87 dB (layer and
# end to end, tiny_lm's first norm) -> 3 dB (3.4x). A 256x256 linear in bf16: 133.6 -> 55.6 dB.
SHADOW_SLACK_DB = 3.0
# ... and another CPU's fp32 GEMM (its kernel choice, blocking, AMX) reorders more than a vector
# width: the CI machine (Intel Xeon, AVX512 + AMX) against the shipped AMD EPYC goldens, 2026-12-03:
# tiny_dit's out/output shadow floor 137.6 -> 134.3 dB (-3.3, the only shadow row beyond 3 dB).
# 3x that on another platform is drift, not a regression; a layer run in tf32 or bf16 instead of
# fp32 still loses 40 to 78 dB, far beyond it.
SHADOW_CROSS_DB = 10.0
# Underflow / saturation percentages: an element can flip across a boundary (flush to zero,
# the top step) when its last bits differ: spread 0.0041 points (one element of 24576; 0 for
# saturation) -> max(0.05 points, 8 elements of the tensor); a scale one binade low saturated
# 6 to 100 points more.
PCT_SLACK = 0.05
PCT_SLACK_ELEMENTS = 8
# Non-finite elements in a gated tensor: none may be added (a NaN/Inf is never noise).
NONFINITE_SLACK = 0

STATS: tuple[Stat, ...] = (
    Stat("sqnr_db_floor", "sqnr_db", "floor", SQNR_SLACK_DB, "dB", "SQNR floor"),
    Stat("worst_block_sqnr_db_floor", "worst_block_sqnr_db", "floor", BLOCK_SQNR_SLACK_DB, "dB",
         "worst-block SQNR floor"),
    Stat("shadow_sqnr_db_floor", "shadow_sqnr_db", "floor", SHADOW_SLACK_DB, "dB",
         "shadow SQNR floor", SHADOW_CROSS_DB),
    Stat("e2e_sqnr_db_floor", "e2e_sqnr_db", "floor", SHADOW_SLACK_DB, "dB",
         "end-to-end SQNR floor", SHADOW_CROSS_DB),
    Stat("underflow_pct_ceiling", "underflow_pct", "ceiling", PCT_SLACK, "%",
         "underflow ceiling"),
    Stat("saturation_pct_ceiling", "saturation_pct", "ceiling", PCT_SLACK, "%",
         "saturation ceiling"),
    Stat("nonfinite_ceiling", "nonfinite", "ceiling", NONFINITE_SLACK, "",
         "non-finite elements"),
)
BY_KEY = {s.key: s for s in STATS}
# Not gated, carried for the slack of the percentages and for readers: the steps the floors
# cover, the fewest elements and the fewest finite non-zero elements the tensor had in a step.
INFO = ("steps", "n", "nz")


def metrics_of(row: dict) -> dict:
    m = row.get("metrics")
    return json.loads(m) if isinstance(m, str) else dict(m or {})


def is_nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _unbounded(s: Stat, x) -> bool:
    """An infinitely bad value: a floor of -inf (an SQNR with infinite error, or error out of
    no signal: a quantizer or layer that made Inf or non-zero values out of finite or zero
    ones), a ceiling of +inf. Like NaN, never noise (a floor of +inf, no error, is fine)."""
    return isinstance(x, (int, float)) and x == (-math.inf if s.kind == "floor" else math.inf)


def worse(kind: str, a: float | None, b: float | None) -> float | None:
    """The worse of two values of one statistic (``kind``: "floor", lower is worse;
    "ceiling", higher is worse): None is undefined (the other one stands), a NaN poisons."""
    if a is None or b is None:
        return b if a is None else a
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return min(a, b) if kind == "floor" else max(a, b)


def slack(stat: Stat, metrics: dict) -> float:
    """The allowed move of ``stat`` (given the golden's metrics: the element count)."""
    if stat.unit == "%":
        # the percentage's own denominator: underflow counts among the finite non-zero
        # elements (nz; goldens written before it was stored: n), saturation among all
        n = (metrics.get("nz") if stat.column == "underflow_pct" else None) or \
            metrics.get("n") or 0
        return max(stat.slack, 100.0 * PCT_SLACK_ELEMENTS / n) if n else stat.slack
    return stat.slack


def show_value(v, unit: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v.is_integer() and not unit:
        return str(int(v))
    return f"{v:.4g}" + (f" {unit}" if unit and unit != "%" else unit)


def case_parts(case_id: str) -> tuple[str, str, str]:
    """(model, recipe, layer) of a telemetry case id ``<model>/<recipe>/<module>/<role>``
    (numcheck.telemetry.floors; layer = ``<module>/<role>``); missing parts are ""."""
    model, recipe, layer = (str(case_id).split("/", 2) + ["", ""])[:3]
    return model, recipe, layer


def where(row) -> str:
    """A record's or row's module, role and recipe as a message reads them:
    ``blocks.0.qkv input [mxfp8, what-if]``."""
    get = row.get if isinstance(row, dict) else (lambda k, d=None: getattr(row, k, d))
    parts = str(get("case_id") or "").split("/")
    if len(parts) >= 4:
        model, recipe, module, role = parts[0], parts[1], "/".join(parts[2:-1]), parts[-1]
        what_if = "what_if=True" in str(get("params") or "")
        return f"{module} {role} [{model}, {recipe}{', what-if' if what_if else ''}]"
    return str(get("case_id") or "")


def absolute(record: Record) -> list[str]:
    """A NaN or infinitely bad statistic fails: it never passes (and a refresh never stores
    it)."""
    m = record.metrics or {}
    return [f"{where(record)}: {s.label} ({s.column}) is "
            f"{'NaN' if is_nan(m.get(s.key)) else show_value(m.get(s.key), '')}"
            for s in STATS if is_nan(m.get(s.key)) or _unbounded(s, m.get(s.key))]


def compare(old: dict, new: dict, foreign: bool = False) -> tuple[list, list, list]:
    """(worse, better, drift) messages of a current telemetry row against its golden row;
    ``foreign``: the row comes from a platform outside the golden's envelope, where a statistic
    beyond its slack but within its cross-platform slack is drift."""
    o, n = metrics_of(old), metrics_of(new)
    at = where(new)
    worse, better, drift = [], [], []
    for s in STATS:
        if s.key not in o:
            continue
        a, b = o[s.key], n.get(s.key)
        if a is None or is_nan(a):
            continue
        if b is None:
            worse.append(f"{at}: {s.label} ({s.column}) no longer measured (golden "
                         f"{show_value(a, s.unit)})")
            continue
        tol = slack(s, o)
        delta = b - a if not is_nan(b) else math.nan
        text = f"{at}: {s.label} ({s.column}) golden {show_value(a, s.unit)}, now {show_value(b, s.unit)}"
        bad = not (b >= a - tol) if s.kind == "floor" else not (b <= a + tol)
        cross = s.cross if foreign else 0.0
        if bad and cross and (b >= a - tol - cross if s.kind == "floor" else b <= a + tol + cross):
            drift.append(f"{text} ({delta:+.3g}, within the cross-platform slack {tol + cross:.3g})")
        elif bad:
            worse.append(f"{text} ({delta:+.3g}, slack {tol:.3g})" if not is_nan(b) else text)
        elif (s.kind == "floor" and b > a + tol) or (s.kind == "ceiling" and b < a - tol):
            better.append(f"{text} ({delta:+.3g})")
    return worse, better, drift


def unbakeable(row: dict, old: dict | None) -> str:
    """Why a telemetry row must not become a golden: a NaN statistic, or non-finite elements
    beyond the golden's (numcheck.goldens.session refuses it at refresh)."""
    m = metrics_of(row)
    nan = [s.key for s in STATS if is_nan(m.get(s.key))]
    if nan:
        return f"{', '.join(nan)} NaN"
    inf = [f"{s.key} {m[s.key]}" for s in STATS if _unbounded(s, m.get(s.key))]
    if inf:
        return ", ".join(inf)
    nf = m.get("nonfinite_ceiling") or 0
    had = (metrics_of(old).get("nonfinite_ceiling") or 0) if old else 0
    if nf > had:
        return f"{int(nf)} non-finite element(s) in a step, the golden {int(had)}"
    return ""


def merge_metrics(old: dict, new: dict) -> str | None:
    """The envelope of two platforms' metrics (a refresh on another platform): the lower floor,
    the higher ceiling, a statistic only one of them measured as that one has it (as
    golden.merge_envelope's ``_worse``: never dropped, which would ungate it on both); the rest
    from ``new``. JSON, as golden rows store it."""
    o, n = metrics_of(old), metrics_of(new)
    out = dict(n)
    for s in STATS:
        a, b = o.get(s.key), n.get(s.key)
        if a is None or is_nan(a):
            continue
        if b is None or is_nan(b):
            out[s.key] = a
            continue
        out[s.key] = min(a, b) if s.kind == "floor" else max(a, b)
    return json.dumps(dict(sorted(out.items())), sort_keys=True, allow_nan=True) if out else None
