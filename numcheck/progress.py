"""Progress of a long run per family (ops, quant, convergence, ...) with an estimate of the time
left, for the terminal.

Each family's estimate comes from its own finished tests: a convergence test trains a model for
its steps (seconds to a minute) while an op case takes milliseconds, so one shared rate would be
wrong for both. The estimate is a family's tests left times its mean test duration so far,
divided by the workers; a family with no finished test yet shows "?".
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


def family_of(nodeid: str) -> str:
    """A test's family: its module's name without ``test_`` (a suite's name)."""
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
        return f"numcheck {_clock(time.monotonic() - self.started)}: " + " | ".join(parts)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60}:{s % 60:02d}"
