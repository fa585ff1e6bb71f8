"""``nc.verify``: one kernel through an op's case set, each case through ``numcheck.run``.

    verify(op, fn) -> the op's grid (or the repro line's --adhoc cases) -> run.run_case per case
    -> judged records -> (golden_dir: the golden session's verdicts) -> Verification

A kernel that raises, or returns the wrong shape, dtype or device, fails that case by name; the
other cases run. The module is not named ``verify``: a submodule of that name would replace the
public function ``numcheck.verify`` on the package once imported.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from numcheck.cases.grid import Case, check_case_set
from numcheck.catalog import as_kernel, get_op
from numcheck.errors import UsageError
from numcheck.kernels import triton_interp
from numcheck.kernels.compiled import isolate_inductor_cache
from numcheck.measure import environment
from numcheck.records import Golden, Record, Status, failing
from numcheck.run import default_device, run_case


@dataclass
class Verification:
    """Result of ``nc.verify``: ``passed``, ``records`` (one ``Record`` per case and output),
    ``failures`` (the records that fail: ``numcheck.records.failing`` in the run's golden mode).
    Records with status "known" failed a rule where the kernel declares a documented weakness:
    reported, not counted as failures."""

    op: str
    kernel: str
    device: str
    cases: str
    records: list[Record]
    mode: str = "check"  # the golden mode the records were judged in

    @property
    def executed(self) -> int:
        return len({r.case_id for r in self.records if r.status != Status.SKIPPED})

    @property
    def failures(self) -> list[Record]:
        return [r for r in self.records if failing(r, self.mode)]

    @property
    def passed(self) -> bool:
        # DESIGN rule 11: a run in which nothing executed (everything skipped) fails.
        return self.executed > 0 and not self.failures

    def summary(self) -> str:
        from numcheck.report.markdown import verification_table
        return verification_table(self)


def case_from_json(op: str, text: str) -> Case:
    """A case from a repro line's ``--adhoc`` JSON (``numcheck.run.case_to_json`` writes it)."""
    try:
        d = json.loads(text)
        params = tuple((k, tuple(v) if isinstance(v, list) else v)
                       for k, v in d.get("params", {}).items())
        return Case(op, d["dtype"], tuple(d["shape"]), d["dist"], int(d["seed"]), params)
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--adhoc {text!r}: expected JSON with dtype, shape, dist, seed and "
                         f"optional params ({type(e).__name__}: {e})") from e


def verify(op: str, fn, *, kernel_name: str | None = None, cases: str = "quick",
           device: str | None = None, golden_dir=None, refresh: bool = False,
           case_ids: list[str] | None = None, save_failures: str | Path | None = None,
           adhoc: list[Case] | None = None, suite: str = "verify") -> Verification:
    """Run op's ``cases`` set ("quick" | "full") against ``fn`` and judge every case.

    fn: a callable with the op's signature (or a registered Kernel). device: default CUDA when
    present. case_ids: only these cases of the set; adhoc: exactly these cases instead (a
    repro line's --adhoc). save_failures: a folder for failing cases' inputs.
    golden_dir: compare every case with the goldens there (``<golden_dir>/<device_class>/
    <suite>.parquet``): a regression fails the case; refresh=True rewrites the rows of the
    cases that ran instead (atomically, only when they changed).
    """
    if refresh and golden_dir is None:
        raise UsageError("verify(refresh=True) needs golden_dir=: the folder to write to")
    check_case_set(cases)
    isolate_inductor_cache()  # a user's kernel may compile: never from another ISA's cache
    triton_interp.install_if_interpreting()  # Triton kernels on the CPU: exact conversions
    spec = get_op(op)
    kern = as_kernel(op, fn, kernel_name)
    device = device or default_device()
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device={device!r}: no CUDA device here; use device='cpu'")
    grid = list(adhoc) if adhoc else spec.grid(cases)
    if case_ids:
        wanted = set(case_ids)
        grid = [c for c in grid if c.id in wanted]
        unknown = wanted - {c.id for c in grid}
        if unknown:
            raise UsageError(f"unknown case id(s) for {op} in {cases!r}: {sorted(unknown)}")
    records: list[Record] = []
    for case in grid:
        records.extend(run_case(spec, kern, case, device, save_dir=save_failures))
    mode = "check"
    if golden_dir is not None:
        from numcheck.goldens.session import GoldenSession
        mode = "refresh" if refresh else "check"
        for r in records:
            r.suite, r.case_set = suite, cases
        gs = GoldenSession(golden_dir, mode, case_set=cases)
        gs.judge(records)
        if refresh:  # what ran is the golden now: its old verdicts are replaced
            gs.finish(records, environment.provenance(device))
            for r in records:
                if r.golden in (Golden.REGRESSED, Golden.MISSING, Golden.NEW,
                                Golden.INPUTS_CHANGED):
                    r.golden = Golden.REFRESHED
    return Verification(op, kern.name, device, cases, records, mode)
