"""How telemetry reads one tensor: which pass applies to it, chosen per tensor.

CPU tensors take one compiled pass each (numcheck/telemetry/_fields_numba.py: all plain fields
and the finiteness the producer check needs, as Python floats accumulated on the host, no torch
op per observation); CUDA tensors the device pass (numcheck/telemetry/_fields_triton.py: one
Triton launch writes a tensor's plain fields as rows on its device, read at ``step()``); where
neither applies, the torch route of ``fields.tensor_stats``. The same choice for the
quantization fields (numcheck/telemetry/_quant_numba.py on CPU; the device pass's MX and NVFP4
rows), the shadows' SQNR sums and the sentinel's finiteness flags.

Which compiled pass runs is numcheck.measure.backend's choice, the one selector, asked here by
kind: ``telemetry-cpu`` (_fields_numba; ``_fast()``), ``telemetry-cuda`` (_fields_triton, for
CUDA tensors) and ``telemetry-cuda-on-cpu`` (_fields_triton under Triton's interpreter, for CPU
tensors: served only by a substitute) through ``_kernel(t)``. A compiler missing is warned once
there; a pass that raises while it runs is ``backend.broken`` (off for the rest of the process,
one warning) and that call takes the torch route. Tests and benchmarks pick a route through
the selector alone: ``backend.substitute(kind, module)`` (None: the torch route; a pass to run
or one planted to fail), ``backend.force("torch")`` or NUMCHECK_BACKEND=torch (every compiled
pass off), ``backend.reset(kind)``.
"""
from __future__ import annotations

import importlib

import torch

from numcheck.measure import backend
from numcheck.quant.mx import MXFormat
from numcheck.quant.nvfp4 import NVFP4Format
from numcheck.telemetry import fields
from numcheck.telemetry.digest import digest

# The compiled passes' kinds for numcheck.measure.backend (its doc: the switch that turns them
# off, NUMCHECK_BACKEND=torch, and the substitutes tests plant).
CPU_PASS = "telemetry-cpu"  # numcheck.telemetry._fields_numba
CUDA_PASS = "telemetry-cuda"  # numcheck.telemetry._fields_triton
CUDA_ON_CPU = "telemetry-cuda-on-cpu"  # _fields_triton interpreted: only a substitute serves it


def _fast():
    """The compiled CPU pass (numcheck.telemetry._fields_numba), or None: numba missing (warned
    once), the compiled passes switched off, or the pass broken."""
    return backend.load(CPU_PASS,
                        lambda: importlib.import_module("numcheck.telemetry._fields_numba"),
                        "numcheck.telemetry: no numba ({}); CPU tensors take the slower torch "
                        "route", stacklevel=3)


def _host_plain(t: torch.Tensor, sums: bool = True) -> list[float] | None:
    """A non-empty CPU tensor's plain fields (fields.PLAIN) from the compiled pass, or None
    where it does not apply (then the torch route: CUDA, subclasses, other dtypes).
    ``sums=False``: the integer pass alone, sum_sq NaN (the producer check's needs)."""
    fast = _fast()
    if fast is None or not fast.handles(t):
        return None
    try:
        return fast.raw(t, sums)
    except Exception as exc:  # noqa: BLE001 - numba that cannot compile here: the torch route
        return _broken(exc)


def read(t: torch.Tensor, full: bool):
    """A non-empty tensor's plain fields: a host list (_host_plain) or device rows
    (dev_rows)."""
    p = _host_plain(t, full)
    return p if p is not None else dev_rows(t)


def digest_field(t: torch.Tensor) -> dict:
    """{"digest": ...} of a non-empty tensor (numcheck/telemetry/digest.py): a float from the
    compiled CPU pass, else the torch route's 0-d tensor (a float on the CPU, read with the
    step's rows on a device)."""
    fast = _fast()
    if fast is not None and fast.handles(t):
        try:
            return {"digest": fast.digest(t)}
        except Exception as exc:  # noqa: BLE001 - as in _host_plain
            _broken(exc)
    d = digest(t)
    return {"digest": float(d) if d.is_cpu else d}


def _host_sqnr(out: torch.Tensor, ref64: torch.Tensor) -> tuple[float, float] | None:
    fast = _fast()
    if fast is None:
        return None
    try:
        return fast.sqnr(out, ref64)
    except Exception as exc:  # noqa: BLE001 - as in _host_plain
        return _broken(exc)


def host_quants(t: torch.Tensor, quantizers: list) -> list[dict | None]:
    """A CPU tensor's quantization fields for each quantizer (None: none) from
    numcheck/telemetry/_quant_numba.py (the same fields as fields.quant_stats, as floats; the
    tensor widened once for the recipes whose blocks pad it alike; it warns once and answers
    None where numba is missing or fails, or for a format or tensor it does not take: then
    quant_stats)."""
    live = [q for q in quantizers if q is not None]
    if not live:
        return [None] * len(quantizers)
    got = iter(importlib.import_module("numcheck.telemetry._quant_numba").quant_fields_many(
        t, [q.format for q in live]))
    out = []
    for q in quantizers:
        r = None if q is None else next(got)
        out.append(r if r is not None or q is None else fields.quant_stats(t, q))
    return out


def _broken(exc: Exception) -> None:
    # off for the rest of the process: a compile failure does not heal
    backend.broken(CPU_PASS, f"numcheck.telemetry: the compiled CPU pass failed "
                   f"({type(exc).__name__}: {exc}); using the torch route", stacklevel=4)


