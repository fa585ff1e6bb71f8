"""pytest plugin (entry point ``pytest11: numcheck``): thin glue over the library.

* options ``--numcheck-*`` with matching ini keys: case set, device, golden folder and mode
  (``--numcheck-strict``, ``--numcheck-refresh``, ``--numcheck-refresh-new-only``), results file;
* markers ``cuda`` (skipped with the reason where no CUDA device is present) and ``slow``;
* the ``numcheck`` fixture (a ``numcheck.frontends.context.SuiteContext``): ``numcheck.verify(op, fn)`` and
  ``numcheck.check_case(item)`` judge cases against the goldens inside any test;
* records travel on the test reports (``record_property``), so under pytest-xdist they reach
  the controller, which alone writes goldens and the results file, once, at the end;
* a terminal summary (cases, passed, regressed, improved, new, missing golden, skipped with
  reasons, known weaknesses by id), and DESIGN rule 11: a run in which an op executed nothing
  fails;
* ``--numcheck-shard I/N`` (numcheck.goldens.shards: rule 11 then moves to ``numcheck merge``);
  progress lines on a terminal (numcheck.frontends.progress); torch's debug log records kept out of a
  numcheck test's captured log, and one GPU per xdist worker on CUDA machines with several.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from numcheck.cases.grid import CASE_SETS
from numcheck.verdicts.findings import cite
from numcheck.records import Golden, Record, Status, from_json

_KEY = pytest.StashKey["_Run"]()
# pytest_runtest_logreport receives no config: the plugin keeps the session's config here, a
# stack (an in-process pytester session runs inside another and must hand it back).
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
        self.progress = None  # numcheck.frontends.progress.Progress on a terminal, else None
        self.progress_shown = 0.0  # when the last progress line was written
        self.steps_dir = ""  # where training runs report their steps (numcheck.frontends.progress)
        self.heartbeat = None  # set() stops the heartbeat thread
        self.collection = ""  # a shard's: numcheck.goldens.shards.collection_id of what it collected

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
    _opt(g, parser, "shard", "run only shard I/N of the collected items (CI matrices; "
         "numcheck merge joins the shards' results files)", default=None)
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
    from numcheck.run import default_device
    return _get(config, "device") or default_device()


def golden_mode(config: pytest.Config) -> str:
    flags = [f for f in ("strict", "refresh", "refresh_new_only") if _get(config, f)]
    if len(flags) > 1:
        raise pytest.UsageError("--numcheck-strict, --numcheck-refresh and "
                                "--numcheck-refresh-new-only exclude each other: pick one")
    return {"strict": "strict", "refresh": "refresh",
            "refresh_new_only": "refresh-new"}.get(flags[0] if flags else "", "check")


def golden_path(config: pytest.Config) -> Path:
    """The run's golden folder: the option or ini key, relative to the rootdir; never inside
    the installed package (its shipped goldens are read beneath this folder, not written)."""
    from numcheck.frontends import builtin

    path = Path(_get(config, "golden_dir") or "golden")
    if not path.is_absolute():
        path = Path(config.rootpath) / path
    shipped = builtin.golden_dir()
    if shipped is not None and not builtin.is_checkout() and \
            path.resolve().is_relative_to(shipped.resolve().parent.parent):
        raise pytest.UsageError(f"--numcheck-golden-dir {path}: inside the installed numcheck "
                                f"package; give a folder of your repository (default: golden/ "
                                f"under the rootdir)")
    return path


def shard(config: pytest.Config) -> tuple[int, int] | None:
    """The run's shard (I, N), or None for a whole run."""
    from numcheck.goldens import shards
    from numcheck.errors import UsageError

    text = _get(config, "shard")
    if not text:
        return None
    try:
        got = shards.parse(text)
    except UsageError as e:
        raise pytest.UsageError(str(e)) from None
    if golden_mode(config).startswith("refresh") or _get(config, "prune"):
        raise pytest.UsageError("--numcheck-shard with --numcheck-refresh/-new-only/--prune: a "
                                "shard would write only its share of each golden file; refresh "
                                "unsharded")
    return got


def _selected_part(config: pytest.Config) -> bool:
    """Does the run select part of the case set (-k, -m, a shard)? Golden rows that no case
    of it ran are then not "unused", and --numcheck-prune would delete live rows."""
    opt = config.option
    part = bool(opt.keyword or opt.markexpr or getattr(opt, "deselect", None) or
                getattr(opt, "lf", False) or (getattr(opt, "maxfail", 0) or 0) > 0 or
                any("::" in str(a) for a in config.args)) or shard(config) is not None
    if part and _get(config, "prune"):
        raise pytest.UsageError("--numcheck-prune with a selection (-k, -m, node ids, --deselect, "
                                "--lf, -x/--maxfail, a shard) would delete the golden rows of "
                                "every case it left out: prune with the whole case set")
    return part


