"""The quantization family's rules: measured SQNR floors of round trips and SQNR-gap ceilings of
quantized GEMMs (the quant suite, ``numcheck.quant.paths``), and its report section.

Floors are measured values (the tables below, on exactly the suite's inputs: fp32 (64, 256) for
round trips, (64, 512) x (512, 64) for GEMMs, seeds from numcheck.quant.paths.case_seed) minus a
stated margin; published gates (8-20 dB) are far too loose: a broken NVFP4 would pass them.
Re-measure with ``roundtrip_record`` / ``gemm_record`` when a shape or seed changes. The
registered quantization ops (fp8_qdq, ...) are judged like every op, by their policies.
"""
from __future__ import annotations

import math

from numcheck.records import Record
from numcheck.verdicts.family import Family, Section

# Measured with numcheck.quant.paths.roundtrip_record / gemm_record on the suite's inputs
# (torch 2.13 CPU), SQNR rounded down and gaps rounded up to 0.1 dB.
# (not imported from numcheck.quant.paths: the suite asks these rules whether a record fails)
MEASURED_DB = {  # path: {dist: (mean SQNR, worst-block SQNR)}, measured, rounded down,
    # one row per path of numcheck.quant.paths.PATHS, in its order
    "fp8_e4m3_tensor": {
        "normal": (31.4, 30.3), "uniform": (31.8, 30.5), "lognormal": (31.5, 28.4),
        "student_t": (31.7, 29.6), "outlier_channels": (31.7, 25.9), "sparse": (31.4, 29.2),
        "zero_blocks": (31.6, 29.9), "constant_rows": (30.4, 24.9), "large_mean": (41.4, 41.2),
        "near_overflow": (31.7, 31.0), "subnormal": (32.3, 29.9), "wide_range": (31.6, 29.0),
    },
    "fp8_e4m3_row": {
        "normal": (31.6, 30.6), "uniform": (31.8, 31.0), "lognormal": (32.4, 30.3),
        "student_t": (32.4, 31.1), "outlier_channels": (35.9, 30.2), "sparse": (32.5, 30.0),
        "zero_blocks": (31.6, 30.7), "constant_rows": (152.1, 142.0), "large_mean": (44.5, 41.2),
        "near_overflow": (31.8, 31.0), "subnormal": (32.3, 29.9), "wide_range": (32.4, 30.0),
    },
    "fp8_e4m3_block128": {
        "normal": (31.7, 30.3), "uniform": (31.9, 30.7), "lognormal": (32.8, 30.2),
        "student_t": (32.7, 30.6), "outlier_channels": (41.6, 31.2), "sparse": (33.1, 29.9),
        "zero_blocks": (31.9, 30.6), "constant_rows": (152.1, 142.0), "large_mean": (45.1, 41.3),
        "near_overflow": (31.8, 30.4), "subnormal": (32.3, 28.8), "wide_range": (33.3, 29.6),
    },
    "fp8_e4m3_block128x128": {
        "normal": (31.5, 31.4), "uniform": (31.8, 31.7), "lognormal": (31.6, 31.5),
        "student_t": (31.4, 31.3), "outlier_channels": (31.6, 31.3), "sparse": (31.4, 31.3),
        "zero_blocks": (31.7, 31.6), "constant_rows": (30.4, 30.4), "large_mean": (41.9, 41.4),
        "near_overflow": (31.7, 31.7), "subnormal": (32.3, 32.3), "wide_range": (31.6, 31.4),
    },
    "fp8_e5m2_tensor": {
        "normal": (25.5, 24.3), "uniform": (25.8, 25.2), "lognormal": (25.5, 22.5),
        "student_t": (25.3, 23.3), "outlier_channels": (26.0, 21.3), "sparse": (25.5, 22.8),
        "zero_blocks": (25.6, 24.1), "constant_rows": (25.9, 19.1), "large_mean": (41.4, 41.2),
        "near_overflow": (25.6, 24.7), "subnormal": (25.9, 24.3), "wide_range": (25.5, 23.2),
    },
    "fp8_e5m2_row": {
        "normal": (25.7, 24.8), "uniform": (25.8, 25.2), "lognormal": (26.6, 23.8),
        "student_t": (26.2, 24.8), "outlier_channels": (30.8, 24.7), "sparse": (26.6, 24.4),
        "zero_blocks": (25.8, 24.3), "constant_rows": (152.1, 142.0), "large_mean": (44.5, 41.2),
        "near_overflow": (25.7, 25.0), "subnormal": (25.9, 24.3), "wide_range": (26.6, 23.9),
    },
    "fp8_e5m2_block128": {
        "normal": (25.8, 24.4), "uniform": (25.9, 25.1), "lognormal": (27.0, 24.0),
        "student_t": (26.6, 24.7), "outlier_channels": (35.0, 24.4), "sparse": (27.3, 23.8),
        "zero_blocks": (25.8, 24.0), "constant_rows": (152.1, 142.0), "large_mean": (45.1, 41.3),
        "near_overflow": (25.8, 24.4), "subnormal": (25.9, 22.2), "wide_range": (27.1, 24.0),
    },
    "fp8_e5m2_block128x128": {
        "normal": (25.5, 25.5), "uniform": (25.8, 25.8), "lognormal": (25.5, 25.4),
        "student_t": (25.6, 25.5), "outlier_channels": (25.7, 25.3), "sparse": (25.5, 25.4),
        "zero_blocks": (25.6, 25.6), "constant_rows": (25.9, 25.9), "large_mean": (41.9, 41.4),
        "near_overflow": (25.6, 25.6), "subnormal": (25.9, 25.8), "wide_range": (25.5, 25.5),
    },
    "mx_e4m3_floor": {
        "normal": (30.7, 22.2), "uniform": (26.2, 22.7), "lognormal": (29.2, 20.0),
        "student_t": (29.2, 20.0), "outlier_channels": (29.1, 18.3), "sparse": (29.0, 19.3),
        "zero_blocks": (30.4, 21.7), "constant_rows": (24.1, 18.2), "large_mean": (54.1, 51.5),
        "near_overflow": (27.2, 21.4), "subnormal": (32.3, 24.7), "wide_range": (26.9, 18.1),
    },
    "mx_e4m3_rceil": {
        "normal": (31.4, 27.8), "uniform": (32.5, 30.0), "lognormal": (31.2, 25.5),
        "student_t": (31.5, 25.7), "outlier_channels": (31.2, 24.9), "sparse": (31.1, 24.6),
        "zero_blocks": (31.4, 28.9), "constant_rows": (33.0, 26.4), "large_mean": (54.1, 51.5),
        "near_overflow": (32.2, 29.1), "subnormal": (32.3, 24.7), "wide_range": (32.2, 25.1),
    },
    "mx_e5m2_floor": {
        "normal": (25.4, 20.9), "uniform": (24.3, 21.8), "lognormal": (25.0, 19.6),
        "student_t": (25.1, 19.7), "outlier_channels": (25.0, 18.3), "sparse": (25.0, 19.1),
        "zero_blocks": (25.4, 21.1), "constant_rows": (22.5, 18.2), "large_mean": (54.1, 51.5),
        "near_overflow": (24.7, 20.6), "subnormal": (25.9, 20.1), "wide_range": (24.6, 18.1),
    },
    "mx_e5m2_rceil": {
        "normal": (25.5, 22.5), "uniform": (26.5, 24.1), "lognormal": (25.5, 20.3),
        "student_t": (25.6, 21.1), "outlier_channels": (25.5, 19.1), "sparse": (25.5, 19.8),
        "zero_blocks": (25.6, 22.9), "constant_rows": (25.9, 19.6), "large_mean": (54.1, 51.5),
        "near_overflow": (26.2, 23.2), "subnormal": (25.9, 20.1), "wide_range": (26.2, 19.7),
    },
    "mx_e2m3_floor": {
        "normal": (30.8, 26.8), "uniform": (31.2, 28.6), "lognormal": (28.9, 23.8),
        "student_t": (29.5, 23.7), "outlier_channels": (30.5, 23.6), "sparse": (30.8, 24.6),
        "zero_blocks": (30.9, 27.7), "constant_rows": (29.7, 24.5), "large_mean": (54.1, 51.5),
        "near_overflow": (31.4, 28.0), "subnormal": (24.7, 3.2), "wide_range": (30.8, 24.1),
    },
    "mx_e2m3_rceil": {
        "normal": (30.8, 26.8), "uniform": (32.2, 30.0), "lognormal": (28.7, 23.8),
        "student_t": (29.4, 23.7), "outlier_channels": (30.6, 23.6), "sparse": (31.0, 24.6),
        "zero_blocks": (30.9, 27.9), "constant_rows": (33.0, 26.4), "large_mean": (54.1, 51.5),
        "near_overflow": (31.8, 29.1), "subnormal": (24.7, 3.2), "wide_range": (31.3, 25.0),
    },
    "mx_e3m2_floor": {
        "normal": (25.4, 20.9), "uniform": (24.3, 21.8), "lognormal": (25.0, 19.6),
        "student_t": (25.1, 19.7), "outlier_channels": (25.0, 18.3), "sparse": (25.0, 19.1),
        "zero_blocks": (25.4, 21.1), "constant_rows": (22.5, 18.2), "large_mean": (54.1, 51.5),
        "near_overflow": (24.7, 20.6), "subnormal": (25.0, 6.9), "wide_range": (24.6, 18.1),
    },
    "mx_e3m2_rceil": {
        "normal": (25.5, 22.5), "uniform": (26.5, 24.1), "lognormal": (25.5, 20.3),
        "student_t": (25.6, 21.1), "outlier_channels": (25.4, 19.1), "sparse": (25.5, 19.8),
        "zero_blocks": (25.6, 22.9), "constant_rows": (25.9, 19.6), "large_mean": (54.1, 51.5),
        "near_overflow": (26.2, 23.2), "subnormal": (25.0, 6.9), "wide_range": (26.2, 19.7),
    },
    "mx_e2m1_floor": {
        "normal": (18.8, 14.8), "uniform": (16.8, 14.6), "lognormal": (16.6, 12.3),
        "student_t": (17.2, 13.0), "outlier_channels": (17.8, 11.8), "sparse": (18.1, 13.0),
        "zero_blocks": (18.6, 14.2), "constant_rows": (15.4, 12.1), "large_mean": (54.1, 51.5),
        "near_overflow": (17.4, 14.2), "subnormal": (14.1, 0.0), "wide_range": (17.0, 12.0),
    },
    "mx_e2m1_rceil": {
        "normal": (18.7, 15.5), "uniform": (20.0, 17.6), "lognormal": (16.1, 12.3),
        "student_t": (16.6, 12.8), "outlier_channels": (19.1, 11.7), "sparse": (19.1, 13.9),
        "zero_blocks": (18.6, 14.5), "constant_rows": (19.5, 14.3), "large_mean": (54.1, 51.5),
        "near_overflow": (19.6, 17.0), "subnormal": (14.1, 0.0), "wide_range": (19.2, 13.9),
    },
    "nvfp4": {
        "normal": (20.4, 16.6), "uniform": (19.8, 16.5), "lognormal": (20.4, 16.3),
        "student_t": (20.7, 16.8), "outlier_channels": (31.2, 16.8), "sparse": (24.9, 17.4),
        "zero_blocks": (20.5, 17.1), "constant_rows": (30.4, 24.9), "large_mean": (41.4, 39.9),
        "near_overflow": (20.2, 16.3), "subnormal": (22.5, 16.8), "wide_range": (24.2, 17.3),
    },
    "nvfp4_2d": {
        "normal": (18.9, 18.1), "uniform": (19.2, 18.5), "lognormal": (14.5, 11.2),
        "student_t": (15.6, 12.5), "outlier_channels": (20.2, 17.6), "sparse": (19.8, 17.2),
        "zero_blocks": (19.3, 18.1), "constant_rows": (20.3, 17.6), "large_mean": (41.4, 41.1),
        "near_overflow": (19.2, 18.0), "subnormal": (18.7, 16.9), "wide_range": (19.1, 16.5),
    },
    "int8": {
        "normal": (43.1, 41.0), "uniform": (48.0, 47.2), "lognormal": (35.4, 30.8),
        "student_t": (36.6, 32.5), "outlier_channels": (35.4, 29.6), "sparse": (45.3, 40.9),
        "zero_blocks": (43.2, 40.6), "constant_rows": (math.inf, math.inf),
        "large_mean": (52.3, 51.2), "near_overflow": (46.7, 45.9), "subnormal": (41.6, 38.8),
        "wide_range": (42.4, 38.4),
    },
    "int4": {
        "normal": (18.5, 15.3), "uniform": (22.9, 21.5), "lognormal": (12.8, 9.0),
        "student_t": (13.3, 9.3), "outlier_channels": (26.9, 13.7), "sparse": (21.7, 17.4),
        "zero_blocks": (18.8, 15.2), "constant_rows": (152.2, 143.3), "large_mean": (45.1, 41.3),
        "near_overflow": (21.9, 20.8), "subnormal": (19.3, 16.0), "wide_range": (20.4, 16.3),
    },
}
GAP_DB = {  # recipe: {dist: measured SQNR gap to BF16}, rounded up
    "fp8_tensor": {
        "normal": 24.3, "uniform": 24.4, "lognormal": 24.0, "student_t": 24.1,
        "outlier_channels": 23.4, "zero_blocks": 24.0,
    },
    "fp8_row": {
        "normal": 24.2, "uniform": 23.9, "lognormal": 24.4, "student_t": 24.1,
        "outlier_channels": 23.8, "zero_blocks": 24.2,
    },
    "fp8_block": {
        "normal": 24.0, "uniform": 24.5, "lognormal": 23.6, "student_t": 23.1,
        "outlier_channels": 22.3, "zero_blocks": 23.6,
    },
    "mxfp8": {
        "normal": 25.2, "uniform": 30.9, "lognormal": 27.3, "student_t": 26.2,
        "outlier_channels": 27.0, "zero_blocks": 25.4,
    },
    "mxfp8_rceil": {
        "normal": 24.2, "uniform": 23.9, "lognormal": 24.4, "student_t": 24.1,
        "outlier_channels": 23.8, "zero_blocks": 24.2,
    },
    "mxfp6": {
        "normal": 24.9, "uniform": 25.4, "lognormal": 27.2, "student_t": 26.1,
        "outlier_channels": 25.1, "zero_blocks": 24.9,
    },
    "mxfp4": {
        "normal": 37.0, "uniform": 40.2, "lognormal": 39.3, "student_t": 38.8,
        "outlier_channels": 38.0, "zero_blocks": 36.7,
    },
    "nvfp4": {
        "normal": 35.2, "uniform": 36.7, "lognormal": 35.2, "student_t": 34.6,
        "outlier_channels": 33.3, "zero_blocks": 34.5,
    },
    "nvfp4_rht_sr": {
        "normal": 36.1, "uniform": 36.6, "lognormal": 36.7, "student_t": 36.2,
        "outlier_channels": 34.4, "zero_blocks": 35.9,
    },
    "int8": {
        "normal": 13.3, "uniform": 8.4, "lognormal": 22.8, "student_t": 21.8,
        "outlier_channels": 21.3, "zero_blocks": 12.6,
    },
}

