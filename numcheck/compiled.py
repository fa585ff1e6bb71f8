"""torch.compile (inductor) variants of ops: ``compiled_kernel`` makes the kernel "compiled" of
an op from a plain eager function; each op family declares its own (rms_norm, adaln_modulate in
norms, swiglu in activations, sdpa in attention). This module registers nothing.

Each kernel is ``torch.compile(fn, dynamic=False)`` of a plain eager function: the same
composition the eager kernel uses (F.rms_norm; F.layer_norm * (1 + scale) + shift; F.silu(a) * b)
or, for attention, a hand-written softmax(QK^T * scale + mask) V, which inductor pattern-matches
into the CPU flash-attention kernel (PLATFORM.md): the numerics judged are those of what actually
runs, not of the eager algorithm. Gradients go through AOTAutograd's compiled backward.

Cost. Compiling is slow (about 10 s for the first graph in a fresh process, 1-3 s per new graph;
every new shape, dtype, stride pattern, mask kind or set of inputs needing gradients is a new
graph), so each kernel accepts only a small fixed set of its op's cases (``supports``): two
shapes, fp32 and bf16, and for rms_norm and sdpa a subset of the params; everything else skips
with that reason. Measured on 2 cores with a fresh inductor cache: the four ops' quick cases
(32 cases, 20 graphs) in ~48 s, ~15 s with a warm cache. Calls run with
``fail_on_recompile_limit_hit``: past RECOMPILE_LIMIT graphs the kernel raises instead of
silently running eager code.

What runs (tests/test_ops_compiled.py): unmasked attention becomes
aten::_scaled_dot_product_flash_attention_for_cpu (forward and backward, GQA included), so the
flash kernel's declared weakness carries over; the causal form stays bmm + softmax. Findings are
declared as known failures in the families (adaln_modulate on column-major rows).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .cases import Case
from .registry import Kernel

DTYPES = ("fp32", "bf16")
# Two shapes per op, each in that op's quick grid (a ragged and an aligned last dim).
SHAPES: dict[str, tuple[tuple[int, ...], ...]] = {
    "rms_norm": ((4, 128), (3, 129)),
    "adaln_modulate": ((2, 16, 128), (3, 7, 129)),
    "swiglu": ((4, 128), (3, 129)),
    "sdpa": ((2, 2, 2, 7, 7, 128), (1, 4, 2, 127, 129, 64)),
}
# Cache entries allowed per compiled function (dynamo's default is 8): the supported sets need at
# most 8 graphs (adaln_modulate's quick cases), 16 leaves room; past it the kernel raises.
RECOMPILE_LIMIT = 16


class Compiled:
    """``torch.compile(fn, dynamic=False)``, built on first call (importing numcheck compiles
    nothing), called with dynamo set to raise rather than fall back to eager."""

    def __init__(self, fn: Callable[..., torch.Tensor], **options: Any):
        self.fn = fn
        self.options = options
        self._compiled: Callable[..., torch.Tensor] | None = None
        self.__name__ = f"compiled_{fn.__name__}"
        self.__qualname__ = self.__name__
        self.__module__ = __name__

    def __call__(self, *args, **kwargs):
        if self._compiled is None:
            self._compiled = torch.compile(self.fn, dynamic=False, **self.options)
        from torch._dynamo import config as dynamo_config
        with dynamo_config.patch(fail_on_recompile_limit_hit=True,
                                 recompile_limit=RECOMPILE_LIMIT):
            return self._compiled(*args, **kwargs)


def _supports(op: str, **params: tuple) -> Callable[[Case, str], str | None]:
    shapes = SHAPES[op]

    def supports(case: Case, device: str) -> str | None:
        if case.shape not in shapes:
            return (f"compiled {op} is checked on shapes {', '.join(map(str, shapes))} only "
                    "(each shape is a new graph, 1-3 s of compile)")
        for name, allowed in params.items():
            if case.param(name) not in allowed:
                return (f"compiled {op} is checked with {name} in {allowed} only, not "
                        f"{case.param(name)!r}")
        return None
    return supports


def compiled_kernel(op: str, fn: Callable[..., torch.Tensor], *,
                    known_failure: Callable[[Case, str, str], str | None] | None = None,
                    **params: tuple) -> Kernel:
    """The kernel "compiled" of ``op``: ``Compiled(fn)`` on the shapes of ``SHAPES[op]``, fp32
    and bf16, and the op params restricted to ``params`` (name -> allowed values)."""
    return Kernel(op, "compiled", Compiled(fn), dtypes=DTYPES, supports=_supports(op, **params),
                  known_failure=known_failure, compiled=True)
