"""The quantization ops: fp8_qdq, mx_qdq, nvfp4_qdq, int8_qdq, int4_qdq and scaled_matmul.

Declared as data (``OPS``, ``KERNELS``; numcheck.catalog registers them, family "quant"), so a
user's quantizer is verified like any kernel; their suite is suites/test_quant.py. The math
(quantizers, FP64 references) lives in numcheck.quant; here are what makes them ops: case grids,
input builders, stats blocks, baselines, policies, and the third-party torch kernels (torch ops
and torch's own float8 casts, written apart from the references on purpose: a kernel must not
share the reference's code).
"""
from __future__ import annotations

import dataclasses

import torch

from numcheck import formats
from numcheck.kernels import triton_interp as _triton_interp
from numcheck.cases import inputs
from numcheck.cases.grid import Case, make_grid
from numcheck.errors import UsageError
from numcheck.verdicts.policy import Policy
from numcheck.quant import fp8, intq, mx, nvfp4
from numcheck.quant.fp8 import BLOCK, FP8_FORMATS, GRANULARITIES
from numcheck.quant.intq import FP32_TINY, INT4_GROUP, INT4_QMAX, INT8_QMAX
from numcheck.quant.mx import ELEMS, MX_BLOCK, SCALE_MODES
from numcheck.quant.nvfp4 import E2M1_MAX, NVFP4_BLOCK, TENSOR_RANGE
from numcheck.quant.recipe import (RECIPES, QuantRecipe, dequantized_operands, get_recipe,
                             scaled_matmul_reference)
from numcheck.registry import Kernel, OpSpec
from numcheck.ops.matmul import matmul_scale, naive_gemm32


def _draw_x(case: Case) -> torch.Tensor:
    return inputs.draw(case.dist, case.shape, seed=case.seed, fmt=case.dtype,
                       stream=f"{case.id}/x")


# ---- fp8_qdq ----------------------------------------------------------------------------------