# Margins below the measured mean SQNR, by distribution. Measured spread of the mean SQNR over
# 4 seeds (same shape): <= 0.6 dB for normal, uniform, zero_blocks, near_overflow, subnormal,
# large_mean and the heavy tails; up to 2.6 dB (MX floor) and 4.0 dB (NVFP4) for
# outlier_channels and 2.3 dB for constant_rows (a few outliers or row values decide the scales).
# A lost half bit of an element format costs 3 dB and a lost bit 6 dB, so 1 dB catches it where the
# spread allows. The worst block (one 16..128-element block) varies more: 4 dB (measured <= 3.4).
MARGIN_DB = {"outlier_channels": 4.5, "constant_rows": 3.0}
DEFAULT_MARGIN_DB = 1.0  # 1 dB: > the 0.6 dB seed spread, < the 3 dB of a lost half bit
BLOCK_MARGIN_DB = 4.0  # worst block: measured seed spread <= 3.4 dB
# Above 60 dB the path is exact up to fp32 rounding of the dequantization (constant rows under
# per-row scales, large_mean under MX): gate at the cap, not at a 150 dB accident of fp32.
CAP_DB = 60.0
# Distributions a path cannot represent at all: reported and goldened, never gated on SQNR.
# None now: NVFP4 on fp32-subnormal x read 0 dB while numcheck decoded with amax / 2688 past the
# clamped encode scale; decoding with the inverse of the encode used, it measures 22.5 dB (1-D)
# and 18.7 dB (16 x 16), seeds 22.5-22.6 / 18.7-18.8 (docs/quant-findings.md, "tiny amax").
UNGATED: dict[tuple[str, str], str] = {}


