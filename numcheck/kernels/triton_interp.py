"""Correct float conversions, float scalars and libdevice for Triton's CPU interpreter
(``TRITON_INTERPRET=1``).

Triton 3.9's interpreter converts floats in one routine, ``_convert_float``, which gets three
things wrong (docs/findings.md, "Triton's CPU interpreter converts floats wrongly"): bf16/fp8
subnormal inputs, fp32 -> bf16 (truncates instead of rounding to nearest even) and fp32 -> fp8
(ties away, a lost carry, NaN and overflow). A correct kernel that stores bf16 from fp32 then
fails numcheck's gates on the CPU for the interpreter's sake. ``install()`` replaces that routine
with an exact one: the input decoded from its bits to float64 (exact for every format it
handles), rounded by numcheck's own bit-level ``formats.round_to`` (nearest even, or toward zero
where the kernel asks for ``rtz``; bf16/fp16/fp32 overflow to inf as IEEE and compiled Triton
do, fp8 saturates to its largest finite value as compiled Triton's ``satfinite`` conversions
do, NaN stays NaN), and encoded back. Formats it does not know (FNUZ fp8 variants) keep
Triton's routine. Compiled kernels never pass through it: their bugs are judged as they are.

It also types Python float arguments as fp32 scalars, as compiled Triton's launcher does, and
gives interpreted kernels ``triton.language.extra.libdevice``'s common functions (the
interpreter leaves them returning None; docs/findings.md, "Triton's CPU interpreter: float
scalar arguments, libdevice, bf16 arithmetic"), and computes bf16 operations through fp32 with
one rounding to bf16 each (the interpreter runs them on the raw uint16 bits).

``nc.verify`` and the pytest plugin install it when ``TRITON_INTERPRET`` is set and triton is
importable (``install_if_interpreting``); ``install()`` returns False where triton is missing or
its interpreter has no such routine (another version: the findings' tests say what holds where).
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import torch

from numcheck import formats

_STATE: dict = {}


def _names():
    import triton.language as tl
    return {tl.float64: ("fp64", torch.float64), tl.float32: ("fp32", torch.float32),
            tl.float16: ("fp16", torch.float16), tl.bfloat16: ("bf16", torch.bfloat16),
            tl.float8e4nv: ("e4m3", torch.float8_e4m3fn), tl.float8e5: ("e5m2", torch.float8_e5m2)}


def _bits_dtype(nbytes: int):
    return {1: (np.uint8, torch.uint8), 2: (np.uint16, torch.int16),
            4: (np.uint32, torch.int32), 8: (np.uint64, torch.int64)}[nbytes]


def _decode(data: np.ndarray, dt: torch.dtype) -> torch.Tensor:
    """float64 values of the raw bits in ``data`` read as ``dt`` (every such value is exact in
    float64)."""
    np_u, t_int = _bits_dtype(torch.finfo(dt).bits // 8)
    raw = torch.from_numpy(np.frombuffer(data.tobytes(), dtype=np_u).copy())
    return (raw if np_u is np.uint8 else raw.view(t_int)).view(dt).double()


def exact_convert(data: np.ndarray, src: str, dst: str, rounding: str = "rne") -> np.ndarray:
    """The bits of ``data`` (raw bits of format ``src``) converted to format ``dst``: decoded
    exactly, rounded by numcheck, encoded; an unsigned integer array of dst's width."""
    table = {name: t for name, t in _names().values()}
    x = _decode(np.asarray(data), table[src])
    fmt = formats.get(dst)
    saturate = dst in ("e4m3", "e5m2")  # compiled Triton's fp8 conversions are satfinite
    y = formats.round_to(x, dst, rounding=rounding, saturate=saturate) if dst != "fp64" else x
    if fmt.name != "fp64" and not saturate:
        y = torch.where(x.isinf(), x, y)  # IEEE: inf stays inf
    out = y.to(table[dst])  # exact: y lies on dst's grid
    np_u, t_int = _bits_dtype(out.element_size())
    raw = out.view(torch.uint8) if np_u is np.uint8 else out.view(t_int)
    return raw.numpy().view(np_u)


def install() -> bool:
    """Replace the interpreter's float conversion with ``exact_convert`` (idempotent). False
    where triton or its ``_convert_float`` is missing."""
    try:
        from triton.runtime import interpreter
    except Exception:  # ImportError, or triton failing at import on this machine
        return False
    if "original" in _STATE:
        return True
    original = getattr(interpreter, "_convert_float", None)
    if original is None:
        return False
    names = _names()
    rtz = interpreter._ir.ROUNDING_MODE.RTZ

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype not in names or output_dtype not in names:
            return original(input, input_dtype, output_dtype, rounding_mode)
        out = exact_convert(input, names[input_dtype][0], names[output_dtype][0],
                            "rz" if rounding_mode == rtz else "rne")
        return out.reshape(np.shape(input))

    _STATE["original"] = original
    interpreter._convert_float = convert
    _install_scalars(interpreter)
    _install_libdevice(interpreter)
    _install_bf16(interpreter)
    _install_autotune()
    return True


