"""The condition-aware bound (DESIGN rule 5): how much error a backward-stable kernel may make.

A backward-stable kernel computes the exact result of inputs perturbed by a few units of its
compute precision (and of intermediate values, which the same perturbation of the inputs
bounds for the ops here: sums of n terms perturb each term by up to (n-1) u, Higham's gamma_n).
Its forward error is then what such perturbations of the inputs produce, measured here on the
case itself with the FP64 reference, for any op and without knowing its formula:

    D = RMS over draws of  f(x * (1 + u_c r)) - f(x),  r_i = +-1 at random, every float input
        (and the upstream gradient, for gradients) perturbed at once

and a kernel's error is within the bound where, block by block (the blocks of the op's
ErrorStats),

    ||out - ref||_b  <=  u_out ||ref||_b + tiny_out sqrt(n_b) + C (||D||_b + u_c F_b),
    C = cond_c + reduction_len   (Policy: cond_c per op with its reason; gamma_n for sums)

The first term is the output's own rounding (u_out: unit roundoff of the output's format;
tiny_out: its smallest normal, for results that underflow), the second what a stable
algorithm may add; F_b is the median block's norm for blocks below ErrorStats' low-energy floor
(BLOCK_ENERGY_EPS of the median: cancelled results such as an exactly-zero gradient row), 0
elsewhere. ``ratio`` is the worst block's left side over its right side: <= 1 passes.

u_c is the compute precision of a stable kernel: fp32 for bf16/fp16 work (every stable kernel
here upcasts; a kernel computing in bf16 is held to the baseline rule instead), the dtype
itself otherwise. Random signs measure the l2 (typical) sensitivity, not the worst case of
the l1 bound; a stable kernel's rounding errors are of random sign too, and C carries the
margin (measured per op: docs/verdicts.md, "Condition-aware bounds").
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from . import formats, inputs
from .stats import BLOCK_ENERGY_EPS, block_sums

DRAWS = 2  # two draws: the RMS of two is within 2x of the expected spread in 9 of 10 cases


def compute_unit(dtype: str) -> float:
    """u_c: the unit roundoff a stable kernel computes in for work in ``dtype``."""
    u = formats.get(dtype).unit_roundoff
    return min(u, formats.get("fp32").unit_roundoff)


def spread(evaluate: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
           exact: dict[str, torch.Tensor], u: float, *, seed: int,
           draws: int = DRAWS) -> dict[str, torch.Tensor]:
    """D per output: ``evaluate`` maps float64 inputs to float64 outputs by name (the FP64
    reference, forward and backward); each float input is perturbed by u relative, with random
    signs drawn from ``seed``."""
    base = {k: v.detach() for k, v in evaluate(exact).items()}
    acc = {k: torch.zeros_like(v) for k, v in base.items()}
    for d in range(draws):
        moved = {}
        for name, x in exact.items():
            if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
                moved[name] = x
                continue
            g = torch.Generator().manual_seed(inputs.seed_for(seed, "cond", name, d))
            r = torch.randint(0, 2, tuple(x.shape), generator=g, dtype=torch.float64) * 2 - 1
            moved[name] = x.detach() * (1.0 + u * r.to(x.dtype))
        out = evaluate(moved)
        for k, v in out.items():
            dev = torch.nan_to_num(v.detach() - base[k], nan=0.0, posinf=0.0, neginf=0.0)
            acc[k] += dev * dev
    return {k: (v / draws).sqrt() for k, v in acc.items()}


def ratio(out: torch.Tensor, ref: torch.Tensor, d: torch.Tensor, out_fmt: str, c: float,
          blocks=None, u_c: float = 0.0) -> float:
    """The worst block's error over its condition-aware bound (see the module doc); elements
    where out or ref is not finite are left to the non-finite rule. NaN when nothing compares."""
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    fin = torch.isfinite(o) & torch.isfinite(r)
    if not bool(fin.any()):
        return math.nan
    zero = torch.zeros((), dtype=torch.float64)
    err2 = block_sums(torch.where(fin, (o - r) ** 2, zero), blocks)
    ref2 = block_sums(torch.where(fin, r * r, zero), blocks)
    d2 = block_sums(torch.where(fin, d.to(torch.float64) ** 2, zero), blocks)
    cnt = block_sums(fin.to(torch.float64), blocks)
    f = formats.get(out_fmt)
    # Blocks far below the median (under ErrorStats' BLOCK_ENERGY_EPS floor: an exactly-zero
    # gradient row computed as a difference) are results of cancellation: a stable kernel's
    # error there is a few u_c of the values it cancels, of the tensor's typical size (the
    # median block's), not of the result. Elsewhere F_b = 0.
    live = cnt > 0
    per = torch.where(live, ref2 / cnt.clamp(min=1), zero)
    median = float(per[live].median()) if bool(live.any()) else 0.0
    cancelled = torch.where(live & (per < BLOCK_ENERGY_EPS * median), median * cnt, zero)
    limit = f.unit_roundoff * ref2.sqrt() + f.min_normal * cnt.sqrt() + \
        c * (d2.sqrt() + u_c * cancelled.sqrt())
    err = err2.sqrt()
    ratios = torch.where(err > 0, err / limit.clamp(min=1e-300), zero)
    return float(ratios.max())
