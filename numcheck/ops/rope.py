"""RoPE: rope(x, cos, sin) = x * cos + rotate_half(x) * sin, the rotate-half convention.

Shapes. ``Case.shape`` is x's ``(B, H, S, D)`` (D even); cos and sin are ``(S, D)`` and broadcast
over batch and heads. ``rotate_half(x) = cat(-x2, x1)`` over the halves of the last dim, so
``out1 = x1 cos - x2 sin`` and ``out2 = x2 cos + x1 sin`` (GPT-NeoX / Llama layout).

Inputs. cos and sin are inputs, rounded to the case dtype like x: built in float64 from the
positions ``offset + 0..S-1`` and ``inv_freq_i = 10000^(-2i/D)``, ``i < D/2``, as
``emb = cat(pos * inv_freq, pos * inv_freq)`` (the two halves share frequencies). Param
``offset`` (full only) starts the positions deep into a long context.

Reference: the formula in float64 (primitives only). Baseline: the same formula in the compute
dtype. Policy: x1 cos - x2 sin cancels (DESIGN rule 5), so no ULP gate: a componentwise bound
|out - ref| <= c u (|x cos| + |rotate_half(x) sin|), with the baseline rule beside it; blocks
are rows of D. Gradients: x only (cos and sin are tables, not trained).
"""
from __future__ import annotations

import torch

from numcheck import formats
from numcheck.cases import inputs
from numcheck.cases.grid import Case, make_grid
from numcheck.verdicts.policy import Policy
from numcheck.registry import Kernel, OpSpec

ROPE_BASE = 10000.0  # RoFormer / Llama's base

_SHAPES = [(2, 4, 7, 64), (1, 4, 129, 128), (3, 2, 33, 80), (1, 3, 127, 2)]
_FULL_SHAPES = [(1, 4, 1025, 128), (1, 1, 1, 256)]
_DISTS = ["normal", "outlier_channels", "uniform", "lognormal"]
# wide_range reaches 2^-20, subnormal in fp16 (there the rounding error is absolute, not
# relative to |x cos|): kept for bf16/fp32 only (see _keep).
_FULL_DISTS = ["student_t", "large_mean", "wide_range"]


def _dt(case: Case) -> torch.dtype:
    return formats.get(case.dtype).torch


def rope_tables(s: int, d: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (cos, sin) of shape (S, D) for positions offset .. offset + S - 1."""
    if d % 2:
        raise ValueError(f"rope: head dim {d} must be even")
    inv_freq = ROPE_BASE ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pos = torch.arange(offset, offset + s, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return torch.cos(emb), torch.sin(emb)


def _rope_inputs(case: Case):
    b, h, s, d = case.shape
    x = inputs.draw(case.dist, case.shape, seed=case.seed, fmt=case.dtype, stream=f"{case.id}/x")
    cos, sin = rope_tables(s, d, int(case.param("offset") or 0))
    dt = _dt(case)
    return {"x": (x, dt), "cos": (cos, dt), "sin": (sin, dt)}, {}


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope_reference(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def rope_baseline(x, cos, sin):
    """fp32 from the stored x, cos, sin, one rounding at the output (DESIGN rule 4: fused RoPE
    kernels load the tables and rotate in fp32)."""
    xf = formats.widen(x)
    return (xf * cos.to(xf.dtype) + rotate_half(xf) * sin.to(xf.dtype)).to(x.dtype)


def _rope_scale(x, cos, sin):
    """|x cos| + |rotate_half(x) sin|: what the result's rounding scales with."""
    return (x * cos).abs() + (rotate_half(x) * sin).abs()


def _eager_rope(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def _keep(row: dict) -> bool:
    return not (row["dist"] == "wide_range" and row["dtype"] == "fp16")


def _rows(case: Case, shape: torch.Size):
    return shape[-1] if len(shape) else None


_FACTORS = {"dtype": ["fp32", "bf16", "fp16"], "shape": _SHAPES, "dist": _DISTS,
            "layout": ["contiguous", "transposed", "sliced"], "offset": [None]}
# Full: positions from 2^17 (a 128k context): large angles, the same kernel arithmetic.
_FULL = {"shape": _FULL_SHAPES, "dist": _FULL_DISTS, "offset": [131072]}


# ---- declared ops and kernels (registered by numcheck.catalog) -------------------------

OPS = (
    OpSpec(
        "rope", _rope_inputs, rope_reference, rope_baseline,
        make_grid("rope", _FACTORS, extra_full=_FULL, keep=_keep),
        # Standard model: x*cos, rotate_half(x)*sin and their sum each rounded once in the compute
        # dtype give |err| <= 2u (|x cos| + |rh(x) sin|) + O(u^2); one rounding of an fp32 result
        # stays under 1u.
        Policy(bound_c=2.0, notes="componentwise bound: x1 cos - x2 sin cancels"),
        grad_args=("x",), blocks=_rows, scale=_rope_scale,
        doc="rope(x, cos, sin) = x * cos + rotate_half(x) * sin; x (B, H, S, D), cos/sin (S, D)"),
)
KERNELS = (
    Kernel("rope", "torch", _eager_rope),
)
