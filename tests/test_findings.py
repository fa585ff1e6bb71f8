"""Known weaknesses by id (numcheck.verdicts.findings): every id a built-in kernel or the environment
table can give is explained by `numcheck explain`, from the package; reasons and the run's
summary cite the id, not a file of the repository."""
from __future__ import annotations


from numcheck.frontends import cli
from numcheck.measure import environment
from numcheck.verdicts import judge as verdict
from numcheck.catalog import kernels, ops
from numcheck.verdicts.findings import FINDINGS, cite
from numcheck.records import Status

pytest_plugins = ["pytester"]


def _known_ids() -> set[str]:
    """Every value the built-in kernels' known_failure functions return, over both case sets,
    both device types and every output name."""
    seen = set()
    for spec in ops():
        outputs = ["out"] + [f"grad_{a}" for a in spec.grad_args]
        for kern in kernels(spec.name).values():
            if kern.known_failure is None:
                continue
            for cases in ("quick", "full"):
                for case in spec.grid(cases):
                    for device in ("cpu", "cuda"):
                        for out in outputs:
                            got = kern.known_failure(case, device, out)
                            if got is not None:
                                seen.add(got)
    return seen


def test_every_builtin_known_failure_is_an_explained_id():
    ids = _known_ids()
    assert len(ids) >= 6  # the catalog declares at least that many weaknesses
    assert ids <= set(FINDINGS), ids - set(FINDINGS)
    env_ids = {finding for _, finding in environment.ENVIRONMENT_FAILURES}
    assert env_ids <= set(FINDINGS), env_ids - set(FINDINGS)


def test_explain_prints_one_finding_and_lists_all(capsys):
    assert cli.main(["explain", "tf32-is-not-fp32"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("tf32-is-not-fp32\n" + FINDINGS["tf32-is-not-fp32"].title)
    assert "10 mantissa bits" in text
    assert cli.main(["explain"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listing] == list(FINDINGS)


def test_explain_of_an_unknown_id_is_a_usage_error(capsys):
    assert cli.main(["explain", "no-such-thing"]) == 2
    err = capsys.readouterr().err
    assert "'no-such-thing': no such known weakness" in err and "tf32-is-not-fp32" in err


def test_a_known_record_cites_the_id_and_a_users_text_as_given():
    from numcheck.catalog import get_op
    from tests._support import golden_record

    # 20x the baseline's error: the baseline rule fails
    rec = golden_record(kernel_rel_l2=0.02, kernel_sqnr_db=34.0, baseline_rel_l2=1e-3,
                        baseline_sqnr_db=60.0, status="pending",
                        known="torch-cpu-gelu-vectorized-erf")
    verdict.judge(rec, get_op("rms_norm").policy)
    assert rec.status == Status.KNOWN, rec.reason
    assert "numcheck explain torch-cpu-gelu-vectorized-erf" in rec.reason
    assert cite("my kernel's own note") == "my kernel's own note"


USER = '''
import torch
import numcheck as nc

def _slow_gelu_is_known(case, device, output):
    return "torch-cpu-gelu-vectorized-erf"

@nc.kernel("gelu", name="coarse", forward_only=True, known_failure=_slow_gelu_is_known)
def coarse(x, approximate="none"):
    return torch.nn.functional.gelu(x.float(), approximate="tanh").to(x.dtype)

def test_coarse(numcheck):
    numcheck.verify("gelu", coarse, case_ids=["fp32-4x128-normal-s0-contiguous-none"])
'''


def test_run_summary_lists_known_ids_without_repository_paths(pytester):
    pytester.makepyfile(test_user=USER)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    out = res.stdout.str()
    assert "docs/findings.md" not in out
    assert ("known       3: torch-cpu-gelu-vectorized-erf:" in out
            or "known       1: torch-cpu-gelu-vectorized-erf:" in out), out[-2000:]
    assert "(numcheck explain torch-cpu-gelu-vectorized-erf)" in out
