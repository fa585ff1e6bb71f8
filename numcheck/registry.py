"""What an op is (``OpSpec``), who computes it (``Kernel``) and the ``Registry`` that holds both.

This module knows no op family: the built-in ops are registered by ``numcheck.catalog`` (the one
module whose job that is), users' ops by ``nc.op(...)`` and users' kernels by
``@nc.kernel(op, ...)``, both against the catalog's registry.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import torch

from numcheck.cases.grid import Case, Grid
from numcheck.errors import UsageError
from numcheck.verdicts.policy import Policy

# A tensor argument: float64 values (before rounding) and the dtype it is stored in.
TensorArg = tuple[torch.Tensor, torch.dtype]
InputBuilder = Callable[[Case], tuple[dict[str, TensorArg], dict[str, Any]]]

SUITES = ("ops", "quant", "user")  # the built-in suite an op runs in ("ops", "quant"), or users'


@dataclass(frozen=True)
class Convention:
    """An answer an op leaves to convention (DESIGN rule 3): what a fully masked attention row
    returns, say. The reference and the baseline take it as the keyword ``name``; a kernel
    declares its choice (``nc.kernel(op, conventions={name: choice})``), else it is held to
    the first choice, the op's default. A kernel that follows another choice than it declares
    is told so by name (numcheck.run), not by an error statistic."""

    name: str  # "masked_rows"
    # (choice, what it means), the first the op's default: (("zero", "a zero row"), ...)
    choices: tuple[tuple[str, str], ...]
    applies: Callable[[Case], bool]  # does the case have what the convention decides?

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.choices)


@dataclass(frozen=True)
class OpSpec:
    """An op: the contract every kernel of it is checked against."""

    name: str
    make_inputs: InputBuilder  # case -> ({arg: (float64 values, storage dtype)}, {kwarg: value})
    reference: Callable[..., torch.Tensor]  # float64 from primitives; autograd gives its grads
    baseline: Callable[..., torch.Tensor]  # naive primitives in the compute dtype
    grid: Grid | Callable[[str], list[Case]]  # "quick" | "full" -> cases
    policy: Policy = field(default_factory=Policy)
    grad_args: tuple[str, ...] = ()  # tensor args that get gradients (empty: forward only)
    blocks: Callable[[Case, torch.Size], Any] | None = None  # error_stats blocks (None: default)
    # Componentwise magnitude for DESIGN rule 5 (|A||B| for GEMM, ...), from float64 inputs.
    scale: Callable[..., torch.Tensor] | None = None
    # Length of the reduction behind each output element (D for norms, K for GEMM), for
    # Policy.bound_per_len.
    reduction_len: Callable[[Case], float] | None = None
    # Terms summed per output element (in the compute precision; the longest chain where there
    # are several), for the condition-aware bound's gamma_n (numcheck.verdicts.conditioning). None: 0.
    sum_len: Callable[[Case], float] | None = None
    # What intermediate roundings of a stable algorithm move each output by, per unit roundoff,
    # beyond what perturbing the inputs does (float64, from the exact inputs; None: nothing).
    cond_scale: Callable[..., torch.Tensor] | None = None
    # Gradients not judged in a case, with the reason in the op's doc (an exactly-zero
    # reference gradient, where no relative rule applies).
    skip_grads: Callable[[Case], tuple[str, ...]] | None = None
    # Output dtypes a kernel may return (default: the case's compute dtype).
    out_dtypes: Callable[[Case], tuple[torch.dtype, ...]] | None = None
    # What the op leaves to convention; reference and baseline take each as a keyword.
    conventions: tuple[Convention, ...] = ()
    doc: str = ""
    suite: str = "user"  # set by the registry: "ops" | "quant" (built-in suites) | "user"

    def blocks_for(self, case: Case, shape: torch.Size) -> Any:
        return self.blocks(case, shape) if self.blocks is not None else None

    def judged_grads(self, case: Case) -> tuple[str, ...]:
        skip = self.skip_grads(case) if self.skip_grads else ()
        return tuple(a for a in self.grad_args if a not in skip)

    def conventions_of(self, kern: "Kernel") -> tuple[tuple[str, str], ...]:
        """The kernel's choice of each convention of the op (its declaration, else the op's
        default), as sorted (name, choice) pairs; an unknown name or choice is a usage error."""
        declared = dict(kern.conventions)
        known = {c.name: c for c in self.conventions}
        for name, choice in declared.items():
            if name not in known:
                raise UsageError(
                    f"kernel {kern.name!r} of {self.name}: conventions={{{name!r}: ...}}: "
                    f"{self.name} has " + (f"the conventions {', '.join(sorted(known))}"
                                           if known else "no conventions"))
            if choice not in known[name].names:
                raise UsageError(
                    f"kernel {kern.name!r} of {self.name}: conventions={{{name!r}: "
                    f"{choice!r}}}: choose one of {', '.join(known[name].names)}")
        return tuple(sorted((c.name, declared.get(c.name, c.names[0]))
                            for c in self.conventions))


@dataclass(frozen=True)
class Kernel:
    """An implementation of an op, with the constraints outside which its cases skip."""

    op: str
    name: str
    fn: Callable[..., torch.Tensor]
    dtypes: tuple[str, ...] | None = None  # compute dtypes it supports (None: any)
    devices: tuple[str, ...] | None = None  # "cpu", "cuda" (None: any)
    forward_only: bool = False
    backward: Callable[..., tuple] | None = None  # fn(grad_out, **inputs, **kwargs) -> grads
    supports: Callable[[Case, str], str | None] | None = None  # -> skip reason, or None
    compiled: bool = False  # torch.compile variant: one xdist group, fixed shapes
    # A documented weakness of this kernel (a finding, docs/findings.md): (case, device, output)
    # -> reason when a failure there is expected. Such records get status "known", not "failed".
    known_failure: Callable[[Case, str, str], str | None] | None = None
    # The ATen ops (schema names, "aten::native_layer_norm_backward", or with the format of the
    # first tensor argument, "aten::_log_softmax:bf16") whose behaviour those weaknesses are:
    # another kernel of the op whose call reaches one (a user's wrapper of the same torch call)
    # and errs no worse than this kernel there is judged by this known_failure too (rule 15).
    reaches: tuple[str, ...] = ()
    # The op's conventions this kernel follows where it departs from the op's defaults
    # ({"masked_rows": "mean_v"}: OpSpec.conventions).
    conventions: tuple[tuple[str, str], ...] | dict[str, str] = ()

    def __post_init__(self) -> None:  # a dict is accepted; kept as sorted pairs (hashable)
        object.__setattr__(self, "conventions", tuple(sorted(dict(self.conventions).items())))

    def skip_reason(self, case: Case, device: str) -> str | None:
        dev = torch.device(device).type
        if self.devices is not None and dev not in self.devices:
            return f"kernel {self.name} runs on {', '.join(self.devices)}, not {dev}"
        if self.dtypes is not None and case.dtype not in self.dtypes:
            return f"kernel {self.name} supports {', '.join(self.dtypes)}, not {case.dtype}"
        return self.supports(case, device) if self.supports else None

    def known(self, case: Case, device: str, output: str) -> str | None:
        return self.known_failure(case, device, output) if self.known_failure else None


KERNEL_CONSTRAINTS = ("dtypes", "devices", "forward_only", "backward", "supports", "compiled",
                      "known_failure", "reaches", "conventions")


class Registry:
    """Ops by name and their kernels by name; an op family registers its ops and kernels,
    naming the suite they run in."""

    def __init__(self) -> None:
        self._ops: dict[str, OpSpec] = {}
        self._kernels: dict[str, dict[str, Kernel]] = {}

    def register_family(self, suite: str, ops: tuple[OpSpec, ...],
                        kernels: tuple[Kernel, ...] = ()) -> None:
        for spec in ops:
            self.register_op(spec, suite)
        for k in kernels:
            self.register_kernel(k)

    def register_op(self, spec: OpSpec, suite: str = "user") -> OpSpec:
        if suite not in SUITES:
            raise UsageError(f"op {spec.name!r}: suite {suite!r}; use one of "
                             f"{', '.join(SUITES)}")
        old = self._ops.get(spec.name)
        if old is not None and old.suite != "user":
            raise UsageError(f"op {spec.name!r}: a built-in op has that name; choose another")
        spec = replace(spec, suite=suite)
        self._ops[spec.name] = spec
        self._kernels.setdefault(spec.name, {})
        return spec

    def register_kernel(self, k: Kernel) -> Kernel:
        self.get_op(k.op).conventions_of(k)  # an unknown convention fails at registration
        self._kernels[k.op][k.name] = k
        return k

    def get_op(self, name: str) -> OpSpec:
        if name not in self._ops:
            raise UsageError(f"unknown op {name!r}; built-in and registered ops: "
                             f"{', '.join(sorted(self._ops))}")
        return self._ops[name]

    def kernels(self, op: str) -> dict[str, Kernel]:
        self.get_op(op)
        return dict(self._kernels[op])

    def ops(self, suite: str | None = None) -> list[OpSpec]:
        """Registered ops in name order, of one suite or all."""
        return [s for n, s in sorted(self._ops.items()) if suite in (None, s.suite)]

    def as_kernel(self, op: str, fn, name: str | None = None) -> Kernel:
        """A Kernel for fn: itself if it is one, the registered kernel of that name if fn is a
        string (``verify("sdpa", "sdpa_flash")``), its registration if registered, else new."""
        if isinstance(fn, Kernel):
            return fn if name is None else replace(fn, name=name)
        if isinstance(fn, str):
            known = self.kernels(op)
            if fn not in known:
                raise UsageError(f"verify({op!r}, {fn!r}): {op} has no kernel named {fn!r}; "
                                 f"registered: {', '.join(sorted(known)) or 'none'} (or pass "
                                 "the kernel function itself)")
            return known[fn] if name is None else replace(known[fn], name=name)
        for k in self.kernels(op).values():
            if k.fn is fn:
                return k if name is None else replace(k, name=name)
        if not callable(fn):
            raise UsageError(f"verify({op!r}, fn): fn must be callable, got "
                             f"{type(fn).__name__}")
        return Kernel(op, name or getattr(fn, "__name__", "kernel"), fn)

    @contextlib.contextmanager
    def restoring(self) -> Iterator["Registry"]:
        """Undo every registration made inside the block (tests register throwaway ops)."""
        ops, kern = dict(self._ops), {k: dict(v) for k, v in self._kernels.items()}
        try:
            yield self
        finally:
            self._ops, self._kernels = ops, kern


def check_constraints(op: str, constraints: dict[str, Any]) -> None:
    bad = set(constraints) - set(KERNEL_CONSTRAINTS)
    if bad:
        raise UsageError(f"@nc.kernel({op!r}): unknown constraint(s) {sorted(bad)}; use "
                         f"{', '.join(KERNEL_CONSTRAINTS)}")
