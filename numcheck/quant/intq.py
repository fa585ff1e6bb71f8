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

from numcheck import formats
from numcheck.errors import UsageError
from numcheck.quant.base import QuantFormat, norm_dim, to64, to_dtype

INT8_QMAX = 127  # DESIGN rule 10: INT8 [-127, 127]
INT4_QMAX = 7  # DESIGN rule 10: INT4 [-7, 7]
INT4_GROUP = 128  # GPTQ/AWQ default group size
FP32_TINY = formats.get("fp32").min_subnormal  # floor for a positive scale (no x / 0)


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
    s = torch.where((amax > 0) & (s == 0), FP32_TINY, s)
    s = torch.where(amax == 0, 1.0, s)
    return torch.where(torch.isfinite(amax), s, float("nan"))


def _quantize(x, qmax: int, group: int | None, dim: int) -> IntQuantized:
    x64 = to64(x)
    d = norm_dim(x64, dim)
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


@dataclass(frozen=True)
class IntFormat(QuantFormat):
    """Symmetric INT8/INT4 as a QuantFormat (module doc): codes in [-qmax, qmax], one fp32 scale
    per slice along ``dim`` (``group`` None: per channel) or per ``group`` elements along it.
    RNE only (no stochastic rounding here)."""

    bits: int = 8
    group: int | None = None
    scale_fmt = "fp32"
    roundings = ("rne",)

    def __post_init__(self):
        if self.bits not in (8, 4):
            raise UsageError(f"IntFormat bits={self.bits}: use 8 (INT8) or 4 (INT4)")

    @property
    def qmax(self) -> int:
        return INT8_QMAX if self.bits == 8 else INT4_QMAX

    @property
    def name(self) -> str:
        return f"int{self.bits}"

    @property
    def elem(self) -> str:
        return self.name

    @property
    def block(self) -> int | None:
        return self.group

    @property
    def unit_roundoff(self) -> float:
        """Half a step relative to the largest code."""
        return 0.5 / self.qmax

    def encode(self, x, dim=-1) -> IntQuantized:
        return _quantize(x, self.qmax, None if self.group is None else int(self.group), dim)

    def decode(self, q: IntQuantized) -> torch.Tensor:
        return int_dequantize(q, torch.float64)

    def qdq(self, x, dim=-1, rounding="rne", generator=None) -> torch.Tensor:
        if rounding != "rne":
            raise UsageError(f"rounding={rounding!r}: integer quantizers round 'rne' only")
        return int_dequantize(self.encode(x, dim))

    def saturation(self, x64, dim=-1) -> torch.Tensor:
        q = self.encode(x64, dim)
        g = x64.shape[q.dim] if self.group is None else self.group
        s = q.scale.double().repeat_interleave(g, dim=q.dim)
        return x64.abs() > (q.qmax + 0.5) * s


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


# ---- the ops' references (int8_qdq/int4_qdq are declared in numcheck/ops/quant.py) ----------

def int8_qdq_reference(x, dim=-1):
    """FP64 reference: the fp32 dequantized value (float64) before the cast to x's dtype."""
    return int_dequantize(int8_quantize(x, dim), torch.float64)


def int4_qdq_reference(x, group=INT4_GROUP, dim=-1):
    return int_dequantize(int4_quantize(x, group, dim), torch.float64)
