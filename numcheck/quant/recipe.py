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
from functools import cached_property

import torch

from numcheck.errors import UsageError
from numcheck.ops.matmul import matmul_reference
from numcheck.quant import transforms as _tr
from numcheck.quant.base import QuantFormat, to64
from numcheck.quant.fp8 import FP8_FORMATS, GRANULARITIES, FP8Format
from numcheck.quant.intq import IntFormat
from numcheck.quant.mx import ELEMS, SCALE_MODES, MXFormat
from numcheck.quant.nvfp4 import NVFP4Format

ROLES = ("x", "w", "grad")

# The one dispatch on ``Quantizer.kind``: each kind's QuantFormat from the Quantizer's fields.
_FORMATS = {
    "fp8": lambda q: FP8Format(q.fmt, q.granularity, q.pow2_scale),
    "mx": lambda q: MXFormat(q.fmt, q.block, q.scale_mode),
    "nvfp4": lambda q: NVFP4Format(q.two_d),
    "int8": lambda q: IntFormat(8),
    "int4": lambda q: IntFormat(4, q.block),
}
KINDS = tuple(_FORMATS)
# ... and the Quantizer fields of each kind's quantization paths in the quant suite
# (numcheck.quant.paths: one round trip each, floors in quant_rules.MEASURED_DB), in its order.
SUITE_FIELDS: dict[str, tuple[dict, ...]] = {
    "fp8": tuple({"fmt": fmt, "granularity": gran} for fmt in FP8_FORMATS
                 for gran in GRANULARITIES),
    "mx": tuple({"fmt": elem, "block": 32, "scale_mode": mode} for elem in ELEMS
                for mode in SCALE_MODES),
    "nvfp4": ({}, {"two_d": True}),
    "int8": ({},),
    "int4": ({"block": 128},),
}


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
        if self.rounding not in self.format.roundings:
            raise UsageError(f"Quantizer kind={self.kind!r} has no stochastic rounding here; "
                             "use rounding='rne'")

    @cached_property
    def format(self) -> QuantFormat:
        """The family's QuantFormat for these fields (validates them)."""
        return _FORMATS[self.kind](self)

    def qdq(self, t, dim: int = -1, generator: torch.Generator | None = None) -> torch.Tensor:
        """Fake-quant of t along ``dim``, in t's dtype."""
        return self.format.qdq(t, dim, self.rounding, generator)


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
    a64, b64 = to64(a), to64(b)
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
    qa, qb = dequantized_operands(a, b, recipe, generator)
    return matmul_reference(qa, qb)
