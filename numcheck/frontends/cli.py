"""The ``numcheck`` command line: ``numcheck <command> [options]``.

Thin over the library, like the plugin. Each subcommand is one function decorated with
``@_command(name, help, arguments)``: the decorator registers it and ``_build_parser`` wires
every registered command into argparse, so adding ``run`` or ``compare`` touches nothing else.
A command returns its exit code (DESIGN.md): 0 all passed, 1 a numerical failure, 2 a usage or
environment error. argparse exits 2 on bad arguments; a ``UsageError`` raised inside a command
is printed as ``numcheck: error: <message>`` and also gives 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from numcheck.cases.grid import CASE_SETS
from numcheck.errors import UsageError
from numcheck.frontends import builtin, doctor

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, tuple[str, tuple, _Handler]] = {}


def _arg(*flags: str, **kwargs) -> tuple[tuple[str, ...], dict]:
    """One argparse argument, as the ``arguments`` entry of ``@_command``."""
    return flags, kwargs


def _command(name: str, help: str, arguments: tuple = ()) -> Callable[[_Handler], _Handler]:
    """Register ``fn(args) -> exit code`` as subcommand ``name``; ``help`` is its one-liner."""
    def register(fn: _Handler) -> _Handler:
        _COMMANDS[name] = (help, tuple(arguments), fn)
        return fn
    return register


def _build_parser() -> argparse.ArgumentParser:
    from numcheck.version import __version__

    parser = argparse.ArgumentParser(
        prog="numcheck",
        description="Numerical validation of training kernels and low-precision paths "
                    "against FP64 references.",
        epilog="exit codes: 0 all passed, 1 numerical failure, 2 usage or environment error")
    parser.add_argument("--version", action="version", version=f"numcheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, arguments, fn) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=(fn.__doc__ or help_text).strip())
        for flags, kwargs in arguments:
            p.add_argument(*flags, **kwargs)
        p.set_defaults(_handler=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``numcheck`` console script and ``python -m numcheck``; returns the
    exit code (argparse's own exits, --help and usage errors, are returned too, not raised)."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        return int(args._handler(args))
    except UsageError as e:
        print(f"numcheck: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `numcheck doctor | head`: the reader left; not an error of ours
        try:
            sys.stdout = open(_devnull(), "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return EXIT_OK


def _devnull() -> str:
    import os
    return os.devnull


# --- doctor -------------------------------------------------------------------------------------

@_command("doctor", help="describe this machine: versions, devices, dtype and SDPA support, "
                         "number formats",
          arguments=(_arg("--json", action="store_true",
                          help="print one JSON object instead of text"),))
def _doctor(args: argparse.Namespace) -> int:
    """Print what numcheck sees on this machine: library versions, the CPU and each CUDA
    device (device class, low-precision dtype support, SDPA backends), optional libraries and
    the number-format table. Paste it into bug reports."""
    report = doctor.report()
    if args.json:
        print(json.dumps(report, indent=2, allow_nan=False))
    else:
        print(doctor.render(report))
    return EXIT_OK


# --- verify -------------------------------------------------------------------------------------

def _resolve_kernel(op: str, ref: str):
    """A built-in kernel name of ``op``, or ``module:attr`` (attr may be dotted); UsageError
    naming what failed otherwise (exit 2)."""
    import importlib

    from numcheck.catalog import kernels

    shipped = kernels(op)
    if ":" not in ref:
        if ref in shipped:
            return shipped[ref]
        raise UsageError(f"--kernel {ref!r}: not a built-in kernel of {op} "
                         f"({', '.join(sorted(shipped)) or 'none'}); give module:function")
    mod_name, attr = ref.split(":", 1)
    try:
        obj = importlib.import_module(mod_name)
    except Exception as e:  # ImportError, or the module's own error at import
        raise UsageError(f"--kernel {ref!r}: cannot import {mod_name!r} "
                         f"({type(e).__name__}: {e}); is it on PYTHONPATH?") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"--kernel {ref!r}: {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


@_command("verify", help="pre-merge check of one kernel against an op's cases",
          arguments=(
              _arg("--op", required=True, help="op name, e.g. rms_norm (numcheck verify --op ?)"),
              _arg("--kernel", required=True,
                   help="module:function of your kernel, or a built-in kernel's name"),
              _arg("--cases", default="quick", choices=CASE_SETS),
              _arg("--case", action="append", dest="case_ids", default=None,
                   help="run only this case id (repeatable)"),
              _arg("--adhoc", action="append", default=None, metavar="JSON",
                   help="run this exact case instead of the set (repro lines print it)"),
              _arg("--device", default=None, help="cpu or cuda (default: cuda when present)"),
              _arg("--save-failures", default=None, metavar="DIR",
                   help="save the inputs of failing cases here (torch.save files)"),
              _arg("--golden-dir", default=None,
                   help="compare with the goldens in DIR/<device_class>/verify.parquet"),
              _arg("--refresh", action="store_true",
                   help="rewrite those goldens for the cases that ran")))
def _verify(args: argparse.Namespace) -> int:
    """Run the op's case set against one kernel and print a table of cases. Exit 0 when every
    executed case passes, 1 on a numerical failure or a kernel that fails on a case (other
    cases still run), 2 on usage errors (unknown op, kernel that cannot be imported)."""
    from numcheck.verification import case_from_json, verify

    fn = _resolve_kernel(args.op, args.kernel)
    adhoc = [case_from_json(args.op, a) for a in args.adhoc] if args.adhoc else None
    v = verify(args.op, fn, cases=args.cases, device=args.device, case_ids=args.case_ids,
               save_failures=args.save_failures, adhoc=adhoc,
               golden_dir=args.golden_dir, refresh=args.refresh,
               kernel_name=None if ":" not in args.kernel else args.kernel.split(":", 1)[1])
    print(v.summary())
    return EXIT_OK if v.passed else EXIT_FAILED


# --- fingerprint --------------------------------------------------------------------------------

@_command("fingerprint", help="how a kernel accumulates: accumulator bits, promotion, rounding, "
                              "summation order, determinism, batch invariance",
          arguments=(
              _arg("--op", required=True, help="matmul, linear, sdpa (accumulation probes); "
                   "softmax, log_softmax, rms_norm, layer_norm (determinism, batch invariance)"),
              _arg("--kernel", required=True,
                   help="module:function of your kernel, or a built-in kernel's name"),
              _arg("--dtype", default="bf16",
                   help="bf16, fp16 or fp32 (sdpa: bf16, fp32; matmul also e4m3 operands)"),
              _arg("--device", default=None, help="cpu or cuda (default: cuda when present)"),
              _arg("--json", action="store_true", help="print one JSON object"),
              _arg("--golden-dir", default=None,
                   help="compare with the fingerprint in DIR/<device_class>/fingerprint.parquet"),
              _arg("--refresh", action="store_true", help="write it there instead")))
def _fingerprint(args: argparse.Namespace) -> int:
    """Fingerprint one kernel (numcheck.forensics.kernel_fingerprint) and print each property with its evidence.
    With --golden-dir: exit 1 when a property changed against the golden recorded on this
    platform (another platform's golden: reported as drift); --refresh records it."""
    import json

    from numcheck.forensics.kernel_fingerprint import as_record, fingerprint
    from numcheck.records import Golden

    kern = _resolve_kernel(args.op, args.kernel)
    name = getattr(kern, "name", None) or args.kernel  # module:function, unique per kernel
    fp = fingerprint(args.op, getattr(kern, "fn", kern), dtype=args.dtype, device=args.device,
                     kernel_name=name)
    print(json.dumps(fp.as_dict(), indent=1, default=str) if args.json else str(fp))
    if args.golden_dir is None:
        if args.refresh:
            raise UsageError("--refresh needs --golden-dir: the folder to write to")
        return EXIT_OK
    from numcheck.measure import environment
    from numcheck.verdicts import judge as verdict
    from numcheck.goldens.session import GoldenSession

    rec = verdict.judge(as_record(fp))
    gs = GoldenSession(args.golden_dir, "refresh" if args.refresh else "check")
    gs.judge([rec])
    if args.refresh:  # (other rows of the file are not this command's: no "unused" notes)
        rep = gs.finish([rec], environment.provenance(fp.device))
        print("\n".join([f"{c.kind:>9} {'/'.join(map(str, c.key[1:4]))}: {c.metrics_line()}"
                          for c in rep.changes] + [f"wrote {p}" for p in rep.written]
                         + [f"unchanged {p}" for p in rep.unchanged]))
        return EXIT_OK
    print(f"golden: {rec.golden}" + (f": {rec.golden_reason}" if rec.golden_reason else ""))
    return EXIT_FAILED if rec.golden == Golden.REGRESSED else EXIT_OK


# --- run / refresh ------------------------------------------------------------------------------

_SELECT = (
    _arg("--suite", action="append", default=None,
         help="built-in suite to run (repeatable; default all): "
              + ", ".join(builtin.suite_names())),
    _arg("-k", dest="keyword", default=None, help="pytest -k selection within the suites"),
    _arg("-n", dest="workers", default="2", help="pytest-xdist workers (0: in process)"),
    _arg("-v", "--verbose", action="store_true",
         help="pytest -v: every failing case in full, torch's own debug log records kept"),
    _arg("--cases", default="quick", choices=CASE_SETS),
    _arg("--device", default=None, help="cpu or cuda (default: cuda when present)"),
    _arg("--golden-dir", default=None,
         help="golden folder (default: numcheck_golden_dir of your pytest ini, else golden/; "
              "an installed numcheck reads its shipped goldens beneath it)"),
)


def _pytest(args: argparse.Namespace, extra: list[str], replaces=None) -> int:
    """Run the built-in suites under pytest with the numcheck options; pytest's exit code.
    ``replaces``: a results file this run rewrites, removed once the arguments are valid, so
    that a run which writes none never leaves an older one to be reported.

    From a checkout, pytest runs in it (its pyproject settings, its golden/). From an installed
    package it runs in the current folder: the rootdir and ini file are the user's project (its
    numcheck_* keys apply; default goldens golden/ there), the shipped goldens lie beneath."""
    import importlib.util
    import os
    import shlex
    import subprocess
    from pathlib import Path

    # -p numcheck.frontends.process: glibc thresholds for numcheck's float64 temporaries (its docstring)
    cmd = [sys.executable, "-m", "pytest", *map(str, builtin.suite_files(args.suite)),
           "-v" if args.verbose else "-q", "-p", "no:cacheprovider", "-p", "numcheck.frontends.process",
           f"--numcheck-cases={args.cases}", *extra]
    if builtin.is_checkout():
        cwd = builtin.suites_dir().parent
    else:
        from numcheck.frontends.userconfig import find_config, numcheck_keys

        cwd = Path.cwd()
        ini = find_config(cwd)
        # No ini file of the user's nor one found above site-packages (their addopts,
        # filterwarnings, python_functions would apply to the suites): the suites' settings and
        # the user's numcheck_* keys alone, by -o; relative paths resolve in their rootdir.
        cmd += ["--rootdir", str(ini.parent if ini else cwd), "-c", os.devnull,
                "-o", "xfail_strict=true", "-ra"]
        for key, value in (numcheck_keys(ini) if ini else {}).items():
            cmd += ["-o", f"{key}={value}"]
    if args.keyword:
        cmd += ["-k", args.keyword]
    if args.device:
        cmd += [f"--numcheck-device={args.device}"]
    if args.golden_dir:
        cmd += [f"--numcheck-golden-dir={Path(args.golden_dir).resolve()}"]
    if str(args.workers) not in ("0", "1"):
        if importlib.util.find_spec("xdist") is None:
            raise UsageError(f"-n {args.workers}: pytest-xdist is not installed "
                             f"(pip install pytest-xdist, or -n 0)")
        cmd += ["-n", str(args.workers), "--dist", "loadgroup"]
    if replaces is not None:
        Path(replaces).unlink(missing_ok=True)
    print("+ " + shlex.join(cmd), flush=True)
    return subprocess.call(cmd, cwd=cwd, env=dict(os.environ))


def _exit_of(pytest_rc: int) -> int:
    # pytest: 0 passed, 1 tests failed, 2 interrupted, 3 internal error, 4 usage, 5 no tests.
    return {0: EXIT_OK, 1: EXIT_FAILED}.get(pytest_rc, EXIT_USAGE)


@_command("run", help="run the built-in suites on this machine's device against the goldens",
          arguments=_SELECT + (
              _arg("--strict", action="store_true",
                   help="a case without golden fails (CI); no golden is written"),
              _arg("--results", default="results/numcheck-results.parquet",
                   help="results parquet (default: %(default)s)"),
              _arg("--shard", default=None, metavar="I/N",
                   help="run every N-th case starting at the I-th (CI matrices); join the "
                        "shards' results with numcheck merge"),
              _arg("--report", default=None,
                   help="markdown report (default: beside the results, report.md)")))
def _run(args: argparse.Namespace) -> int:
    """Run the built-in suites (quick cases by default) on this machine's device, compare every
    case with the goldens, write the results parquet and a markdown report. Exit 0 when all
    passed, 1 on a numerical failure or golden regression, 2 on usage or environment errors
    (a bad golden file among them; results are still written)."""
    from pathlib import Path

    results = Path(args.results).resolve()
    report = _report_path(args, results)
    extra = [f"--numcheck-results={results}"] + (["--numcheck-strict"] if args.strict else [])
    if args.shard:
        from numcheck.goldens.shards import parse
        parse(args.shard)  # a usage error before pytest starts
        extra.append(f"--numcheck-shard={args.shard}")
    rc = _exit_of(_pytest(args, extra, replaces=results))
    if results.exists():
        from numcheck.verdicts.families import sections
        tables = sections(_write_report(results, report))
        if tables:
            print(tables)
        print(f"results: {results}\nreport:  {report} (and {report.with_suffix('.html')})")
    return rc


def _report_path(args: argparse.Namespace, results):
    """--report (the markdown file; the HTML report goes beside it), default beside the
    results; UsageError for a .html name, which the HTML report would overwrite."""
    from pathlib import Path

    report = Path(args.report).resolve() if args.report else results.with_name("report.md")
    if report.suffix == ".html":
        raise UsageError(f"--report {args.report}: names the markdown report; give a .md "
                         f"name, the HTML report is written beside it as "
                         f"{report.with_suffix('.html').name}")
    return report


def _write_report(results, report):
    """The markdown report of a results file (and its plots) at ``report``, and the
    self-contained HTML report beside it (``.html``); returns the records."""
    from numcheck.goldens.store import read_results
    from numcheck.report.markdown import markdown_report
    from numcheck.report.html import html_report

    records, prov = read_results(results)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(markdown_report(records, prov, plot_path=report), encoding="utf-8")
    report.with_suffix(".html").write_text(html_report(records, prov), encoding="utf-8")
    return records


@_command("refresh", help="rerun the selected suites and rewrite their golden rows",
          arguments=_SELECT + (
              _arg("--new-only", action="store_true",
                   help="only add rows for cases that have none"),
              _arg("--prune", action="store_true",
                   help="also remove rows of cases that no longer exist"),
              _arg("--allow-nonfinite", action="store_true",
                   help="store NaN/inf the FP64 reference does not have (refused otherwise)")))
def _refresh(args: argparse.Namespace) -> int:
    """Rerun the selected suites (--suite, -k) and rewrite the goldens of the cases that ran;
    prints per case what changed (old -> new). Files whose rows did not change are not
    rewritten. Review the diff (git diff golden/, or the .txt beside each file) and commit."""
    extra = ["--numcheck-refresh-new-only" if args.new_only else "--numcheck-refresh"]
    if args.prune:
        extra.append("--numcheck-prune")
    if args.allow_nonfinite:
        extra.append("--numcheck-refresh-allow-nonfinite")
    return _exit_of(_pytest(args, extra))


# --- compare / show / report --------------------------------------------------------------------

@_command("compare", help="per-case changes between two goldens or results files",
          arguments=(_arg("old"), _arg("new"),
                     _arg("--all", action="store_true", help="also list unchanged rows")))
def _compare(args: argparse.Namespace) -> int:
    """Compare NEW with OLD row by row under the golden regression rules (regressions first).
    Exit 1 when a row regressed, 0 otherwise, 2 for unreadable files."""
    from numcheck.goldens.store import read_table
    from numcheck.goldens.regression import compare_tables
    from numcheck.report.markdown import change_table

    tables = []
    for name in (args.old, args.new):
        got = read_table(name, results=True)
        if got is None:
            raise UsageError(f"{name}: no such file")
        tables.append(got[0])
    changes, unchanged = compare_tables(*tables, same=args.all)
    print(change_table(changes, show_same=args.all, unchanged=unchanged))
    return EXIT_FAILED if any(c.regressed for c in changes) else EXIT_OK


@_command("diff", help="where two telemetry runs part ways: the first rows whose statistics "
                       "differ beyond a noise band, and whose digests differ",
          arguments=(_arg("files", nargs="+", metavar="FILE",
                          help="A B, or A1 A2 ... -- B: telemetry parquet files; the last is "
                               "run B, the ones before it runs of A (repeats: the band is "
                               "measured from them)"),
                     _arg("--first", type=int, default=10,
                          help="divergences listed (default: %(default)s)"),
                     _arg("--rtol", type=float, default=None,
                          help="the relative band without repeats (default: 2^-8)"),
                     _arg("--html", metavar="PATH", default=None,
                          help="also write the page: the first divergences and per module x "
                               "step heatmaps of the excess over the band and of the digests")))
def _diff(args: argparse.Namespace) -> int:
    """Align the rows of run B with those of run A (step, rank, module, op, role, pass,
    recipe) in A's execution order and list the first rows whose statistics differ beyond the
    band, and, where both runs recorded digests (watch(..., digests=True)), whose bits differ
    (docs/telemetry.md, "Where two runs part ways"). Exit 1 when they diverge, 0 when not, 2
    for unreadable files."""
    from numcheck.telemetry.divergence import RTOL, diff
    if len(args.files) < 2:
        raise UsageError("numcheck diff: give two telemetry files, A B (or A1 A2 ... -- B)")
    *runs, b = args.files
    got = diff(runs if len(runs) > 1 else runs[0], b,
               rtol=RTOL if args.rtol is None else args.rtol)
    print(got.summary(first=args.first))
    if args.html:
        from numcheck.telemetry.divergence_html import diff_html
        path = Path(args.html)
        try:
            path.write_text(diff_html(got, first=args.first))
        except OSError as e:
            raise UsageError(f"numcheck diff --html {str(path)!r}: cannot write it ({e})") from e
        print(f"page: {path}")
    return EXIT_FAILED if got else EXIT_OK


@_command("show", help="a golden or results file as sorted text (git textconv driver)",
          arguments=(_arg("file"),))
def _show(args: argparse.Namespace) -> int:
    """Print FILE as text, one sorted line per row. As a git textconv driver it makes `git diff`
    of goldens readable: git config diff.numcheck.textconv "numcheck show" and a line
    `*.parquet diff=numcheck` in .gitattributes."""
    from numcheck.goldens.store import show
    print(show(args.file), end="")
    return EXIT_OK


@_command("report", help="markdown report of a results file (for a PR comment), or HTML",
          arguments=(_arg("results"), _arg("--out", default=None, help="write here, not stdout "
                                                 "(and the HTML report beside it)"),
                     _arg("--html", default=None, metavar="FILE",
                          help="write only the self-contained HTML report to FILE")))
def _report(args: argparse.Namespace) -> int:
    """Markdown for a pull-request comment: summary, failures and regressions with repro
    commands, worst cases per op (with --out: the convergence plots and the HTML report beside
    it). --html: one self-contained HTML file to open in a browser (docs/report.md)."""
    from pathlib import Path

    from numcheck.report.markdown import markdown_report

    if args.html:
        from numcheck.goldens.store import read_results
        from numcheck.report.html import html_report
        out = Path(args.html)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(html_report(*read_results(args.results)), encoding="utf-8")
        print(f"wrote {out.resolve()}")
    elif args.out:
        _write_report(args.results, Path(args.out))
    else:
        from numcheck.goldens.store import read_results
        print(markdown_report(*read_results(args.results)), end="")
    return EXIT_OK


# --- inspect ------------------------------------------------------------------------------------

@_command("inspect", help="train a model a few steps under numcheck.telemetry: per-layer "
                          "statistics, what a recipe would do, the first NaN/Inf producer",
          arguments=(
              _arg("--model", default=None,
                   help="mlp, tiny_lm, tiny_dit, or module:attr (a callable seed -> "
                        "(model, task, lr), as numcheck.convergence.models.build)"),
              _arg("--recipe", default=None, help="recipe whose quantizers are measured "
                   "(fp8_tensor fp8_row fp8_block mxfp8 mxfp6 mxfp4 nvfp4 ...)"),
              _arg("--what-if", action="append", default=[], metavar="RECIPE",
                   help="another recipe measured on the same tensors (repeatable)"),
              _arg("--shadow", action="store_true",
                   help="float64 shadows: each layer's own error and the accumulated one"),
              _arg("--loss", default=None, metavar="MODULE:ATTR",
                   help="a callable (model, batch) -> loss; default: model.loss(batch), else "
                        "the loss in model(batch)'s output (a 0-d tensor, .loss or "
                        "['loss'])"),
              _arg("--steps", type=int, default=5),
              _arg("--every", type=int, default=1, metavar="N",
                   help="record statistics on every N-th step; the producer check covers "
                        "every step (default: %(default)s)"),
              _arg("--merge", nargs="+", default=None, metavar="PARQUET",
                   help="merge per-rank telemetry files instead of running a model"),
              _arg("--nproc", type=int, default=1, metavar="N", help="train on N ranks "
                   "(DDP; gloo, NCCL on N GPUs), merged (default: %(default)s)"),
              _arg("--out", default="results/telemetry",
                   help="folder for telemetry.parquet and the heatmap (default: %(default)s)")))
def _inspect(args: argparse.Namespace) -> int:
    """Train the model for --steps steps (fp32) under numcheck.telemetry.watcher, write the
    records (parquet), a per-layer x step heatmap (png) and the telemetry page (html:
    heatmaps of every statistic), print the last step's per-layer table and the first
    non-finite producer (--nproc N: N DDP ranks, their rank*.parquet merged, the producer's
    rank named). Exit 1 when a NaN/Inf was produced, 0 otherwise."""
    from numcheck.telemetry import inspect as ins

    if (args.model is None) == (args.merge is None) or (args.merge and args.nproc != 1):
        raise UsageError("give --model (run a model, on --nproc N ranks) or --merge (join "
                         "per-rank files; without --nproc)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame, where, producer = (ins.merge_files(args.merge), None, None) if args.merge else \
        ins.run_model(args.model, args.nproc, out, recipe=args.recipe, loss=args.loss,
                      what_if=tuple(args.what_if), shadow=args.shadow, steps=args.steps,
                      every=args.every)
    if frame is None:   # torchrun's ranks but 0 (rank 0 reports; an exit 1 here would make
        return EXIT_OK  # torchrun stop rank 0 while it writes)
    frame.to_parquet(out / "telemetry.parquet", index=False)
    print(ins.table(frame))
    if producer:
        print(producer)
    png = ins.plot(frame, out / "telemetry.png") if not frame.empty else None
    title = f"numcheck inspect: {args.model or f'{len(args.merge)} merged files'}"
    page = ins.write_html(frame, out / "telemetry.html", producer=producer, title=title)
    print(f"records: {out / 'telemetry.parquet'} ({len(frame)} rows)"
          + (f"\nplot:    {png}" if png else "") + f"\npage:    {page}")
    return EXIT_FAILED if where else EXIT_OK


# --- plan ---------------------------------------------------------------------------------------

@_command("plan", help="per linear layer, the cheapest candidate format whose what-if "
                       "statistics stay within the limits",
          arguments=(_arg("records", nargs="*", metavar="PARQUET",
                          help="sensitivity records (nc.telemetry.sensitivity); or --model"),
                     _arg("--model", default=None, help="measure this model first: a "
                          "built-in or planted name (mlp_outliers) or module:attr (as inspect)"),
                     _arg("--loss", default=None, metavar="MODULE:ATTR",
                          help="a callable (model, batch) -> loss (as for inspect)"),
                     _arg("--batches", type=int, default=2, help="with --model"),
                     _arg("--candidates", default="nvfp4,mxfp8,bf16",
                          help="comma-separated recipe names (default: %(default)s)"),
                     _arg("--limit", action="append", default=[], metavar="NAME=VALUE",
                          help="override a limit (VALUE none: off): gemm_drop_db "
                               "saturation_pts underflow_pct worst_block_drop_db "
                               "min_gemm_sqnr_db"),
                     _arg("--verify", action="store_true",
                          help="train the plan and the cheapest uniform recipe through the "
                               "convergence gate (a built-in or planted --model)"),
                     _arg("--out", default="results/plan",
                          help="folder for plan.json (and sensitivity.parquet with --model)")))
def _plan(args: argparse.Namespace) -> int:
    """Per linear layer, the cheapest candidate within the limits (docs/telemetry.md, "Which
    layers can take which format"): print it with why each layer left the cheapest format,
    write plan.json (numcheck converge --plan). Exit 1 when --verify's gate fails the plan."""
    from numcheck.telemetry.planner import plan

    if bool(args.records) == bool(args.model):
        raise UsageError("numcheck plan: give sensitivity parquet files or --model (not both)")
    limits = {}
    for item in args.limit:
        name, sep, value = item.partition("=")
        try:
            limits[name] = None if value.lower() == "none" else float(value if sep else "?")
        except ValueError as e:
            raise UsageError(f"--limit {item!r}: write NAME=VALUE, VALUE a number or none") from e
    candidates = tuple(c for c in args.candidates.split(",") if c)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = args.records
    if args.model:
        from numcheck.telemetry.inspect import measure_sensitivity
        records = measure_sensitivity(args.model, args.batches, candidates, args.loss)
        records.to_parquet(out / "sensitivity.parquet", index=False)
        print(f"records: {out / 'sensitivity.parquet'} ({len(records)} rows)")
    got = plan(records, candidates=candidates, limits=limits)
    print(got.summary())
    print(f"plan: {got.to_json(out / 'plan.json')}")
    if not args.verify:
        return EXIT_OK
    if not args.model or ":" in args.model:
        raise UsageError("--verify trains a built-in or planted model: give --model NAME")
    run, passed = got.verify(args.model)
    print(run.table())
    return EXIT_OK if passed else EXIT_FAILED


# --- init ---------------------------------------------------------------------------------------

@_command("init", help="set numcheck up in a repository: pytest ini keys, CI workflow, "
                       ".gitattributes textconv line, a first test",
          arguments=(_arg("--root", default=".", help="the repository's root (default: .)"),
                     _arg("--force", action="store_true",
                          help="overwrite numcheck's own files (workflow, example test) where "
                               "they differ; shared files only ever get lines added")))
def _init(args: argparse.Namespace) -> int:
    """Write the pytest ini keys, .github/workflows/numcheck.yml (a CPU job and a GPU job on a
    self-hosted runner), the .gitattributes textconv line (and set the driver in this clone)
    and a first test. A rerun changes nothing; a file that differs is kept unless --force.
    Exit 2 when the root is not a folder or a configuration file cannot be parsed."""
    from numcheck.frontends.scaffold import init_project, render
    print(render(init_project(args.root, force=args.force)))
    return EXIT_OK


# --- merge --------------------------------------------------------------------------------------

@_command("merge", help="join the results files of a sharded run (numcheck run --shard I/N)",
          arguments=(_arg("files", nargs="+", help="every shard's results parquet"),
                     _arg("--results", default="results/numcheck-results.parquet",
                          help="merged results parquet (default: %(default)s)"),
                     _arg("--report", default=None,
                          help="markdown report (default: beside the results, report.md)")))
def _merge(args: argparse.Namespace) -> int:
    """Join the shards' results into one results file and report, as one unsharded run would
    have written them, and judge the whole run: exit 1 on a failing record or an op that
    executed no case in any shard (DESIGN rule 11), 2 when a shard is missing, repeated or of
    another run."""
    from pathlib import Path

    from numcheck.goldens.store import write_results
    from numcheck.goldens.shards import merge, summary

    records, prov = merge(args.files)
    results = Path(args.results).resolve()
    report = _report_path(args, results)
    write_results(results, records, prov)
    _write_report(results, report)
    lines, failed = summary(records, prov.get("golden_mode", "check"))
    print("\n".join([f"merged {prov['merged_shards']} shards ({len(args.files)} files)", *lines,
                     f"results: {results}", f"report:  {report}"]))
    return EXIT_FAILED if failed else EXIT_OK


# --- explain ------------------------------------------------------------------------------------

@_command("explain", help="what a known weakness id means (ids appear in summaries and reasons)",
          arguments=(_arg("id", nargs="?", default=None,
                          help="a known weakness id; without one, the list of ids"),))
def _explain(args: argparse.Namespace) -> int:
    """Print a known weakness: what happens, why, which side is right, where it was
    measured. The ids are those a run's summary lists under "known"."""
    from numcheck.verdicts.findings import FINDINGS, explain

    if args.id is not None and args.id not in FINDINGS:
        raise UsageError(f"{args.id!r}: no such known weakness; known ids:\n{explain()}")
    print(explain(args.id))
    return EXIT_OK


# --- converge -----------------------------------------------------------------------------------

@_command("converge", help="short paired training runs per precision recipe, gated",
          arguments=(
              _arg("--model", action="append", default=None,
                   help="mlp, tiny_lm or tiny_dit (repeatable; default all), or a planted "
                        "model: mlp_outliers, tiny_lm_outliers (numcheck plan's test bed)"),
              _arg("--recipe", action="append", default=None,
                   help="recipe name (repeatable; default every recipe): fp32 bf16 fp8_tensor "
                        "fp8_row fp8_block mxfp8 mxfp4 nvfp4 nvfp4_rht_sr ..."),
              _arg("--steps", type=int, default=None),
              _arg("--seeds", type=int, default=None, help="number of paired seeds"),
              _arg("--cases", default="quick", choices=CASE_SETS),
              _arg("--plan", default=None, metavar="PLAN_JSON",
                   help="also train this per-layer plan (numcheck plan's plan.json) as "
                        "recipe 'plan'"),
              _arg("--out", default="results/convergence",
                   help="folder for the plot (<model>.png), table and curves parquet")))
def _converge(args: argparse.Namespace) -> int:
    """Train each model under each recipe with the same initial weights and data order as the
    fp32 reference (per seed), print the loss-gap table, write the curves (parquet, golden
    schema), the table and a loss-vs-step plot. Exit 1 when a recipe diverges, leaves its band
    against bf16, saturates or produces NaN/inf."""
    import warnings
    from pathlib import Path

    from numcheck.measure import environment
    from numcheck.convergence import MODELS, converge
    from numcheck.goldens.store import write_results
    from numcheck.records import failing

    out = Path(args.out)
    records = []
    recipes = args.recipe
    if args.plan:
        from numcheck.convergence.recipes import DEFAULT_RECIPES
        from numcheck.telemetry.planner import Plan
        recipes = {**{r: None for r in (args.recipe or DEFAULT_RECIPES)},
                   "plan": Plan.from_json(args.plan)}
    for model in args.model or list(MODELS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = converge(model, recipes=recipes, steps=args.steps,
                           seeds=None if args.seeds is None else range(args.seeds),
                           cases=args.cases, device="cpu", out_dir=out)
        print(run.table())
        print(f"plot: {out / (model + '.png')}\n")
        records += run.records()
    path = write_results(out / "curves.parquet", records, environment.provenance("cpu"))
    print(f"curves: {path}")
    return EXIT_FAILED if any(failing(r) for r in records) else EXIT_OK
