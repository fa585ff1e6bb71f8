"""A kernel's block errors against its baseline's, rank by rank (DESIGN rule 4).

ErrorStats keeps each side's worst block only. Compared worst against worst, a baseline whose
worst block is bad for a reason of its own hides the kernel's errors in every other block: on
a near-one-hot softmax row the fp32 baseline's backward cancels (SQNR 11.6 dB), and a kernel
that sums its rows in bf16 (rel 0.12 where the baseline has 9e-3) passed. So the rule compares
the two sorted lists of block errors rank by rank: the kernel's r-th worst block against the
baseline's r-th worst (rank 1 is worst against worst), over the worse half of the blocks.

Not block against the same block: where a block's result cancels, one element's rounding
decides its error, and two equally accurate kernels differ there by a random factor (CPU flash
attention against the naive composition, bf16, V with outlier channels: the flash kernel 13x
the naive one's error on one row, 2 rows that way against 35 the other way). Ranks compare the
distributions, which stay put but at their ends: the best blocks are the minimum of many random
errors (two equally accurate kernels with lognormal block errors, sigma 1, 64 blocks: every rank
differs by more than 2x in 35% of draws, the worse half in 19%, worst against worst alone in
14%), and a kernel's trouble lives in its worse half.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy
import torch

from numcheck.measure.blocks import block_sums
from numcheck.measure.stats import BLOCK_ENERGY_EPS


class WorstRank(NamedTuple):
    """The rank where the kernel's block error is largest against what the rule allows."""

    ratio: float  # kernel rel / (k * baseline rel + floor) at that rank; <= 1 passes
    rank: int  # 1: the worst blocks of both
    block: int  # the kernel's block at that rank (ErrorStats.worst_block's order)
    kernel_rel: float
    baseline_rel: float


def block_rel(out: torch.Tensor, base: torch.Tensor, ref: torch.Tensor,
              blocks=None) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Per-block relative l2 error of ``out`` and of ``base`` against ``ref``, each block's
    signal floored as in error_stats (BLOCK_ENERGY_EPS of the median block's, per element);
    elements where any of the three is non-finite are left to the non-finite rule."""
    o, b, r = (t.detach().to("cpu", torch.float64) for t in (out, base, ref))
    fin = torch.isfinite(o) & torch.isfinite(b) & torch.isfinite(r)
    zero = torch.zeros((), dtype=torch.float64)
    cnt = block_sums(fin.to(torch.float64), blocks).numpy()
    sig = block_sums(torch.where(fin, r * r, zero), blocks).numpy()
    errs = [block_sums(torch.where(fin, (x - r) ** 2, zero), blocks).numpy() for x in (o, b)]
    live = cnt > 0
    c = numpy.where(live, cnt, 1.0)
    per_s = sig / c
    live_s = per_s[live]
    mid = (live_s.size - 1) // 2  # the lower median, as error_stats
    floor = BLOCK_ENERGY_EPS * float(numpy.partition(live_s, mid)[mid]) if live_s.size else 0.0
    signal = numpy.maximum(per_s, floor)
    with numpy.errstate(divide="ignore", invalid="ignore"):
        rel = [numpy.where(live & (e > 0), numpy.sqrt(e / c / signal), 0.0) for e in errs]
    return rel[0], rel[1]


def worst_rank(out: torch.Tensor, base: torch.Tensor, ref: torch.Tensor, k: float,
               floor: float, blocks=None) -> WorstRank:
    """The rank (in the worse half) at which the kernel's block error most exceeds ``k`` x the
    baseline's block error of the same rank + ``floor``."""
    kr, br = block_rel(out, base, ref, blocks)
    if kr.size == 0:
        return WorstRank(0.0, 0, -1, 0.0, 0.0)
    half = (kr.size + 1) // 2
    order = numpy.argsort(-kr, kind="stable")[:half]
    ks, bs = kr[order], -numpy.sort(-br)[:half]
    with numpy.errstate(divide="ignore", invalid="ignore"):
        ratio = numpy.where(ks > 0, ks / (k * bs + floor), 0.0)
    i = int(numpy.argmax(ratio))
    return WorstRank(float(ratio[i]), i + 1, int(order[i]), float(ks[i]), float(bs[i]))
