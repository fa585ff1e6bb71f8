"""torch.compile (inductor) variants of existing ops: kernel "compiled" of rms_norm,
adaln_modulate, swiglu and sdpa.

The ops themselves (grid, reference, baseline, policy) live in their families' files; this file
only registers kernels, looked up by name when numcheck.ops loads it (after the other families).
An op whose family is missing (not importable) gets no compiled kernel.

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
declared as known failures below (adaln_modulate on column-major rows).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from . import KERNELS, OPS, Case, Kernel, _load_builtins, register_kernel

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


# ---- the functions compiled -----------------------------------------------------------------

def _rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _adaln(x, shift, scale, eps):
    return F.layer_norm(x, (x.shape[-1],), None, None, eps) * (1 + scale) + shift


def _swiglu(a, b):
    return F.silu(a) * b


def _attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """softmax(QK^T * scale + mask) V written out (GQA by repeat_interleave), the pattern
    inductor's fuse_attention pass rewrites into scaled_dot_product_attention."""
    h, hkv = q.shape[-3], k.shape[-3]
    if hkv != h:
        k = k.repeat_interleave(h // hkv, dim=-3)
        v = v.repeat_interleave(h // hkv, dim=-3)
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * sc
    if is_causal:
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask.to(s.device), float("-inf"))
    return torch.matmul(s.softmax(dim=-1), v)


# ---- known weaknesses (findings) -------------------------------------------------------------

def _adaln_strided_rows(case: Case, device: str, output: str) -> str | None:
    """Finding: on a transposed (column-major) x, inductor reduces each row with one sequential
    fp32 accumulator (a left-to-right two-pass in fp32 reproduces its per-row rstd errors: -13.4
    vs -14.5 u, +12.4 vs +11.7 u on a 128-wide row); contiguous rows get lane-wise sums (<= 1.7 u).
    A benign summation order (DESIGN rule 7), but 7x the norms baseline's cascaded torch.mean on
    one row of fp32-2x16x128-zero_blocks: the norms family's baseline rule does not yet allow for
    reordered sums (softmax's baselines use a sequential sum for this reason)."""
    if case.param("layout") == "transposed" and case.dtype == "fp32" and output in ("out",
                                                                                    "grad_x"):
        return "inductor: sequential per-row fp32 reduction on strided rows (benign order)"
    return None


def _sdpa_known(case: Case, device: str, output: str) -> str | None:
    """Unmasked, non-causal attention compiles to the CPU flash kernel (forward and backward:
    checked with the profiler in tests/test_ops_compiled.py), so the flash kernel's declared
    weakness applies; causal cases run inductor's own bmm + softmax."""
    flash = KERNELS.get("sdpa", {}).get("sdpa_flash")
    if case.param("causal") or flash is None or flash.known_failure is None:
        return None
    return flash.known_failure(case, device, output)


# ---- registration ---------------------------------------------------------------------------

_KERNELS = {
    # weight: only the same-dtype weight (fp32 weights beside bf16 x would double the graphs).
    "rms_norm": (_rms_norm, {"weight": ("same",)}, None),
    "adaln_modulate": (_adaln, {}, _adaln_strided_rows),
    "swiglu": (_swiglu, {}, None),
    # No attn_mask: each mask kind is another graph, and a fully masked row would give NaN here
    # (softmax over -inf), not the convention's 0. Causal and unmasked cases run.
    "sdpa": (_attention, {"mask": (None,)}, _sdpa_known),
}

# Imported directly (``from numcheck.ops import compiled``) before the built-ins loaded, this
# module would find no ops: load them first (a no-op when the loader is what imports us).
_load_builtins()
for _op, (_fn, _params, _known) in _KERNELS.items():
    if _op in OPS:  # the family loaded
        register_kernel(Kernel(_op, "compiled", Compiled(_fn), dtypes=DTYPES,
                               supports=_supports(_op, **_params), known_failure=_known,
                               compiled=True))
