"""Ops and kernels: what is computed (an OpSpec) and who computes it (a Kernel).

An OpSpec holds everything numcheck knows about one op: its case grid, an input builder, the
FP64 reference written from primitives, the naive same-precision baseline and the verdict
policy. Built-in ops live one family per file in this package and register themselves on
import; users add ops with ``nc.op(...)`` and implementations with ``@nc.kernel(op, ...)``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ..errors import UsageError
from ..policy import Policy

# A tensor argument: float64 values (before rounding) and the dtype it is stored in.
TensorArg = tuple[torch.Tensor, torch.dtype]
InputBuilder = Callable[["Case"], tuple[dict[str, TensorArg], dict[str, Any]]]


@dataclass(frozen=True)
class Case:
    """One enumerated case of an op: the golden key's case part, with a readable stable id."""

    op: str
    dtype: str  # the compute dtype of the case (a numcheck format name: bf16, fp16, fp32, ...)
    shape: tuple[int, ...]  # the op's own shape convention (see its OpSpec.doc)
    dist: str
    seed: int
    params: tuple[tuple[str, Any], ...] = ()  # op variants: causal, gqa groups, layout, ...

    @property
    def id(self) -> str:
        from ..inputs import case_id
        return case_id(dtype=self.dtype, shape=self.shape, dist=self.dist, seed=self.seed,
                       **dict(self.params))

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)


@dataclass
class OpSpec:
    """An op: the contract every kernel of it is checked against."""

    name: str
    make_inputs: InputBuilder  # case -> ({arg: (float64 values, storage dtype)}, {kwarg: value})
    reference: Callable[..., torch.Tensor]  # float64 from primitives; autograd gives its grads
    baseline: Callable[..., torch.Tensor]  # naive primitives in the compute dtype
    grid: Callable[[str], list[Case]]  # "quick" | "full" -> cases
    policy: Policy = field(default_factory=Policy)
    grad_args: tuple[str, ...] = ()  # tensor args that get gradients (empty: forward only)
    blocks: Callable[[Case, torch.Size], Any] = lambda case, shape: None  # error_stats blocks
    # Componentwise magnitude for DESIGN rule 5 (|A||B| for GEMM, ...), from float64 inputs.
    scale: Callable[..., torch.Tensor] | None = None
    # Length of the reduction behind each output element (D for norms, K for GEMM), for
    # Policy.bound_per_len.
    reduction_len: Callable[[Case], float] | None = None
    # Gradients not judged in a case, with the reason in the op's doc (an exactly-zero
    # reference gradient, where no relative rule applies).
    skip_grads: Callable[[Case], tuple[str, ...]] | None = None
    # Output dtypes a kernel may return (default: the case's compute dtype).
    out_dtypes: Callable[[Case], tuple[torch.dtype, ...]] | None = None
    doc: str = ""


@dataclass
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

    def skip_reason(self, case: Case, device: str) -> str | None:
        dev = torch.device(device).type
        if self.devices is not None and dev not in self.devices:
            return f"kernel {self.name} runs on {', '.join(self.devices)}, not {dev}"
        if self.dtypes is not None and case.dtype not in self.dtypes:
            return f"kernel {self.name} supports {', '.join(self.dtypes)}, not {case.dtype}"
        return self.supports(case, device) if self.supports else None


OPS: dict[str, OpSpec] = {}
KERNELS: dict[str, dict[str, Kernel]] = {}

# Built-in op families, imported on first lookup (each registers its ops and kernels).
_FAMILIES = ("norms", "matmul", "attention", "softmax", "activations", "rope", "compiled")
_loaded = False


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for fam in _FAMILIES:
        try:
            importlib.import_module(f"{__name__}.{fam}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{fam}":
                raise
    # The quantization paths are ops too (fp8_qdq, mx_qdq, ..., scaled_matmul), so a user's
    # quantizer is verified like any kernel; their suite is suites/test_quant.py.
    importlib.import_module("numcheck.quant")


def register_op(spec: OpSpec) -> OpSpec:
    OPS[spec.name] = spec
    KERNELS.setdefault(spec.name, {})
    return spec


def get_op(name: str) -> OpSpec:
    _load_builtins()
    if name not in OPS:
        raise UsageError(f"unknown op {name!r}; built-in and registered ops: "
                         f"{', '.join(sorted(OPS))}")
    return OPS[name]


def kernels(op: str) -> dict[str, Kernel]:
    get_op(op)
    return KERNELS[op]


def register_kernel(k: Kernel) -> Kernel:
    get_op(k.op)
    KERNELS[k.op][k.name] = k
    return k


def kernel(op: str, name: str | None = None, **constraints) -> Callable:
    """Decorator: register ``fn`` as an implementation of ``op`` (``@nc.kernel("rms_norm")``).

    constraints: dtypes=("bf16",), devices=("cuda",), forward_only=True, backward=fn,
    supports=lambda case, device: reason-or-None, compiled=True.
    """
    bad = set(constraints) - {"dtypes", "devices", "forward_only", "backward", "supports",
                              "compiled", "known_failure"}
    if bad:
        raise UsageError(f"@nc.kernel({op!r}): unknown constraint(s) {sorted(bad)}; use dtypes, "
                         "devices, forward_only, backward, supports, compiled")

    def register(fn: Callable) -> Callable:
        register_kernel(Kernel(op, name or fn.__name__, fn, **constraints))
        return fn
    return register


def as_kernel(op: str, fn, name: str | None = None) -> Kernel:
    """A Kernel for fn: itself if it is one, its registration if registered, else a new one."""
    if isinstance(fn, Kernel):
        return fn if name is None else replace(fn, name=name)
    for k in kernels(op).values():
        if k.fn is fn:
            return k if name is None else replace(k, name=name)
    if not callable(fn):
        raise UsageError(f"verify({op!r}, fn): fn must be callable, got {type(fn).__name__}")
    return Kernel(op, name or getattr(fn, "__name__", "kernel"), fn)


def op(name: str, *, reference, inputs, baseline, policy: Policy | None = None,
       grid=None, grad_args: tuple[str, ...] = (), blocks=None, scale=None,
       doc: str = "") -> OpSpec:
    """Define a user op (a fused kernel that is no built-in op, e.g. norm + quantize).

    reference: float64 function from primitives; inputs: case -> ({arg: (float64, dtype)},
    kwargs); baseline: the naive composition in the compute dtype; grid: "quick"|"full" ->
    cases (default: a small grid over bf16/fp32, normal/outlier inputs).
    """
    if name in OPS and name in _builtin_names():
        raise UsageError(f"nc.op({name!r}): a built-in op has that name; choose another")
    from ..cases import default_grid
    spec = OpSpec(name=name, make_inputs=inputs, reference=reference, baseline=baseline,
                  grid=grid or default_grid(name), policy=policy or Policy(),
                  grad_args=tuple(grad_args), blocks=blocks or (lambda c, s: None),
                  scale=scale, doc=doc)
    return register_op(spec)


def _builtin_names() -> set[str]:
    _load_builtins()
    return {n for n, s in OPS.items() if family(s) is not None}


def family(spec: OpSpec) -> str | None:
    """"ops" or "quant" for built-in ops (their suite's name), None for users' ops."""
    mod = spec.make_inputs.__module__
    if mod.startswith(__name__):
        return "ops"
    if mod.startswith("numcheck.quant"):
        return "quant"
    return None