def _install_autotune() -> None:
    """``@triton.autotune`` with several configs: the first config the kernel's own pruning
    keeps, without benchmarking (the interpreter has no device to time: the bare Autotuner
    raises "0 active drivers"; docs/findings.md). On a GPU the tuned config runs compiled."""
    from triton.runtime.autotuner import Autotuner
    original = Autotuner.prune_configs

    def prune_configs(self, kwargs):
        return original(self, kwargs)[:1]

    _STATE["prune_configs"] = original
    Autotuner.prune_configs = prune_configs


def _install_scalars(interpreter) -> None:
    """Python float arguments typed as compiled Triton's launcher types them, fp32 scalars (the
    interpreter passes the float itself: ``eps.to(tl.float32)`` raises; docs/findings.md)."""
    import triton.language as tl
    original = interpreter._implicit_cvt

    def cvt(arg):
        if isinstance(arg, float):
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32),
                                                      tl.float32), tl.float32)
        return original(arg)

    _STATE["implicit_cvt"] = original
    interpreter._implicit_cvt = cvt


def _erf(x):  # numpy has no erf: Python's float64 math.erf, element by element
    return np.vectorize(math.erf, otypes=[np.float64])(x)


# libdevice functions a kernel may call, as float64 numpy functions of their arguments: the
# interpreter leaves triton.language.extra.libdevice unpatched (each call returns None). Each
# result is numpy's float64 value (within an ulp) rounded once to the argument's format: for
# fp32 and narrower, the correctly rounded result but in rare near-ties; CUDA's libdevice is
# within its documented 1-2 ulp of that.
_LIBDEVICE = {
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "sqrt": np.sqrt, "exp": np.exp, "exp2": np.exp2,
    "log": np.log, "log2": np.log2, "tanh": np.tanh, "pow": np.power,
    "fast_expf": np.exp, "fast_logf": np.log, "fast_dividef": np.divide, "div_rn": np.divide,
    # float64 holds the product of two fp32 values exactly; the sum is rounded to float64 and
    # then to fp32, which can differ from a fused multiply-add in a rare tie
    "fma": lambda a, b, c: a * b + c,
    # exact in every format (the float64 result is representable): quantizers round with these
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint, "nearbyint": np.rint,
    "round": lambda x: np.copysign(np.floor(np.abs(x) + 0.5), x),  # C round: ties away
    "abs": np.abs, "fabs": np.abs, "fmax": np.fmax, "fmin": np.fmin, "copysign": np.copysign,
    "log1p": np.log1p, "expm1": np.expm1, "log10": np.log10, "exp10": lambda x: 10.0 ** x,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "atan2": np.arctan2, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "cbrt": np.cbrt,
    "hypot": np.hypot, "fmod": np.fmod, "erf": _erf,
}

# The finding id under which a kernel that needs what the interpreter cannot run is reported
# (numcheck.measure.environment.ENVIRONMENT_FAILURES; `numcheck explain`).
LIBDEVICE_LIMIT = "triton-interp-libdevice"


def _limit(what: str, implemented: str) -> str:
    return (f"{what} is not implemented under Triton's CPU interpreter (numcheck's support "
            f"implements {implemented}): an environment limit [{LIBDEVICE_LIMIT}], not a "
            "kernel failure; run the kernel compiled on a GPU")


class _Globals:
    """A function's globals as attributes, so that the interpreter's patch scope (``set_attr``,
    ``restore``) can swap a name a kernel imported from libdevice and put it back."""

    def __init__(self, names: dict) -> None:
        object.__setattr__(self, "_names", names)

    def __getattr__(self, name):
        try:
            return self._names[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value) -> None:
        self._names[name] = value

    def __delattr__(self, name) -> None:
        del self._names[name]


