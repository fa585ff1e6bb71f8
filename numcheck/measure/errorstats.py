"""``ErrorStats``: the statistics of one output against its FP64 reference, as a plain record.

Torch-free so that the readers of goldens and results (``records``, ``golden``, ``regression``
and the ``compare`` / ``show`` / ``report`` commands) never import torch; ``stats.error_stats``
computes it. Definitions: ``numcheck.measure.stats``' module docstring.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ErrorStats:
    """Statistics of ``out`` against ``ref``; ``as_dict()`` gives plain ints/floats for parquet."""

    fmt: str  # format the ULPs are counted in
    n: int  # elements
    n_compared: int  # elements where out and the rounded reference are both finite
    n_nan: int  # NaN in out
    n_inf: int  # +-inf in out
    nonfinite_mismatch: int  # elements whose class (finite, NaN, +inf, -inf) differs from the rounded ref
    max_abs: float  # max |out - ref|
    mean_abs: float  # mean |out - ref|
    rel_l2: float  # ||out - ref|| / ||ref||
    sqnr_db: float  # 10 log10(sum ref^2 / sum (out - ref)^2); the same statistic as rel_l2, in dB
    cosine: float  # cosine similarity; reported, never a gate (a binade-off scale keeps it at 1)
    bias: float  # sum(out - ref) / sum |ref|: directional rounding (floor, ceil) shows here
    max_ulp: int  # max ULP distance in fmt between out and the rounded reference
    mean_ulp: float
    p99_ulp: int  # nearest-rank 99th percentile, exact
    bias_ulp: float  # mean signed ULP distance (out above the rounded ref counts +)
    mag_bias_ulp: float  # mean ULP distance toward larger magnitude: truncation gives < 0
    min_block_sqnr_db: float  # worst block SQNR, low-energy blocks floored (BLOCK_ENERGY_EPS)
    worst_block: int  # flat index of that block (-1 when no block has compared elements)
    n_blocks: int

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)
