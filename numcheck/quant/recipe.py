"""Quantization recipes: which quantizer each GEMM operand gets, and the reference scaled GEMM.

A ``Quantizer`` describes one fake quantization (kind "fp8" | "mx" | "nvfp4" | "int8" | "int4"
with its format, granularity, scale mode and rounding); a ``QuantRecipe`` names one per role:
``x`` (activations), ``w`` (weights), ``grad`` (output gradients), plus an optional random
Hadamard transform (``hadamard``: block size) applied along the reduction dim to both operands of
``scaled_matmul`` before quantization. The transform is never undone explicitly: with the same
signs on both operands (A Q)(Q^T B) = A B, so it only changes what quantization loses.

``QuantRecipe.qdq(role, t, dim=-1, generator=None)`` is the one entry point the convergence
runs use: the fake-quant of ``t`` for that role along ``dim`` (the GEMM's reduction dim), in t's
dtype; identity when the role has no quantizer. It does not apply the Hadamard transform (a
training loop that wants it applies ``transforms.hadamard`` with ``recipe.hadamard`` to both
operands, as ``scaled_matmul`` does). Roles with ``rounding="sr"`` need a ``generator``.

``scaled_matmul(a, b, recipe, generator=None)``: a (..., M, K) quantized along K (dim -1),
b (K, N) along K (dim 0), RHT first where the recipe has it; the dequantized operands in fp32 are
multiplied with torch.matmul in fp32; returns fp32. ``scaled_matmul_reference`` is the float64
product of the float64 dequantized operands (explicit sums, no GEMM), the op's FP64 reference.

Recipes (``RECIPES``; sources in the comments): fp8_tensor, fp8_row, fp8_block, mxfp8,
mxfp8_rceil, mxfp6, mxfp4, nvfp4, nvfp4_rht_sr, int8.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import formats
from ..errors import UsageError
from . import fp8 as _fp8
from . import intq as _intq
from . import transforms as _tr

KINDS = ("fp8", "mx", "nvfp4", "int8", "int4")
ROLES = ("x", "w", "grad")


def _mx():
    from . import mx
    return mx


def _nvfp4():
    from . import nvfp4
    return nvfp4


@dataclass(frozen=True)
class Quantizer:
    """One fake quantization. Fields by kind:

    * fp8: ``fmt`` e4m3|e5m2, ``granularity`` tensor|row|block128|block128x128, ``pow2_scale``;
    * mx: ``fmt`` = the element (e4m3|e5m2|e2m3|e3m2|e2m1), ``block`` (32), ``scale_mode``
      floor|rceil;
    * nvfp4: ``two_d`` (16 x 16 tiles over the last two dims, for weights);
    * int8: per channel (amax over dim); int4: ``block`` = the group (128).

    ``rounding``: "rne" (the formats' spec) or "sr" (stochastic, fp8/mx/nvfp4 elements only; the
    scales are the RNE path's, only the element rounding changes).
    """

    kind: str
    fmt: str = "e4m3"
    granularity: str = "tensor"
    block: int = 32
    scale_mode: str = "floor"
    pow2_scale: bool = False
    rounding: str = "rne"
    two_d: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UsageError(f"Quantizer kind={self.kind!r}: use one of {', '.join(KINDS)}")
        if self.rounding not in ("rne", "sr"):
            raise UsageError(f"Quantizer rounding={self.rounding!r}: use 'rne' or 'sr'")
        if self.rounding == "sr" and self.kind in ("int8", "int4"):
            raise UsageError(f"Quantizer kind={self.kind!r} has no stochastic rounding here; "
                             "use rounding='rne'")
        if self.kind == "fp8":
            _fp8._fmt(self.fmt)
            _fp8._check_gran(self.granularity)

    def qdq(self, t, dim: int = -1, generator: torch.Generator | None = None) -> torch.Tensor:
        """Fake-quant of t along ``dim``, in t's dtype."""
        k = self.kind
        if k == "fp8":
            return _fp8.fp8_qdq(t, self.fmt, self.granularity, dim, self.pow2_scale,
                                self.rounding, generator)
        if k == "int8":
            return _intq.int8_qdq(t, dim)
        if k == "int4":
            return _intq.int4_qdq(t, self.block, dim)
        if self.rounding == "rne":
            if k == "mx":
                return _mx().mx_qdq(t, self.fmt, self.block, self.scale_mode, dim)
            return _nvfp4().nvfp4_qdq(t, dim, self.two_d)
        return self._sr_blocked(t, dim, generator)

    def _sr_blocked(self, t, dim, generator):
        """MX/NVFP4 with stochastic element rounding: the RNE path's scales, x / scale rounded
        with ``round_to(..., "sr")`` (saturating), times the scale (exact: power of two for MX,
        e4m3 * fp32 for NVFP4), rounded once to t's dtype."""
        if generator is None:
            raise UsageError("rounding='sr' needs generator=torch.Generator(device=t.device)"
                             ".manual_seed(n): stochastic rounding must be reproducible")
        x64 = _fp8.to64(t)
        d = dim % x64.dim() if x64.dim() else 0
        if self.kind == "mx":
            mx = _mx()
            q = mx.mx_quantize(x64, self.fmt, self.block, self.scale_mode, dim)
            nan = (q.scale_code == mx.E8M0_NAN).repeat_interleave(self.block, dim=d)
            e = q.scale_exp.to(torch.int64).clamp(-1022, 1023).repeat_interleave(self.block,
                                                                                 dim=d)
            s = ((e + 1023) << 52).view(torch.float64)  # 2^e exactly
            el = formats.round_to(x64 / s, self.fmt, "sr", saturate=True, generator=generator)
            out = torch.where(nan, float("nan"), el * s)
        else:
            q = _nvfp4().nvfp4_quantize(x64, dim, self.two_d)
            bs = q.block_scale * q.tensor_scale
            if self.two_d:
                s = bs.repeat_interleave(16, dim=-2).repeat_interleave(16, dim=-1)
            else:
                s = bs.repeat_interleave(16, dim=d)
            el = formats.round_to(x64 / torch.where(s == 0, 1.0, s), "e2m1", "sr",
                                  saturate=True, generator=generator)
            out = torch.where(s == 0, 0.0 * x64, el * s)  # flushed blocks give 0 (NaN stays)
        return _fp8.to_dtype(out, t.dtype if isinstance(t, torch.Tensor) else torch.float64)


@dataclass(frozen=True)
class QuantRecipe:
    """A training recipe: a Quantizer (or None: no quantization) per role, and an optional RHT
    block size for the GEMM operands (module doc)."""

    name: str
    x: Quantizer | None = None
    w: Quantizer | None = None
    grad: Quantizer | None = None
    hadamard: int | None = None

    def __post_init__(self):
        if self.hadamard is not None and self.hadamard not in _tr.HADAMARD_BLOCKS:
            raise UsageError(f"QuantRecipe hadamard={self.hadamard}: use None or one of "
                             f"{_tr.HADAMARD_BLOCKS}")

    def qdq(self, role: str, t: torch.Tensor, dim: int = -1,
            generator: torch.Generator | None = None) -> torch.Tensor:
        """Fake-quant ``t`` as ``role`` ("x" | "w" | "grad") along ``dim``; t's dtype.
        Identity (t itself) when the role has no quantizer."""
        if role not in ROLES:
            raise UsageError(f"role={role!r}: use one of {', '.join(ROLES)}")
        q = getattr(self, role)
        return t if q is None else q.qdq(t, dim, generator)


def _fp8q(fmt="e4m3", gran="tensor", **kw) -> Quantizer:
    return Quantizer("fp8", fmt=fmt, granularity=gran, **kw)


def _mxq(elem, mode="floor") -> Quantizer:
    return Quantizer("mx", fmt=elem, block=32, scale_mode=mode)


RECIPES: dict[str, QuantRecipe] = {r.name: r for r in [
    # Transformer Engine's FP8 "hybrid" format: e4m3 forward, e5m2 gradients, per-tensor scales.
    QuantRecipe("fp8_tensor", _fp8q(), _fp8q(), _fp8q("e5m2")),
    # torchao Float8 rowwise recipe: e4m3 everywhere, one scale per row along the reduction dim,
    # scales rounded down to powers of two (round_scales_to_power_of_2=True).
    QuantRecipe("fp8_row", _fp8q(gran="row", pow2_scale=True), _fp8q(gran="row", pow2_scale=True),
                _fp8q(gran="row", pow2_scale=True)),
    # DeepSeek-V3: e4m3, 1x128 activation/gradient tiles, 128x128 weight blocks.
    QuantRecipe("fp8_block", _fp8q(gran="block128"), _fp8q(gran="block128x128"),
                _fp8q(gran="block128")),
    # OCP MX v1.0 / torchao MX training: MXFP8 e4m3 blocks of 32, floor (spec) or rceil scales.
    QuantRecipe("mxfp8", _mxq("e4m3"), _mxq("e4m3"), _mxq("e4m3")),
    QuantRecipe("mxfp8_rceil", _mxq("e4m3", "rceil"), _mxq("e4m3", "rceil"),
                _mxq("e4m3", "rceil")),
    # MXFP6: e2m3 operands (more mantissa for forward), e3m2 gradients (more range).
    QuantRecipe("mxfp6", _mxq("e2m3"), _mxq("e2m3"), _mxq("e3m2")),
    QuantRecipe("mxfp4", _mxq("e2m1"), _mxq("e2m1"), _mxq("e2m1")),
    # NVFP4, plain: 1x16 blocks everywhere, RNE.
    QuantRecipe("nvfp4", Quantizer("nvfp4"), Quantizer("nvfp4"), Quantizer("nvfp4")),
    # NVIDIA's NVFP4 training recipe: 16x16 2-D weight scales, SR on gradients, RHT (16) on the
    # GEMM operands (here on every scaled_matmul, i.e. also the forward GEMM).
    QuantRecipe("nvfp4_rht_sr", Quantizer("nvfp4"), Quantizer("nvfp4", two_d=True),
                Quantizer("nvfp4", rounding="sr"), hadamard=16),
    # LLM.int8()-style symmetric INT8, per channel along the reduction dim; gradients unquantized.
    QuantRecipe("int8", Quantizer("int8"), Quantizer("int8"), None),
]}


def get_recipe(name) -> QuantRecipe:
    """A recipe by name (a QuantRecipe passes through); UsageError listing the names."""
    if isinstance(name, QuantRecipe):
        return name
    if name not in RECIPES:
        raise UsageError(f"unknown recipe {name!r}; use one of {', '.join(RECIPES)} or build a "
                         "QuantRecipe")
    return RECIPES[name]


# ---- the scaled GEMM --------------------------------------------------------------------------

def _check_gemm(a, b):
    if a.dim() < 2 or b.dim() != 2 or a.shape[-1] != b.shape[0]:
        raise UsageError(f"scaled_matmul: need a (..., M, K) and b (K, N); got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")


def dequantized_operands(a, b, recipe, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) after the recipe's RHT and fake quantization, float64, on a's device."""
    r = get_recipe(recipe)
    a64, b64 = _fp8.to64(a), _fp8.to64(b)
    _check_gemm(a64, b64)
    if r.hadamard:
        signs = _tr.rht_signs(r.hadamard, generator=generator)  # one draw for both operands
        a64 = _tr.hadamard(a64, r.hadamard, -1, signs=signs)
        b64 = _tr.hadamard(b64, r.hadamard, 0, signs=signs)
    return r.qdq("x", a64, -1, generator), r.qdq("w", b64, 0, generator)


def scaled_matmul(a, b, recipe, generator=None) -> torch.Tensor:
    """a (..., M, K) @ b (K, N) with both operands quantized by ``recipe`` (a name or a
    QuantRecipe) along K; the dequantized operands in fp32, torch.matmul in fp32; fp32 result."""
    qa, qb = dequantized_operands(a, b, recipe, generator)
    return torch.matmul(qa.float(), qb.float())


def scaled_matmul_reference(a, b, recipe, generator=None) -> torch.Tensor:
    """FP64 reference: the exact (float64, explicit sums) product of the float64 dequantized
    operands."""
    from ..ops.matmul import matmul_reference
    qa, qb = dequantized_operands(a, b, recipe, generator)
    return matmul_reference(qa, qb)


def scaled_matmul_baseline(a, b, recipe):
    """Naive fp32 GEMM loop over K of the fp32 dequantized operands (numcheck.ops.matmul)."""
    from ..ops.matmul import _naive_gemm32
    qa, qb = dequantized_operands(a, b, recipe)
    return _naive_gemm32(qa.float(), qb.float())


def _scale(a, b, recipe):
    from ..ops.matmul import _matmul_scale
    qa, qb = dequantized_operands(a, b, recipe)
    return _matmul_scale(qa, qb)


# ---- third-party kernel: torch._scaled_mm ----------------------------------------------------

def _scaled_mm_reason(r: QuantRecipe) -> str | None:
    for role in ("x", "w"):
        q = getattr(r, role)
        if q is None or q.kind != "fp8" or q.rounding != "rne":
            return (f"recipe {r.name}: torch._scaled_mm takes FP8 (e4m3/e5m2) operands; "
                    f"{role} is {'unquantized' if q is None else q.kind}")
        if q.granularity not in ("tensor", "row"):
            return (f"recipe {r.name}: torch._scaled_mm on CPU takes tensor-wise or row-wise "
                    f"scales only; {q.granularity} scaling (like 1x32 MX, 1x16 NVFP4) needs "
                    "CUDA (PLATFORM.md), and numcheck has no wrapper for torch's CUDA "
                    "block-scaled GEMM yet")
    if r.x.granularity != r.w.granularity:
        return f"recipe {r.name}: _scaled_mm needs both operands scaled alike"
    if r.hadamard:
        return f"recipe {r.name}: the RHT is not part of torch._scaled_mm"
    return None


def torch_scaled_mm(a, b, recipe):
    """Third-party kernel: fp32 amax/scale with torch ops, torch's float8 casts, and
    torch._scaled_mm (fp32 accumulation) with the decode scales 1/scale."""
    r = get_recipe(recipe)
    if _scaled_mm_reason(r):
        raise UsageError(_scaled_mm_reason(r))
    af, bf = a.float(), b.float()
    ops = []
    for t, q, d in ((af, r.x, -1), (bf, r.w, 0)):
        dt = _fp8._TORCH_FP8[q.fmt]
        fmax = torch.finfo(dt).max
        amax = t.abs().amax() if q.granularity == "tensor" else t.abs().amax(d, keepdim=True)
        s = _fp8.torch_fp8_scale(amax, q.fmt, q.pow2_scale)
        ops.append(((t * s).clamp(-fmax, fmax).to(dt), torch.reciprocal(s).float()))
    (a8, sa), (b8, sb) = ops
    b8 = b8.t().contiguous().t()  # _scaled_mm wants the second operand column-major
    return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.float32)


# ---- op registration --------------------------------------------------------------------------

_SHAPES = [(64, 256, 48), (32, 512, 64), (16, 1024, 16)]  # (M, K, N); K a multiple of 128
_DISTS = ["normal", "outlier_channels", "student_t"]
# One rounding of the fp32 result, plus one fp32 rounding of each operand (the dequantized
# operands, or _scaled_mm's decode scales 1/scale) and a quarter-unit margin, as matmul's policy.
_BOUND_C = 1.0 + 2.0 + 0.25


def _inputs(case):
    from .. import inputs
    m, k, n = case.shape
    dt = formats.get(case.dtype).torch
    a = inputs.draw(case.dist, (m, k), seed=case.seed, fmt=case.dtype, stream=f"{case.id}/a")
    bdist = "normal" if case.dist == "outlier_channels" else case.dist  # outliers in a only
    b = inputs.draw(bdist, (k, n), seed=case.seed, fmt=case.dtype, stream=f"{case.id}/b")
    return {"a": (a, dt), "b": (b, dt)}, {"recipe": case.param("recipe", "fp8_tensor")}


def _register() -> None:
    from ..cases import make_grid
    from ..ops import OPS, Kernel, OpSpec, register_kernel, register_op
    from ..policy import Policy
    if "scaled_matmul" in OPS:
        return
    # DESIGN rule 5: GEMM is judged componentwise, |out - ref| <= c u (|A||B| + eta) with
    # gamma_K of fp32 accumulation (reduction_len = K in fp32 units), plus the baseline rule.
    policy = Policy(bound_c=_BOUND_C, bound_per_len=1.0,
                    notes="componentwise |Aq||Bq| bound of the dequantized operands")
    register_op(OpSpec(
        "scaled_matmul", _inputs, scaled_matmul_reference, scaled_matmul_baseline,
        make_grid("scaled_matmul", {"dtype": ["bf16", "fp32"], "shape": _SHAPES, "dist": _DISTS,
                                    "recipe": list(RECIPES)},
                  extra_full={"dist": ["wide_range", "zero_blocks"]}),
        policy, blocks=lambda case, shape: (min(shape[-2], 128), min(shape[-1], 128)),
        scale=_scale, reduction_len=lambda case: float(case.shape[1]),
        out_dtypes=lambda case: (torch.float32,),
        doc="scaled_matmul(a, b, recipe): a (M, K), b (K, N) fake-quantized along K by the "
            "recipe (RHT first where it has one), fp32 accumulation, fp32 out; shape (M, K, N)"))

    def supports(case, device):
        return _scaled_mm_reason(get_recipe(case.param("recipe")))
    register_kernel(Kernel("scaled_matmul", "torch_scaled_mm", torch_scaled_mm,
                           forward_only=True, supports=supports))


_register()
