"""NVFP4 reference quantizer: ``nvfp4_quantize``, ``nvfp4_dequantize``, ``nvfp4_qdq``.

NVFP4 (NVIDIA's FP4 format for Blackwell; the NVFP4 description in the CUDA/PTX and Transformer
Engine documentation) is two-level scaled e2m1: blocks of 16 elements along ``dim``, each with an
e4m3 block scale, and one fp32 per-tensor scale. DESIGN rule 10 fixes the arithmetic (its
stored decode scale amax / 2688 is read as "the inverse of the encode scale": past the encode
clamp that is 1 / S_enc, see "Tiny amax"); why each step is what it is:

* Per-tensor: amax = max |x| over the tensor. The encode scale is
  S_enc = fp32(448 * 6 / amax) (448 = e4m3 max, 6 = e2m1 max: the block scales then use e4m3's
  whole range). What is *stored* is the decode scale ``tensor_scale`` = fp32(amax / (448 * 6))
  (rule 10; fp32(1 / S_enc) where S_enc clamps, below). amax = 0 (all-zero tensor) gives
  S_enc = tensor_scale = 1 (Transformer Engine's convention), so the result is zeros, never
  0/0 = NaN. S_enc is clamped to fp32's max (a tensor so small that 2688/amax overflows fp32;
  rule 10's "scale clamped to the fp32 max").
* **Tiny amax**: where S_enc is clamped (amax < 2688 / fp32 max ~ 2^-116.6), the stored decode
  scale is fp32(1 / S_enc) = 2^-128, not amax / 2688. The decode must invert the encode that was
  used (NVIDIA's NVFP4 description: S_dec = 1 / S_enc); amax / 2688 is that inverse only while
  S_enc is not clamped, and past the clamp it leaves x / (block_scale * tensor_scale) up to
  2688 / (amax * fp32 max) too large: large elements saturate and SQNR falls from ~20 dB to
  6 dB at 2^-118, 1.5 dB at 2^-120 (docs/quant-findings.md, "NVFP4 at a tiny global amax").
  With 1 / S_enc it stays ~20 dB down to amax ~2^-131 (the largest block scale,
  amax * fp32 max / 6, is still an e4m3 normal >= 2^-6) and every block flushes only below
  amax = 6 * 2^-10 / fp32 max ~ 2^-135.4. Unclamped amax keeps amax / 2688 bit for bit.
* Block scale: block_scale = e4m3_rne_saturating(block_amax / 6 * S_enc), rounded once from the
  exact value (float64 holds block_amax * S_enc exactly, and its quotient by 6 cannot fall on an
  e4m3 rounding boundary, so the float64 quotient rounds like the exact one). A kernel that
  computes block_amax / 6 * S_enc in fp32 first rounds twice and can differ by one e4m3 step in
  rare near-midpoint blocks.
* **Flush**: a block whose scale is below half of e4m3's smallest subnormal (2^-10) rounds to an
  e4m3 zero. Such a block dequantizes to 0: its codes are 0 (not x / 0). This happens to blocks
  more than ~2^17.6 (e4m3's range, 448 / 2^-10) below the tensor's amax, e.g. one block 1e6x
  larger than the rest flushes all the others (tests/test_quant_nvfp4.py pins it).
* Elements: x / (block_scale * tensor_scale) rounded RNE to e2m1, saturating at +-6
  (block_scale * tensor_scale is exact in float64; the quotient rounds like the exact one).
* Dequantize: codes * block_scale * tensor_scale, exact in float64 in either association.
* NaN anywhere in the tensor makes amax NaN; the whole tensor dequantizes to NaN (no scale has a
  NaN code that would confine it: e4m3's NaN is the block scale's, and amax poisons S_enc). Inf
  likewise gives NaN everywhere (2688 / inf = 0 encode scale, inf decode scale).

``two_d=True`` (weights): 16 x 16 tiles over the last two dims, one e4m3 scale per tile, so that a
transposed weight reuses the same quantization (NVIDIA's 2-D block scaling for weights).

Fake-quant (``nvfp4_qdq``) rounds the float64 result to x's dtype once (RNE; it is *not* always
exact there: code * block_scale * tensor_scale carries up to 2 + 4 + 24 significant bits).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from numcheck import formats
from numcheck.errors import UsageError
from numcheck.quant.base import QuantFormat, need_generator, to64, to_dtype

NVFP4_BLOCK = 16  # NVFP4: 16 e2m1 elements share one e4m3 scale (NVIDIA NVFP4 description)
E4M3_MAX = 448.0  # OFP8 e4m3fn max normal, 1.75 * 2^8 (OCP 8-bit FP spec table 1)
E2M1_MAX = 6.0  # e2m1 max, 1.5 * 2^2 (OCP MX v1.0 section 5.3.3)
TENSOR_RANGE = E4M3_MAX * E2M1_MAX  # 2688: amax maps to the largest block scale x element


@dataclass(frozen=True)
class NVFP4Quantized:
    """codes: e2m1 values (float64, x's shape); block_scale: e4m3 values as float64, one per
    block (x's shape with ``dim`` / 16, or both last dims / 16 for two_d); tensor_scale: the fp32
    decode scale amax / 2688, or 1 / S_enc where S_enc clamps (0-d float64 tensor holding an
    fp32 value)."""

    codes: torch.Tensor
    block_scale: torch.Tensor
    tensor_scale: torch.Tensor
    dim: int
    two_d: bool


def _check(x, dim: int, two_d: bool, who: str) -> torch.Tensor:
    x64 = formats.as_float64(x, who)
    if x64.dim() == 0:
        raise UsageError(f"{who}: x is a scalar; NVFP4 blocks run along a dimension of a tensor")
    if not -x64.dim() <= dim < x64.dim():
        raise UsageError(f"{who}: dim={dim} is out of range for a {x64.dim()}-d tensor")
    dims = [dim % x64.dim()]
    if two_d:
        if x64.dim() < 2 or dims[0] < x64.dim() - 2:
            raise UsageError(f"{who}: two_d=True tiles the last two dims with 16 x 16 tiles; "
                             f"give a tensor of at least 2 dims and dim=-1 or -2 (got dim={dim})")
        dims = [x64.dim() - 2, x64.dim() - 1]
    for d in dims:
        n = x64.shape[d]
        if n % NVFP4_BLOCK:
            raise UsageError(f"{who}: x.shape[{d}] = {n} is not a multiple of {NVFP4_BLOCK} "
                             f"(the NVFP4 block); pad that dimension to "
                             f"{-(-n // NVFP4_BLOCK) * NVFP4_BLOCK} (with zeros) first")
    return x64


def _fp32(v: torch.Tensor) -> torch.Tensor:
    return formats.round_to(v, "fp32", "rne", saturate=False)


def tensor_scales(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(encode, decode) per-tensor scales in fp32 (as float64) from the tensor's amax (DESIGN
    rule 10): 2688 / amax and amax / 2688; both 1 for amax = 0; encode clamped to fp32's max,
    and then decode = fp32(1 / clamped encode) (module doc, "Tiny amax")."""
    zero = amax == 0
    safe = torch.where(zero, 1.0, amax)
    enc = _fp32(TENSOR_RANGE / safe)
    # fp32(2688 / amax) overflows (inf) below amax = 2688 / fp32 max ~ 2^-116.6: rule 10's clamp
    clamped = enc > formats.get("fp32").max
    enc = enc.clamp(max=formats.get("fp32").max)
    # the decode inverts the encode actually used: past the clamp fp32(1 / fp32 max) = 2^-128
    # (an fp32 subnormal), elsewhere amax / 2688 (rule 10, unchanged)
    dec = torch.where(clamped, _fp32(1.0 / enc), _fp32(safe / TENSOR_RANGE))
    return torch.where(zero, 1.0, enc), torch.where(zero, 1.0, dec)


def _tiles(x64: torch.Tensor, dim: int, two_d: bool):
    """(blocks view (..., nb, 16) or (..., R/16, C/16, 256), undo function)."""
    if two_d:
        *lead, r, c = x64.shape
        t = x64.reshape(*lead, r // 16, 16, c // 16, 16).transpose(-3, -2)
        t = t.reshape(*lead, r // 16, c // 16, 256)

        def undo(v):
            return v.reshape(*lead, r // 16, c // 16, 16, 16).transpose(-3, -2).reshape(
                x64.shape)

        def expand(s):  # one value per tile -> x's shape
            return s.repeat_interleave(16, dim=-2).repeat_interleave(16, dim=-1)
        return t, undo, expand
    moved = torch.movedim(x64, dim, -1)
    shape = moved.shape
    t = moved.reshape(*shape[:-1], shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)

    def undo(v):
        return torch.movedim(v.reshape(shape), -1, dim)

    def expand(s):
        return torch.repeat_interleave(s, NVFP4_BLOCK, dim=dim)
    return t, undo, expand


def nvfp4_quantize(x, dim: int = -1, two_d: bool = False) -> NVFP4Quantized:
    """Quantize x to NVFP4 (see the module docstring for every rule and why)."""
    x64 = _check(x, dim, two_d, "nvfp4_quantize")
    dim = dim % x64.dim()
    amax = x64.abs().amax() if x64.numel() else torch.zeros((), dtype=torch.float64)
    if x64.numel() and bool(torch.isnan(x64).any()):
        amax = torch.tensor(float("nan"), dtype=torch.float64)
    enc, dec = tensor_scales(amax)
    t, undo, _ = _tiles(x64, dim, two_d)
    bamax = t.abs().amax(dim=-1)
    # DESIGN rule 10: block decode scale = block_amax / 6 * S_enc, rounded RNE (saturating) to
    # e4m3; underflow below 2^-10 rounds to 0 (the flush).
    bs = formats.round_to(bamax * enc / E2M1_MAX, "e4m3", "rne", saturate=True)
    denom = (bs * dec)[..., None]  # exact: 4 + 24 significant bits
    flushed = denom == 0
    codes = formats.round_to(t / torch.where(flushed, 1.0, denom), "e2m1", "rne", saturate=True)
    codes = torch.where(flushed & ~torch.isnan(t), torch.copysign(torch.zeros_like(t), t), codes)
    codes = torch.where(torch.isnan(dec), float("nan"), codes)
    if not two_d:
        bs = torch.movedim(bs, -1, dim)  # block axis back where ``dim`` was
    return NVFP4Quantized(undo(codes), bs, dec, dim, two_d)


def nvfp4_dequantize(q: NVFP4Quantized) -> torch.Tensor:
    """codes * block_scale * tensor_scale in float64 (exact)."""
    _, _, expand = _tiles(q.codes, q.dim, q.two_d)
    return q.codes * expand(q.block_scale * q.tensor_scale)


def nvfp4_qdq(x, dim: int = -1, two_d: bool = False) -> torch.Tensor:
    """Fake-quant: nvfp4_dequantize(nvfp4_quantize(x)) rounded once (RNE) to x's dtype."""
    out = nvfp4_dequantize(nvfp4_quantize(x, dim, two_d))
    if not isinstance(x, torch.Tensor) or x.dtype == torch.float64:
        return out
    return to_dtype(out, x.dtype).to(x.device)


@dataclass(frozen=True)
class NVFP4Format(QuantFormat):
    """NVFP4 as a QuantFormat: e2m1 elements, an e4m3 scale per 16 along ``dim`` (or per 16 x 16
    tile of the last two dims: ``two_d``) times one fp32 tensor scale (module doc); RNE or
    stochastic element rounding (SR keeps the RNE path's scales; flushed blocks give 0)."""

    two_d: bool = False
    elem = "e2m1"
    bits = 4
    scale_fmt = "e4m3"

    @property
    def name(self) -> str:
        return "nvfp4_2d" if self.two_d else "nvfp4"

    @property
    def block(self):
        return (NVFP4_BLOCK, NVFP4_BLOCK) if self.two_d else NVFP4_BLOCK

    def encode(self, x, dim=-1) -> NVFP4Quantized:
        return nvfp4_quantize(x, dim, self.two_d)

    def decode(self, q: NVFP4Quantized) -> torch.Tensor:
        return nvfp4_dequantize(q)

    def _scales(self, q: NVFP4Quantized) -> torch.Tensor:
        """block_scale * tensor_scale per element (x's shape; 0 in flushed blocks)."""
        return _tiles(q.codes, q.dim, q.two_d)[2](q.block_scale * q.tensor_scale)

    def qdq(self, x, dim=-1, rounding="rne", generator=None) -> torch.Tensor:
        if rounding == "rne":
            return nvfp4_qdq(x, dim, self.two_d)
        need_generator(generator)
        x64 = to64(x)
        s = self._scales(self.encode(x64, dim))
        el = formats.round_to(x64 / torch.where(s == 0, 1.0, s), "e2m1", "sr", saturate=True,
                              generator=generator)
        out = torch.where(s == 0, 0.0 * x64, el * s)  # flushed blocks give 0 (NaN stays)
        return to_dtype(out, x.dtype if isinstance(x, torch.Tensor) else torch.float64)

    def saturation(self, x64, dim=-1) -> torch.Tensor:
        # Flushed blocks (scale 0) are underflow, not clipping.
        s = self._scales(self.encode(x64, dim))
        return (s > 0) & (x64.abs() > formats.get("e2m1").overflow_threshold * s)


# ---- the op's reference (the nvfp4_qdq op itself is declared in numcheck/ops/quant.py) -------

def nvfp4_qdq_reference(x, two_d=False):
    """The op's FP64 reference is x itself: NVFP4 is judged as an SQNR gap (DESIGN rule 4, "quantized
    paths are measured as an SQNR gap"), because fp32 implementations legitimately differ from
    the exact quantizer in near-midpoint elements (see its policy in numcheck/ops/quant.py)."""
    return x.clone()
