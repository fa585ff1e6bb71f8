"""pytest plugin (entry point ``pytest11: numcheck``): thin glue over the library.

* options ``--numcheck-*`` with matching ini keys: case set, device, golden folder and mode
  (``--numcheck-strict``, ``--numcheck-refresh``, ``--numcheck-refresh-new-only``), results file;
* markers ``cuda`` (skipped with the reason where no CUDA device is present) and ``slow``;
* the ``numcheck`` fixture (a ``numcheck.suite.SuiteContext``): ``numcheck.verify(op, fn)`` and
  ``numcheck.check_case(item)`` judge cases against the goldens inside any test;
* records travel on the test reports (``record_property``), so under pytest-xdist they reach
  the controller, which alone writes goldens and the results file, once, at the end;
* a terminal summary (cases, passed, regressed, improved, new, missing golden, skipped with
  reasons), and DESIGN rule 11: a run in which an op executed nothing fails.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest

from .cases import CASE_SETS
from .records import Golden, Record, Status, from_json

_KEY = pytest.StashKey["_Run"]()
# pytest_runtest_logreport receives no config: the plugin keeps the session's config here.
_CONFIG: list[pytest.Config] = []


class _Run:
    """Records seen by this process (the controller under xdist)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.status: Counter = Counter()
        self.golden: Counter = Counter()
        self.by_op: dict[str, Counter] = defaultdict(Counter)
        self.seconds: dict[str, float] = defaultdict(float)
        self.skip_reasons: Counter = Counter()
        self.idle: list[str] = []
        self.finish_lines: list[str] = []
        self.golden_error: str = ""

    def add(self, records: list[Record], duration: float) -> None:
        self.records.extend(records)
        for r in records:
            self.status[r.status] += 1
            self.by_op[r.op][r.status] += 1
            if r.golden:
                self.golden[r.golden] += 1
            if r.status == Status.SKIPPED:
                self.skip_reasons[r.reason] += 1
        if records:
            self.seconds[records[0].op] += duration


def _opt(group, parser, name: str, help: str, ini_type: str | None = None, **kw) -> None:
    group.addoption(f"--numcheck-{name}", dest=f"numcheck_{name.replace('-', '_')}",
                    help=help + f" (ini: numcheck_{name.replace('-', '_')})", **kw)
    parser.addini(f"numcheck_{name.replace('-', '_')}", help, type=ini_type)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("numcheck")
    _opt(g, parser, "cases", "case set of the suites and hypothesis profile: quick or full",
         choices=CASE_SETS, default=None)
    _opt(g, parser, "device", "device the suites run kernels on (default: cuda when present)",
         default=None)
    _opt(g, parser, "golden-dir", "folder of the parquet goldens (default: golden/ under the "
         "rootdir)", default=None)
    _opt(g, parser, "strict", "CI mode: a case without golden fails; no golden is written",
         "bool", action="store_true", default=None)
    _opt(g, parser, "refresh", "rewrite the golden rows of the cases that ran", "bool",
         action="store_true", default=None)
    _opt(g, parser, "refresh-new-only", "add golden rows for cases that have none; keep the "
         "others", "bool", action="store_true", default=None)
    _opt(g, parser, "refresh-allow-nonfinite", "let refresh store a NaN/inf the FP64 reference "
         "does not have", "bool", action="store_true", default=None)
    _opt(g, parser, "prune", "remove golden rows that belong to no case of the run's case set",
         "bool", action="store_true", default=None)
    _opt(g, parser, "results", "write every record of the run to this parquet file", default=None)
    _opt(g, parser, "slow", "also run tests marked slow (long sweeps, big tensors)", "bool",
         action="store_true", default=None)


def _get(config: pytest.Config, name: str):
    v = config.getoption(f"numcheck_{name}")
    return v if v is not None else config.getini(f"numcheck_{name}")


def case_set(config: pytest.Config) -> str:
    value = _get(config, "cases") or "quick"
    if value not in CASE_SETS:
        raise pytest.UsageError(f"numcheck_cases = {value!r}: use quick or full")
    return value


def suite_device(config: pytest.Config) -> str:
    from .run import default_device
    return _get(config, "device") or default_device()


def golden_mode(config: pytest.Config) -> str:
    flags = [f for f in ("strict", "refresh", "refresh_new_only") if _get(config, f)]
    if len(flags) > 1:
        raise pytest.UsageError("--numcheck-strict, --numcheck-refresh and "
                                "--numcheck-refresh-new-only exclude each other: pick one")
    return {"strict": "strict", "refresh": "refresh",
            "refresh_new_only": "refresh-new"}.get(flags[0] if flags else "", "check")


def _session(config: pytest.Config):
    from .session import GoldenSession

    gdir = _get(config, "golden_dir") or "golden"
    path = Path(gdir)
    if not path.is_absolute():
        path = Path(config.rootpath) / path
    return GoldenSession(path, golden_mode(config),
                         allow_nonfinite=bool(_get(config, "refresh_allow_nonfinite")),
                         prune=bool(_get(config, "prune")), case_set=case_set(config))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device; skipped with the reason without one")
    config.addinivalue_line("markers", "slow: long-running; run with --numcheck-slow")
    golden_mode(config)  # option conflicts are usage errors before anything runs
    from . import _triton_interp
    _triton_interp.install_if_interpreting()  # users' Triton kernels in the CPU interpreter
    config.stash[_KEY] = _Run()
    _CONFIG[:] = [config]
    from hypothesis import settings

    from .inputs import register_profiles
    register_profiles()
    settings.load_profile(case_set(config))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    no_cuda = None if torch.cuda.is_available() else pytest.mark.skip(
        reason="needs a CUDA device: torch.cuda.is_available() is False on this machine")
    no_slow = None if _get(config, "slow") else pytest.mark.skip(
        reason="slow: run with --numcheck-slow")
    for item in items:
        if no_cuda and "cuda" in item.keywords:
            item.add_marker(no_cuda)
        if no_slow and "slow" in item.keywords:
            item.add_marker(no_slow)


