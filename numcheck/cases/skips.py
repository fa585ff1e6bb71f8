"""Skip rules as values (``nc.skips``): the ``supports=`` of a kernel and the ``skip_grads=`` of
an op, built from what a case is, so that a user's kernel or op says in one line where it does
not apply and why. numcheck's own kernels use the same rules (compiled kernels' shapes,
attention's layouts, the interpreter's availability), so a reason reads the same whoever wrote
the kernel.

    @nc.kernel("rms_norm", supports=nc.skips.only("my_rmsnorm", dtype=("bf16",), layout=(
        "contiguous",)))
    nc.op("softcap", reference=..., grad_args=("x",),
          skip_grads=nc.skips.grads_where(lambda case: case.dist == "near_overflow", "x"))

A supports rule is ``(case, device) -> reason or None``; a skip_grads rule is
``case -> names of the gradients not judged``. ``first(...)`` chains supports rules.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from numcheck.cases.grid import Case
from numcheck.errors import UsageError

Supports = Callable[[Case, str], "str | None"]
SkipGrads = Callable[[Case], "tuple[str, ...]"]

_FIELDS = ("dtype", "shape", "dist", "seed")  # Case's own; anything else is an op param


def _value(case: Case, name: str) -> Any:
    return getattr(case, name) if name in _FIELDS else case.param(name)


def _shown(values: Iterable) -> str:
    return ", ".join(map(repr if not all(isinstance(v, tuple) for v in values) else str, values))


def only(what: str, *, why: str = "", **allowed: Iterable) -> Supports:
    """Cases whose field or param ``name`` is one of ``allowed[name]`` run; any other skips,
    naming the value and ``why`` (``only("compiled rms_norm", shape=[(4, 128)], why="each
    shape is a new graph")``). A param a case does not have reads as None."""
    if not allowed:
        raise UsageError(f"skips.only({what!r}): name at least one field or param and its "
                         "allowed values (dtype=('bf16',), layout=('contiguous',), ...)")
    rules = {name: tuple(values) for name, values in allowed.items()}

    def supports(case: Case, device: str) -> str | None:
        for name, values in rules.items():
            got = _value(case, name)
            if got not in values:
                tail = f" ({why})" if why else ""
                return f"{what} runs with {name} in {_shown(values)} only, not {got!r}{tail}"
        return None
    return supports


def when(predicate: Callable[[Case], bool], reason: str) -> Supports:
    """Cases where ``predicate(case)`` holds skip with ``reason``."""
    def supports(case: Case, device: str) -> str | None:
        return reason if predicate(case) else None
    return supports


def contiguous(what: str) -> Supports:
    """Kernels that need inputs with last-dim stride 1 skip the grid's other layouts
    (transposed, sliced) with the reason."""
    def supports(case: Case, device: str) -> str | None:
        layout = case.param("layout", "contiguous")
        if layout != "contiguous":
            return f"{what} needs inputs with last-dim stride 1, not {layout} ones"
        return None
    return supports


def first(*rules: Supports | None) -> Supports:
    """The first reason any of ``rules`` gives (None entries are ignored)."""
    live = [r for r in rules if r is not None]

    def supports(case: Case, device: str) -> str | None:
        for rule in live:
            reason = rule(case, device)
            if reason:
                return reason
        return None
    return supports


def grads_where(predicate: Callable[[Case], bool], *args: str) -> SkipGrads:
    """An op's ``skip_grads``: the gradients of ``args`` are not judged where
    ``predicate(case)`` holds (say why in the op's doc: an exactly-zero reference gradient, an
    overflow every unfused backward makes); the forward still is."""
    if not args:
        raise UsageError("skips.grads_where(predicate, *args): name the arguments whose "
                         "gradients are not judged there")

    def skip_grads(case: Case) -> tuple[str, ...]:
        return tuple(args) if predicate(case) else ()
    return skip_grads
