"""``nc.adapt``: a kernel with an op's signature around a library's entry point.

Library kernels are rarely called the way an op is: autograd Functions take positional
arguments only (and add library switches between versions), entry points return several
tensors (q and k of RoPE; loss and gradient) or a dataclass, and low-level launchers write their
result into a buffer they are given. ``adapt`` states each of those once, so that the wrapper a
user writes is the mapping and nothing else (docs/triton.md, "Adapting library kernels").
numcheck gives every kernel call fresh copies of its inputs, so a kernel that writes into its
inputs (gradients stored over the logits) never disturbs the reference or the baseline.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import torch

from numcheck.errors import UsageError

__all__ = ["adapt"]


def adapt(call: Callable, args: Callable | None = None, *, output: Any = None,
          name: str | None = None) -> Callable:
    """A function with an op's signature that calls ``call`` and returns the op's output.

    call: the library's function, or a ``torch.autograd.Function`` subclass (called through
        ``.apply``, positionally).
    args: a function with the op's parameters (numcheck passes them by name) returning what
        ``call`` takes: a tuple of positional arguments, or ``(tuple, dict)`` with keywords.
        Its signature becomes the kernel's (a parameter it does not take makes the cases that
        need another value skip, as for any kernel). None: the op's arguments positionally,
        with ``call``'s own signature (a Function's ``forward`` without ``ctx``).
    output: the op's output from what ``call`` returned: an int (item of a tuple or list), a
        str (field of a dataclass or named tuple, key of a dict), or a function
        ``(result, call_args) -> tensor`` (e.g. ``lambda res, a: a[3]``: the buffer a kernel
        wrote into). None: the result itself.
    """
    target = _callee(call)
    label = name or getattr(call, "__name__", "kernel")
    pick = _picker(output, label)
    if args is not None and not callable(args):
        raise UsageError(f"adapt({label}, args=...): args must be a function of the op's "
                         f"parameters returning call's arguments, got {type(args).__name__}")

    own = _signature(call)

    def adapted(*a, **kw):
        if args is None:  # call's parameters, in its order
            try:
                bound = own.bind(*a, **kw)
            except TypeError as e:
                raise UsageError(f"adapt({label}): {e}; {label} takes "
                                 f"({', '.join(own.parameters)}), numcheck passed "
                                 f"({', '.join(kw)}): give args=lambda <the op's parameters>: "
                                 f"(<{label}'s arguments>)") from None
            bound.apply_defaults()
            pos, named = tuple(bound.arguments.values()), {}
        else:
            got = args(*a, **kw)
            pos, named = got if _is_pos_kw(got) else (tuple(got), {})
        return pick(target(*pos, **named), pos)

    adapted.__name__ = label
    adapted.__qualname__ = label
    adapted.__doc__ = f"{label} adapted to an op's signature (numcheck.adapt)"
    adapted.__signature__ = _signature(args) if args is not None else own
    return adapted


def _callee(call: Callable) -> Callable:
    if inspect.isclass(call) and issubclass(call, torch.autograd.Function):
        return call.apply
    if not callable(call):
        raise UsageError(f"adapt(call): call must be a function or a torch.autograd.Function, "
                         f"got {type(call).__name__}")
    return call


def _is_pos_kw(got: Any) -> bool:
    return (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], (tuple, list))
            and isinstance(got[1], dict))


def _signature(fn: Callable) -> inspect.Signature:
    """The kernel's parameters: args' own, or call's (a Function's forward without ctx)."""
    if inspect.isclass(fn) and issubclass(fn, torch.autograd.Function):
        sig = inspect.signature(fn.forward)
        return sig.replace(parameters=list(sig.parameters.values())[1:])
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: it takes everything
        return inspect.Signature([inspect.Parameter("kw", inspect.Parameter.VAR_KEYWORD)])


def _picker(output: Any, label: str) -> Callable[[Any, tuple], Any]:
    if output is None:
        return lambda res, _: res
    if callable(output):
        return output
    if isinstance(output, int):
        def item(res, _):
            if not isinstance(res, (tuple, list)) or not -len(res) <= output < len(res):
                raise UsageError(f"adapt({label}, output={output}): {label} returned "
                                 f"{_describe(res)}, which has no item {output}")
            return res[output]
        return item
    if isinstance(output, str):
        def field(res, _):
            if isinstance(res, dict) and output in res:
                return res[output]
            if hasattr(res, output) and (dataclasses.is_dataclass(res) or hasattr(res, "_fields")):
                return getattr(res, output)
            raise UsageError(f"adapt({label}, output={output!r}): {label} returned "
                             f"{_describe(res)}, which has no field {output!r}")
        return field
    raise UsageError(f"adapt({label}, output=...): an int, a field name or a function "
                     f"(result, call_args) -> tensor; got {type(output).__name__}")


def _describe(res: Any) -> str:
    if isinstance(res, (tuple, list)):
        return f"a {type(res).__name__} of {len(res)}"
    if dataclasses.is_dataclass(res):
        return f"a {type(res).__name__} with fields {[f.name for f in dataclasses.fields(res)]}"
    if isinstance(res, dict):
        return f"a dict with keys {sorted(map(str, res))}"
    return f"a {type(res).__name__}"