def _session(config: pytest.Config):
    from numcheck.frontends import builtin
    from numcheck.goldens.session import GoldenSession

    # the built-in suites of an installed package: their shipped goldens lie beneath the user's
    base = builtin.golden_dir() if not builtin.is_checkout() and \
        builtin.runs_builtin_suites([str(a) for a in config.args]) else None
    return GoldenSession(golden_path(config), golden_mode(config),
                         allow_nonfinite=bool(_get(config, "refresh_allow_nonfinite")),
                         prune=bool(_get(config, "prune")), case_set=case_set(config),
                         base_dir=base, partial=_selected_part(config))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device; skipped with the reason without one")
    config.addinivalue_line("markers", "slow: long-running; run with --numcheck-slow")
    golden_mode(config)  # option conflicts are usage errors before anything runs
    golden_path(config)
    _selected_part(config)
    from numcheck.kernels import triton_interp as _triton_interp
    _triton_interp.install_if_interpreting()  # users' Triton kernels in the CPU interpreter
    config.stash[_KEY] = _Run()
    _start_progress(config)
    _CONFIG.append(config)
    from hypothesis import settings

    from numcheck.cases.strategies import register_profiles
    register_profiles()
    settings.load_profile(case_set(config))


def worker_gpu(worker_id: str, count: int) -> int | None:
    """The GPU of xdist worker ``gwK`` on a machine with ``count`` GPUs: K mod count (workers
    beyond the count share round-robin); None with fewer than two GPUs."""
    if count < 2 or not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        return None
    return int(worker_id[2:]) % count


def _pin_worker_gpu(config: pytest.Config) -> None:
    """Under pytest-xdist on a machine with several GPUs, one device per worker: the worker's
    current CUDA device, which "cuda" (the default device and --numcheck-device=cuda) means.
    An explicit --numcheck-device=cuda:N is left as given. Called by the session fixture of
    numcheck's tests on CUDA only: other test sessions never get a CUDA context from it."""
    wid = getattr(config, "workerinput", {}).get("workerid", "")
    if not wid or ":" in (_get(config, "device") or ""):
        return
    import torch
    if not torch.cuda.is_available():
        return
    idx = worker_gpu(wid, torch.cuda.device_count())
    if idx is not None:
        torch.cuda.set_device(idx)


# Library noise in a numcheck test's warnings, none of it the user's: torch's own deprecated
# internals, and numpy's overflow warnings inside Triton's CPU interpreter (a compiled kernel
# overflows to inf silently; the verdict judges the inf). Only on tests using the fixture.
_NUMCHECK_ITEM_MARKS = (
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter"),
)


class _QuietTorch(logging.Filter):
    """Keeps torch's own records below WARNING out of the captured log of a test that uses
    numcheck: torch.__trace alone logs ~2000 empty DEBUG lines for one compiled kernel (its
    structured-trace payloads are for tlparse). ``-v`` keeps them; other tests are untouched."""

    active = False  # set per test: does it use the numcheck fixture?

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.active or record.levelno >= logging.WARNING or \
            not (record.name == "torch" or record.name.startswith("torch."))


_QUIET = _QuietTorch()


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    handler = getattr(config.pluginmanager.get_plugin("logging-plugin"), "report_handler", None)
    if handler is not None and config.get_verbosity() <= 0:
        handler.addFilter(_QUIET)


def pytest_runtest_setup(item: pytest.Item) -> None:
    _QUIET.active = "numcheck" in getattr(item, "fixturenames", ())


def pytest_unconfigure(config: pytest.Config) -> None:
    if _KEY in config.stash:
        _stop_progress(config)
    if config in _CONFIG:
        _CONFIG.remove(config)


@pytest.hookimpl(trylast=True)  # the shard's share of what -k and -m left
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    part = shard(config)
    if part is not None:
        from numcheck.goldens import shards
        collected = shards.collection_id([it.nodeid for it in items])
        config.stash[_KEY].collection = collected
        if hasattr(config, "workeroutput"):  # an xdist worker: the controller records it
            config.workeroutput["numcheck_collection"] = collected
        items[:], dropped = shards.select(items, part, key=lambda it: it.nodeid)
        config.hook.pytest_deselected(items=dropped)

    no_cuda = None if torch.cuda.is_available() else pytest.mark.skip(
        reason="needs a CUDA device: torch.cuda.is_available() is False on this machine")
    no_slow = None if _get(config, "slow") else pytest.mark.skip(
        reason="slow: run with --numcheck-slow")
    for item in items:
        if "numcheck" in getattr(item, "fixturenames", ()):
            for mark in _NUMCHECK_ITEM_MARKS:
                item.add_marker(mark)
        if no_cuda and "cuda" in item.keywords:
            item.add_marker(no_cuda)
        if no_slow and "slow" in item.keywords:
            item.add_marker(no_slow)


