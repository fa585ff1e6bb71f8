"""Symmetric integer reference quantizers: INT8 per channel, INT4 per group (DESIGN rule 10).

* INT8, ``int8_quantize(x, dim=-1)``: PER CHANNEL = one scale per slice along ``dim`` (amax over
  ``dim``): x (M, K) with dim=-1 has one scale per row, the LLM.int8()/SmoothQuant per-token or
  per-output-channel scaling along the GEMM's reduction dim. Codes in [-127, 127] (-128 unused:
  symmetric).
* INT4, ``int4_quantize(x, group=128, dim=-1)``: one scale per group of ``group`` consecutive
  elements along ``dim`` (GPTQ/AWQ's group size 128); codes in [-7, 7]. The size along ``dim``
  must be a multiple of ``group`` (UsageError otherwise).

Common rules: amax = max |x| over the group (float64; exact for every float input);
scale = fp32(amax / qmax) (one rounding); amax == 0 gives scale 1 (zeros stay zeros). A positive
amax so small that amax / qmax underflows fp32 to 0 gets the smallest fp32 subnormal instead
(never a division by zero). Non-finite amax -> scale NaN -> the group is NaN.
codes = clamp(round_half_to_even(fp32(x / scale)), -qmax, qmax): the quotient is an fp32
division, as the kernels compute it (torch.round(x.float() / scale)); FP8's fp32 product shows
why the fp32 step must be fixed (numcheck/quant/fp8.py). An exact .5 stays .5 and goes to the
even integer. Dequantized = fp32(codes * scale), cast (RNE) to x's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import formats
from ..errors import UsageError
from .fp8 import _norm_dim, to64, to_dtype

INT8_QMAX = 127  # DESIGN rule 10: INT8 [-127, 127]
INT4_QMAX = 7  # DESIGN rule 10: INT4 [-7, 7]
INT4_GROUP = 128  # GPTQ/AWQ default group size
_FP32_TINY = formats.get("fp32").min_subnormal  # floor for a positive scale (no x / 0)


@dataclass(frozen=True)
class IntQuantized:
    """codes: int8 tensor (x's shape) in [-qmax, qmax]; scale: fp32 decode scale per channel or
    group, shape = x's with ``dim`` of size (number of groups along dim); x = codes * scale."""

    codes: torch.Tensor
    scale: torch.Tensor
    qmax: int
    group: int | None  # None: per channel (the whole slice along dim)
    dim: int
    dtype: torch.dtype


def _scale(amax: torch.Tensor, qmax: int) -> torch.Tensor:
    s = formats.round_to(amax / qmax, "fp32")
    s = torch.where((amax > 0) & (s == 0), _FP32_TINY, s)
    s = torch.where(amax == 0, 1.0, s)
    return torch.where(torch.isfinite(amax), s, float("nan"))


def _quantize(x, qmax: int, group: int | None, dim: int) -> IntQuantized:
    x64 = to64(x)
    d = _norm_dim(x64, dim)
    t = x64.movedim(d, -1)
    n = t.shape[-1]
    g = n if group is None else group
    if group is not None and (group < 1 or n % group):
        raise UsageError(f"group={group}: x has {n} elements along dim={dim} (shape "
                         f"{tuple(x64.shape)}), not a multiple of group; pad x along dim to a "
                         f"multiple of {group} or pass a group that divides {n}")
    if n == 0:
        g = 1
    tb = t.reshape(*t.shape[:-1], n // g if g else 0, g)
    amax = tb.abs().amax(-1, keepdim=True) if tb.numel() else torch.zeros(
        (*tb.shape[:-1], 1), dtype=torch.float64)
    s = _scale(amax, qmax)
    # fp32 division (float64 quotient rounded once to fp32 = correctly rounded fp32 division),
    # then torch.round: half to even on exact float64 values.
    codes = torch.round(formats.round_to(tb / s, "fp32", saturate=False)).clamp(-qmax, qmax)
    nan = torch.isnan(codes)
    codes_i = torch.where(nan, 0.0, codes).to(torch.int8).reshape(t.shape).movedim(-1, d)
    scale = s.squeeze(-1).movedim(-1, d).float()
    return IntQuantized(codes_i, scale, qmax, group, d,
                        x.dtype if isinstance(x, torch.Tensor) else torch.float64)


def int_dequantize(q: IntQuantized, dtype: torch.dtype | None = None) -> torch.Tensor:
    """codes * scale (exact in float64), rounded once to dtype (default: x's dtype)."""
    n = q.codes.shape[q.dim]
    g = n if q.group is None else q.group
    s = q.scale.double().repeat_interleave(max(g, 1), dim=q.dim) if n else \
        torch.zeros(q.codes.shape, dtype=torch.float64)
    return to_dtype(formats.round_to(q.codes.double() * s, "fp32", saturate=False),
                    dtype or q.dtype)


def int8_quantize(x, dim=-1) -> IntQuantized:
    """Symmetric INT8, one scale per slice along ``dim`` (per channel); module doc."""
    return _quantize(x, INT8_QMAX, None, dim)


def int4_quantize(x, group=INT4_GROUP, dim=-1) -> IntQuantized:
    """Symmetric INT4, one scale per ``group`` elements along ``dim``; module doc."""
    return _quantize(x, INT4_QMAX, int(group), dim)


def int8_dequantize(q: IntQuantized, dtype=None) -> torch.Tensor:
    return int_dequantize(q, dtype)


def int4_dequantize(q: IntQuantized, dtype=None) -> torch.Tensor:
    return int_dequantize(q, dtype)


def int8_qdq(x, dim=-1) -> torch.Tensor:
    """Fake quant INT8 per channel (amax over ``dim``), result in x's dtype."""
    return int_dequantize(int8_quantize(x, dim))


def int4_qdq(x, group=INT4_GROUP, dim=-1) -> torch.Tensor:
    """Fake quant INT4 per group of ``group`` along ``dim``, result in x's dtype."""
    return int_dequantize(int4_quantize(x, group, dim))


# ---- op registration ------------------------------------------------------------------------

def int8_qdq_reference(x, dim=-1):
    """FP64 reference: the fp32 dequantized value (float64) before the cast to x's dtype."""
    return int_dequantize(int8_quantize(x, dim), torch.float64)


def int4_qdq_reference(x, group=INT4_GROUP, dim=-1):
    return int_dequantize(int4_quantize(x, group, dim), torch.float64)


def torch_int_qdq(x, qmax: int, group: int | None, dim: int) -> torch.Tensor:
    """Third-party kernel: torch ops in fp32, torch.round (half to even)."""
    xf = x.float().transpose(dim, -1)
    n = xf.shape[-1]
    g = n if group is None else group
    xb = xf.unflatten(-1, (n // g, g))
    amax = xb.abs().amax(-1, keepdim=True)
    s = amax / qmax
    s = torch.where(amax == 0, torch.ones_like(s), s)
    s = torch.where((amax > 0) & (s == 0), torch.full_like(s, _FP32_TINY), s)
    q = torch.round(xb / s).clamp(-qmax, qmax)
    return (q * s).flatten(-2).transpose(dim, -1).to(x.dtype)


def torch_int8_qdq(x, dim=-1):
    return torch_int_qdq(x, INT8_QMAX, None, dim)


def torch_int4_qdq(x, group=INT4_GROUP, dim=-1):
    return torch_int_qdq(x, INT4_QMAX, group, dim)


_SHAPES8 = [(4, 256), (3, 130, 257), (1, 4096), (256, 384)]
_SHAPES4 = [(4, 256), (3, 128, 384), (1, 4096), (256, 384)]  # every dim a multiple of 128 ...
_DISTS = ["normal", "outlier_channels", "zero_blocks", "wide_range", "subnormal",
          "near_overflow"]


def _inputs(case):
    from .. import inputs
    x = inputs.draw(case.dist, case.shape, seed=case.seed, fmt=case.dtype,
                    stream=f"{case.id}/x")
    kw = {"dim": case.param("dim", -1)}
    if case.op == "int4_qdq":
        kw["group"] = case.param("group", INT4_GROUP)
    return {"x": (x, formats.get(case.dtype).torch)}, kw


def _int4_ok(row) -> bool:
    """... except the leading dim of (3, 128, 384) along dim=0: dropped (UsageError by design)."""
    return row["shape"][row["dim"]] % row.get("group", INT4_GROUP) == 0


def _register() -> None:
    from ..cases import make_grid
    from ..ops import OPS, Kernel, OpSpec, register_kernel, register_op
    from ..policy import Policy
    if "int8_qdq" in OPS:
        return
    # Exact (DESIGN rules 5, 10): the fp32 dequantized value cast once to x's dtype is the
    # answer; a correct quantizer matches it bit for bit (max ULP 0).
    policy = Policy(max_ulp=0, notes="exact: integer fake-quant, reference rounded to x's dtype")
    register_op(OpSpec(
        "int8_qdq", _inputs, int8_qdq_reference, int8_qdq,
        make_grid("int8_qdq", {"dtype": ["bf16", "fp32"], "shape": _SHAPES8, "dist": _DISTS,
                               "dim": [-1, 0]},
                  extra_full={"dtype": ["fp16"], "dist": ["student_t", "sparse"]}),
        policy, doc="int8_qdq(x, dim=-1): symmetric INT8 [-127, 127], one fp32 scale amax/127 "
                    "per slice along dim; bit-exact (max ULP 0)"))
    register_op(OpSpec(
        "int4_qdq", _inputs, int4_qdq_reference, int4_qdq,
        make_grid("int4_qdq", {"dtype": ["bf16", "fp32"], "shape": _SHAPES4, "dist": _DISTS,
                               "dim": [-1, 0]},
                  extra_full={"dtype": ["fp16"], "dist": ["student_t", "sparse"]},
                  keep=_int4_ok),
        policy, doc="int4_qdq(x, group=128, dim=-1): symmetric INT4 [-7, 7], one fp32 scale "
                    "amax/7 per group of 128 along dim; bit-exact (max ULP 0)"))
    register_kernel(Kernel("int8_qdq", "torch", torch_int8_qdq, forward_only=True))
    register_kernel(Kernel("int4_qdq", "torch", torch_int4_qdq, forward_only=True))


_register()
