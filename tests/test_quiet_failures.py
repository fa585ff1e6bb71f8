"""A failing case reads as a few lines (issue 16): torch's own debug log records never flood
the failure (a compiled kernel's torch.__trace logged ~2000 empty DEBUG lines), a case's
outputs share one worst-elements/numerics/repro block, and a test of many failing cases shows
the first few in full; -v shows everything."""
from __future__ import annotations

import re

import pytest

pytest_plugins = ["pytester"]

KERNEL = '''
import os
import pytest, torch

def _eager(x, weight, eps):
    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * r * weight.float() * SCALE).to(x.dtype)   # 1% off: fails every case

SCALE = float(os.environ.get("SCALE", "1.01"))
_core = torch.compile(_eager, dynamic=False) if os.environ.get("COMPILE") else _eager

def scaled_rms(x, weight, eps):
    return _core(x, weight, eps)

CASES = os.environ["CASES"].split(",")

def test_scaled(numcheck):
    numcheck.verify("rms_norm", scaled_rms, case_ids=CASES)
'''
ONE = "fp32-4x128-normal-s0-contiguous-same"
MANY = ",".join([ONE, "fp32-16x33-normal-s0-transposed-same", "fp32-1x7-normal-s0-contiguous-fp32",
                 "fp32-3x129-outlier_channels-s0-contiguous-same",
                 "fp32-3x129-zero_blocks-s0-contiguous-fp32",
                 "fp32-4x128-constant_rows-s0-contiguous-fp32",
                 "fp32-16x33-large_mean-s0-contiguous-same"])


def _failure_block(out: str) -> list[str]:
    """The lines pytest prints for the failing test: from its ``___ test ___`` header to the
    next section of the session (warnings, numcheck's summary, short summary)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^_+ test_scaled _+$", line))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("=" * 10))
    return lines[start:end]


@pytest.fixture
def project(pytester, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    pytester.makepyfile(test_kernel=KERNEL)
    return pytester


def test_one_failing_case_is_at_most_15_lines(project, monkeypatch):
    monkeypatch.setenv("CASES", ONE)
    monkeypatch.setenv("COMPILE", "1")  # inductor: torch.__trace's flood of DEBUG records
    res = project.runpytest_subprocess("-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    block = _failure_block(res.stdout.str())
    assert len(block) <= 15, "\n".join(block)
    text = "\n".join(block)
    assert "torch.__trace" not in res.stdout.str()
    # what the reader needs is still there: each output's rule, the worst elements, the repro
    for what in ("  out: rel_l2", "  grad_x: rel_l2", "  grad_weight: rel_l2",
                 "  worst_elements: ", "  numerics: ", "  repro: numcheck verify --op rms_norm"):
        assert what in text, text
    assert text.count("repro: ") == 1  # the outputs of a case share it
    verbose = project.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    assert "torch.__trace" in verbose.stdout.str()  # -v: torch's own records are kept


def test_many_failing_cases_show_the_first_five_in_full(project, monkeypatch):
    monkeypatch.setenv("CASES", MANY)
    res = project.runpytest_subprocess("-p", "no:cacheprovider")
    block = _failure_block(res.stdout.str())
    text = "\n".join(block)
    assert text.count("repro: ") == 5
    assert "7 failing cases, the first 5 in full (pytest -v: all of them)" in text
    assert len(block) <= 15 * 7, text
    verbose = project.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    vtext = "\n".join(_failure_block(verbose.stdout.str()))
    assert vtext.count("repro: ") == 7


def test_golden_changes_are_listed_ten_at_most(project, monkeypatch):
    monkeypatch.setenv("CASES", MANY)
    monkeypatch.setenv("SCALE", "1.0")  # the right kernel: its goldens
    project.runpytest_subprocess("-p", "no:cacheprovider",
                                 "--numcheck-refresh").assert_outcomes(passed=1)
    monkeypatch.setenv("SCALE", "1.01")  # 7 cases x 3 outputs regress
    out = project.runpytest_subprocess("-p", "no:cacheprovider").stdout.str()
    assert len(re.findall(r"^ +regressed rms_norm/", out, re.M)) == 10, out
    assert "... and 11 more golden changes (pytest -v, numcheck report)" in out
