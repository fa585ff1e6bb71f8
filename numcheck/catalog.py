"""The catalog: the registry with numcheck's built-in ops and kernels in it.

This module's one job is registration: each op family (one file under ``numcheck/ops/``)
declares its ops and kernels as data (``OPS``, ``KERNELS``) and is registered here, explicitly,
with the built-in suite its ops run in. Importing any other module registers nothing. Everything that looks ops up
(``verify``, the suites, the CLI) imports this module; users extend it with ``op`` and
``kernel`` (``nc.op``, ``@nc.kernel``).
"""
from __future__ import annotations

import importlib
from typing import Callable

from numcheck.cases.grid import default_grid
from numcheck.verdicts.policy import Policy
from numcheck.registry import Kernel, OpSpec, Registry, check_constraints

# One line an op family: the suite its ops run in and its module (a constant name, so that
# tests/test_imports.py sees the edge).
CATALOG = Registry()
for _suite, _family in (
        ("ops", importlib.import_module("numcheck.ops.norms")),
        ("ops", importlib.import_module("numcheck.ops.matmul")),
        ("ops", importlib.import_module("numcheck.ops.attention")),
        ("ops", importlib.import_module("numcheck.ops.softmax")),
        ("ops", importlib.import_module("numcheck.ops.activations")),
        ("ops", importlib.import_module("numcheck.ops.rope")),
        ("quant", importlib.import_module("numcheck.ops.qdq")),
):
    CATALOG.register_family(_suite, _family.OPS, _family.KERNELS)

get_op = CATALOG.get_op
kernels = CATALOG.kernels
as_kernel = CATALOG.as_kernel


def ops(suite: str | None = None) -> list[OpSpec]:
    """Registered ops in name order: those of the built-in suite ``"ops"`` or ``"quant"``,
    users' ops (``"user"``) or all (None)."""
    return CATALOG.ops(suite)


def kernel(op: str, name: str | None = None, **constraints) -> Callable:
    """Decorator: register ``fn`` as an implementation of ``op`` (``@nc.kernel("rms_norm")``).

    constraints: dtypes=("bf16",), devices=("cuda",), forward_only=True, backward=fn,
    supports=lambda case, device: reason-or-None, compiled=True, known_failure=fn,
    reaches=("aten::op[:fmt]", ...) (the ATen ops whose weaknesses known_failure documents:
    other kernels of the op reaching them borrow it; ``numcheck.registry.Kernel``).
    """
    check_constraints(op, constraints)

    def register(fn: Callable) -> Callable:
        CATALOG.register_kernel(Kernel(op, name or fn.__name__, fn, **constraints))
        return fn
    return register


def op(name: str, *, reference, inputs, baseline, policy: Policy | None = None, grid=None,
       grad_args: tuple[str, ...] = (), blocks=None, scale=None, reduction_len=None,
       skip_grads=None, out_dtypes=None, sum_len=None, cond_scale=None,
       doc: str = "") -> OpSpec:
    """Define a user op (a fused kernel that is no built-in op, e.g. norm + quantize).

    reference: float64 function from primitives; inputs: case -> ({arg: (float64, dtype)},
    kwargs); baseline: the naive composition in the compute dtype; grid: "quick"|"full" ->
    cases (default: a small grid over bf16/fp32, normal/outlier inputs); the other fields as in
    ``OpSpec``.
    """
    return CATALOG.register_op(OpSpec(
        name=name, make_inputs=inputs, reference=reference, baseline=baseline,
        grid=grid or default_grid(name), policy=policy or Policy(), grad_args=tuple(grad_args),
        blocks=blocks, scale=scale, reduction_len=reduction_len, skip_grads=skip_grads,
        out_dtypes=out_dtypes, sum_len=sum_len, cond_scale=cond_scale, doc=doc))
