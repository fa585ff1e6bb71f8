"""OCP Microscaling (MX v1.0) reference quantizers: ``mx_quantize``, ``mx_dequantize``, ``mx_qdq``.

Written from the OCP Microscaling Formats (MX) Specification v1.0 (section 5: an MX block is k
elements P_i sharing one E8M0 scale X, value = X * P_i; section 6.3, Algorithm 1: the conversion)
and DESIGN rule 10. Element rounding is numcheck's own ``formats.round_to`` from float64 (no
library cast, so no double rounding). Everything is float64 inside; why each choice:

* **floor** (the spec's Algorithm 1): shared_exp = floor(log2(amax)) - emax_elem, amax = max |x|
  over the block. floor(log2) comes from amax's float64 exponent bits, so it is exact for every
  value, fp32/bf16 subnormals included (they are normal in float64); float64 subnormals give an
  exponent far below -127 and clamp anyway. The largest element lands in [2^emax, 2^(emax+1)),
  which can exceed max_elem (e4m3: 1.75 * 2^8): such elements saturate to +-max_elem (the spec's
  "clamping normal numbers to the max normal").
* **rceil** (NVIDIA's MXFP8 recipe, cuBLAS/Transformer Engine "RCEIL"): q = amax / max_elem as an
  fp32 quotient (correctly rounded; for fp32/bf16/fp16 amax this is exactly fp32 division, since
  float64 has >= 2*24+2 bits and double rounding of a quotient is then innocuous), and the scale
  is q rounded up to a power of two. Nothing saturates (beyond rounding the largest element to
  max_elem when q itself rounded down onto a power of two).
* The exponent is clamped to [-127, 127], E8M0's range (spec section 5.4.1; DESIGN rule 10).
  For fp32/bf16/fp16 inputs the upper clamp never acts (floor(log2 amax) <= 127, emax_elem >= 2);
  for float64 inputs beyond fp32's range it does, and elements saturate (the spec's reference
  code, microsoft/microxcaling, writes NaN there instead; numcheck follows rule 10).
* **Zero block**: amax = 0 has no exponent; the scale is the smallest, exponent -127 (code 0x00),
  and every element is 0 (never 0/0 = NaN). This is what the clamp gives naturally (microxcaling
  does the same: its log2(0) is replaced by -126, then clamped to -127).
* **NaN** anywhere in a block: scale code 0xFF (E8M0's only NaN, spec section 5.4.1) and the
  whole block dequantizes to NaN (the spec's rule for a NaN scale, paraphrased: every element of
  the block is NaN whatever its P_i). ``scale_exp`` holds 128 there (= 0xFF - 127) and ``codes`` hold NaN.
* **Inf** anywhere in a block: floor(log2(inf)) - emax_elem is beyond E8M0's range. The spec's
  Algorithm 1 does not treat special values separately; its reference implementation
  (microxcaling ``_quantize_mx``) encodes an out-of-range shared exponent of a non-finite amax
  as the NaN scale, so an Inf makes the whole block NaN (code 0xFF). torchao 0.18 does not: it
  writes a finite code and saturates the Inf (docs/quant-findings.md, MX-2). Element formats
  e2m3/e3m2/e2m1 and e4m3 have no Inf to carry it anyway.

Fake-quant (``mx_qdq``) returns x's dtype. The dequantized value code * 2^e is exactly
representable in x's dtype for bf16/fp32/fp16 inputs (an element keeps at most 4 significant bits
and, where rounding happened, is a multiple of the input's own quantum divided by 2^e), so the
result is exact; the one exception is rceil on an input within one element step of the dtype's
top binade (e.g. bf16 max 0x1.fep127 in e4m3: 255 rounds to 256, times 2^120 = 2^128), which
overflows to inf, as an fp32 dequantization in hardware does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from numcheck import formats
from numcheck.errors import UsageError
from numcheck.quant.base import QuantFormat, need_generator, to64, to_dtype

ELEMS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")  # OCP MX v1.0 section 5.3 element types
SCALE_MODES = ("floor", "rceil")
MX_BLOCK = 32  # OCP MX v1.0 section 5.1: k = 32 for every concrete MX format
E8M0_BIAS = 127  # OCP MX v1.0 section 5.4.1: E8M0 bias
E8M0_EMIN, E8M0_EMAX = -127, 127  # OCP MX v1.0 section 5.4.1: exponents 2^-127 .. 2^127
E8M0_NAN = 0xFF  # OCP MX v1.0 section 5.4.1: the only NaN encoding of E8M0
NAN_EXP = E8M0_NAN - E8M0_BIAS  # scale_exp value of a NaN block (128): code - bias, out of range


@dataclass(frozen=True)
class MXQuantized:
    """An MX-quantized tensor.

    codes: element values (float64, on elem's grid, x's shape; NaN in NaN blocks);
    scale_exp: int32 E8M0 exponents, x's shape with ``dim`` divided by ``block`` (128 = NaN);
    scale_code: uint8 E8M0 encodings (exp + 127; 0xFF = NaN).
    """

    codes: torch.Tensor
    scale_exp: torch.Tensor
    scale_code: torch.Tensor
    elem: str
    block: int
    dim: int


def _check_params(elem: str, block: int, scale_mode: str, who: str) -> None:
    if elem not in ELEMS:
        raise UsageError(f"{who}: elem={elem!r} is not an MX element type; use one of "
                         f"{', '.join(ELEMS)}")
    if scale_mode not in SCALE_MODES:
        raise UsageError(f"{who}: scale_mode={scale_mode!r}; use 'floor' (OCP MX v1.0 "
                         "Algorithm 1) or 'rceil' (amax/max_elem rounded up to a power of two)")
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise UsageError(f"{who}: block={block!r}; give a positive int (32 in OCP MX v1.0)")


def _check(x, elem: str, block: int, scale_mode: str, dim: int, who: str) -> torch.Tensor:
    _check_params(elem, block, scale_mode, who)
    x64 = formats.as_float64(x, who)
    if x64.dim() == 0:
        raise UsageError(f"{who}: x is a scalar; MX blocks run along a dimension of a tensor")
    if not -x64.dim() <= dim < x64.dim():
        raise UsageError(f"{who}: dim={dim} is out of range for a {x64.dim()}-d tensor")
    n = x64.shape[dim]
    if n % block:
        raise UsageError(f"{who}: x.shape[{dim}] = {n} is not a multiple of block={block}; "
                         f"pad that dimension to {-(-n // block) * block} (with zeros) first")
    return x64


def _shared_exp(amax: torch.Tensor, f: formats.Format, scale_mode: str) -> torch.Tensor:
    """The unclamped-then-clamped E8M0 exponent of each block (int64) from its finite amax."""
    if scale_mode == "floor":
        # OCP MX v1.0 section 6.3, Algorithm 1: floor(log2(amax)) - emax_elem.
        e = formats.floor_log2(amax) - f.emax
    else:
        # rceil: the fp32 quotient amax / max_elem (NVIDIA's MXFP8 "RCEIL" recipe), rounded up to
        # a power of two. As float64 the fp32 quotient is normal, so its bits give floor(log2);
        # a nonzero fraction moves it up one binade. q = 0 (fp32 underflow) or amax = 0: clamped.
        q = formats.round_to(amax / f.max, "fp32", "rne", saturate=False)
        q = torch.where(torch.isinf(q), formats.get("fp32").max, q)
        bits = q.view(torch.int64)
        e = formats.floor_log2(q) + ((bits & ((1 << 52) - 1)) != 0).to(torch.int64)
    return e.clamp(E8M0_EMIN, E8M0_EMAX)  # E8M0's range; DESIGN rule 10


def _blocks_view(x64: torch.Tensor, block: int, dim: int) -> tuple[torch.Tensor, torch.Size]:
    """x with ``dim`` moved last and split into (n // block, block); returns it and the moved
    shape (to undo)."""
    moved = torch.movedim(x64, dim, -1)
    shape = moved.shape
    return moved.reshape(*shape[:-1], shape[-1] // block, block), shape


def mx_quantize(x, elem: str = "e4m3", block: int = MX_BLOCK, scale_mode: str = "floor",
                dim: int = -1) -> MXQuantized:
    """Quantize x to MX blocks of ``block`` elements along ``dim`` (see the module docstring).

    x: any floating tensor (converted to float64 exactly). Raises UsageError for an unknown elem
    or scale_mode, or a ``dim`` whose size is not a multiple of ``block`` (pad it).
    """
    x64 = _check(x, elem, block, scale_mode, dim, "mx_quantize")
    f = formats.get(elem)
    dim = dim % x64.dim()
    xb, moved_shape = _blocks_view(x64, block, dim)
    finite = torch.isfinite(xb)
    bad = ~finite.all(dim=-1)  # NaN or Inf in the block -> NaN scale (see the module docstring)
    amax = torch.where(finite, xb.abs(), 0.0).amax(dim=-1)
    e = _shared_exp(amax, f, scale_mode)
    # x / 2^e: exact in float64 (a power-of-two scaling; results below 2^-1022 round to 0 in
    # every element format anyway). Elements rounded RNE, saturating at +-max_elem (Algorithm 1:
    # "clamping normal numbers to the max normal").
    v = formats.round_to(xb * formats.pow2(-e)[..., None], f, "rne", saturate=True)
    v = torch.where(bad[..., None], float("nan"), v)
    e = torch.where(bad, NAN_EXP, e)
    codes = torch.movedim(v.reshape(moved_shape), -1, dim)
    scale_exp = torch.movedim(e, -1, dim).to(torch.int32)
    scale_code = (scale_exp + E8M0_BIAS).to(torch.uint8)
    return MXQuantized(codes, scale_exp, scale_code, elem, block, dim)


def mx_dequantize(q: MXQuantized) -> torch.Tensor:
    """codes * 2^scale_exp in float64 (exact); NaN where the scale code is 0xFF."""
    e = q.scale_exp.to(torch.int64)
    nan = q.scale_code == E8M0_NAN
    s = torch.where(nan, float("nan"), formats.pow2(torch.where(nan, 0, e)))
    s = torch.repeat_interleave(s, q.block, dim=q.dim)
    return q.codes * s


def mx_qdq(x, elem: str = "e4m3", block: int = MX_BLOCK, scale_mode: str = "floor",
           dim: int = -1) -> torch.Tensor:
    """Fake-quant: mx_dequantize(mx_quantize(x, ...)) in x's dtype (float64 for non-tensors)."""
    out = mx_dequantize(mx_quantize(x, elem, block, scale_mode, dim))
    return to_dtype(out, x.dtype).to(x.device) if isinstance(x, torch.Tensor) else out


@dataclass(frozen=True)
class MXFormat(QuantFormat):
    """An MX format as a QuantFormat: ``elem`` elements in blocks of ``block`` along ``dim``,
    one E8M0 (power-of-two) scale per block (module doc); RNE or stochastic element rounding
    (SR keeps the RNE path's scales: x / 2^e rounded with ``round_to(..., "sr")``)."""

    elem: str = "e4m3"
    block: int = MX_BLOCK
    scale_mode: str = "floor"
    scale_fmt = "e8m0"

    def __post_init__(self):
        _check_params(self.elem, self.block, self.scale_mode, "MX format")

    @property
    def name(self) -> str:
        k = "" if self.block == MX_BLOCK else f"_k{self.block}"
        return f"mx_{self.elem}_{self.scale_mode}{k}"

    @property
    def bits(self) -> int:
        return formats.get(self.elem).bits

    @property
    def amax_overshoot(self) -> float:
        # floor scales put a block's amax in [2^emax, 2^(emax+1)) of the element grid
        f = formats.get(self.elem)
        return 2.0 ** (f.emax + 1) / f.max if self.scale_mode == "floor" else 1.0

    def encode(self, x, dim=-1) -> MXQuantized:
        return mx_quantize(x, self.elem, self.block, self.scale_mode, dim)

    def decode(self, q: MXQuantized) -> torch.Tensor:
        return mx_dequantize(q)

    def _scales(self, q: MXQuantized) -> torch.Tensor:
        """2^scale_exp per element (x's shape; exponents clamped into float64's normal range)."""
        e = q.scale_exp.to(torch.int64).clamp(-1022, 1023)
        return formats.pow2(e.repeat_interleave(self.block, dim=q.dim))

    def qdq(self, x, dim=-1, rounding="rne", generator=None) -> torch.Tensor:
        if rounding == "rne":
            return mx_qdq(x, self.elem, self.block, self.scale_mode, dim)
        need_generator(generator)
        x64 = to64(x)
        q = self.encode(x64, dim)
        nan = (q.scale_code == E8M0_NAN).repeat_interleave(self.block, dim=q.dim)
        s = self._scales(q)  # 2^e exactly
        el = formats.round_to(x64 / s, self.elem, "sr", saturate=True, generator=generator)
        out = torch.where(nan, float("nan"), el * s)
        return to_dtype(out, x.dtype if isinstance(x, torch.Tensor) else torch.float64)

    def saturation(self, x64, dim=-1) -> torch.Tensor:
        s = self._scales(self.encode(x64, dim))
        return x64.abs() > formats.get(self.elem).overflow_threshold * s


# ---- the op's reference (the mx_qdq op itself is declared in numcheck/ops/quant.py) ----------

def mx_qdq_reference(x, elem="e4m3", block=MX_BLOCK, scale_mode="floor"):
    """The op's FP64 reference: the float64 fake-quant result (exact, DESIGN rule 10)."""
    return mx_dequantize(mx_quantize(x, elem, block, scale_mode, -1))