def roundtrip_floor(path: str, dist: str) -> tuple[float, float] | None:
    """(mean floor, worst-block floor) in dB, or None when UNGATED."""
    if (path, dist) in UNGATED:
        return None
    mean, block = MEASURED_DB[path][dist]
    m = MARGIN_DB.get(dist, DEFAULT_MARGIN_DB)
    return min(mean, CAP_DB) - m, min(block, CAP_DB) - max(m, BLOCK_MARGIN_DB)


# The GEMM's gap to BF16 may grow by this much over its measured value. Gap spread over seeds
# follows the operands' round-trip spread (x2 for two quantized operands is bounded by the
# larger of the two): 1.5 dB, outliers 4.5 dB as above.
GAP_MARGIN_DB = {"outlier_channels": 4.5}
DEFAULT_GAP_MARGIN_DB = 1.5


def gap_ceiling(recipe: str, dist: str) -> float:
    return GAP_DB[recipe][dist] + GAP_MARGIN_DB.get(dist, DEFAULT_GAP_MARGIN_DB)


# quick: the emphasis (outliers, heavy tails, zero blocks) plus N(0,1); full: the whole zoo.
QUICK_DISTS = ("normal", "student_t", "outlier_channels", "zero_blocks")
GEMM_QUICK_DISTS = ("normal", "outlier_channels")
GEMM_FULL_DISTS = ("normal", "uniform", "lognormal", "student_t", "outlier_channels",
                   "zero_blocks")


