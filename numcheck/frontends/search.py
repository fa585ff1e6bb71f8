"""Hypothesis search beside the enumerated grid (DESIGN rule 8).

The search draws cases from an op's factor lists (every value the ``full`` grid knows, combined
freely, with fresh seeds), runs them, and steers toward the worst error with
``hypothesis.target``. It gates on the absolute and baseline rules only (never on goldens), and
a failure prints one shell line that reruns the case (``numcheck verify ... --adhoc '{...}'``).
"""
from __future__ import annotations

import math

from hypothesis import assume, given, note, target
from hypothesis import strategies as st

from numcheck.errors import UsageError
from numcheck.cases.strategies import seeds
from numcheck.cases.grid import Case, Grid
from numcheck.records import Record, Status, failing
from numcheck.registry import Kernel, OpSpec
from numcheck.run import run_case

_TARGET_CAP = 1e6  # hypothesis needs finite targets; a ratio past this is a failure anyway


def case_strategy(spec: OpSpec) -> st.SearchStrategy[Case]:
    grid = spec.grid
    if not isinstance(grid, Grid):
        raise UsageError(f"op {spec.name}: its grid has no factor lists to search over "
                         "(build it with numcheck.cases.grid.make_grid)")
    rows = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in grid.all_factors.items()})
    if grid.repair is not None:
        rows = rows.map(grid.repair)
    if grid.keep is not None:
        rows = rows.filter(grid.keep)
    return st.builds(grid.case, rows, seeds())


def _error_ratio(r: Record) -> float:
    """How far the kernel's error is from the baseline's: what the search climbs."""
    k, b = r.kernel_stats.rel_l2, r.baseline_stats.rel_l2
    if not math.isfinite(k):
        return _TARGET_CAP
    return min(k / b, _TARGET_CAP) if b > 0 else (0.0 if k == 0 else _TARGET_CAP)


def search_test(spec: OpSpec, kern: Kernel, device: str):
    """A hypothesis test function (call it) that searches ``spec``'s cases for ``kern``."""
    @given(case=case_strategy(spec))
    def search(case: Case) -> None:
        records = run_case(spec, kern, case, device)
        ran = [r for r in records if r.status != Status.SKIPPED]
        # Documented weaknesses are findings already written down: search elsewhere.
        assume(ran and not any(r.status == Status.KNOWN for r in ran))
        for r in ran:
            if r.kernel_stats is not None and r.baseline_stats is not None:
                target(_error_ratio(r), label=f"{r.output} error / baseline error")
        bad = [r for r in ran if failing(r)]
        for r in bad:
            note(f"repro: {r.repro}")
        assert not bad, "\n".join(f"{r.label}: {r.reason}\n  repro: {r.repro}" for r in bad)
    return search
