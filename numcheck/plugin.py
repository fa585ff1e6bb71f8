"""pytest plugin (entry point ``pytest11: numcheck``): thin glue over the library.

* markers ``cuda`` (skipped with the reason where no CUDA device is present) and ``slow``
  (skipped unless ``--numcheck-slow``);
* ``--numcheck-cases quick|full`` picks the case set of the built-in suites and the hypothesis
  profile of the same name; ``--numcheck-device`` the device they run on;
* suite tests attach their records to the report (``record_property("numcheck", ...)``, which
  also lands in JUnit XML and crosses from xdist workers to the controller); the controller
  counts them, prints a summary with wall time per op, and fails the run when an op executed
  no case at all (DESIGN rule 11: everything skipped is not a pass).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

CASE_SETS = ("quick", "full")
_KEY = pytest.StashKey["_Tally"]()
# pytest_runtest_logreport receives no config: the plugin keeps the session's config here.
_CONFIG: list[pytest.Config] = []


class _Tally:
    """Records seen by this process (the controller under xdist)."""

    def __init__(self) -> None:
        self.status: Counter = Counter()
        self.by_op: dict[str, Counter] = defaultdict(Counter)
        self.seconds: dict[str, float] = defaultdict(float)
        self.skip_reasons: Counter = Counter()
        self.idle: list[str] = []

    def add(self, records: list[dict], duration: float) -> None:
        for r in records:
            self.status[r["status"]] += 1
            self.by_op[r["op"]][r["status"]] += 1
            if r["status"] == "skipped":
                self.skip_reasons[r["reason"]] += 1
        if records:
            self.seconds[records[0]["op"]] += duration


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("numcheck")
    group.addoption("--numcheck-slow", action="store_true", default=False,
                    help="also run tests marked slow (long sweeps, big tensors)")
    group.addoption("--numcheck-cases", choices=CASE_SETS, default=None,
                    help="case set of the built-in suites and hypothesis profile "
                         "(default: ini numcheck_cases, else quick)")
    group.addoption("--numcheck-device", default=None,
                    help="device the suites run kernels on (default: cuda when present)")
    parser.addini("numcheck_cases", "default case set: quick or full", default="quick")


def case_set(config: pytest.Config) -> str:
    value = config.getoption("--numcheck-cases") or config.getini("numcheck_cases") or "quick"
    if value not in CASE_SETS:
        raise pytest.UsageError(f"numcheck_cases = {value!r}: use quick or full")
    return value


def suite_device(config: pytest.Config) -> str:
    from .run import default_device
    return config.getoption("--numcheck-device") or default_device()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device; skipped with the reason without one")
    config.addinivalue_line("markers", "slow: long-running; run with --numcheck-slow")
    config.stash[_KEY] = _Tally()
    _CONFIG[:] = [config]
    from hypothesis import settings

    from .inputs import register_profiles
    register_profiles()
    settings.load_profile(case_set(config))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    no_cuda = None if torch.cuda.is_available() else pytest.mark.skip(
        reason="needs a CUDA device: torch.cuda.is_available() is False on this machine")
    no_slow = None if config.getoption("--numcheck-slow") else pytest.mark.skip(
        reason="slow: run with --numcheck-slow")
    for item in items:
        if no_cuda and "cuda" in item.keywords:
            item.add_marker(no_cuda)
        if no_slow and "slow" in item.keywords:
            item.add_marker(no_slow)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    for name, value in report.user_properties:
        if name == "numcheck" and _CONFIG:
            _CONFIG[0].stash[_KEY].add(json.loads(value), report.duration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # xdist worker: the controller judges the whole run
    tally = session.config.stash[_KEY]
    tally.idle = [op for op, c in tally.by_op.items()
                  if not (c["passed"] + c["failed"] + c["error"] + c["known"])]
    if tally.idle and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    tally = config.stash[_KEY]
    if not tally.status:
        return
    tr = terminalreporter
    tr.section("numcheck")
    s = tally.status
    tr.write_line(f"case set {case_set(config)}: {sum(s.values())} records, {s['passed']} passed, "
                  f"{s['failed']} failed, {s['error']} kernel errors, {s['known']} known "
                  f"weaknesses (docs/findings.md), {s['skipped']} skipped")
    for op in sorted(tally.by_op):
        c = tally.by_op[op]
        tr.write_line(f"  {op:16} {c['passed']:5} passed {c['failed'] + c['error']:4} failed "
                      f"{c['skipped']:5} skipped  {tally.seconds[op]:7.1f} s")
    for reason, n in tally.skip_reasons.most_common(8):
        tr.write_line(f"  skipped {n:5}: {reason}")
    for op in tally.idle:
        tr.write_line(f"  FAILED: op {op} executed no case (every case skipped) - DESIGN rule 11",
                      red=True)
