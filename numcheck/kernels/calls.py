"""How numcheck calls a kernel: the keyword arguments its signature takes (``taken``), and the
ATen ops one call of it reaches (``reached_ops``, for DESIGN rule 15's borrowed findings)."""
from __future__ import annotations

import contextlib
import inspect
import sys
import warnings
from typing import Any, Callable

import torch

from numcheck import formats
from numcheck.errors import UsageError
from numcheck.registry import Kernel


def _defaults(reference: Callable) -> dict[str, Any]:
    """The op's parameter defaults, from its reference's signature (the op's signature)."""
    try:
        params = inspect.signature(reference).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not p.empty}


def taken(fn: Callable, reference: Callable,
          kw: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The keyword arguments ``fn`` accepts (DESIGN, "Public contract"): a parameter it does
    not take is left out when the case gives it the op's default (``reference``'s), and makes
    the case skip (the reason, second) when the case needs another value. Callables without a
    readable signature, or with ``**kwargs``, get everything."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return dict(kw), None
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return dict(kw), None
    defaults = _defaults(reference)
    out, missing = {}, []
    for k, v in kw.items():
        if k in params:
            out[k] = v
        elif not (k in defaults and not isinstance(v, torch.Tensor) and v == defaults[k]):
            missing.append(f"{k}={v!r}" if not isinstance(v, torch.Tensor) else k)
    name = getattr(fn, "__name__", "kernel")
    return out, (f"{name} does not take {', '.join(missing)} (not the op's default)"
                 if missing else None)


def reached_ops(kern: Kernel, kin: dict[str, torch.Tensor], grads: tuple[str, ...],
                kernel_kw: dict[str, Any], backward_kw: dict[str, Any]) -> frozenset[str]:
    """The ATen ops a call of the kernel on ``kin`` (leaves for ``grads``), forward and
    backward, dispatches: each schema name, alone and with the format of its first tensor
    argument ("aten::_log_softmax:bf16"); what was seen until an error, if the kernel cannot
    run under a dispatch mode (compiled code)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class _Reached(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func._schema.name)
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None and first.is_floating_point():  # "aten::gelu:bf16" too
                with contextlib.suppress(UsageError):  # a dtype numcheck has no format for
                    seen.add(f"{func._schema.name}:{formats.get(first.dtype).name}")
            return func(*args, **(kwargs or {}))

    try:
        with _Reached(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the kernel's warnings were seen in its real run
            out = kern.fn(**kin, **kernel_kw)
            g = torch.ones_like(out)  # any upstream gradient reaches the same ops
            if grads and kern.backward is not None:
                kern.backward(g, **{n: t.detach() for n, t in kin.items()}, **backward_kw)
            elif grads and out.requires_grad:
                torch.autograd.grad(out, [kin[n] for n in grads], g, allow_unused=True)
    except Exception:  # noqa: BLE001 - what ran until then is what it reached
        pass
    if "torch._dynamo" in sys.modules:
        # What Dynamo compiled under the mode (eager flex_attention compiles its higher-order
        # op; its frame counters do not show it) stays cached: a frame marked as skipped made
        # every later flex_attention call in the process raise Unsupported. Forget it all: the
        # next compiled call compiles afresh (from the on-disk inductor cache).
        torch._dynamo.reset()
    return frozenset(seen)