def _kernel(t: torch.Tensor):
    """The device pass for t (numcheck.telemetry._fields_triton), or None: for a CUDA tensor,
    Triton missing or failing to load (warned once), the compiled passes switched off, or the
    pass broken; for any other tensor, unless a test substituted the interpreted copy."""
    if not t.is_cuda:
        return backend.load(CUDA_ON_CPU)
    return backend.load(CUDA_PASS,
                        lambda: importlib.import_module("numcheck.telemetry._fields_triton"),
                        "numcheck.telemetry: no Triton ({0.__class__.__name__}: {0}); CUDA "
                        "tensors take the torch route (~20 kernel launches a tensor)",
                        errors=(Exception,),  # ImportError, or a Triton that fails to load
                        stacklevel=5)


def _launch(t: torch.Tensor, fn, *args):
    """fn(*args), a device-pass function reading t; None where it raised (a GPU or Triton the
    kernel does not build on): the pass of t's kind of device is then off for the rest of the
    process (backend.broken), with one warning, and the caller takes the torch route."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of the pass: the torch route
        backend.broken(CUDA_PASS if t.is_cuda else CUDA_ON_CPU,
                       f"numcheck.telemetry: the device pass failed ({type(exc).__name__}: "
                       f"{exc}); using the torch route", stacklevel=5)
        return None


def dev_rows(t: torch.Tensor) -> torch.Tensor:
    """A non-empty tensor's fields.PLAIN as rows on its device, read at step(): (r, 8) float64
    from the device pass (one kernel launch), or (1, 8) from the torch route
    (fields.tensor_stats) where the pass does not apply or failed."""
    k = _kernel(t)
    rows = _launch(t, k.plain_rows, t) if k is not None and k.handles(t) else None
    if rows is not None:
        return rows
    return torch.stack([v.to(torch.float64) for v in fields.tensor_stats(t).values()])[None]


_BLOCK_FORMATS = (MXFormat, NVFP4Format)   # the device pass's quantization statistics


def put(parts: list, part: tuple | None) -> None:
    if part is not None:
        parts.append(part)


def dev_quant(t: torch.Tensor, quantizer, acc: list[float]) -> tuple | None:
    """fields.quant_stats(t, quantizer) as a device part (field indices, rows[, what to apply to
    the rows read back]): for an MX or NVFP4 format (these exact classes: a subclass may change
    any rule), the device pass's rows (_fields_triton.quant_rows: one launch, NVFP4 two; q_n merged
    into ``acc``), else the reference quantizer's torch ops, stacked."""
    fmt = quantizer.format
    k = _kernel(t)
    got = _launch(t, k.quant_rows, t, fmt) if k is not None and type(fmt) in _BLOCK_FORMATS \
        and t.dim() >= 1 and k.handles(t) else None
    if got is not None:
        fields.host_update(acc, {"q_n": float(t.numel())})
        rows, fix = got
        return (k.QUANT_INDEX, rows) if fix is None else (k.QUANT_INDEX, rows, fix)
    return dev_part(fields.quant_stats(t, quantizer), acc)


def dev_part(values: dict, acc: list[float]) -> tuple | None:
    """Split fields (name -> 0-d tensor or float): floats merged into the host vector ``acc``
    now, tensors as one device row (field indices, (1, k) float64) to merge at step()."""
    dev = {k: v for k, v in values.items() if isinstance(v, torch.Tensor) and not v.is_cpu}
    host = {k: v for k, v in values.items() if k not in dev}
    if host:
        fields.host_update(acc, host)
    if not dev:
        return None
    return (tuple(fields.INDEX[k] for k in dev),
            torch.stack([v.to(torch.float64).reshape(()) for v in dev.values()])[None])


def sqnr_pair(out: torch.Tensor, ref64: torch.Tensor, prefix: str) -> list:
    """fields.sqnr_pair as contributions to a row (Accumulator.add's ``extra``): Python floats
    from the compiled CPU pass; on a device, the device pass's rows (_fields_triton.sqnr_rows: one
    launch); else the torch route's fields."""
    r = _host_sqnr(out, ref64)
    if r is not None:
        return [{f"{prefix}_n": 1.0, f"{prefix}_sig_sq": r[0], f"{prefix}_err_sq": r[1]}]
    k = _kernel(out)
    rows = _launch(out, k.sqnr_rows, out, ref64) if k is not None and k.handles(out) and \
        ref64.dtype is torch.float64 and ref64.shape == out.shape and \
        ref64.device == out.device else None
    if rows is not None:
        return [{f"{prefix}_n": 1.0},
                ((fields.INDEX[f"{prefix}_sig_sq"], fields.INDEX[f"{prefix}_err_sq"]), rows)]
    return [fields.sqnr_pair(out, ref64, prefix)]


# The sentinel's flags: Python bools (CPU tensors, known at once) or 0-d bool tensors on a
# device (read back at step()).
def _and(a, b):
    if isinstance(a, bool):
        if isinstance(b, bool):
            return a and b
        a, b = b, a
    if isinstance(b, bool):
        return a if b else torch.zeros((), dtype=torch.bool, device=a.device)
    return a & b.to(a.device)


def all_finite(ts: list[torch.Tensor]):
    """No NaN and no Inf in any of ts, nothing else read: a bool (CPU tensors: the
    compiled integer max) or a 0-d device flag (the sentinel's reads)."""
    fast, ok = _fast(), True
    for t in ts:
        if t.layout is torch.sparse_coo:   # nn.Embedding(sparse=True)'s gradient
            t = t._values()
        f = None
        if fast is not None and t.numel() and fast.handles(t):
            try:
                f = fast.finite(t)
            except Exception as exc:  # noqa: BLE001 - as in _host_plain
                _broken(exc)
        ok = _and(ok, torch.isfinite(t.detach()).all() if f is None else f)
    return ok
