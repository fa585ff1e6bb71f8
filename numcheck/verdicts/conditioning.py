"""The condition-aware bound (DESIGN rule 5): how much error a backward-stable kernel may make.

A backward-stable kernel computes the exact result of inputs perturbed by a few units of its
compute precision (and of intermediate values, which the same perturbation of the inputs
bounds for the ops here: sums of n terms perturb each term by up to (n-1) u, Higham's gamma_n).
Its forward error is then what such perturbations of the inputs produce, measured here on the
case itself with the FP64 reference, for any op and without knowing its formula:

    D = RMS over draws of  f(x * (1 + u_c r)) - f(x),  r_i = +-1 at random, every float input
        (and the upstream gradient, for gradients) perturbed at once

and a kernel's error is within the bound where, block by block (the blocks of the op's
ErrorStats; element by element for ops with a componentwise rule),

    ||out - ref||_b  <=  ||rnd(ref) - ref||_b + 2 C (||D + u_c S + (c_0 / C) u_c |ref| ||_b
                                                     + u_c F_b),
    C = cond_c + sum_len   (Policy.cond_c per op with its reason; OpSpec.sum_len: gamma_n)

The first term is the output's own rounding (rnd: numcheck's RNE to the output's format), the
second what a stable algorithm may add: a computed value within e of ref rounds to within
|rnd(ref) - ref| + 2e of it (a neighbour only where e reaches the midpoint); S is the op's
OpSpec.cond_scale (intermediates no input perturbation stands for); c_0 u_c |ref| is the
result's own relative perturbation (Higham's mixed stability, "Accuracy and Stability" 1.5:
y + dy = f(x + dx)), c_0 = OWN_C roundings of the result itself and not C (a sum's
length scales its terms' errors, which D measures, not the result's last rounding). No input
perturbation stands for it where the result hardly moves with its inputs (silu at its minimum,
log p of a dominant logit), and it covers the FP64 reference's own error (a few u_64 |ref|,
u_64 = 2^-29 u_fp32, where the reference is relatively accurate: references that would cancel
are written log1p-style), so that a bound is never read below what float64 resolves and a
correctly rounded output passes; F_b is the median block's
norm for blocks below ErrorStats' low-energy floor (BLOCK_ENERGY_EPS of the median: cancelled
results such as an exactly-zero gradient row), 0 elsewhere. ``ratio`` is the worst block's
(element's) left side over its right side: <= 1 passes.

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

from numcheck import formats
from numcheck.cases import inputs
from numcheck.measure.blocks import block_index, block_sums
from numcheck.measure.stats import BLOCK_ENERGY_EPS

# c_0 of the module doc: the roundings of the result itself a stable kernel may make, the count
# policy.COND_C allows it (not imported: policy imports this module).
OWN_C = 4.0

# Eight draws: the elementwise bound reads D per element, whose estimate from few draws can be
# near 0 by chance (compiled adaln_modulate, fp32-2x16x128-zero_blocks-s0-transposed, a
# benign sequential row sum: ratio 1.36 with 2 draws, 0.31 with 4, 0.17 with 8). Each draw is
# one more FP64 reference (forward and backward), paid only by records that fail a baseline or
# componentwise rule.
DRAWS = 8


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
          blocks=None, u_c: float = 0.0, *, elementwise: bool = False) -> float:
    """The kernel's error over its condition-aware bound (see the module doc), the worst block
    (``elementwise``: the worst element, for ops judged element by element); elements where
    out or ref is not finite are left to the non-finite rule. NaN when nothing compares."""
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    fin = torch.isfinite(o) & torch.isfinite(r)
    if not bool(fin.any()):
        return math.nan
    zero = torch.zeros((), dtype=torch.float64)
    rounded = formats.round_to(torch.where(fin, r, zero), out_fmt)
    fin &= torch.isfinite(rounded)  # beyond the format's range: the non-finite rule's
    err = torch.where(fin, (o - r).abs(), zero)
    rnd = torch.where(fin, (rounded - r).abs(), zero)
    own = OWN_C / c if c > 0 else 0.0  # the result's own roundings, c_0 of them (module doc)
    dd = torch.where(fin, d.to(torch.float64) + own * u_c * r.abs(), zero)
    cnt = block_sums(fin.to(torch.float64), blocks)
    ref2 = block_sums(torch.where(fin, r * r, zero), blocks)
    # Blocks far below the median (under ErrorStats' BLOCK_ENERGY_EPS floor: an exactly-zero
    # gradient row computed as a difference) are results of cancellation: a stable kernel's
    # error there is a few u_c of the values it cancels, of the tensor's typical size (the
    # median block's), not of the result. Elsewhere F = 0.
    live = cnt > 0
    per = torch.where(live, ref2 / cnt.clamp(min=1), zero)
    median = float(per[live].median()) if bool(live.any()) else 0.0
    low = live & (per < BLOCK_ENERGY_EPS * median)
    if elementwise:
        f_elem = low.to(torch.float64)[block_index(o.shape, blocks)] * math.sqrt(median)
        limit = rnd + 2 * c * (dd + u_c * f_elem)
        ratios = torch.where(err > 0, err / limit.clamp(min=1e-300), zero)
        return float(ratios.max())
    err_b = block_sums(err * err, blocks).sqrt()
    rnd_b = block_sums(rnd * rnd, blocks).sqrt()
    d_b = block_sums(dd * dd, blocks).sqrt()
    f_b = torch.where(low, median * cnt, zero).sqrt()
    limit = rnd_b + 2 * c * (d_b + u_c * f_b)
    ratios = torch.where(err_b > 0, err_b / limit.clamp(min=1e-300), zero)
    return float(ratios.max())