@pytest.fixture(scope="session")
def _numcheck_golden_session(pytestconfig: pytest.Config):
    from numcheck.kernels.compiled import isolate_inductor_cache
    # Before any kernel of a numcheck test compiles (a user's own torch.compile included):
    # inductor's cache per CPU capability (numcheck.kernels.compiled). Only sessions using numcheck.
    isolate_inductor_cache()
    if suite_device(pytestconfig).startswith("cuda"):
        _pin_worker_gpu(pytestconfig)
    return _session(pytestconfig)


@pytest.fixture(scope="session")
def _numcheck_case_memo():
    """The suites' shared per-case work (numcheck.run.CaseMemo): a case's kernels run one after
    another and share its inputs, FP64 reference and baseline. One per session."""
    from numcheck.run import CaseMemo
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
    from numcheck.frontends.context import SuiteContext

    from numcheck.frontends.progress import family_of
    suite = family_of(str(request.node.fspath))
    return SuiteContext(suite_device(request.config), case_set(request.config),
                        _numcheck_golden_session, record_property, suite, _numcheck_case_memo,
                        verbose=request.config.get_verbosity() > 0)


# Seconds between progress lines: often enough to see a run move, rarely enough not to bury the
# test output between them.
_PROGRESS_EVERY = 10.0


def _start_progress(config: pytest.Config) -> None:
    """Progress lines on a terminal (NUMCHECK_PROGRESS=1 forces them, =0 turns them off);
    never in an xdist worker, never into a file or pipe. A line after a test finishes, and from
    a heartbeat thread while a long test (a training run) keeps the terminal quiet; training
    steps come through a folder the workers write to (numcheck.frontends.progress)."""
    import os
    import sys
    import tempfile
    import threading

    from numcheck.frontends.progress import Progress

    want = os.environ.get("NUMCHECK_PROGRESS", "")
    if hasattr(config, "workerinput") or want == "0" or (want != "1" and not sys.stdout.isatty()):
        return
    workers = getattr(config.option, "numprocesses", None)
    run = config.stash[_KEY]
    run.progress = Progress(workers=workers if isinstance(workers, int) else 1)
    run.progress_shown = run.progress.started
    run.steps_dir = tempfile.mkdtemp(prefix="numcheck-progress-")
    os.environ["NUMCHECK_PROGRESS_DIR"] = run.steps_dir  # before xdist starts its workers
    run.heartbeat = threading.Event()
    threading.Thread(target=_heartbeat, args=(config, run.heartbeat), daemon=True).start()


def _heartbeat(config: pytest.Config, stop) -> None:
    run = config.stash[_KEY]
    while not stop.wait(1.0):
        if run.progress.families and time.monotonic() - run.progress_shown >= _PROGRESS_EVERY:
            _write_progress(config)