def _install_libdevice(interpreter) -> None:
    """libdevice's functions inside an interpreted kernel's patch scope (``_patch_lang``)."""
    import triton.language as tl
    original = interpreter._patch_lang
    names = _names()

    def numeric(name, fn):
        def call(*args, _semantic=None, **kwargs):
            ts = [a if isinstance(a, tl.tensor) else interpreter._implicit_cvt(a) for a in args]
            dtype = ts[0].type.scalar
            if dtype not in names:
                raise NotImplementedError(_limit(f"libdevice.{name} of {dtype}",
                                                 "fp64, fp32, fp16 and bf16 arguments"))
            fmt = names[dtype][0]
            vals = [_decode(np.ascontiguousarray(t.handle.data), names[t.type.scalar][1])
                    .numpy().reshape(np.shape(t.handle.data)) for t in ts]
            with np.errstate(all="ignore"):
                exact = np.asarray(fn(*np.broadcast_arrays(*vals)), dtype=np.float64)
            bits = exact_convert(exact.view(np.uint64), "fp64", fmt).reshape(exact.shape)
            data = bits.view(interpreter._get_np_dtype(dtype)) if fmt != "bf16" else bits
            shape_of = max(ts, key=lambda t: np.ndim(t.handle.data))
            return tl.tensor(interpreter.TensorHandle(data, dtype), shape_of.type)
        return call

    impls = {name: numeric(name, fn) for name, fn in _LIBDEVICE.items()}

    def missing(f):  # what the bare interpreter leaves returning None, named instead
        def call(*args, _semantic=None, **kwargs):
            raise NotImplementedError(_limit(f"{f.__module__}.{f.__name__}",
                                             ", ".join(sorted(_LIBDEVICE))))
        return call

    def libdevice(value) -> bool:  # the module, or one of its functions imported by name
        return getattr(value, "__name__" if inspect.ismodule(value) else "__module__",
                       "").startswith("triton.language.extra")

    def patch_lang(fn):
        scope = original(fn)
        names = _Globals(fn.__globals__)
        for key, value in list(fn.__globals__.items()):
            if not libdevice(value):
                continue
            if inspect.ismodule(value):  # `libdevice.rsqrt(x)`
                for name, f in vars(value).items():
                    if inspect.isfunction(f) and not name.startswith("_"):
                        scope.set_attr(value, name, impls.get(name) or missing(f))
            elif inspect.isfunction(value):  # `from ...libdevice import rsqrt`
                scope.set_attr(names, key, impls.get(value.__name__) or missing(value))
        return scope

    _STATE["patch_lang"] = original
    interpreter._patch_lang = patch_lang


_MODULES: dict = {}


def kernels_module(device):
    """numcheck.kernels.triton_builtin for ``device``: on CUDA the module as imported (compiled
    kernels); on the CPU a second copy of it whose ``@triton.jit`` decorators ran with the
    interpreter switched on inside ``triton.knobs.runtime.scope()`` (restored after: no other
    kernel of the process and no environment variable changes), with ``install()``."""
    if torch.device(device).type != "cpu":
        from numcheck.kernels import triton_builtin as triton_kernels
        return triton_kernels
    if "cpu" not in _MODULES:
        import importlib.util

        import triton
        install()
        spec = importlib.util.find_spec("numcheck.kernels.triton_builtin")
        mod = importlib.util.module_from_spec(spec)
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = True
            spec.loader.exec_module(mod)
        _MODULES["cpu"] = mod
    return _MODULES["cpu"]


def available() -> str | None:
    """None where triton imports, else why not (a skip reason)."""
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'numcheck[triton]')"
    return None


# Interpreted, numcheck's row kernels run one program per row in Python: a 32769-row size
# class would take minutes on the CPU; compiled on a GPU it runs (bench/gpu_run.sh).
INTERPRETED_MAX_ROWS = 4096


def supports(case, device) -> str | None:
    """A Kernel ``supports`` for numcheck's Triton kernels: skip every case where triton is
    missing, and the size classes beyond INTERPRETED_MAX_ROWS rows on the CPU."""
    rows = int(np.prod(case.shape[:-1])) if len(case.shape) > 1 else 1
    if torch.device(device).type == "cpu" and rows > INTERPRETED_MAX_ROWS:
        return (f"interpreted on the CPU: {rows} rows > {INTERPRETED_MAX_ROWS}, one program "
                "each; run compiled on a GPU")
    return available()


def interpreting() -> bool:
    """Does ``TRITON_INTERPRET`` ask for Triton's interpreter in this process?"""
    import os
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")


def install_if_interpreting() -> bool:
    """``install()`` where ``TRITON_INTERPRET`` asks for the interpreter (and only there: importing
    triton costs a second)."""
    return install() if interpreting() else False


# Float operations on bf16 operands (the interpreter keeps bf16 as uint16 bits and hands them to
# numpy as integers: docs/findings.md). Each runs on the operands decoded to fp32 (exact) and
# its result is rounded once to bf16 by numcheck's rounding, as compiled Triton computes a bf16
# op; comparisons keep the interpreter's own result form.
_BF16_ARITH = ("add", "subtract", "multiply", "divide", "fmod", "minimum", "maximum", "fmin",
               "fmax")
