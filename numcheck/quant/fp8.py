"""FP8 reference quantizers: current scaling (tensor, row, 1x128, 128x128) and delayed scaling.

The rules (DESIGN rule 10), each pinned by tests/test_quant_fp8.py:

* amax: max |x| over the scaling group, rounded to fp32 (exact for bf16/fp16/fp32 inputs).
* encode scale: ``scale = max_fmt / amax`` computed in fp32 (the fp32-rounded quotient of two fp32
  numbers: float64 division then one rounding to fp32 is the correctly rounded fp32 division,
  as 53 >= 2*24 + 2), clamped to the fp32 max (amax tiny: 448 / 1e-45 overflows fp32).
  amax == 0 gives scale 1 (the group is all zeros and stays zeros, never NaN).
  A non-finite amax (inf or NaN in the group) gives scale NaN: the whole group becomes NaN.
* ``pow2_scale=True``: the fp32 scale rounded DOWN to a power of two (2^floor(log2 scale)), so
  x * scale never exceeds max_fmt (torchao's round_scales_to_power_of_2 does the same).
* codes: ``round_to(fp32(x * scale), fmt, "rne", saturate=True)``: the product is an fp32
  multiplication (the correctly rounded fp32 product; float64 holds it exactly first), then ONE
  rounding to fmt. This is what every FP8 kernel does (Transformer Engine, torchao: x.float() *
  scale, then the fp8 cast), and it is not a numcheck double rounding: fp32 x * scale is a step of
  the algorithm. It matters: the exact product x * scale differs from it at e4m3/e5m2 midpoints
  far more often than chance suggests, because x / amax * max is often exactly a midpoint in
  real arithmetic and only the scale's own fp32 rounding moves it off (measured on the fp8_qdq
  ``full`` grid: 1,766 of 6.1M codes differ, in 27 of 120 cases; 50 of 4,096 bf16 near-overflow
  elements with e4m3 1x128; tests/test_quant_fp8.py pins one such element).
* dequantization: ``fp32(codes / scale)`` (an fp32 division, as kernels dequantize in fp32),
  then cast (RNE) to x's dtype. For fp32 x that is one rounding; for bf16/fp16 x the two steps
  differ from one rounding of the exact quotient on some elements (measured on the fp8_qdq
  ``full`` grid: 11,839 of 6.1M elements by 1 ULP, in 20 of 120 cases), so the spec fixes the
  fp32 step. Transformer
  Engine multiplies by ``scale_inv = fp32(1/scale)`` instead; that differs by up to 1 ULP in fp32
  and is a different kernel (docs: open doubt in the quant report).

Granularity (``dim`` is the reduction dim of the GEMM the tensor feeds):

* ``tensor``: one scale for the whole tensor (shape ``()``).
* ``row``: one scale per slice along ``dim``, i.e. amax over ``dim`` (x (M, K), dim=-1: one scale
  per row; b (K, N) with dim=0: one per column). Scale shape: x's with ``dim`` of size 1.
* ``block128``: 1 x 128 blocks along ``dim`` (DeepSeek-V3 activations; dim=0 for the wgrad
  operand). A size that is not a multiple of 128 ends in a partial block (amax over what is
  there: the same as zero padding). Scale shape: x's with ``dim`` of size ceil(n/128).
* ``block128x128``: 128 x 128 tiles of the LAST TWO dims (DeepSeek-V3 weights), partial at the
  edges; ``dim`` does not matter (a tile is a tile in either orientation: qdq(x.mT) =
  qdq(x).mT). Scale shape: (..., ceil(R/128), ceil(C/128)).

``DelayedScaling`` (Transformer Engine's delayed scaling): the scale comes from an amax
history, not from the tensor being quantized; values beyond the range saturate to +-max.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from numcheck import formats
from numcheck.errors import UsageError
from numcheck.quant.base import QuantFormat, norm_dim, to64, to_dtype

FP8_FORMATS = ("e4m3", "e5m2")
GRANULARITIES = ("tensor", "row", "block128", "block128x128")
BLOCK = 128  # DeepSeek-V3 fine-grained FP8: 1x128 activation tiles, 128x128 weight blocks
_FP32_MAX = formats.get("fp32").max  # the scale is an fp32 number (DESIGN rule 10: clamp)


def check_fmt(fmt) -> formats.Format:
    """The FP8 element format named ``fmt`` (UsageError unless e4m3 or e5m2)."""
    f = formats.get(fmt)
    if f.name not in FP8_FORMATS:
        raise UsageError(f"fmt={fmt!r}: FP8 quantization takes 'e4m3' or 'e5m2'")
    return f


def check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise UsageError(f"granularity={granularity!r}: use one of {', '.join(GRANULARITIES)}")


# ---- group amax / scale expansion (shared with intq.py) ----------------------------------------

def group_amax(a: torch.Tensor, granularity: str, dim: int, block: int = BLOCK) -> torch.Tensor:
    """max over each scaling group of ``a`` (>= 0, float64; NaN propagates). Compact shape."""
    if granularity == "tensor":
        return a.amax() if a.numel() else torch.zeros((), dtype=a.dtype)
    if granularity == "row":
        return a.amax(dim=dim, keepdim=True)
    if granularity == "block128":  # 1 x block along dim
        t = a.movedim(dim, -1)
        n = t.shape[-1]
        nb = -(-n // block)
        t = torch.nn.functional.pad(t, (0, nb * block - n))  # zeros do not change an amax
        m = t.reshape(*t.shape[:-1], nb, block).amax(-1)
        return m.movedim(-1, dim)
    if a.dim() < 2:
        raise UsageError("granularity='block128x128' needs x with at least 2 dims (tiles of "
                         "the last two); use 'block128' for a vector")
    r, c = a.shape[-2:]
    br, bc = -(-r // block), -(-c // block)
    t = torch.nn.functional.pad(a, (0, bc * block - c, 0, br * block - r))
    return t.reshape(*a.shape[:-2], br, block, bc, block).amax(dim=(-3, -1))


def expand(s: torch.Tensor, shape: torch.Size, granularity: str, dim: int,
           block: int = BLOCK) -> torch.Tensor:
    """A compact per-group tensor broadcast back to x's shape."""
    if granularity in ("tensor", "row"):
        return s.expand(shape)
    if granularity == "block128":
        return s.repeat_interleave(block, dim=dim).narrow(dim, 0, shape[dim])
    t = s.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return t[..., :shape[-2], :shape[-1]]


