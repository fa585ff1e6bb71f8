"""The built-in suites' case list and their per-case check, shared by suites/ and the CLI.

A suite test is one (op, kernel, case): it runs the case, judges it against the goldens,
attaches the records to the pytest report (the plugin tallies them), skips with the kernel's reason, and fails with the records'
diagnostics (reason, worst elements, numerics state, repro command).
"""
from __future__ import annotations

import json
import math

from numcheck.verdicts import judge as verdict
from numcheck.cases.grid import Case
from numcheck.catalog import get_op, kernels
from numcheck.catalog import ops as catalog_ops
from numcheck.goldens.store import GoldenError
from numcheck.records import Golden, Record, Status, failing, to_json
from numcheck.registry import Kernel, OpSpec
from numcheck.run import CaseMemo, run_case
from numcheck.verification import verify

# Fields a suite attaches to each pytest report (kept small: JUnit XML carries them too).
_SLIM = ("op", "kernel", "case_id", "output", "status", "reason", "golden", "kernel_sqnr_db",
         "baseline_sqnr_db", "kernel_max_ulp", "kernel_min_block_sqnr_db", "bound_ratio")


def suite_cases(cases: str, ops: list[str] | None = None,
                suite: str = "ops") -> list[tuple[OpSpec, Kernel, Case]]:
    """Every (op, built-in kernel, case) of the case set, in a stable order: op by op, case by
    case, the kernels of a case one after another (they share its inputs, reference and
    baseline: numcheck.run.CaseMemo); ``suite`` picks the built-in ops of that suite ("ops" or
    "quant")."""
    out = []
    for spec in [get_op(n) for n in sorted(ops)] if ops else catalog_ops(suite):
        kerns = kernels(spec.name)
        names = sorted(kerns)
        for case in spec.grid(cases):
            out.extend((spec, kerns[k], case) for k in names)
    return out


def case_param_id(item: tuple[OpSpec, Kernel, Case]) -> str:
    spec, kern, case = item
    return f"{spec.name}/{kern.name}/{case.id}"


def slim(record: Record) -> dict:
    row = record.as_row()
    out = {}
    for k in _SLIM:
        v = row.get(k)
        out[k] = None if isinstance(v, float) and math.isnan(v) else v
    return out


# Failing cases shown in full by default; pytest -v shows every one (DESIGN "Failure
# diagnostics": a failure reads as a few lines, not a log)
_CASES_SHOWN = 5


def format_failures(records: list[Record], *, all_cases: bool = False) -> str:
    """A failure's text: per failing case its label, one line per failing output (the rule
    and the golden verdict; a kernel error's first line), then the worst output's worst
    elements, the numerics state and the repro command, which the outputs of a case share. The first ``_CASES_SHOWN`` cases
    in full unless ``all_cases``, one line each for the rest."""
    by_case: dict[tuple, list[Record]] = {}
    for r in records:
        by_case.setdefault((r.op, r.kernel, r.case_id), []).append(r)
    lines = []
    for n, (key, recs) in enumerate(by_case.items()):
        why = [_why(r) for r in recs]
        if n >= _CASES_SHOWN and not all_cases:
            lines.append(f"{'/'.join(map(str, key))}: {len(recs)} failing output(s)")
            continue
        lines.append(f"{'/'.join(map(str, key))}:")
        lines += [f"  {r.output}: {w if all_cases else _first_line(w)}" for r, w in zip(recs, why)]
        worst = min(recs, key=_rank)
        for key_ in ("worst_elements", "numerics", "saved_inputs", "repro"):
            if getattr(worst, key_):
                lines.append(f"  {key_}: {getattr(worst, key_)}")
    if len(by_case) > _CASES_SHOWN and not all_cases:
        lines.append(f"{len(by_case)} failing cases, the first {_CASES_SHOWN} in full "
                     f"(pytest -v: all of them)")
    return "\n".join(lines)


def _first_line(text: str) -> str:
    """A kernel error's text can be a compiler's hundreds of lines: its first, and a count."""
    head, _, rest = text.partition("\n")
    return f"{head} ({rest.count(chr(10)) + 1} more lines: pytest -v)" if rest else head


def _rank(r: Record) -> tuple:
    """The output whose diagnostics a case shows: one that has them, the lowest SQNR first."""
    sqnr = r.kernel_stats.sqnr_db if r.kernel_stats is not None else None
    return (not (r.worst_elements or r.repro),
            sqnr if isinstance(sqnr, float) and not math.isnan(sqnr) else math.inf)


def _why(r: Record) -> str:
    why = r.reason if r.status in (Status.FAILED, Status.ERROR, Status.KNOWN) else ""
    prefix = f"{r.output}: "
    # the rule's texts repeat the output's name (after a known weakness's citation too)
    why = why.replace(" | " + prefix, " | ").replace("): " + prefix, "): ")
    why = why[len(prefix):] if why.startswith(prefix) else why
    if r.golden_reason and r.golden not in (None, Golden.SAME, Golden.NEW):
        why = (why + " | " if why else "") + f"golden {r.golden}: {r.golden_reason}"
    return why