def _stop_progress(config: pytest.Config) -> None:
    import os
    import shutil

    run = config.stash[_KEY]
    if run.progress is None:
        return
    run.heartbeat.set()
    os.environ.pop("NUMCHECK_PROGRESS_DIR", None)
    shutil.rmtree(run.steps_dir, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    prog = session.config.stash[_KEY].progress
    if prog is not None:
        prog.collected([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    collected = getattr(node, "workeroutput", {}).get("numcheck_collection")
    if collected and _CONFIG:
        _CONFIG[-1].stash[_KEY].collection = collected


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    if _CONFIG and _CONFIG[-1].stash[_KEY].progress is not None:
        _CONFIG[-1].stash[_KEY].progress.collected(list(ids))


def _show_progress(config: pytest.Config, report: pytest.TestReport) -> None:
    run = config.stash[_KEY]
    run.progress.finished(report.nodeid, report.duration)
    if time.monotonic() - run.progress_shown >= _PROGRESS_EVERY:
        _write_progress(config)


def _write_progress(config: pytest.Config) -> None:
    run = config.stash[_KEY]
    run.progress_shown = time.monotonic()
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is None:
        return
    # in one process a test may be running, its output captured: the line goes past that
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        tw = getattr(tr, "_tw", None)  # under xdist the dots leave the line open
        if tw is not None and tw.width_of_current_line:
            tr.write("\n")
        tr.write_line(run.progress.line())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _CONFIG and hasattr(_CONFIG[-1], "workerinput"):
        return  # an xdist worker: the report, records included, goes to the controller as is
    # Full records ride on the report to this process; take them off before JUnit XML sees them.
    full = [v for n, v in report.user_properties if n == "numcheck_records"]
    if full:
        report.user_properties = [(n, v) for n, v in report.user_properties
                                  if n != "numcheck_records"]
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    if _CONFIG and _CONFIG[-1].stash[_KEY].progress is not None:
        _show_progress(_CONFIG[-1], report)
    if full and _CONFIG:
        _CONFIG[-1].stash[_KEY].add(from_json(full[-1]), report.duration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return  # xdist worker: the controller judges the whole run and writes the files
    run = config.stash[_KEY]
    from numcheck.measure import environment
    from numcheck.errors import UsageError

    from numcheck.goldens.shards import idle_ops
    run.idle = idle_ops(run.records)
    # a shard's ops may have run elsewhere: rule 11 is numcheck merge's (numcheck.goldens.shards)
    failed = bool(run.idle) and shard(config) is None
    if shard(config) is not None and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK  # a share can be empty; merge judges the run
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
        from numcheck.goldens.store import write_results
        part = shard(config)
        write_results(results, run.records, {**prov, "golden_mode": golden_mode(config),
                                             "case_set": case_set(config),
                                             **({"shard": "%d/%d" % part,
                                                 "collection": run.collection}
                                                if part else {})})
        run.finish_lines.append(f"results: {results} ({len(run.records)} records)")
    if run.golden_error:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
    elif failed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_DRIFT_LINES = 5
_GOLDEN_LINES = 10  # golden changes listed by default: a broken kernel regresses every case


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash[_KEY]
    if not run.status and not run.golden_error:
        return
    tr = terminalreporter
    tr.section("numcheck")
    s, g = run.status, run.golden
    tr.write_line(f"case set {case_set(config)}, goldens {golden_mode(config)}: "
                  f"{sum(s.values())} records, {s['passed']} passed, {s['failed']} failed, "
                  f"{s['error']} kernel errors, {s['known']} known weaknesses, "
                  f"{s['skipped']} skipped")
    if g:
        tr.write_line("golden: " + ", ".join(f"{g[k]} {k}" for k in
                                             ("same", "regressed", "drift", "improved", "new",
                                              "missing", "inputs_changed") if g[k]))
    for op in sorted(run.by_op):
        c = run.by_op[op]
        tr.write_line(f"  {op:16} {c['passed']:5} passed {c['failed'] + c['error']:4} failed "
                      f"{c['skipped']:5} skipped  {run.seconds[op]:7.1f} s")
    known = Counter(r.known for r in run.records if r.status == Status.KNOWN)
    for k, n in known.most_common():
        tr.write_line(f"  known   {n:5}: {cite(k)}")
    for reason, n in run.skip_reasons.most_common(8):
        tr.write_line(f"  skipped {n:5}: {reason}")
    changed = [r for r in run.records if r.golden in (
        Golden.REGRESSED, Golden.MISSING, Golden.INPUTS_CHANGED, Golden.IMPROVED)]
    shown = changed if config.get_verbosity() > 0 else changed[:_GOLDEN_LINES]
    for r in shown:
        tr.write_line(f"  {r.golden.value:>14} {r.label}: {r.golden_reason}",
                      red=r.golden != Golden.IMPROVED)
    if len(changed) > len(shown):  # every one is in the results file and the report
        tr.write_line(f"  {'':14} ... and {len(changed) - len(shown)} more golden changes "
                      f"(pytest -v, numcheck report)", red=True)
    drift = [r for r in run.records if r.golden == Golden.DRIFT]
    for r in drift[:_DRIFT_LINES]:  # not failing: the first few say what moved, and where
        tr.write_line(f"  {'drift':>14} {r.label}: {r.golden_reason}")
    if len(drift) > _DRIFT_LINES:
        tr.write_line(f"  {'':14} ... and {len(drift) - _DRIFT_LINES} more drift rows "
                      f"(numcheck report)")
    for line in run.finish_lines:
        tr.write_line(f"  {line}")
    part = shard(config)
    for op in run.idle:
        if part:
            tr.write_line(f"  op {op} executed no case in shard {part[0]}/{part[1]}: numcheck "
                          f"merge checks it over all shards (DESIGN rule 11)")
        else:
            tr.write_line(f"  FAILED: op {op} executed no case (every case skipped) - DESIGN "
                          f"rule 11", red=True)
    if run.golden_error:
        tr.write_line(f"  ERROR (exit 2): {run.golden_error}", red=True)