def encode_scale(amax64: torch.Tensor, fmt_max: float, pow2_scale: bool) -> torch.Tensor:
    """DESIGN rule 10: fp32(max / fp32(amax)); amax 0 -> 1; clamped to fp32 max; non-finite
    amax -> NaN; pow2 rounds down. Returns float64 holding fp32 values."""
    amax = formats.round_to(amax64, "fp32", saturate=False)  # exact for bf16/fp16/fp32; inf stays
    # saturate=True clamps an overflowing quotient (amax < 448 / fp32 max) to the fp32 max.
    q = formats.round_to(fmt_max / torch.where(amax > 0, amax, 1.0), "fp32", saturate=True)
    s = torch.where(amax == 0, 1.0, q)
    s = torch.where(torch.isfinite(amax), s, float("nan"))
    if pow2_scale:
        s = pow2_floor(s)
    return s


def pow2_floor(s: torch.Tensor) -> torch.Tensor:
    """2^floor(log2 s) for positive finite normal float64 s, from the exponent bits (NaN stays)."""
    p = formats.pow2(formats.floor_log2(s))
    return torch.where(torch.isfinite(s) & (s > 0), p, s)


# ---- current scaling --------------------------------------------------------------------------

@dataclass(frozen=True)
class FP8Quantized:
    """codes: float64 values on fmt's grid (x's shape); scale: fp32 ENCODE scale per group
    (compact shape, see the module doc); dequantized = codes / scale."""

    codes: torch.Tensor
    scale: torch.Tensor
    fmt: str
    granularity: str
    dim: int
    dtype: torch.dtype

    @property
    def scale_inv(self) -> torch.Tensor:
        """The decode scale 1/scale rounded to fp32 (what torch._scaled_mm takes)."""
        return (1.0 / self.scale.double()).float()


def _quantize_values(x64, scale_full, f, rounding, generator):
    # x * scale is an fp32 multiplication (FP32_PRODUCT): the float64 product is exact for
    # bf16/fp16/fp32 x (<= 48 significant bits) and is rounded once to fp32, then once to fmt.
    xs = formats.round_to(x64 * scale_full, "fp32", saturate=False)
    return formats.round_to(xs, f, rounding=rounding, saturate=True, generator=generator)


def fp8_quantize(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False,
                 rounding="rne", generator=None) -> FP8Quantized:
    """FP8 current scaling (module doc). rounding "rne" (spec) or "sr" (needs generator)."""
    f = check_fmt(fmt)
    check_granularity(granularity)
    if rounding not in ("rne", "sr"):
        raise UsageError(f"rounding={rounding!r}: FP8 quantizers round 'rne' or 'sr'")
    x64 = to64(x)
    d = norm_dim(x64, dim)
    scale = encode_scale(group_amax(x64.abs(), granularity, d), f.max, pow2_scale)
    codes = _quantize_values(x64, expand(scale, x64.shape, granularity, d), f, rounding,
                             generator)
    return FP8Quantized(codes, scale.float(), f.name, granularity, d, x.dtype
                        if isinstance(x, torch.Tensor) else torch.float64)


def fp8_dequantize(q: FP8Quantized, dtype: torch.dtype | None = None) -> torch.Tensor:
    """codes / scale, rounded once to ``dtype`` (default: the quantized tensor's dtype)."""
    s = expand(q.scale.double(), q.codes.shape, q.granularity, q.dim)
    return to_dtype(dequant_fp32(q.codes, s), dtype or q.dtype)