class SuiteContext:
    """What a suite test (or a user's test, through the ``numcheck`` fixture) needs: the
    device, the case set, the golden session and a way to hand records to the run.

    ``attach`` gives the records to pytest's report: a slim copy under ``numcheck`` (JUnit
    XML keeps it) and the full rows under ``numcheck_records``, which the plugin takes off the
    report in the process that collects every record (the xdist controller) before JUnit sees
    it. Workers never write golden files.
    """

    def __init__(self, device: str, case_set: str, session, record_property,
                 suite: str | None, memo: CaseMemo | None = None,
                 verbose: bool = False) -> None:
        self.device = device
        self.case_set = case_set
        self.session = session
        self._record_property = record_property
        self.suite = suite
        self.memo = memo  # the last case's shared work (numcheck.run.CaseMemo), or None
        self.verbose = verbose  # pytest -v: every failing case in full

    @property
    def mode(self) -> str:
        return self.session.mode if self.session is not None else "check"

    def attach(self, records: list[Record]) -> None:
        self._record_property("numcheck", json.dumps([slim(r) for r in records], default=str))
        self._record_property("numcheck_records", to_json(records))

    def judge(self, records: list[Record]) -> list[Record]:
        """Judge what is not judged yet (numcheck.verdicts.judge), stamp golden verdicts, attach, and
        return the records that fail the test (numcheck.records.failing)."""
        for r in records:
            if self.suite and not r.suite:
                r.suite = self.suite
            r.case_set = r.case_set or self.case_set
            if r.status == Status.PENDING:
                verdict.judge(r, _policy_of(r.op))
        error = None
        if self.session is not None:
            try:
                self.session.judge(records)
            except GoldenError as e:  # the controller sees it too and ends the run with exit 2
                error = str(e)
        if error is not None:
            import pytest

            for r in records:
                r.golden, r.golden_reason = Golden.BAD_GOLDEN, error
            self.attach(records)
            first, self.session.error_reported = not self.session.error_reported, True
            # the file and the remedy once, not a traceback per case (issue 31)
            pytest.fail(error if first else f"{error.partition(': ')[0]}: unusable golden file, "
                        "reported above; the run ends with exit 2", pytrace=False)
        self.attach(records)
        return [r for r in records if failing(r, self.mode)]

    def check_case(self, item) -> list[Record]:
        """Run one suite item; raises pytest's skip/fail/xfail outcomes."""
        spec, kern, case = item
        return self.check_records(run_case(spec, kern, case, self.device, memo=self.memo))

    def check_records(self, records: list[Record]) -> list[Record]:
        import pytest

        bad = self.judge(records)
        if all(r.status == Status.SKIPPED for r in records):
            pytest.skip(records[0].reason)
        if bad:
            pytest.fail(format_failures(bad, all_cases=self.verbose), pytrace=False)
        known = [r for r in records if r.status == Status.KNOWN]
        if known:
            pytest.xfail(format_failures(known, all_cases=self.verbose))
        return records

    def fingerprint(self, op: str, fn, *, dtype: str = "bf16", kernel_name: str | None = None):
        """``numcheck.fingerprint`` inside a test, recorded under this test module's suite: a
        property that changed against the golden (recorded on this platform) fails the test;
        ``--numcheck-refresh`` records it. Returns the Fingerprint."""
        from numcheck.forensics.kernel_fingerprint import as_record, fingerprint

        fp = fingerprint(op, fn, dtype=dtype, device=self.device, kernel_name=kernel_name)
        self.check_records([as_record(fp, suite=self.suite or "fingerprint")])
        return fp

    def telemetry_floors(self, frame_or_t, *, model: str, inputs=None,
                         repro: str | None = None, device: str | None = None):
        """A model's telemetry gated against its golden inside a test: the per-layer floors
        and ceilings over the steps of ``frame_or_t`` (a ``numcheck.telemetry.watcher``'s
        ``Telemetry`` or its ``records()`` frame: SQNR, worst-block SQNR, shadow SQNRs,
        underflow, saturation, non-finite elements; numcheck.telemetry.floors), one record per
        (module, op, role, recipe) under this test module's suite, case ids
        ``<model>/<recipe>/<module>/<role>``. A floor below the golden's beyond its slack (or a
        NaN statistic) fails the test naming layer, statistic, golden and now;
        ``--numcheck-refresh`` records them. ``inputs``: anything hashed into the input digest
        (seed, data version); ``repro``: the command that reruns it (default: this pytest
        test); ``device``: where the model ran (default: the run's device), whose device class
        keys the golden. Returns the records."""
        import os

        import pytest

        from numcheck.telemetry.floors import as_records

        if repro is None:
            current = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
            repro = f"pytest '{current}'" if current else ""
        records = as_records(frame_or_t, model=model, suite=self.suite or "telemetry",
                             device=device or self.device, inputs=inputs, repro=repro)
        if not records:
            pytest.fail(f"telemetry of {model}: no gated statistic in the frame (watch it with "
                        f"recipe=, what_if= or shadow=True, and call t.step())", pytrace=False)
        return self.check_records(records)

    def verify(self, op: str, fn, *, fail: bool = True, **kwargs):
        """``numcheck.verify`` inside a test: same run, same goldens, same summary. Fails the
        test with the diagnostics unless ``fail=False`` (then inspect ``.passed``)."""
        import pytest

        kwargs.setdefault("cases", self.case_set)
        kwargs.setdefault("device", self.device)
        v = verify(op, fn, **kwargs)
        v.mode = self.mode
        bad = self.judge(v.records)
        if fail and (bad or v.executed == 0):
            pytest.fail(format_failures(bad, all_cases=self.verbose) or v.summary(),
                        pytrace=False)
        return v


def _policy_of(op: str):
    """The registered op's policy, None for a name no op has (a model, a quantization path): a
    record's family asks for it where its rules need one (the ops family)."""
    names = {spec.name: spec for spec in catalog_ops()}
    return names[op].policy if op in names else None