def _roundtrip_failures(r: Record) -> list[str]:
    why = []
    if r.metric("nonfinite"):
        why.append(f"{r.metric('nonfinite')} NaN/inf in qdq(x) where x is finite")
    k = r.kernel_stats
    if (r.kernel, r.dist) not in UNGATED and r.dist not in MEASURED_DB.get(r.kernel, {}):
        # a new path (docs/DESIGN.md, "add a quantization format"): fails, saying what to write
        return why + [f"no measured floor for path {r.kernel!r}, distribution {r.dist!r}: "
                      f"measured here SQNR {k.sqnr_db:.2f} dB, worst block "
                      f"{k.min_block_sqnr_db:.2f} dB; add them (rounded down) to "
                      "numcheck.quant.quant_rules.MEASURED_DB"]
    fl = roundtrip_floor(r.kernel, r.dist)
    if fl is None:
        return why
    mean, block = fl
    if not k.sqnr_db >= mean:
        why.append(f"SQNR {k.sqnr_db:.2f} dB < floor {mean:.1f} dB (measured "
                   f"{MEASURED_DB[r.kernel][r.dist][0]} minus margin)")
    if not k.min_block_sqnr_db >= block:
        why.append(f"worst-block SQNR {k.min_block_sqnr_db:.2f} dB < floor {block:.1f} dB "
                   f"(block {k.worst_block})")
    return why