def dequant_fp32(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32(codes / scale) as float64 (float64 division rounded once to fp32 is the correctly
    rounded fp32 division, 53 >= 2*24 + 2). NaN scale -> NaN."""
    return formats.round_to(codes / scale, "fp32", saturate=False)


def fp8_qdq(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False,
            rounding="rne", generator=None) -> torch.Tensor:
    """Fake quant: fp8_dequantize(fp8_quantize(...)) in x's dtype."""
    return fp8_dequantize(fp8_quantize(x, fmt, granularity, dim, pow2_scale, rounding,
                                       generator))


@dataclass(frozen=True)
class FP8Format(QuantFormat):
    """FP8 current scaling as a QuantFormat: e4m3/e5m2 elements, one fp32 encode scale per
    group of ``granularity`` (module doc); RNE or stochastic element rounding."""

    fmt: str = "e4m3"
    granularity: str = "tensor"
    pow2_scale: bool = False
    bits = 8
    scale_fmt = "fp32"

    def __post_init__(self):
        check_fmt(self.fmt)
        check_granularity(self.granularity)

    @property
    def elem(self) -> str:
        return check_fmt(self.fmt).name

    @property
    def name(self) -> str:
        return f"fp8_{self.elem}_{self.granularity}"

    @property
    def block(self):
        return {"block128": BLOCK, "block128x128": (BLOCK, BLOCK)}.get(self.granularity)

    def encode(self, x, dim=-1) -> FP8Quantized:
        return fp8_quantize(x, self.fmt, self.granularity, dim, self.pow2_scale)

    def decode(self, q: FP8Quantized) -> torch.Tensor:
        return fp8_dequantize(q, torch.float64)

    def qdq(self, x, dim=-1, rounding="rne", generator=None) -> torch.Tensor:
        return fp8_qdq(x, self.fmt, self.granularity, dim, self.pow2_scale, rounding, generator)

    def saturation(self, x64, dim=-1) -> torch.Tensor:
        # The scaled value is the fp32 product |x * scale| (what the element cast sees).
        q = self.encode(x64, dim)
        s = expand(q.scale, x64.shape, q.granularity, q.dim)
        return formats.round_to(x64.abs() * s, "fp32", saturate=False) > \
            formats.get(self.fmt).overflow_threshold


# ---- delayed scaling --------------------------------------------------------------------------

class DelayedScaling:
    """Transformer Engine-style delayed scaling for one tensor (tensor-wise).

    ``qdq(x)``: scale = fp32(max_fmt / amax_h) / 2^margin, where amax_h is the max of the amax
    history ("max") or its last entry ("most_recent"); amax_h == 0 gives scale 1. Elements beyond
    +-max_fmt after scaling SATURATE (they are what delayed scaling gets wrong). Then x's own
    amax (fp32) is pushed; the history keeps the last ``history_len`` entries.

    First call: the history is empty, so x's own amax is used (the first step is current
    scaling), then pushed. ``scale`` holds the last scale used, ``history`` the amaxes.
    """

    def __init__(self, fmt="e4m3", history_len=16, margin=0, algo="max"):
        self.fmt = check_fmt(fmt).name
        if int(history_len) < 1:
            raise UsageError(f"history_len={history_len}: need at least 1")
        if algo not in ("max", "most_recent"):
            raise UsageError(f"algo={algo!r}: use 'max' or 'most_recent'")
        self.history_len, self.margin, self.algo = int(history_len), margin, algo
        self._hist: deque[float] = deque(maxlen=self.history_len)
        self.scale: float | None = None

    @property
    def history(self) -> tuple[float, ...]:
        return tuple(self._hist)

    def _amax_h(self, current: float) -> float:
        if not self._hist:
            return current
        return max(self._hist) if self.algo == "max" else self._hist[-1]

    def qdq(self, x, rounding="rne", generator=None) -> torch.Tensor:
        f = formats.get(self.fmt)
        x64 = to64(x)
        cur = float(formats.round_to(x64.abs().amax() if x64.numel() else
                                     torch.zeros((), dtype=torch.float64), "fp32"))
        s = encode_scale(torch.tensor(self._amax_h(cur), dtype=torch.float64), f.max, False)
        s = float(s) * 2.0 ** -self.margin  # TE: sf = (fp8_max / amax) / 2^margin
        self.scale = s
        codes = _quantize_values(x64, torch.tensor(s, dtype=torch.float64), f, rounding,
                                 generator)
        self._hist.append(cur)
        out = dequant_fp32(codes, torch.tensor(s, dtype=torch.float64))
        return to_dtype(out, x.dtype if isinstance(x, torch.Tensor) else torch.float64)


# ---- the op's reference (the fp8_qdq op itself is declared in numcheck/ops/quant.py) ---------

def fp8_qdq_reference(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """The op's FP64 reference: the fp32 dequantized value (float64 tensor) before the final
    cast to x's dtype (the ULP gate rounds it once, RNE, which is that cast)."""
    q = fp8_quantize(x, fmt, granularity, dim, pow2_scale)
    return dequant_fp32(q.codes, expand(q.scale.double(), q.codes.shape, q.granularity, q.dim))
