"""Which compiled pass runs: the one selector (``load``, ``broken``), its switch (the
``NUMCHECK_BACKEND`` environment variable, ``force``, ``substitute``), and ``njit``.

Each statistic numcheck computes has a torch route (the reference, runs everywhere) and, where
a compiler is at hand, a compiled pass that gives the same figures (each pass's module doc says
how exactly: counts bitwise, float sums within a stated order bound): numba for CPU tensors,
Triton for CUDA tensors. A pass is a *kind*, named by its caller:

    =========================  ==========================================  ====================
    kind                       module                                      asked by
    =========================  ==========================================  ====================
    ``stats-cpu``              numcheck.measure._stats_numba (numba)       measure.stats
    ``stats-cuda``             numcheck.measure._stats_triton (Triton)     measure.stats
    ``telemetry-cpu``          numcheck.telemetry._fields_numba (numba)    telemetry.passes
    ``telemetry-cuda``         numcheck.telemetry._fields_triton (Triton)  telemetry.passes
    ``telemetry-cuda-on-cpu``  _fields_triton under Triton's interpreter   telemetry.passes
    =========================  ==========================================  ====================

The last serves CPU tensors only when a test substitutes it (below). numcheck.telemetry.
_quant_numba, which handles a missing numba itself, asks ``mode()``: off under "torch".

``load(kind, importer, missing)`` gives the pass's module, or None where the torch route runs:
its compiler missing (``importer`` raised ImportError: warned once, ``missing`` says what), the
pass switched off (below), or broken. ``broken(kind, why)`` is the callers' answer to a
pass that raised while it ran (a CPU or GPU its compiler cannot build for): off for the rest
of the process, warned once; the call that failed takes the torch route. Callers pass the
importer (``lambda: importlib.import_module("numcheck.telemetry._fields_numba")``, a constant
name, so tests/test_imports.py sees the edge): this module imports no pass, and no numba or
Triton itself, so it loads wherever numcheck does.

The switch, for users and tests:

* ``NUMCHECK_BACKEND=torch`` (environment): every compiled pass off, no warning; the torch
  routes run (to rule a compiled pass out when a figure looks wrong, or to time the routes).
  Unset, empty or ``auto``: compiled passes where their compiler is present (the default).
  Anything else is a UsageError at the first pass chosen. Read once, at the first choice;
  ``reset()`` reads it again.
* ``force("torch")`` / ``force("auto")``: the same in-process, for the rest of the process, or
  until the ``with`` block ends when used as a context manager (it restores what was before).
* ``substitute(kind, module)``: ``load(kind, ...)`` gives ``module`` (None: the torch route)
  whatever the mode says; as a function, or a context manager that restores the previous
  choice. Tests use it to send CPU tensors through a Triton pass run by Triton's interpreter
  (``substitute("telemetry-cuda-on-cpu", K)``: a kind with no importer, so only a substitute
  serves it) or to plant a pass that fails. A substitute that breaks becomes None until its
  ``with`` block ends.
* ``reset(kind=None)``: forget the choices of ``kind`` (its import, broken state, substitute),
  or of every kind, ``force`` and the environment's mode too (read again at the next choice).

Precedence: a substitute, then the mode (torch: None), then a pass off for the process
(compiler missing, broken), then the imported module.

``njit``: numba.njit(nogil=True) with numba's on-disk cache, or without it where numba finds no
writable place for one (numcheck installed read-only and no writable user cache directory:
there ``cache=True`` raises RuntimeError when the function is decorated, which would fail the
import of every module with a compiled loop). numba is imported when njit decorates, so a
module using it fails to import (ImportError) where numba is missing, which ``load`` answers.
numba freezes module globals into the compiled code and its cache keeps them (the cache is
keyed on the source file alone): the passes read only exact format constants that way.
"""
from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable

from numcheck.errors import UsageError

ENV = "NUMCHECK_BACKEND"
MODES = ("auto", "torch")

_UNSET = object()
_lock = threading.RLock()  # an importer may load another pass
_chosen: dict = {}  # kind -> the module load gives now, or None: the one lookup of a hot call
_imported: dict = {}  # kind -> the module its importer gave
_off: dict = {}  # kind -> why it is off for the process (compiler missing, broken)
_subs: dict = {}  # kind -> a substitute module (None: the torch route)
_mode: list = []  # [the mode in force]; empty until the first choice reads the environment


