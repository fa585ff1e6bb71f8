"""Progress per family with an estimate of the time left (numcheck.frontends.progress), on a terminal
only; and one GPU per xdist worker on a machine with several."""
from __future__ import annotations

import re

import pytest

from numcheck.frontends import plugin
from numcheck.frontends.progress import Progress, family_of

pytest_plugins = ["pytester"]


def test_family_of_a_node_id():
    assert family_of("suites/test_ops.py::test_op_case[rms_norm/torch/x]") == "ops"
    assert family_of("/site/numcheck/_builtin/suites/test_convergence.py::t[mlp/fp8]") == \
        "convergence"
    assert family_of("test_mine.py::test_a") == "mine"


def test_each_family_is_estimated_from_its_own_rate():
    p = Progress(workers=2)
    p.collected([f"test_ops.py::t[{i}]" for i in range(100)] +
                [f"test_convergence.py::t[{i}]" for i in range(10)])
    p.collected(["test_ops.py::again"])  # a second worker's collection adds nothing
    for i in range(50):
        p.finished(f"test_ops.py::t[{i}]", 0.4)
    for i in range(2):
        p.finished(f"test_convergence.py::t[{i}]", 30.0)
    assert p.eta("ops") == pytest.approx(50 * 0.4 / 2)
    assert p.eta("convergence") == pytest.approx(8 * 30.0 / 2)
    line = p.line()
    assert "ops 50/100 0:10" in line and "convergence 2/10 2:00" in line
    fresh = Progress()
    fresh.collected(["test_quant.py::a"])
    assert fresh.eta("quant") is None and "quant 0/1 ?" in fresh.line()


TESTS = '''
import pytest, torch

def rms(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)

@pytest.mark.parametrize("case", ["fp32-4x128-normal-s0-contiguous-same",
                                  "fp32-16x33-normal-s0-transposed-same"])
def test_rms(numcheck, case):
    numcheck.verify("rms_norm", rms, case_ids=[case])
'''
_LINE = re.compile(r"^numcheck \d+:\d\d: kernels \d/2 ", re.M)


def _project(pytester):
    pytester.makepyfile(test_kernels=TESTS)
    # every finished test writes a line (subprocess runs: triton's extension cannot be
    # imported twice into one process, which in-process pytester runs would do)
    pytester.makeconftest("import numcheck.frontends.plugin as p\np._PROGRESS_EVERY = 0.0\n")


@pytest.mark.parametrize("env, shown", [("1", True), ("", False), ("0", False)])
def test_progress_lines_on_a_terminal_only(pytester, monkeypatch, env, shown):
    monkeypatch.setenv("NUMCHECK_PROGRESS", env)  # pytester's output is no TTY: "" is quiet
    _project(pytester)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    assert bool(_LINE.search(res.stdout.str())) == shown, res.stdout.str()


def test_progress_under_xdist(pytester, monkeypatch):
    monkeypatch.setenv("NUMCHECK_PROGRESS", "1")
    _project(pytester)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    res.assert_outcomes(passed=2)
    assert re.search(r"^numcheck \d+:\d\d: kernels 2/2 done", res.stdout.str(), re.M), \
        res.stdout.str()


def test_one_gpu_per_xdist_worker():
    assert plugin.worker_gpu("gw0", 4) == 0
    assert plugin.worker_gpu("gw5", 4) == 1  # more workers than GPUs: round-robin
    assert plugin.worker_gpu("gw3", 1) is None  # one GPU: every worker on it
    assert plugin.worker_gpu("master", 4) is None


def test_training_steps_reach_the_line(tmp_path, monkeypatch):
    from numcheck.frontends import progress

    monkeypatch.setenv("NUMCHECK_PROGRESS_DIR", str(tmp_path))
    monkeypatch.setattr(progress, "_last_write", [0.0])
    progress.training_step(0, 60)
    progress.training_step(1, 60)  # within the second: not written
    assert progress.training_steps(str(tmp_path)) == (1, 60)
    progress.training_step(59, 60)  # the last step always is
    assert progress.training_steps(str(tmp_path)) == (60, 60)
    (tmp_path / "other.steps").write_text("5 100")  # another worker's run
    p = Progress()
    p.collected(["test_convergence.py::t"])
    assert "training step 65/160" in p.line()
    assert progress.training_steps(None) == (0, 0)


def test_a_heartbeat_line_while_a_long_test_runs(pytester, monkeypatch):
    monkeypatch.setenv("NUMCHECK_PROGRESS", "1")
    pytester.makeconftest("import numcheck.frontends.plugin as p\np._PROGRESS_EVERY = 1.0\n")
    pytester.makepyfile(test_long='''
import time
from numcheck.frontends.progress import training_step

def test_trains():
    training_step(5, 10)
    time.sleep(3)
''')
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    # only the heartbeat can write a line before the one test finished
    assert re.search(r"^numcheck \d+:\d\d: long 0/1 \? \| training step 6/10$",
                     res.stdout.str(), re.M), res.stdout.str()