_BF16_COMPARE = ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")


def _install_bf16(interpreter) -> None:
    """bf16 arithmetic, math, fma, clamps, dots, reductions and scans through fp32 (above)."""
    import triton.language as tl
    handle, bf16, fp32 = interpreter.TensorHandle, tl.bfloat16, tl.float32
    builder, reduce_ops, scan_ops = (interpreter.InterpreterBuilder, interpreter.ReduceOps,
                                     interpreter.ScanOps)
    arith = {getattr(np, n) for n in _BF16_ARITH}
    compare = {getattr(np, n) for n in _BF16_COMPARE}

    def up(data):
        return (np.asarray(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)

    def down(data):
        x = np.asarray(data, dtype=np.float32)
        return exact_convert(x.view(np.uint32).reshape(-1), "fp32", "bf16").reshape(x.shape)

    def is_bf16(h):
        return isinstance(h, handle) and h.dtype == bf16

    originals = {}

    def patch(cls, name, make):
        originals[(cls, name)] = getattr(cls, name)
        setattr(cls, name, make(originals[(cls, name)]))

    def binary(original):
        def binary_op(self, lhs, rhs, op):
            if not (is_bf16(lhs) and is_bf16(rhs)) or op not in arith | compare:
                return original(self, lhs, rhs, op)
            with np.errstate(all="ignore"):
                out = op(up(lhs.data), up(rhs.data))
            if op in arith:
                return handle(down(out), bf16)
            return handle(out.astype(np.uint16), bf16)  # as the interpreter shapes a compare
        return binary_op

    def through_fp32(original):  # every bf16 operand decoded; a fp32 result rounded back
        def method(self, *args):
            if not any(is_bf16(a) for a in args):
                return original(self, *args)
            args = [handle(up(a.data), fp32) if is_bf16(a) else a for a in args]
            with np.errstate(all="ignore"):
                out = original(self, *args)
            return handle(down(out.data), bf16) if out.dtype == fp32 else out
        return method

    def dot(original):  # operands decoded; the accumulator keeps its own type
        def create_dot(self, a, b, d, *rest):
            a, b = (handle(up(x.data), fp32) if is_bf16(x) else x for x in (a, b))
            return original(self, a, b, d, *rest)
        return create_dot

    def reduce_sum(original):  # per-op rounding: the combine function's bf16 adds, in order
        def reduce(self, input):
            if input.dtype == bf16:
                return self.generic_reduce((input,))[0]
            return original(self, input)
        return reduce

    def reduce_min_max(original):  # compared as values, not as bit patterns
        def min_max(self, input, val_reduce_op, idx_reduce_op=None):
            x = input[0] if isinstance(input, tuple) else input
            if x.dtype != bf16:
                return original(self, input, val_reduce_op, idx_reduce_op)
            wide = tl.core.tensor(handle(up(x.handle.data), fp32), x.type.with_element_ty(fp32)
                                  if isinstance(x.type, tl.block_type) else fp32)
            got = original(self, wide, val_reduce_op, idx_reduce_op)

            def back(t):  # the values are bf16 values: exact either way
                return self.to_tensor(down(t.handle.data), bf16) if t.dtype == fp32 else t
            return tuple(map(back, got)) if isinstance(got, tuple) else back(got)
        return min_max

    def scan(original):
        def method(self, input):
            return self.generic_scan([input]) if input.dtype == bf16 else original(self, input)
        return method

    patch(builder, "binary_op", binary)
    for name in ("unary_op", "ternary_op", "create_fma", "create_rsqrt", "create_erf"):
        patch(builder, name, through_fp32)
    patch(builder, "create_dot", dot)
    patch(reduce_ops, "sum", reduce_sum)
    patch(reduce_ops, "min_max", reduce_min_max)
    patch(scan_ops, "cumsum", scan)
    patch(scan_ops, "cumprod", scan)
    _STATE["bf16"] = originals


def uninstall() -> None:
    """Put Triton's own routines back (tests)."""
    if "original" in _STATE:
        from triton.runtime import interpreter
        interpreter._convert_float = _STATE.pop("original")
        interpreter._implicit_cvt = _STATE.pop("implicit_cvt")
        interpreter._patch_lang = _STATE.pop("patch_lang")
        from triton.runtime.autotuner import Autotuner
        Autotuner.prune_configs = _STATE.pop("prune_configs")
        for (cls, name), method in _STATE.pop("bf16").items():
            setattr(cls, name, method)