def njit(**kw):
    def deco(f):
        import numba
        try:
            return numba.njit(nogil=True, cache=True, **kw)(f)
        except RuntimeError:   # "cannot cache function ...: no locator available"
            return numba.njit(nogil=True, **kw)(f)
    return deco


def mode() -> str:
    """The mode in force: "auto" (compiled passes where present) or "torch" (none)."""
    if not _mode:
        value = os.environ.get(ENV, "").strip().lower() or "auto"
        if value not in MODES:
            raise UsageError(f"{ENV}={os.environ[ENV]!r}: use one of {', '.join(MODES)} "
                             "(torch: every compiled pass off)")
        _mode.append(value)
    return _mode[0]


def load(kind: str, importer: Callable | None = None, missing: str = "",
         errors: tuple = (ImportError,), stacklevel: int = 2):
    """The compiled pass of ``kind`` (its module), or None where the torch route runs.

    ``importer()`` imports the module, once; where it raises one of ``errors`` the pass is off
    for the process and ``missing.format(exc)`` is warned once (a RuntimeWarning; ``stacklevel``
    as the caller would give warnings.warn). ``importer`` None: only a substitute serves
    ``kind`` (or a module an earlier call imported). One dict lookup once chosen."""
    m = _chosen.get(kind, _UNSET)
    if m is not _UNSET:
        return m
    if importer is None and kind not in _subs and kind not in _imported:
        return None  # nothing chosen, nothing remembered: a later load with an importer imports
    why = None
    with _lock:
        if kind in _subs:
            m = _subs[kind]
        elif mode() == "torch" or kind in _off:
            m = None
        elif kind in _imported:
            m = _imported[kind]
        elif importer is None:  # the substitute went meanwhile
            return None
        else:
            try:
                m = _imported[kind] = importer()
            except errors as exc:
                m, why = None, missing.format(exc)
                _off[kind] = why
        _chosen[kind] = m
    if why is not None:
        warnings.warn(why, RuntimeWarning, stacklevel=stacklevel + 1)
    return m


def broken(kind: str, why: str, stacklevel: int = 2) -> None:
    """The pass of ``kind`` raised while it ran (``why`` says so): off for the rest of the
    process (a substitute: until its ``with`` block ends), ``why`` warned once (a RuntimeWarning;
    ``stacklevel`` as the caller would give warnings.warn)."""
    with _lock:
        if kind in _subs:
            if _subs[kind] is None:
                return
            _subs[kind] = None
        elif kind in _off:
            return
        else:
            _off[kind] = why
        _chosen.pop(kind, None)
    warnings.warn(why, RuntimeWarning, stacklevel=stacklevel + 1)


class _Restore:
    """A switch that took effect when made; as a context manager, undone at the block's end."""

    def __init__(self, undo: Callable[[], None]) -> None:
        self._undo = undo

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            self._undo()
            _chosen.clear()


def force(value: str) -> _Restore:
    """Every compiled pass off (``"torch"``) or back to the default (``"auto"``), in this
    process: for good, or until the ``with`` block ends. Substitutes still apply."""
    if value not in MODES:
        raise UsageError(f"backend.force({value!r}): use one of {', '.join(MODES)}")
    with _lock:
        before = list(_mode)
        _mode[:] = [value]
        _chosen.clear()

    def undo():
        _mode[:] = before
    return _Restore(undo)


def substitute(kind: str, module) -> _Restore:
    """``load(kind, ...)`` gives ``module`` (None: the torch route), whatever the mode: for
    good, or until the ``with`` block ends."""
    with _lock:
        before = _subs.get(kind, _UNSET)
        _subs[kind] = module
        _chosen.pop(kind, None)

    def undo():
        if before is _UNSET:
            _subs.pop(kind, None)
        else:
            _subs[kind] = before
    return _Restore(undo)


def reset(kind: str | None = None) -> None:
    """Forget the choices made (of ``kind``, or all): the next ``load`` imports again, a broken
    pass is tried again; with no kind, substitutes and ``force`` go too and the environment is
    read again."""
    with _lock:
        if kind is None:
            for d in (_chosen, _imported, _off, _subs):
                d.clear()
            _mode.clear()
        else:
            for d in (_chosen, _imported, _off, _subs):
                d.pop(kind, None)