def fp8_qdq_baseline(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """A quantizer's baseline is the exact answer in the output dtype: the reference, rounded."""
    return fp8.fp8_qdq(x, fmt, granularity, dim, pow2_scale)


TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def torch_amax(xf: torch.Tensor, granularity: str, dim: int) -> torch.Tensor:
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
    fmax = torch.finfo(TORCH_FP8[fmt]).max
    # torch.full_like(...) / amax, not fmax / amax: a Python number over a tensor is computed as
    # amax.reciprocal() * fmax in torch (Tensor.__rtruediv__), two roundings, 1 fp32 ulp off.
    s = (torch.full_like(amax, fmax) / amax).clamp(max=torch.finfo(torch.float32).max)
    s = torch.where(amax == 0, torch.ones_like(s), s)
    if pow2_scale:
        m, e = torch.frexp(s)  # s = m 2^e, m in [0.5, 1)
        s = torch.where(torch.isfinite(s), torch.ldexp(torch.ones_like(s), e - 1), s)
    return s


def torch_fp8_qdq(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """Third-party kernel: fp32 amax and scale with torch ops, x * scale in fp32, torch's float8
    cast (RNE; clamped first, as e5m2's cast does not saturate), dequantized codes / scale in fp32,
    cast to x's dtype."""
    dt = TORCH_FP8[fmt]
    fmax = torch.finfo(dt).max
    xf = x.float()
    d = dim % x.dim()
    s = torch_fp8_scale(torch_amax(xf, granularity, d), fmt, pow2_scale)
    codes = (xf * s).clamp(-fmax, fmax).to(dt)
    return (codes.float() / s).to(x.dtype)


def _fp8_inputs(case):
    kw = {"fmt": case.param("fmt", "e4m3"), "granularity": case.param("granularity", "tensor"),
          "dim": case.param("dim", -1), "pow2_scale": case.param("pow2_scale", False)}
    return {"x": (_draw_x(case), formats.get(case.dtype).torch)}, kw


def _fp8_blocks(case, shape):
    """DESIGN rule 6: blocks follow the scaling group (rows / 128 blocks / 128x128 tiles)."""
    g = case.param("granularity", "tensor")
    if len(shape) < 2 or g == "tensor":
        return None
    if g == "block128x128":
        return (min(shape[-2], BLOCK), min(shape[-1], BLOCK))
    if case.param("dim", -1) in (-1, len(shape) - 1):
        return shape[-1] if g == "row" else min(BLOCK, shape[-1])
    return None


_FP8_SHAPES = [(4, 256), (3, 130, 257), (1, 4096), (256, 384)]  # ragged blocks, tiles, a long row
_FP8_DISTS = ["normal", "outlier_channels", "zero_blocks", "wide_range", "subnormal",
              "near_overflow"]


def _fp8_row(dtype, shape, dist, fmt, granularity, dim=-1, pow2_scale=False):
    return {"dtype": dtype, "shape": shape, "dist": dist, "fmt": fmt, "granularity": granularity,
            "dim": dim, "pow2_scale": pow2_scale}


# Fixed rows after the pairwise design (which stays as it was: no case id moves), in both sets
# (full: three seeds each); docs/grid-audit.md.
_FP8_PROBES = [
    # Row scaling on rows longer than one 128-wide tile and not a power of two (the design's
    # row cases are 384, 4096 or 3 long): a row amax over several tiles and a tail.
    _fp8_row("bf16", (8, 200), "normal", "e4m3", "row"),
    _fp8_row("fp32", (4, 390), "outlier_channels", "e5m2", "row", pow2_scale=True),
    _fp8_row("bf16", (2, 1000), "wide_range", "e4m3", "row", pow2_scale=True),
    _fp8_row("fp32", (390, 5), "near_overflow", "e4m3", "row", dim=0),  # per-column (wgrad)
    # Zero (and constant) blocks under a tiny / huge tensor amax (inputs.BLOCK_SCALE_
    # DISTRIBUTIONS): groups whose 448 / amax leaves fp32 and clamps, next to all-zero groups.
    _fp8_row("fp32", (4, 390), "blocks_tiny", "e4m3", "block128"),
    _fp8_row("bf16", (130, 257), "blocks_tiny", "e4m3", "block128x128", pow2_scale=True),
    _fp8_row("fp32", (3, 130, 257), "blocks_tiny", "e4m3", "tensor", pow2_scale=True),
    _fp8_row("bf16", (8, 200), "blocks_tiny", "e5m2", "row"),
    _fp8_row("bf16", (4, 390), "blocks_huge", "e5m2", "block128"),
    _fp8_row("fp32", (130, 257), "blocks_huge", "e4m3", "block128x128"),
    _fp8_row("bf16", (390, 5), "blocks_huge", "e4m3", "block128", dim=0, pow2_scale=True),
]

FP8_QDQ = OpSpec(
    "fp8_qdq", _fp8_inputs, fp8.fp8_qdq_reference, fp8_qdq_baseline,
    make_grid("fp8_qdq", {"dtype": ["bf16", "fp32"], "shape": _FP8_SHAPES, "dist": _FP8_DISTS,
                          "fmt": list(FP8_FORMATS), "granularity": list(GRANULARITIES),
                          "dim": [-1, 0], "pow2_scale": [False, True]},
              extra_full={"dtype": ["fp16"], "dist": ["student_t", "lognormal", "sparse",
                                                      "large_mean"]},
              probes=_FP8_PROBES),
    # Exact (DESIGN rules 5, 10): the reference rounded once to x's dtype is the answer; a
    # correct quantizer matches it bit for bit (max ULP 0). A wrong scale or a truncating cast
    # moves many elements by >= 1 ULP.
    # cond_c None: exact, max ULP 0 is the rule (no stable alternative to excuse)
    Policy(max_ulp=0, cond_c=None, notes="exact: FP8 fake-quant, reference rounded to x's dtype"),
    blocks=_fp8_blocks,
    doc="fp8_qdq(x, fmt='e4m3'|'e5m2', granularity='tensor'|'row'|'block128'|"
        "'block128x128', dim=-1, pow2_scale=False): FP8 current-scaling fake-quant; result "
        "in x's dtype, bit-exact (max ULP 0)")


# ---- mx_qdq -----------------------------------------------------------------------------------

def mx_qdq_baseline(x, elem="e4m3", block=MX_BLOCK, scale_mode="floor"):
    """A quantizer's baseline is the exact answer in the output dtype: the reference, rounded."""
    return mx.mx_qdq(x, elem, block, scale_mode, -1)


def torch_mx_qdq(x, elem="e4m3", block=MX_BLOCK, scale_mode="floor"):
    """Third-party kernel: torch ops and torch's own float8 casts (e4m3/e5m2 elements only).

    amax in fp32, exponent via torch.frexp, x / 2^e in fp32 (exact: x * 2^-e stays within fp32's
    range), clamped to +-max_elem and cast with ``Tensor.to(torch.float8_*)``, dequantized in
    fp32. NaN/Inf blocks give NaN.
    """
    fp8_dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[elem]
    fmax = torch.finfo(fp8_dt).max
    emax = {"e4m3": 8, "e5m2": 15}[elem]  # exponent of the largest normal (OFP8 spec table 1)
    xf = x.float()
    xb = xf.reshape(*xf.shape[:-1], xf.shape[-1] // block, block)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    if scale_mode == "floor":
        m, ex = torch.frexp(amax)  # amax = m 2^ex, m in [0.5, 1): floor(log2 amax) = ex - 1
        e = ex.to(torch.int32) - 1 - emax
    else:
        q = amax / fmax  # fp32 division
        m, ex = torch.frexp(q)
        e = torch.where(m == 0.5, ex - 1, ex).to(torch.int32)
        e = torch.where(q == 0, -127, e)
    e = torch.where(amax == 0, -127, e).clamp(-127, 127)
    scale = torch.ldexp(torch.ones_like(amax), e)
    scale = torch.where(torch.isfinite(amax), scale, float("nan"))
    # Two steps so that 2^127 and 2^-127 stay exact (fp32 holds both; 2^-127 is subnormal).
    el = (xb / scale).clamp(-fmax, fmax).to(fp8_dt).float()
    out = (el * scale).reshape(xf.shape)
    return out.to(x.dtype)


def _mx_elem_supported(case, device) -> str | None:
    if case.param("elem") not in ("e4m3", "e5m2"):
        return (f"torch has no conversion to {case.param('elem')} (no float6 dtype; "
                "float4_e2m1fn_x2 is packed storage without a cast)")
    return None


def _mx_inputs(case):
    kw = {"elem": case.param("elem", "e4m3"), "block": case.param("block", MX_BLOCK),
          "scale_mode": case.param("scale_mode", "floor")}
    return {"x": (_draw_x(case), formats.get(case.dtype).torch)}, kw


def _mx_blocks(case, shape):
    """DESIGN rule 6: the exact MX block, 32 consecutive elements along the last dim."""
    return case.param("block", MX_BLOCK)


_MX_SHAPES = [(4, 64), (2, 3, 96), (1, 1024), (8, 32)]
# Outliers, heavy tails, zero blocks (the 0-scale rule), subnormal and near-overflow inputs (the
# E8M0 clamp and rceil's overflow corner), wide_range (every binade).
_MX_DISTS = ["normal", "outlier_channels", "student_t", "zero_blocks", "wide_range", "subnormal",
             "near_overflow"]
# Fixed rows after the pairwise design (unchanged): zero and constant blocks under a tiny tensor
# amax (floor(log2 amax) - emax_elem below E8M0's -127: the clamp) and a huge one.
_MX_PROBES = [
    {"dtype": "fp32", "shape": (16, 256), "dist": "blocks_tiny", "elem": "e4m3",
     "scale_mode": "floor"},
    {"dtype": "bf16", "shape": (16, 256), "dist": "blocks_tiny", "elem": "e5m2",
     "scale_mode": "rceil"},
    {"dtype": "bf16", "shape": (2, 3, 96), "dist": "blocks_tiny", "elem": "e2m1",
     "scale_mode": "floor"},
    {"dtype": "bf16", "shape": (16, 256), "dist": "blocks_huge", "elem": "e4m3",
     "scale_mode": "rceil"},
    {"dtype": "fp32", "shape": (1, 1024), "dist": "blocks_huge", "elem": "e5m2",
     "scale_mode": "floor"},
]

MX_QDQ = OpSpec(
    "mx_qdq", _mx_inputs, mx.mx_qdq_reference, mx_qdq_baseline,
    make_grid("mx_qdq", {"dtype": ["bf16", "fp32"], "shape": _MX_SHAPES, "dist": _MX_DISTS,
                         "elem": list(ELEMS), "scale_mode": list(SCALE_MODES)},
              extra_full={"dist": ["lognormal", "sparse", "uniform", "large_mean"]},
              probes=_MX_PROBES),
    # Exact (DESIGN rules 5, 10): the qdq result is representable in x's dtype (numcheck.quant.mx
    # module doc), so a correct quantizer matches the reference bit for bit: max ULP 0 in x's
    # dtype. A scale one binade off or a truncating cast moves many elements by >= 1 ULP.
    Policy(max_ulp=0, cond_c=None, notes="exact: MX fake-quant is representable in x's dtype"),
    blocks=_mx_blocks,
    doc="mx_qdq(x, elem, block=32, scale_mode='floor'|'rceil'): OCP MX v1.0 fake-quant along "
        "the last dim; result in x's dtype, bit-exact (max ULP 0)")


# ---- nvfp4_qdq --------------------------------------------------------------------------------

def nvfp4_qdq_baseline(x, two_d=False):
    """The exact NVFP4 quantizer (rule 10) in the output dtype: the error a correct kernel has."""
    return nvfp4.nvfp4_qdq(x, -1, two_d)


_E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # every e2m1 magnitude (OCP MX 5.3.3)


def torch_nvfp4_qdq(x, two_d=False):
    """Third-party kernel in torch ops (fp32 math as a GPU kernel does it, Transformer Engine's
    order): S_enc = 2688 / amax, block scale = (block_amax / 6 * S_enc) cast with torch's
    float8_e4m3fn, elements x * (S_enc / block_scale) in fp32, rounded to e2m1 by a bucketize
    over the 8 magnitudes (torch has no e2m1 cast), dequantized as code * block_scale * (amax / 2688).
    That decode is TE's too (dequantize_nvfp4.cuh, the GEMM's alpha = amax_a amax_b / 2688^2),
    also where S_enc clamps, so below amax ~2^-116.6 it shrinks the result (known failure
    te-nvfp4-tiny-amax-decode)."""
    xf = x.float()
    amax = xf.abs().amax()
    enc = torch.where(amax > 0, TENSOR_RANGE / amax, torch.ones_like(amax))
    enc = enc.clamp(max=torch.finfo(torch.float32).max)
    if two_d:
        *lead, r, c = xf.shape
        t = xf.reshape(*lead, r // 16, 16, c // 16, 16).transpose(-3, -2).reshape(
            *lead, r // 16, c // 16, 256)
    else:
        t = xf.reshape(*xf.shape[:-1], xf.shape[-1] // 16, 16)
    bamax = t.abs().amax(dim=-1, keepdim=True)
    bs = (bamax / E2M1_MAX * enc).to(torch.float8_e4m3fn).float()
    recip = torch.where(bs == 0, torch.zeros_like(bs), enc / bs)
    v = (t * recip).clamp(-E2M1_MAX, E2M1_MAX)
    grid = torch.tensor(_E2M1_GRID, dtype=torch.float32, device=x.device)
    mids = (grid[1:] + grid[:-1]) / 2
    a = v.abs()
    i = torch.bucketize(a, mids)  # nearest magnitude; a tie (a == mids[i]) gives the lower
    tie = (i < len(mids)) & (a == mids[i.clamp(max=len(mids) - 1)])
    i = torch.where(tie & (i % 2 == 1), i + 1, i)  # ties to the even code (odd index = m 1)
    code = torch.copysign(grid[i], v)
    dec = torch.where(amax > 0, amax / TENSOR_RANGE, torch.ones_like(amax))
    out = code * bs * dec
    if two_d:
        out = out.reshape(*lead, r // 16, c // 16, 16, 16).transpose(-3, -2).reshape(xf.shape)
    else:
        out = out.reshape(xf.shape)
    return out.to(x.dtype)


# The ``amax`` param: normal inputs rescaled to a tensor amax of exactly 2^k, over the range
# where the per-tensor scales leave fp32's normals (issue: no case lay between 2^-89 and
# 2^-116, so a kernel flushing tiny tensors to zero passed). 2^-80..2^-112: amax / 2688 falls
# from an fp32 normal towards its subnormals (below 2^-114.6); 2^-116 / 2^-117: either side of
# amax = 2688 / fp32 max ~ 2^-116.6, where S_enc = 2688 / amax clamps; 2^-118, 2^-120: deeper
# past the clamp (blocks_tiny sits at ~2^-121, with zero blocks).
_NVFP4_AMAX = {f"amax=2^{k}": k for k in (-80, -88, -96, -104, -112, -116, -117, -118, -120)}


def _nvfp4_inputs(case):
    x = _draw_x(case)
    k = _NVFP4_AMAX.get(case.param("amax"))
    if k is not None:  # the drawn tensor rescaled so that its amax is exactly 2^k
        x = x / x.abs().amax() * 2.0 ** k
    return ({"x": (x, formats.get(case.dtype).torch)}, {"two_d": case.param("two_d", False)})


def _nvfp4_blocks(case, shape):
    """DESIGN rule 6: the exact NVFP4 block (16 along the last dim, or the 16 x 16 tile)."""
    return (NVFP4_BLOCK, NVFP4_BLOCK) if case.param("two_d", False) else NVFP4_BLOCK


_NVFP4_SHAPES = [(16, 64), (32, 32), (2, 16, 48), (16, 1024)]
_NVFP4_DISTS = ["normal", "outlier_channels", "student_t", "zero_blocks", "wide_range",
                "lognormal"]
# Fixed rows after the pairwise design (unchanged): zero and constant blocks and 16 x 16 tiles
# under a tiny tensor amax (2688 / amax beyond fp32's max: the encode scale clamps; amax / 2688 an
# fp32 subnormal) and a huge one.
_NVFP4_PROBES = [
    {"dtype": "fp32", "shape": (16, 1024), "dist": "blocks_tiny", "two_d": False, "amax": None},
    {"dtype": "bf16", "shape": (48, 64), "dist": "blocks_tiny", "two_d": True, "amax": None},
    {"dtype": "bf16", "shape": (16, 1024), "dist": "blocks_huge", "two_d": False, "amax": None},
    {"dtype": "fp32", "shape": (48, 64), "dist": "blocks_huge", "two_d": True, "amax": None},
]


def _amax_row(dtype, shape, k, two_d=False):
    return {"dtype": dtype, "shape": shape, "dist": "normal", "two_d": two_d,
            "amax": f"amax=2^{k}"}


# Both sets, cheap shapes (after the rows above: their order, and so no case id, moves): one far
# below 2^-88 (where a kernel flushing tiny tensors shows), the last unclamped and the first
# clamped amax, and the deepest.
_NVFP4_PROBES += [_amax_row("fp32", (16, 64), -104), _amax_row("bf16", (32, 32), -116, True),
                  _amax_row("fp32", (16, 64), -117), _amax_row("bf16", (16, 64), -120)]
# full: every amax of _NVFP4_AMAX in the other dtype / layout, wider shapes
_NVFP4_FULL_PROBES = [
    _amax_row("bf16", (16, 1024), -80), _amax_row("fp32", (32, 32), -88, True),
    _amax_row("bf16", (2, 16, 48), -96), _amax_row("bf16", (32, 32), -104, True),
    _amax_row("fp32", (16, 1024), -112), _amax_row("fp32", (2, 16, 48), -116),
    _amax_row("bf16", (16, 1024), -117, True), _amax_row("fp32", (16, 1024), -118),
    _amax_row("bf16", (2, 16, 48), -118, True), _amax_row("fp32", (32, 32), -120, True),
]

def _amax_param(case: Case) -> Case:
    """Cases without an amax keep the params they had (the factor exists for the probes)."""
    return dataclasses.replace(case, params=tuple(
        (k, v) for k, v in case.params if not (k == "amax" and v is None)))


NVFP4_QDQ = OpSpec(
    "nvfp4_qdq", _nvfp4_inputs, nvfp4.nvfp4_qdq_reference, nvfp4_qdq_baseline,
    make_grid("nvfp4_qdq", {"dtype": ["bf16", "fp32"], "shape": _NVFP4_SHAPES,
                            "dist": _NVFP4_DISTS, "two_d": [False, True], "amax": [None]},
              extra_full={"dist": ["sparse", "uniform", "near_overflow", "subnormal"]},
              probes=_NVFP4_PROBES, full_probes=_NVFP4_FULL_PROBES, transform=_amax_param),
    # Not bit-exact across implementations. Measured on N(0,1) bf16/fp32 64x1024 tensors: an
    # fp32 kernel evaluating rule 10 in fp32 (block_amax / 6 * S_enc rounded twice, x / (bs * dec)
    # rounded twice) differs from the exact quantizer in 0.14% of elements, Transformer Engine's
    # order (x * (S_enc / bs), decode 1 / S_enc) in 0.22%: inputs that sit exactly on an e2m1
    # midpoint in exact arithmetic go either way depending on the last bit of an fp32 scale, and
    # a rounded block scale can move one e4m3 step. Both choices at a midpoint have the same
    # error, so the op is judged against x (reference = identity) with the exact quantizer as the
    # baseline: kernel error <= 1.25 x the exact quantizer's, on the whole tensor and on the worst
    # 16-element block. A scale one binade off (saturation or a lost bit), truncation (rz's rms
    # error is 2x RNE's) or the inverse tensor scale fail it; a NaN from a zero block fails the
    # non-finite rule.
    # cond_c None, no truncation gate: perturbing x moves elements across e2m1 steps (a whole
    # quantization step, no rounding-sized allowance), and a lossy result is not one rounding
    Policy(baseline_k=1.25, cond_c=None, auto_truncation=False,
           notes="SQNR gap to the exact NVFP4 quantizer, k = 1.25"),
    blocks=_nvfp4_blocks,
    doc="nvfp4_qdq(x, two_d=False): NVFP4 fake-quant (e2m1, e4m3 scale per 16 along the last "
        "dim or per 16x16 tile, fp32 tensor scale amax/2688, 1/S_enc where S_enc clamps); "
        "result in x's dtype")


# amax below 2688 / fp32 max (~2^-116.6): fp32(2688 / amax) overflows and S_enc clamps (rule 10)
_S_ENC_CLAMPS = TENSOR_RANGE / torch.finfo(torch.float32).max


def _te_tiny_amax_decode(case: Case, device: str, output: str) -> str | None:
    """Finding (docs/quant-findings.md, "NVFP4 at a tiny global amax"): the torch kernel
    decodes with amax / 2688 where S_enc has clamped (Transformer Engine's arithmetic), so its
    result is amax * fp32 max / 2688 times too small: 12 dB at amax 2^-117, 4 dB at 2^-118,
    0.9 dB at 2^-120, against the exact quantizer's ~20 dB. Known wherever the case's amax is
    below the clamp: the amax param; subnormal inputs (amax < the smallest normal, 2^-126 in
    bf16 / fp32); blocks_tiny (amax < 2^(e_min + 6): numcheck.cases.inputs)."""
    k = _NVFP4_AMAX.get(case.param("amax"))
    tiny = formats.get(case.dtype).min_normal
    top = 2.0 ** k if k is not None else {"subnormal": tiny, "blocks_tiny": tiny * 2 ** 6}.get(
        case.dist, float("inf"))
    return "te-nvfp4-tiny-amax-decode" if top <= _S_ENC_CLAMPS else None


# ---- int8_qdq, int4_qdq -----------------------------------------------------------------------

def torch_int_qdq(x, qmax: int, group: int | None, dim: int) -> torch.Tensor:
    """Third-party kernel: torch ops in fp32, torch.round (half to even)."""
    xf = x.float().transpose(dim, -1)
    n = xf.shape[-1]
    g = n if group is None else group
    xb = xf.unflatten(-1, (n // g, g))
    amax = xb.abs().amax(-1, keepdim=True)
    s = amax / qmax
    s = torch.where(amax == 0, torch.ones_like(s), s)
    s = torch.where((amax > 0) & (s == 0), torch.full_like(s, FP32_TINY), s)
    q = torch.round(xb / s).clamp(-qmax, qmax)
    return (q * s).flatten(-2).transpose(dim, -1).to(x.dtype)


def torch_int8_qdq(x, dim=-1):
    return torch_int_qdq(x, INT8_QMAX, None, dim)


def torch_int4_qdq(x, group=INT4_GROUP, dim=-1):
    return torch_int_qdq(x, INT4_QMAX, group, dim)


def _int_inputs(case):
    kw = {"dim": case.param("dim", -1)}
    if case.op == "int4_qdq":
        kw["group"] = case.param("group", INT4_GROUP)
    return {"x": (_draw_x(case), formats.get(case.dtype).torch)}, kw


_INT8_SHAPES = [(4, 256), (3, 130, 257), (1, 4096), (256, 384)]
_INT4_SHAPES = [(4, 256), (3, 128, 384), (1, 4096), (256, 384)]  # every dim a multiple of 128 ...
_INT_DISTS = ["normal", "outlier_channels", "zero_blocks", "wide_range", "subnormal",
              "near_overflow"]


def _int4_ok(row) -> bool:
    """... except the leading dim of (3, 128, 384) along dim=0: dropped (UsageError by design)."""
    return row["shape"][row["dim"]] % row.get("group", INT4_GROUP) == 0


# Exact (DESIGN rules 5, 10): the fp32 dequantized value cast once to x's dtype is the answer; a
# correct quantizer matches it bit for bit (max ULP 0).
_INT_POLICY = Policy(max_ulp=0, cond_c=None,
                     notes="exact: integer fake-quant, reference rounded to x's dtype")

INT8_QDQ = OpSpec(
    "int8_qdq", _int_inputs, intq.int8_qdq_reference, intq.int8_qdq,
    make_grid("int8_qdq", {"dtype": ["bf16", "fp32"], "shape": _INT8_SHAPES, "dist": _INT_DISTS,
                           "dim": [-1, 0]},
              extra_full={"dtype": ["fp16"], "dist": ["student_t", "sparse"]}),
    _INT_POLICY,
    doc="int8_qdq(x, dim=-1): symmetric INT8 [-127, 127], one fp32 scale amax/127 per slice "
        "along dim; bit-exact (max ULP 0)")

INT4_QDQ = OpSpec(
    "int4_qdq", _int_inputs, intq.int4_qdq_reference, intq.int4_qdq,
    make_grid("int4_qdq", {"dtype": ["bf16", "fp32"], "shape": _INT4_SHAPES, "dist": _INT_DISTS,
                           "dim": [-1, 0]},
              extra_full={"dtype": ["fp16"], "dist": ["student_t", "sparse"]},
              keep=_int4_ok),
    _INT_POLICY,
    doc="int4_qdq(x, group=128, dim=-1): symmetric INT4 [-7, 7], one fp32 scale amax/7 per "
        "group of 128 along dim; bit-exact (max ULP 0)")


# ---- scaled_matmul ----------------------------------------------------------------------------

def scaled_matmul_baseline(a, b, recipe):
    """Naive fp32 GEMM loop over K of the fp32 dequantized operands (numcheck.ops.matmul)."""
    qa, qb = dequantized_operands(a, b, recipe)
    return naive_gemm32(qa.float(), qb.float())


def _scaled_matmul_scale(a, b, recipe):
    qa, qb = dequantized_operands(a, b, recipe)
    return matmul_scale(qa, qb)


def scaled_mm_reason(r: QuantRecipe) -> str | None:
    """Why torch._scaled_mm cannot run recipe r (None: it can)."""
    for role in ("x", "w"):
        q = getattr(r, role)
        if q is None or not isinstance(q.format, fp8.FP8Format) or q.rounding != "rne":
            return (f"recipe {r.name}: torch._scaled_mm takes FP8 (e4m3/e5m2) operands; "
                    f"{role} is {'unquantized' if q is None else q.format.name}")
        if q.format.granularity not in ("tensor", "row"):
            return (f"recipe {r.name}: torch._scaled_mm on CPU takes tensor-wise or row-wise "
                    f"scales only; {q.format.granularity} scaling (like 1x32 MX, 1x16 NVFP4) "
                    "needs CUDA (PLATFORM.md), and numcheck has no wrapper for torch's CUDA "
                    "block-scaled GEMM yet")
    if r.x.format.granularity != r.w.format.granularity:
        return f"recipe {r.name}: _scaled_mm needs both operands scaled alike"
    if r.hadamard:
        return f"recipe {r.name}: the RHT is not part of torch._scaled_mm"
    return None


def torch_scaled_mm(a, b, recipe):
    """Third-party kernel: fp32 amax/scale with torch ops, torch's float8 casts, and
    torch._scaled_mm (fp32 accumulation) with the decode scales 1/scale."""
    r = get_recipe(recipe)
    if scaled_mm_reason(r):
        raise UsageError(scaled_mm_reason(r))
    af, bf = a.float(), b.float()
    ops = []
    for t, f, d in ((af, r.x.format, -1), (bf, r.w.format, 0)):
        dt = TORCH_FP8[f.fmt]
        fmax = torch.finfo(dt).max
        amax = t.abs().amax() if f.granularity == "tensor" else t.abs().amax(d, keepdim=True)
        s = torch_fp8_scale(amax, f.fmt, f.pow2_scale)
        ops.append(((t * s).clamp(-fmax, fmax).to(dt), torch.reciprocal(s).float()))
    (a8, sa), (b8, sb) = ops
    b8 = b8.t().contiguous().t()  # _scaled_mm wants the second operand column-major
    return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.float32)


def _scaled_mm_supports(case, device):
    return scaled_mm_reason(get_recipe(case.param("recipe")))


def _scaled_matmul_inputs(case):
    m, k, n = case.shape
    dt = formats.get(case.dtype).torch
    a = inputs.draw(case.dist, (m, k), seed=case.seed, fmt=case.dtype, stream=f"{case.id}/a")
    bdist = "normal" if case.dist == "outlier_channels" else case.dist  # outliers in a only
    b = inputs.draw(bdist, (k, n), seed=case.seed, fmt=case.dtype, stream=f"{case.id}/b")
    return {"a": (a, dt), "b": (b, dt)}, {"recipe": case.param("recipe", "fp8_tensor")}


_SCALED_MM_SHAPES = [(64, 256, 48), (32, 512, 64), (16, 1024, 16)]  # (M, K, N); K % 128 == 0
_SCALED_MM_DISTS = ["normal", "outlier_channels", "student_t"]
# One rounding of the fp32 result, plus one fp32 rounding of each operand (the dequantized
# operands, or _scaled_mm's decode scales 1/scale) and a quarter-unit margin, as matmul's policy.
BOUND_C = 1.0 + 2.0 + 0.25

SCALED_MATMUL = OpSpec(
    "scaled_matmul", _scaled_matmul_inputs, scaled_matmul_reference, scaled_matmul_baseline,
    make_grid("scaled_matmul", {"dtype": ["bf16", "fp32"], "shape": _SCALED_MM_SHAPES,
                                "dist": _SCALED_MM_DISTS, "recipe": list(RECIPES)},
              extra_full={"dist": ["wide_range", "zero_blocks"]}),
    # DESIGN rule 5: GEMM is judged componentwise, |out - ref| <= c u (|A||B| + eta) with
    # gamma_K of fp32 accumulation (reduction_len = K in fp32 units), plus the baseline rule.
    # cond_c None: perturbing a and b moves their quantization, not a rounding of the GEMM
    Policy(bound_c=BOUND_C, bound_per_len=1.0, cond_c=None,
           notes="componentwise |Aq||Bq| bound of the dequantized operands"),
    blocks=lambda case, shape: (min(shape[-2], 128), min(shape[-1], 128)),
    scale=_scaled_matmul_scale, reduction_len=lambda case: float(case.shape[1]),
    out_dtypes=lambda case: (torch.float32,),
    doc="scaled_matmul(a, b, recipe): a (M, K), b (K, N) fake-quantized along K by the "
        "recipe (RHT first where it has one), fp32 accumulation, fp32 out; shape (M, K, N)")


OPS: tuple[OpSpec, ...] = (FP8_QDQ, MX_QDQ, NVFP4_QDQ, INT8_QDQ, INT4_QDQ, SCALED_MATMUL)
def _triton_fp8_qdq(x, fmt="e4m3", granularity="row", dim=-1, pow2_scale=False):
    return _triton_interp.kernels_module(x.device).fp8_qdq(x, fmt, granularity, dim, pow2_scale)


def _triton_fp8_supports(case, device):
    if case.param("granularity") != "row" or \
            case.param("dim", -1) not in (-1, len(case.shape) - 1):
        return "triton fp8_qdq scales rows along the last dim only"
    return _triton_interp.available()


def _triton_mx_qdq(x, elem="e4m3", block=32, scale_mode="floor"):
    return _triton_interp.kernels_module(x.device).mx_qdq(x, elem, block, scale_mode)


def _triton_mx_supports(case, device):
    if case.param("elem", "e4m3") not in ("e4m3", "e5m2"):
        return "triton mx_qdq is MXFP8: e4m3 and e5m2 elements"
    return _triton_interp.available()


KERNELS: tuple[Kernel, ...] = (
    Kernel("fp8_qdq", "torch", torch_fp8_qdq, forward_only=True),
    # numcheck.kernels.triton_builtin: interpreted on the CPU (docs/triton.md), compiled on CUDA
    Kernel("fp8_qdq", "triton", _triton_fp8_qdq, forward_only=True,
           supports=_triton_fp8_supports),
    Kernel("mx_qdq", "torch", torch_mx_qdq, forward_only=True, supports=_mx_elem_supported),
    Kernel("mx_qdq", "triton", _triton_mx_qdq, forward_only=True, supports=_triton_mx_supports),
    Kernel("nvfp4_qdq", "torch", torch_nvfp4_qdq, forward_only=True,
           known_failure=_te_tiny_amax_decode),
    Kernel("int8_qdq", "torch", torch_int8_qdq, forward_only=True),
    Kernel("int4_qdq", "torch", torch_int4_qdq, forward_only=True),
    Kernel("scaled_matmul", "torch_scaled_mm", torch_scaled_mm, forward_only=True,
           supports=_scaled_mm_supports),
)