@pytest.fixture(scope="session")
def _numcheck_golden_session(pytestconfig: pytest.Config):
    from .compiled import isolate_inductor_cache
    # Before any kernel of a numcheck test compiles (a user's own torch.compile included):
    # inductor's cache per CPU capability (numcheck.compiled). Only sessions using numcheck.
    isolate_inductor_cache()
    return _session(pytestconfig)


@pytest.fixture(scope="session")
def _numcheck_case_memo():
    """The suites' shared per-case work (numcheck.run.CaseMemo): a case's kernels run one after
    another and share its inputs, FP64 reference and baseline. One per session."""
    from .run import CaseMemo
    memo = CaseMemo()
    yield memo
    memo.clear()


@pytest.fixture
def numcheck(request: pytest.FixtureRequest, record_property, _numcheck_golden_session,
             _numcheck_case_memo):
    """numcheck inside a test: ``numcheck.verify(op, fn)`` runs an op's cases against ``fn``,
    judges them against the goldens (suite = the test module's name without ``test_``) and
    records them into this run's summary, goldens and results; ``numcheck.check_case(item)``
    does the same for one (op, kernel, case) of the built-in suites."""
    from .suite import SuiteContext

    module = Path(str(request.node.fspath)).stem
    suite = module[5:] if module.startswith("test_") else module
    return SuiteContext(suite_device(request.config), case_set(request.config),
                        _numcheck_golden_session, record_property, suite, _numcheck_case_memo)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _CONFIG and hasattr(_CONFIG[0], "workerinput"):
        return  # an xdist worker: the report, records included, goes to the controller as is
    # Full records ride on the report to this process; take them off before JUnit XML sees them.
    full = [v for n, v in report.user_properties if n == "numcheck_records"]
    if full:
        report.user_properties = [(n, v) for n, v in report.user_properties
                                  if n != "numcheck_records"]
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    if full and _CONFIG:
        _CONFIG[0].stash[_KEY].add(from_json(full[-1]), report.duration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return  # xdist worker: the controller judges the whole run and writes the files
    run = config.stash[_KEY]
    from . import environment
    from .errors import UsageError

    run.idle = [op for op, c in run.by_op.items()
                if not sum(n for st, n in c.items() if st != Status.SKIPPED)]
    failed = bool(run.idle)
    prov = environment.provenance(suite_device(config))
    try:
        if run.records:
            rep = _session(config).finish(run.records, prov)
            run.finish_lines = rep.lines()
    except UsageError as e:  # a bad golden file: exit 2, results below still written
        run.golden_error = str(e)
    bad = [r for r in run.records if r.golden == Golden.BAD_GOLDEN]
    if bad and not run.golden_error:
        run.golden_error = bad[0].golden_reason
    results = _get(config, "results")
    if results:
        from .golden import write_results
        write_results(results, run.records, {**prov, "golden_mode": golden_mode(config)})
        run.finish_lines.append(f"results: {results} ({len(run.records)} records)")
    if run.golden_error:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
    elif failed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_DRIFT_LINES = 5


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash[_KEY]
    if not run.status and not run.golden_error:
        return
    tr = terminalreporter
    tr.section("numcheck")
    s, g = run.status, run.golden
    tr.write_line(f"case set {case_set(config)}, goldens {golden_mode(config)}: "
                  f"{sum(s.values())} records, {s['passed']} passed, {s['failed']} failed, "
                  f"{s['error']} kernel errors, {s['known']} known weaknesses "
                  f"(docs/findings.md), {s['skipped']} skipped")
    if g:
        tr.write_line("golden: " + ", ".join(f"{g[k]} {k}" for k in
                                             ("same", "regressed", "drift", "improved", "new",
                                              "missing", "inputs_changed") if g[k]))
    for op in sorted(run.by_op):
        c = run.by_op[op]
        tr.write_line(f"  {op:16} {c['passed']:5} passed {c['failed'] + c['error']:4} failed "
                      f"{c['skipped']:5} skipped  {run.seconds[op]:7.1f} s")
    for reason, n in run.skip_reasons.most_common(8):
        tr.write_line(f"  skipped {n:5}: {reason}")
    for r in run.records:
        if r.golden in (Golden.REGRESSED, Golden.MISSING, Golden.INPUTS_CHANGED,
                        Golden.IMPROVED):
            tr.write_line(f"  {r.golden.value:>14} {r.label}: {r.golden_reason}",
                          red=r.golden != Golden.IMPROVED)
    drift = [r for r in run.records if r.golden == Golden.DRIFT]
    for r in drift[:_DRIFT_LINES]:  # not failing: the first few say what moved, and where
        tr.write_line(f"  {'drift':>14} {r.label}: {r.golden_reason}")
    if len(drift) > _DRIFT_LINES:
        tr.write_line(f"  {'':14} ... and {len(drift) - _DRIFT_LINES} more drift rows "
                      f"(numcheck report)")
    for line in run.finish_lines:
        tr.write_line(f"  {line}")
    for op in run.idle:
        tr.write_line(f"  FAILED: op {op} executed no case (every case skipped) - DESIGN rule 11",
                      red=True)
    if run.golden_error:
        tr.write_line(f"  ERROR (exit 2): {run.golden_error}", red=True)
