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

from .errors import UsageError
from .inputs import seeds
from .ops import Case, Kernel, OpSpec
from .run import run_case

_TARGET_CAP = 1e6  # hypothesis needs finite targets; a ratio past this is a failure anyway


def case_strategy(spec: OpSpec) -> st.SearchStrategy[Case]:
    factors = getattr(spec.grid, "factors", None)
    if not factors:
        raise UsageError(f"op {spec.name}: its grid has no factor lists to search over "
                         "(build it with numcheck.cases.make_grid)")
    keep = getattr(spec.grid, "keep", None)
    repair = getattr(spec.grid, "repair", None)
    rows = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in factors.items()})
    if repair is not None:
        rows = rows.map(repair)
    if keep is not None:
        rows = rows.filter(keep)

    def build(row: dict, seed: int) -> Case:
        params = tuple((k, v) for k, v in row.items() if k not in ("dtype", "shape", "dist"))
        return Case(spec.name, row["dtype"], tuple(row["shape"]), row["dist"], seed, params)
    return st.builds(build, rows, seeds())


def _error_ratio(r: dict) -> float:
    """How far the kernel's error is from the baseline's: what the search climbs."""
    k, b = r.get("kernel_rel_l2", 0.0), r.get("baseline_rel_l2", 0.0)
    if not math.isfinite(k):
        return _TARGET_CAP
    return min(k / b, _TARGET_CAP) if b > 0 else (0.0 if k == 0 else _TARGET_CAP)


def search_test(spec: OpSpec, kern: Kernel, device: str):
    """A hypothesis test function (call it) that searches ``spec``'s cases for ``kern``."""
    @given(case=case_strategy(spec))
    def search(case: Case) -> None:
        records = run_case(spec, kern, case, device)
        ran = [r for r in records if r["status"] != "skipped"]
        # Documented weaknesses are findings already written down: search elsewhere.
        assume(ran and not any(r["status"] == "known" for r in ran))
        for r in ran:
            if "kernel_rel_l2" in r:
                target(_error_ratio(r), label=f"{r['output']} error / baseline error")
        bad = [r for r in ran if r["status"] != "passed"]
        for r in bad:
            note(f"repro: {r['repro']}")
        assert not bad, "\n".join(f"{spec.name}/{kern.name} {r['case_id']} {r['output']}: "
                                  f"{r['reason']}\n  repro: {r['repro']}" for r in bad)
    return search
