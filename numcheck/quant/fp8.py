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

from .. import formats
from ..errors import UsageError

FP8_FORMATS = ("e4m3", "e5m2")
GRANULARITIES = ("tensor", "row", "block128", "block128x128")
BLOCK = 128  # DeepSeek-V3 fine-grained FP8: 1x128 activation tiles, 128x128 weight blocks
_FP32_MAX = formats.get("fp32").max  # the scale is an fp32 number (DESIGN rule 10: clamp)


def _fmt(fmt) -> formats.Format:
    f = formats.get(fmt)
    if f.name not in FP8_FORMATS:
        raise UsageError(f"fmt={fmt!r}: FP8 quantization takes 'e4m3' or 'e5m2'")
    return f


def _check_gran(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise UsageError(f"granularity={granularity!r}: use one of {', '.join(GRANULARITIES)}")


def _norm_dim(x: torch.Tensor, dim: int) -> int:
    if x.dim() == 0:
        raise UsageError("x is a scalar: quantize a tensor with at least one dimension")
    if not -x.dim() <= dim < x.dim():
        raise UsageError(f"dim={dim} is out of range for x of shape {tuple(x.shape)}")
    return dim % x.dim()


def to64(x) -> torch.Tensor:
    """x's values as float64 (exact for every float dtype)."""
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x, dtype=torch.float64)
    if not x.is_floating_point():
        raise UsageError(f"x has dtype {x.dtype}; quantizers take floating-point tensors")
    return x.detach().to(torch.float64)


