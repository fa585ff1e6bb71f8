"""DESIGN rule 3: which of an op's declared conventions a failing kernel follows.

Where a case reaches a convention (a fully masked row of attention), a failing kernel may
follow another choice of it than the one it is held to. The same results are judged under each
other choice (the caller's ``judge_under``: the reference and the baseline under those
conventions, the kernel's outputs as they are); the choice under which fewest records fail
(fewer than now) and no output errs more is the one the kernel follows: its records are
reported, failing, with the convention's name and the remedy, not as an error statistic.
"""
from __future__ import annotations

import math
from typing import Callable

from numcheck.cases.grid import Case
from numcheck.records import Record, Status
from numcheck.registry import Kernel, OpSpec

Conventions = tuple[tuple[str, str], ...]


def followed(spec: OpSpec, kern: Kernel, case: Case, mine: Conventions, records: list[Record],
             judge_under: Callable[[Conventions], list[Record]]) -> list[Record]:
    """``records`` (judged under ``mine``), or the records under the choice the kernel follows,
    each failing with the convention named and how to declare it."""
    held_to = dict(mine)
    fits = []  # (records failing, convention, choice, what it means, the records under it)
    for conv in (c for c in spec.conventions if c.applies(case)):
        for choice, meaning in conv.choices:
            if choice == held_to[conv.name]:
                continue
            theirs = judge_under(tuple(sorted({**held_to, conv.name: choice}.items())))
            if all(_no_larger(a, b) for a, b in zip(theirs, records)):
                fits.append((_failing(theirs), conv, choice, meaning, theirs))
    fits = [f for f in fits if f[0] < _failing(records)]
    if not fits:
        return records
    least = min(f[0] for f in fits)
    (_, conv, choice, meaning, theirs), *same = [f for f in fits if f[0] == least]
    held = "it declares" if conv.name in dict(kern.conventions) else "the op's default"
    also = "".join(f" (or {f[2]!r}: the same on what this case judges)" for f in same)
    told = (f"convention {conv.name}: the kernel follows {choice!r} ({meaning}){also}, not "
            f"{held_to[conv.name]!r} ({held}); if that is meant, declare it: "
            f"nc.kernel({spec.name!r}, conventions={{{conv.name!r}: {choice!r}}})")
    for r in theirs:
        if r.status in (Status.PASSED, Status.FAILED, Status.KNOWN):
            under = (f"under {choice!r} every rule passes" if r.status == Status.PASSED
                     else f"under {choice!r}: {r.reason}")
            r.status, r.known, r.reason = Status.FAILED, "", f"{told}; {under}"
    return theirs


def _failing(records: list[Record]) -> int:
    return sum(r.status == Status.FAILED for r in records)


def _no_larger(a: Record, b: Record) -> bool:
    """a (under another convention) passes, or errs no more than b."""
    if a.status == Status.PASSED:
        return True
    if a.kernel_stats is None or b.kernel_stats is None:
        return False
    mine, theirs = a.kernel_stats.rel_l2, b.kernel_stats.rel_l2
    return a.output == b.output and (math.isnan(theirs) or mine <= theirs)
