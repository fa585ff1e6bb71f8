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

Inductor's cache and the CPU capability. Inductor generates C++ for the ISA that
``ATEN_CPU_CAPABILITY`` selects (``default`` = scalar code, ``avx2``, ``avx512``), but its FX-graph
cache key does not include that choice: a graph cached under one capability is served under
another from the same ``TORCHINDUCTOR_CACHE_DIR`` (docs/findings.md, "Inductor's cache ignores
ATEN_CPU_CAPABILITY": NaN from an avx512 compile run under avx2; on an AVX2 machine a C++ compile
error, or numerics of neither capability's fresh compile). ``isolate_inductor_cache`` therefore points inductor at
``<TORCHINDUCTOR_CACHE_DIR or inductor's default>/numcheck-<capability>`` before numcheck compiles
anything: every ``Compiled`` call runs it, and so does the plugin once per session (before a
user's own ``torch.compile`` inside a numcheck test). The state it leaves is one environment
variable of this process, ``TORCHINDUCTOR_CACHE_DIR``, which inductor reads on every cache access
(torch/_inductor/runtime/cache_dir_utils.py: ``cache_dir()``; it also hands the variable to its
compile workers on every job): later ``torch.compile`` calls of the same process and its child
processes share the per-capability folder. Set the variable to a folder named
``numcheck-<capability>`` to choose it yourself; one named ``numcheck-<other capability>`` (a
parent process's) is replaced by its sibling for this capability, never nested.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable

import torch

from numcheck.cases import skips
from numcheck.cases.grid import Case
from numcheck.registry import Kernel

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
# Prefix of the per-capability folders isolate_inductor_cache makes inside inductor's cache.
CACHE_PREFIX = "numcheck-"


def inductor_cache_dir(capability: str, current: str | None) -> str:
    """The inductor cache folder for ATen CPU ``capability`` ("AVX2", "DEFAULT", "AVX512", ...)
    given the current ``TORCHINDUCTOR_CACHE_DIR`` (None when unset: inductor's default folder,
    ``<tmp>/torchinductor_<user>``). A ``current`` already named ``numcheck-*`` was set by numcheck
    (this capability: kept; another one, e.g. a parent process's: its sibling is returned)."""
    tag = CACHE_PREFIX + re.sub(r"[^0-9a-z]+", "_", capability.lower()).strip("_")
    if current:
        base = os.path.abspath(current)
        if os.path.basename(base).startswith(CACHE_PREFIX):
            base = os.path.dirname(base)
    else:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir
            base = default_cache_dir()
        except ImportError:  # torch before the module existed: inductor's documented default
            import getpass
            import tempfile
            base = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    return os.path.join(base, tag)


def isolate_inductor_cache() -> str:
    """Point inductor's on-disk cache at the folder of the ATen CPU capability in effect
    (``torch.backends.cpu.get_cpu_capability()``): sets ``TORCHINDUCTOR_CACHE_DIR`` in this
    process's environment (module doc) and returns the folder. Idempotent and cheap; takes effect
    for every compile and cache lookup after it, since inductor reads the variable each time."""
    path = inductor_cache_dir(str(torch.backends.cpu.get_cpu_capability()),
                              os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


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
        isolate_inductor_cache()  # every call: a new shape compiles here too
        if self._compiled is None:
            self._compiled = torch.compile(self.fn, dynamic=False, **self.options)
        from torch._dynamo import config as dynamo_config
        with dynamo_config.patch(fail_on_recompile_limit_hit=True,
                                 recompile_limit=RECOMPILE_LIMIT):
            return self._compiled(*args, **kwargs)


def _supports(op: str, **params: tuple) -> Callable[[Case, str], str | None]:
    return skips.only(f"compiled {op}", shape=SHAPES[op], **params,
                      why="each shape or param value is another graph, 1-3 s of compile")


def compiled_kernel(op: str, fn: Callable[..., torch.Tensor], *,
                    known_failure: Callable[[Case, str, str], str | None] | None = None,
                    **params: tuple) -> Kernel:
    """The kernel "compiled" of ``op``: ``Compiled(fn)`` on the shapes of ``SHAPES[op]``, fp32
    and bf16, and the op params restricted to ``params`` (name -> allowed values)."""
    return Kernel(op, "compiled", Compiled(fn), dtypes=DTYPES, supports=_supports(op, **params),
                  known_failure=known_failure, compiled=True)
