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
from numcheck.ops.derived import careful_baseline, default_inputs
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
    other kernels of the op reaching them borrow it; ``numcheck.registry.Kernel``),
    conventions={"masked_rows": "mean_v"} (the op's conventions it follows where it departs
    from the op's defaults: ``OpSpec.conventions``, in the op's doc).
    """
    check_constraints(op, constraints)

    def register(fn: Callable) -> Callable:
        CATALOG.register_kernel(Kernel(op, name or fn.__name__, fn, **constraints))
        return fn
    return register


def op(name: str, *, reference, inputs=None, baseline=None, policy: Policy | None = None,
       grid=None, grad_args: tuple[str, ...] = (), blocks=None, scale=None, reduction_len=None,
       skip_grads=None, out_dtypes=None, sum_len=None, cond_scale=None, conventions=(),
       doc: str = "") -> OpSpec:
    """Define a user op (a fused kernel that is no built-in op, e.g. norm + quantize).

    reference: a function of torch primitives, run in float64 (it gets float64 tensors).
    inputs: case -> ({arg: (float64, dtype)}, kwargs); default: each parameter of
    ``reference`` without a default is a tensor of the case's shape, dtype and distribution.
    baseline: the careful same-precision implementation (DESIGN rule 4); default: the
    reference itself run on the stored inputs widened to fp32 (``formats.widen``), its result
    rounded once to the first input's dtype. grid: "quick"|"full" -> cases (default: fp32,
    bf16 and fp16, two ragged shapes, normal and outlier inputs, contiguous and transposed
    layouts). The other fields as in ``OpSpec``.
    """
    inputs = inputs or default_inputs(reference)
    baseline = baseline or careful_baseline(reference)
    return CATALOG.register_op(OpSpec(
        name=name, make_inputs=inputs, reference=reference, baseline=baseline,
        grid=grid or default_grid(name), policy=policy or Policy(), grad_args=tuple(grad_args),
        blocks=blocks, scale=scale, reduction_len=reduction_len, skip_grads=skip_grads,
        out_dtypes=out_dtypes, sum_len=sum_len, cond_scale=cond_scale,
        conventions=tuple(conventions), doc=doc))