def to_dtype(v64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 values rounded ONCE (numcheck's RNE) to dtype; float64 stays as it is."""
    if dtype == torch.float64:
        return v64
    return formats.round_to(v64, dtype, saturate=False).to(dtype)


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
    e = (s.view(torch.int64) >> 52) - 1023
    p = ((e + 1023) << 52).view(torch.float64)
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
    f = _fmt(fmt)
    _check_gran(granularity)
    if rounding not in ("rne", "sr"):
        raise UsageError(f"rounding={rounding!r}: FP8 quantizers round 'rne' or 'sr'")
    x64 = to64(x)
    d = _norm_dim(x64, dim)
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
        self.fmt = _fmt(fmt).name
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


# ---- op registration ------------------------------------------------------------------------

def fp8_qdq_reference(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """The op's FP64 reference: the fp32 dequantized value (float64 tensor) before the final
    cast to x's dtype (the ULP gate rounds it once, RNE, which is that cast)."""
    q = fp8_quantize(x, fmt, granularity, dim, pow2_scale)
    return dequant_fp32(q.codes, expand(q.scale.double(), q.codes.shape, q.granularity, q.dim))


def fp8_qdq_baseline(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """A quantizer's baseline is the exact answer in the output dtype: the reference, rounded."""
    return fp8_qdq(x, fmt, granularity, dim, pow2_scale)


def _torch_amax(xf: torch.Tensor, granularity: str, dim: int) -> torch.Tensor:
    """Group amax with plain torch ops in fp32, expanded to x's shape (written apart from
    group_amax/expand on purpose: the kernel must not share the reference's code)."""
    a = xf.abs()
    if granularity == "tensor":
        return a.amax().expand(a.shape)
    if granularity == "row":
        return a.amax(dim=dim, keepdim=True).expand(a.shape)
    if granularity == "block128":
        t = a.transpose(dim, -1)
        n = t.shape[-1]
        pad = (-n) % BLOCK
        t = torch.cat([t, t.new_zeros(*t.shape[:-1], pad)], -1)
        m = t.unflatten(-1, (-1, BLOCK)).amax(-1, keepdim=True).expand(*t.shape[:-1], -1, BLOCK)
        return m.flatten(-2)[..., :n].transpose(dim, -1)
    r, c = a.shape[-2:]
    pr, pc = (-r) % BLOCK, (-c) % BLOCK
    t = torch.nn.functional.pad(a, (0, pc, 0, pr))
    t = t.unflatten(-1, (-1, BLOCK)).unflatten(-3, (-1, BLOCK))  # (..., R/128, 128, C/128, 128)
    m = t.amax(dim=(-3, -1), keepdim=True).expand(t.shape)
    return m.flatten(-2).flatten(-3, -2)[..., :r, :c]


def torch_fp8_scale(amax: torch.Tensor, fmt: str, pow2_scale: bool) -> torch.Tensor:
    """fp32 max/amax with torch ops: 0 -> 1, clamped to fp32 max, pow2 rounded down (frexp)."""
    fmax = torch.finfo(_TORCH_FP8[fmt]).max
    # torch.full_like(...) / amax, not fmax / amax: a Python number over a tensor is computed as
    # amax.reciprocal() * fmax in torch (Tensor.__rtruediv__), two roundings, 1 fp32 ulp off.
    s = (torch.full_like(amax, fmax) / amax).clamp(max=torch.finfo(torch.float32).max)
    s = torch.where(amax == 0, torch.ones_like(s), s)
    if pow2_scale:
        m, e = torch.frexp(s)  # s = m 2^e, m in [0.5, 1)
        s = torch.where(torch.isfinite(s), torch.ldexp(torch.ones_like(s), e - 1), s)
    return s


_TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def torch_fp8_qdq(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """Third-party kernel: fp32 amax and scale with torch ops, x * scale in fp32, torch's float8
    cast (RNE; clamped first, as e5m2's cast does not saturate), dequantized codes / scale in fp32,
    cast to x's dtype."""
    dt = _TORCH_FP8[fmt]
    fmax = torch.finfo(dt).max
    xf = x.float()
    d = dim % x.dim()
    s = torch_fp8_scale(_torch_amax(xf, granularity, d), fmt, pow2_scale)
    codes = (xf * s).clamp(-fmax, fmax).to(dt)
    return (codes.float() / s).to(x.dtype)


_SHAPES = [(4, 256), (3, 130, 257), (1, 4096), (256, 384)]  # ragged blocks, tiles, a long row
_DISTS = ["normal", "outlier_channels", "zero_blocks", "wide_range", "subnormal",
          "near_overflow"]


def _inputs(case):
    from .. import inputs
    x = inputs.draw(case.dist, case.shape, seed=case.seed, fmt=case.dtype,
                    stream=f"{case.id}/x")
    kw = {"fmt": case.param("fmt", "e4m3"), "granularity": case.param("granularity", "tensor"),
          "dim": case.param("dim", -1), "pow2_scale": case.param("pow2_scale", False)}
    return {"x": (x, formats.get(case.dtype).torch)}, kw


def _blocks(case, shape):
    """DESIGN rule 6: blocks follow the scaling group (rows / 128 blocks / 128x128 tiles)."""
    g = case.param("granularity", "tensor")
    if len(shape) < 2 or g == "tensor":
        return None
    if g == "block128x128":
        return (min(shape[-2], BLOCK), min(shape[-1], BLOCK))
    if case.param("dim", -1) in (-1, len(shape) - 1):
        return shape[-1] if g == "row" else min(BLOCK, shape[-1])
    return None


def _register() -> None:
    from ..cases import make_grid
    from ..ops import OPS, Kernel, OpSpec, register_kernel, register_op
    from ..policy import Policy
    if "fp8_qdq" in OPS:
        return
    # Exact (DESIGN rules 5, 10): the reference rounded once to x's dtype is the answer; a
    # correct quantizer matches it bit for bit (max ULP 0). A wrong scale or a truncating cast
    # moves many elements by >= 1 ULP.
    policy = Policy(max_ulp=0, notes="exact: FP8 fake-quant, reference rounded to x's dtype")
    register_op(OpSpec(
        "fp8_qdq", _inputs, fp8_qdq_reference, fp8_qdq_baseline,
        make_grid("fp8_qdq", {"dtype": ["bf16", "fp32"], "shape": _SHAPES, "dist": _DISTS,
                              "fmt": list(FP8_FORMATS), "granularity": list(GRANULARITIES),
                              "dim": [-1, 0], "pow2_scale": [False, True]},
                  extra_full={"dtype": ["fp16"], "dist": ["student_t", "lognormal", "sparse",
                                                          "large_mean"]}),
        policy, blocks=_blocks,
        doc="fp8_qdq(x, fmt='e4m3'|'e5m2', granularity='tensor'|'row'|'block128'|"
            "'block128x128', dim=-1, pow2_scale=False): FP8 current-scaling fake-quant; result "
            "in x's dtype, bit-exact (max ULP 0)"))
    register_kernel(Kernel("fp8_qdq", "torch", torch_fp8_qdq, forward_only=True))


_register()
