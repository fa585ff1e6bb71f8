"""The built-in op suite's case list and its per-case check, shared by suites/ and the CLI.

A suite test is one (op, kernel, case): it runs the case, attaches the records to the pytest
report (the plugin tallies them), skips with the kernel's reason, and fails with the records'
diagnostics (reason, worst elements, numerics state, repro command).
"""
from __future__ import annotations

import json
import math

from .ops import OPS, Case, Kernel, OpSpec, _load_builtins, kernels
from .run import run_case

# Fields a suite attaches to each pytest report (kept small: JUnit XML carries them too).
_SLIM = ("op", "kernel", "case_id", "output", "status", "reason", "kernel_sqnr_db",
         "baseline_sqnr_db", "kernel_max_ulp", "kernel_min_block_sqnr_db", "bound_ratio")


def suite_cases(cases: str, ops: list[str] | None = None) -> list[tuple[OpSpec, Kernel, Case]]:
    """Every (op, built-in kernel, case) of the case set, in a stable order."""
    _load_builtins()
    out = []
    for name in sorted(ops or OPS):
        spec = OPS[name]
        for kname in sorted(kernels(name)):
            for case in spec.grid(cases):
                out.append((spec, kernels(name)[kname], case))
    return out


def case_param_id(item: tuple[OpSpec, Kernel, Case]) -> str:
    spec, kern, case = item
    return f"{spec.name}/{kern.name}/{case.id}"


def slim(record: dict) -> dict:
    out = {}
    for k in _SLIM:
        v = record.get(k)
        out[k] = None if isinstance(v, float) and not math.isfinite(v) and math.isnan(v) else v
    return out


def format_failures(records: list[dict]) -> str:
    lines = []
    for r in records:
        lines.append(f"{r['op']}/{r['kernel']}/{r['case_id']} {r['output']}: {r['reason']}")
        for key in ("worst_elements", "numerics", "saved_inputs", "repro"):
            if r.get(key):
                lines.append(f"  {key}: {r[key]}")
    return "\n".join(lines)


def check_case(item, device: str, record_property) -> list[dict]:
    """Run one suite item; returns its records. Raises pytest's skip/fail outcomes."""
    import pytest

    spec, kern, case = item
    records = run_case(spec, kern, case, device)
    record_property("numcheck", json.dumps([slim(r) for r in records], default=str))
    if all(r["status"] == "skipped" for r in records):
        pytest.skip(records[0]["reason"])
    bad = [r for r in records if r["status"] in ("failed", "error")]
    if bad:
        pytest.fail(format_failures(bad), pytrace=False)
    known = [r for r in records if r["status"] == "known"]
    if known:
        pytest.xfail(format_failures(known))
    return records
