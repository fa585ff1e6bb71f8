"""Progress of a long run per family (ops, quant, convergence, ...) with an estimate of the time
left, for the terminal.

Each family's estimate comes from its own finished tests: a convergence test trains a model for
its steps (seconds to a minute) while an op case takes milliseconds, so one shared rate would be
wrong for both. The estimate is a family's tests left times its mean test duration so far,
divided by the workers; a family with no finished test yet shows "?".

Training steps: a convergence test runs for tens of seconds, so the line also shows the steps
of the training runs in progress. ``training_step`` (called by ``numcheck.convergence.train``
each step) writes this process's current step, at most once a second, to a file in the folder
``NUMCHECK_PROGRESS_DIR`` names (the plugin sets it on a terminal; xdist workers inherit it);
``Progress.line`` sums those files. Without the variable it does nothing.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

_STEP_FILE_EVERY = 1.0  # seconds between a process's step writes: the line shows every 10 s
_last_write = [0.0]


def training_step(step: int, steps: int) -> None:
    """Report that a training run is at ``step`` (0-based) of ``steps``."""
    folder = os.environ.get("NUMCHECK_PROGRESS_DIR")
    now = time.monotonic()
    if not folder or (now - _last_write[0] < _STEP_FILE_EVERY and step + 1 < steps):
        return
    _last_write[0] = now
    try:
        (Path(folder) / f"{os.getpid()}.steps").write_text(f"{step + 1} {steps}")
    except OSError:  # the folder went away with the session: progress is best effort
        pass


def training_steps(folder: str | None) -> tuple[int, int]:
    """(steps done, steps) of the training runs last reported in ``folder``, summed."""
    done = total = 0
    for f in Path(folder).glob("*.steps") if folder else ():
        try:
            d, t = map(int, f.read_text().split())
        except (OSError, ValueError):  # being written: next time
            continue
        done, total = done + d, total + t
    return done, total


def family_of(nodeid: str) -> str:
    """A test's family: its module's name without ``test_``, which is also the suite its
    records go to (the ``numcheck`` fixture names it so)."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    module = module[:-3] if module.endswith(".py") else module
    return module[5:] if module.startswith("test_") else module


@dataclass
class _Family:
    total: int = 0
    done: int = 0
    seconds: float = 0.0  # summed test durations (worker time)


@dataclass
class Progress:
    workers: int = 1
    families: dict[str, _Family] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def collected(self, nodeids: list[str]) -> None:
        """The run's tests (once: the controller's collection, or one xdist worker's)."""
        if any(f.total for f in self.families.values()):
            return
        for nid in nodeids:
            self.families.setdefault(family_of(nid), _Family()).total += 1

    def finished(self, nodeid: str, duration: float) -> None:
        f = self.families.setdefault(family_of(nodeid), _Family())
        f.done += 1
        f.seconds += duration

    def eta(self, family: str) -> float | None:
        """Seconds left for ``family`` at its measured rate, None before its first test."""
        f = self.families[family]
        if not f.done:
            return None
        return (f.total - f.done) * f.seconds / f.done / max(self.workers, 1)

    def line(self) -> str:
        parts = []
        for name, f in self.families.items():
            if not f.total:
                continue
            left = self.eta(name)
            eta = "?" if left is None else "done" if f.done >= f.total else _clock(left)
            parts.append(f"{name} {f.done}/{f.total} {eta}")
        done, total = training_steps(os.environ.get("NUMCHECK_PROGRESS_DIR"))
        if total and done < total:
            parts.append(f"training step {done}/{total}")
        return f"numcheck {_clock(time.monotonic() - self.started)}: " + " | ".join(parts)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60}:{s % 60:02d}"