def _gemm_failures(r: Record) -> list[str]:
    why = []
    if r.metric("nonfinite"):
        why.append(f"{r.metric('nonfinite')} NaN/inf in the quantized GEMM")
    gap, ceil = r.metric("sqnr_gap_db"), gap_ceiling(r.kernel, r.dist)
    if not gap <= ceil:  # `not <=`: a NaN gap fails
        why.append(f"SQNR gap to BF16 {gap:.2f} dB > {ceil:.1f} dB (measured "
                   f"{GAP_DB[r.kernel][r.dist]} plus margin)")
    return why


class QuantRules(Family):
    """Round trips (op "roundtrip") and quantized GEMMs (op "gemm") of the quant suite."""

    name = family = "quant"

    def holds(self, row: dict) -> bool:
        # the quant suite's own rows; a curve, fingerprint or telemetry row is never one
        return row.get("suite") == "quant" and row.get("op") in ("roundtrip", "gemm") and \
            row.get("series") is None and row.get("output", "out") == "out"

    def html_section(self, records: list[Record], mode: str) -> Section | None:
        from numcheck.quant.quant_html import heatmaps_section
        return heatmaps_section(records, mode)

    def absolute(self, record: Record, policy=None) -> list[str]:
        if record.kernel_stats is None:
            return ["no statistics measured"]
        if record.op == "roundtrip":
            why = _roundtrip_failures(record)
            if not why and roundtrip_floor(record.kernel, record.dist) is None:
                record.reason = f"not gated: {UNGATED[(record.kernel, record.dist)]}"
            return why
        return _gemm_failures(record)

    golden = None  # the common statistics rules (numcheck.goldens.regression) are the quant rows' rules

    def section(self, records: list[Record], plot_path=None) -> str:
        table = sqnr_table(records)
        return f"### Quantization\n\n{table}\n" if table else ""


