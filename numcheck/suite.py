"""The built-in op suite's case list and its per-case check, shared by suites/ and the CLI.

A suite test is one (op, kernel, case): it runs the case, judges it against the goldens, attaches the records to the pytest
report (the plugin tallies them), skips with the kernel's reason, and fails with the records'
diagnostics (reason, worst elements, numerics state, repro command).
"""
from __future__ import annotations

import json
import math

from .ops import OPS, Case, Kernel, OpSpec, _load_builtins, family, kernels
from .run import run_case

# Fields a suite attaches to each pytest report (kept small: JUnit XML carries them too).
_SLIM = ("op", "kernel", "case_id", "output", "status", "reason", "golden", "kernel_sqnr_db",
         "baseline_sqnr_db", "kernel_max_ulp", "kernel_min_block_sqnr_db", "bound_ratio")


def suite_cases(cases: str, ops: list[str] | None = None,
                suite: str = "ops") -> list[tuple[OpSpec, Kernel, Case]]:
    """Every (op, built-in kernel, case) of the case set, in a stable order; ``suite`` picks
    the built-in ops of that family ("ops" or "quant")."""
    _load_builtins()
    out = []
    for name in sorted(ops or OPS):
        spec = OPS[name]
        if ops is None and family(spec) != suite:
            continue
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
        why = r["reason"] if r["status"] in ("failed", "error") else ""
        if r.get("golden_reason") and r.get("golden") not in ("same", "new"):
            why = (why + " | " if why else "") + f"golden {r['golden']}: {r['golden_reason']}"
        lines.append(f"{r['op']}/{r['kernel']}/{r['case_id']} {r['output']}: {why}")
        for key in ("worst_elements", "numerics", "saved_inputs", "repro"):
            if r.get(key):
                lines.append(f"  {key}: {r[key]}")
    return "\n".join(lines)


class SuiteContext:
    """What a suite test (or a user's test, through the ``numcheck`` fixture) needs: the
    device, the case set, the golden session and a way to hand records to the run.

    ``attach`` gives the records to pytest's report: a slim copy under ``numcheck`` (JUnit
    XML keeps it) and the full rows under ``numcheck_records``, which the plugin takes off the
    report in the process that collects every record (the xdist controller) before JUnit sees
    it. Workers never write golden files.
    """

    def __init__(self, device: str, case_set: str, session, record_property,
                 suite: str | None) -> None:
        self.device = device
        self.case_set = case_set
        self.session = session
        self._record_property = record_property
        self.suite = suite

    def attach(self, records: list[dict]) -> None:
        for r in records:
            if self.suite and not r.get("suite"):
                r["suite"] = self.suite
            r.setdefault("case_set", self.case_set)
        self._record_property("numcheck", json.dumps([slim(r) for r in records], default=str))
        self._record_property("numcheck_records", json.dumps(records, default=str))

    def judge(self, records: list[dict]) -> list[dict]:
        """Stamp golden verdicts, attach, and return the records that fail the test."""
        for r in records:
            if self.suite and not r.get("suite"):
                r["suite"] = self.suite
            r.setdefault("case_set", self.case_set)
        if self.session is not None:
            from .golden import GoldenError
            try:
                self.session.judge(records)
            except GoldenError as e:  # the controller sees it too and ends the run with exit 2
                for r in records:
                    r["golden"], r["golden_reason"] = "bad_golden", str(e)
                self.attach(records)
                raise
        self.attach(records)
        return [r for r in records if r["status"] in ("failed", "error")
                or (self.session is not None and self.session.failing(r))]

    def check_case(self, item) -> list[dict]:
        """Run one suite item; raises pytest's skip/fail/xfail outcomes."""
        spec, kern, case = item
        return self.check_records(run_case(spec, kern, case, self.device))

    def check_records(self, records: list[dict]) -> list[dict]:
        import pytest

        bad = self.judge(records)
        if all(r["status"] == "skipped" for r in records):
            pytest.skip(records[0]["reason"])
        if bad:
            pytest.fail(format_failures(bad), pytrace=False)
        known = [r for r in records if r["status"] == "known"]
        if known:
            pytest.xfail(format_failures(known))
        return records

    def verify(self, op: str, fn, *, fail: bool = True, **kwargs):
        """``numcheck.verify`` inside a test: same run, same goldens, same summary. Fails the
        test with the diagnostics unless ``fail=False`` (then inspect ``.passed``)."""
        import pytest

        from .run import verify
        kwargs.setdefault("cases", self.case_set)
        kwargs.setdefault("device", self.device)
        v = verify(op, fn, **kwargs)
        bad = self.judge(v.records)
        if fail and (bad or v.executed == 0):
            pytest.fail(format_failures(bad) or v.summary(), pytrace=False)
        return v
