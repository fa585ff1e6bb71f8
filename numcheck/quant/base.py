"""What every quantization family shares: ``QuantFormat``, the one interface a recipe asks (never
a family's name), and the float64 in/out helpers of the quantizers.

A family (fp8.py, mx.py, nvfp4.py, intq.py) implements ``QuantFormat`` once; ``Quantizer``
(recipe.py) builds its family's format from its fields and hands every call to it.
"""
from __future__ import annotations

import torch

from numcheck import formats
from numcheck.errors import UsageError

Block = int | tuple[int, int] | None


class QuantFormat:
    """One quantization format: element grid, scaling block and scale, and the operations.

    Attributes (set by each family): ``name`` (fp8_e4m3_row, mx_e2m1_floor, nvfp4_2d, int4, ...),
    ``elem`` (the element grid: a ``numcheck.formats`` name, or "int8"/"int4"), ``bits`` (bits
    per element), ``block`` (elements sharing one scale: k consecutive along ``dim`` (1-D),
    (rows, cols) tiles of the last two dims (2-D), or None: the whole slice along ``dim`` or the
    whole tensor), ``scale_fmt`` (what a block's scale is: "fp32", "e8m0", "e4m3"), ``roundings``
    (element roundings it offers: "rne", and "sr" where the family has it).
    """

    name: str
    elem: str
    bits: int
    block: Block
    scale_fmt: str
    roundings: tuple[str, ...] = ("rne", "sr")

    def encode(self, x, dim: int = -1):
        """Quantize x along ``dim``: the family's codes and scales (FP8Quantized, ...)."""
        raise NotImplementedError

    def decode(self, q) -> torch.Tensor:
        """The dequantized values of ``encode``'s result, float64 (before any cast to x's dtype)."""
        raise NotImplementedError

    def qdq(self, x, dim: int = -1, rounding: str = "rne",
            generator: torch.Generator | None = None) -> torch.Tensor:
        """Fake quant along ``dim`` in x's dtype; ``rounding="sr"`` needs ``generator``."""
        raise NotImplementedError

    def saturation(self, x64: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Boolean mask (x's shape): |x| beyond the largest value representable at its block's
        scale by more than half the top step (``formats.Format.overflow_threshold``)."""
        raise NotImplementedError

    @property
    def unit_roundoff(self) -> float:
        """Largest relative rounding error of the element grid (half an ulp)."""
        return formats.get(self.elem).unit_roundoff

    @property
    def amax_overshoot(self) -> float:
        """How far above the element max a block's amax lands by design (1: it never does)."""
        return 1.0


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


def norm_dim(x: torch.Tensor, dim: int) -> int:
    """``dim`` as a non-negative index into x's dims (UsageError for a scalar or out of range)."""
    if x.dim() == 0:
        raise UsageError("x is a scalar: quantize a tensor with at least one dimension")
    if not -x.dim() <= dim < x.dim():
        raise UsageError(f"dim={dim} is out of range for x of shape {tuple(x.shape)}")
    return dim % x.dim()


def need_generator(generator) -> None:
    """UsageError unless a generator is given: stochastic rounding must be reproducible."""
    if generator is None:
        raise UsageError("rounding='sr' needs generator=torch.Generator(device=t.device)"
                         ".manual_seed(n): stochastic rounding must be reproducible")
