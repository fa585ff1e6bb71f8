"""Which modules and functions a watch records as which op (docs/telemetry.md, "Coverage"):
``classify`` (a module by its class: registered classes, built-in class names, torch's own),
the torch functions watched as ops (``FUNCTION_OPS``), ``register`` (a user's module class,
torch function, Python function or "module:function"), the torch-function mode a registered
function's wrapper reports to (``Observer``), and what counts as a compiled region
(``compiled_region``: a torch.compile wrapper or a module compiled in place).
"""
from __future__ import annotations

import functools
import importlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from numcheck.errors import UsageError

# torch functions watched as ops (the watch's op mode and the float64 copy's capture read it;
# ``register`` adds to it): function -> op.
FUNCTION_OPS = {F.scaled_dot_product_attention: "sdpa", torch.softmax: "softmax",
                torch.Tensor.softmax: "softmax", F.softmax: "softmax"}


# Module classes a user registered (``numcheck.telemetry.register``): class -> op, the first
# match in registration order wins over the built-in classes below.
_REGISTERED: dict[type, str] = {}
# Built-in classes by name, for model libraries' modules numcheck does not import: rotary
# embeddings (the cos/sin tables they return) and adaLN modulation modules.
_BY_NAME = (("Rotary", "rope"), ("AdaLayerNorm", "modulate"), ("Modulation", "modulate"))
# How many watches have their op mode entered: a registered function's wrapper reads this
# plain int first, so an unwatched call (compiled by Dynamo too) costs one global read.
WATCHING = [0]


class Observer(TorchFunctionMode):
    """A torch-function mode that a registered Python function's wrapper tells about its calls
    (``observed``): the watch's op mode, the float64 shadow's capture. While one is entered,
    the wrappers look for it (``WATCHING``)."""

    def __enter__(self):
        WATCHING[0] += 1
        return super().__enter__()

    def __exit__(self, *exc):
        WATCHING[0] -= 1
        return super().__exit__(*exc)

    def observed(self, func, call: tuple, out) -> None:
        """``func`` (a registered function's wrapper, op ``func.__numcheck_op__``) was called
        with ``call`` = (args, kwargs) and returned ``out``."""
        raise NotImplementedError


def _function_op(fn, op: str):
    """A Python function that, called while a watch's forward runs, reports its call to the
    watch as op ``op`` (rows, shadow, producer checks); unwatched it only calls ``fn``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        if WATCHING[0]:
            for m in torch.overrides._get_current_function_mode_stack():
                if isinstance(m, Observer):
                    m.observed(wrapper, (args, kwargs), out)
        return out

    wrapper.__numcheck_op__ = op
    return wrapper


def _torch_functions() -> frozenset:
    """The functions torch hands to TorchFunctionMode (torch.add, torch.Tensor.mul, F.gelu)."""
    global _OVERRIDABLE
    if _OVERRIDABLE is None:
        _OVERRIDABLE = frozenset(f for fs in torch.overrides.get_overridable_functions().values()
                                 for f in fs)
    return _OVERRIDABLE


_OVERRIDABLE: frozenset | None = None


def register(target, op: str):
    """Watch ``target``'s calls as op ``op``: their inputs, weight (a module's), outputs and
    gradients become rows under that op, with a float64 shadow, and the producer checks name
    that op. ``target`` is

    * an ``nn.Module`` subclass (its subclasses too): its modules are watched;
    * a torch function (``torch.addcmul``, ``torch.Tensor.mul``): every call of it in a watched
      forward (all of them: ``torch.add`` is every residual add and more);
    * a Python function (adaLN's modulation, a RoPE, a gated residual): returns a wrapper that
      reports its calls; the model must call the wrapper (``f = register(f, "rope")``);
    * ``"package.module:function"``: that function, replaced in its module by the wrapper (for
      library code that looks the name up there at call time).

    Registering again replaces the op. Returns ``target`` (a class, a torch function) or the
    wrapper."""
    if not (isinstance(op, str) and op.isidentifier()):
        raise UsageError(f"telemetry.register({getattr(target, '__name__', target)!r}, "
                         f"op={op!r}): give the op a name (an identifier such as 'modulate' "
                         "or 'rope')")
    if isinstance(target, type):
        if not issubclass(target, nn.Module):
            raise UsageError(f"telemetry.register: {target!r} is not an nn.Module subclass; "
                             "register a module class, a function or 'module:function'")
        _REGISTERED[target] = op
        return target
    if isinstance(target, str):
        return _register_path(target, op)
    if hasattr(target, "__numcheck_op__"):   # a wrapper already
        target.__numcheck_op__ = op
        return target
    if callable(target) and target in _torch_functions():
        FUNCTION_OPS[target] = op
        return target
    if callable(target):
        return _function_op(target, op)
    raise UsageError(f"telemetry.register: {target!r} is neither a module class nor a "
                     "function; register a module class, a function or 'module:function'")


def _register_path(path: str, op: str):
    mod_name, _, attr = path.partition(":")
    try:
        home = importlib.import_module(mod_name)
        fn = getattr(home, attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise UsageError(f"telemetry.register({path!r}): cannot load it ({type(e).__name__}: "
                         f"{e}); give 'package.module:function'") from e
    if isinstance(fn, type) or not callable(fn):
        return register(fn, op)
    wrapped = register(fn, op)
    if wrapped is not fn:
        setattr(home, attr, wrapped)
    return wrapped


def classify(m: nn.Module) -> str | None:
    """The op a watched module records under, or None (not watched: producer checks only)."""
    if compiled_region(m):
        return "compiled"   # (its __getattr__ would show the compiled module's weight)
    for cls, op in _REGISTERED.items():
        if isinstance(m, cls):
            return op
    name = type(m).__name__
    for part, op in _BY_NAME:
        if part in name:
            return op
    if isinstance(m, nn.MultiheadAttention):
        return "attention"
    if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
        return "embedding"
    w = getattr(m, "weight", None)
    if isinstance(m, nn.Linear) or (hasattr(m, "in_features") and hasattr(m, "out_features")
                                    and isinstance(w, torch.Tensor) and w.dim() == 2):
        return "linear"  # nn.Linear and drop-ins (convergence.linear.QuantLinear)
    if isinstance(m, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)) or name.endswith("Norm"):
        return "norm"
    return None


def compiled_region(m: nn.Module) -> bool:
    """m is a ``torch.compile`` wrapper (OptimizedModule: its hooks run outside the compiled
    program, its ``_orig_mod``'s modules inside it) or a module compiled in place
    (``m.compile()``: its own hooks run inside the compiled ``_call_impl`` too)."""
    return type(m).__name__ == "OptimizedModule" or compiled_in_place(m)


def compiled_in_place(m: nn.Module) -> bool:
    """``m.compile()`` was called: ``m(...)`` runs ``m._compiled_call_impl``, Dynamo's
    compilation of ``m._call_impl`` (module hooks included)."""
    return m.__dict__.get("_compiled_call_impl") is not None


def region_body(m: nn.Module) -> nn.Module:
    """The module whose forward a compiled region runs: the wrapper's ``_orig_mod``, or m."""
    return m if compiled_in_place(m) else m._orig_mod