QUANT_RULES = QuantRules()


# ---- the report section -----------------------------------------------------------------------

def _db(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return "inf" if v == math.inf else "-inf" if v == -math.inf else f"{v:.1f}"


def _grid(title: str, corner: str, records: list[Record], order: list[str], cell,
          footer) -> list[str]:
    """A markdown table: one row per kernel (in ``order``), one column per distribution,
    ``cell(record)`` in each (bold FAIL when the record failed), then ``footer`` = (label,
    fn(record)) over the first record of each distribution (the BF16 yardstick)."""
    from numcheck.cases import inputs  # torch: only where a table is drawn, never to judge
    dists = [d for d in inputs.DISTRIBUTIONS if any(r.dist == d for r in records)]
    kernels = sorted({r.kernel for r in records},
                     key=lambda k: (order.index(k) if k in order else 999, k))
    by = {(r.kernel, r.dist): r for r in records}
    out = [title, "", f"| {corner} | " + " | ".join(dists) + " |", "|---|" + "---|" * len(dists)]
    for k in kernels:
        row = []
        for d in dists:
            r = by.get((k, d))
            text = "" if r is None else cell(r)
            row.append(f"**{text} FAIL**" if r is not None and r.status == "failed" else text)
        out.append(f"| {k} | " + " | ".join(row) + " |")
    first: dict[str, Record] = {}
    for r in records:
        first.setdefault(r.dist, r)
    label, fn = footer
    out.append(f"| {label} | " + " | ".join(fn(first[d]) for d in dists) + " |")
    return out


def _roundtrip_cell(r: Record) -> str:
    s = f"{_db(r.kernel_stats.sqnr_db)} / {_db(r.kernel_stats.min_block_sqnr_db)}"
    clip = r.metric("clip_frac")
    return s + (f" ({100 * clip:.2g}%)" if clip else "")


def sqnr_table(records: list[Record]) -> str:
    """Markdown: round-trip SQNR "mean / worst block" (dB) by path x distribution, the BF16
    yardstick row, and the SQNR gap of each quantized GEMM recipe to BF16 by distribution.
    Records of other ops are ignored; an empty string when there is nothing to show."""
    rt = [r for r in records if r.op == "roundtrip" and r.kernel_stats is not None]
    gm = [r for r in records if r.op == "gemm" and r.kernel_stats is not None]
    parts: list[str] = []
    if rt:
        parts += _grid("Round-trip SQNR, dB: mean / worst block (clip %), vs the fp32 input",
                       "path", rt, list(MEASURED_DB), _roundtrip_cell,
                       ("bf16 (yardstick)", lambda r: f"{_db(r.baseline_stats.sqnr_db)} / "
                                                      f"{_db(r.baseline_stats.min_block_sqnr_db)}"))
    if gm:
        from numcheck.quant.recipe import RECIPES  # torch: only where a table is drawn
        if parts:
            parts.append("")
        parts += _grid("Quantized GEMM: SQNR gap to the BF16 GEMM, dB (recipe SQNR in brackets)",
                       "recipe", gm, list(RECIPES),
                       lambda r: f"{_db(r.metric('sqnr_gap_db'))} ({_db(r.kernel_stats.sqnr_db)})",
                       ("bf16 GEMM SQNR", lambda r: _db(r.baseline_stats.sqnr_db)))
    return "\n".join(parts)
