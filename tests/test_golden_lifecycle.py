"""The golden lifecycle through the pytest plugin, serially and under pytest-xdist (-n 2).

A user's rms_norm kernel ("mine") runs through the ``numcheck`` fixture on a few bf16 and fp32
cases; KERNEL_MODE switches it between the good kernel, a worse one (the normalized value is
rounded to the activation dtype before the weight multiply: one extra rounding, about half a
bit in bf16) and a benign rewrite (the fp32 sum of squares in another order).
"""
from __future__ import annotations

import os
import signal

import pyarrow.parquet as pq
import pytest

pytest_plugins = ["pytester"]

KERNELS = '''
import os

import pytest
import torch

import numcheck as nc

CASES = ["bf16-4x128-outlier_channels-s0-contiguous-same",
         "bf16-2x7x1025-zero_blocks-s0-contiguous-same",
         "bf16-16x33-zero_blocks-s0-contiguous-same",
         "fp32-4x128-normal-s0-contiguous-same",
         "fp32-3x129-outlier_channels-s0-contiguous-same"]


@nc.kernel("rms_norm", name="mine", forward_only=True)
def mine(x, weight, eps):
    mode = os.environ.get("KERNEL_MODE", "good")
    xf = x.float()
    if mode == "reordered":  # benign: the fp32 sum of squares backwards, in two halves
        sq = (xf * xf).flip(-1)
        h = sq.shape[-1] // 2
        ss = sq[..., :h].sum(-1, keepdim=True) + sq[..., h:].sum(-1, keepdim=True)
    else:
        ss = (xf * xf).sum(-1, keepdim=True)
    y = xf * torch.rsqrt(ss / x.shape[-1] + eps)
    if mode == "worse":  # stores the normalized activations before the weight multiply
        y = y.to(x.dtype).float()
    return (y * weight.float()).to(x.dtype)


@pytest.mark.parametrize("case", CASES)
def test_mine(numcheck, case):
    numcheck.verify("rms_norm", mine, case_ids=[case])
'''

XDIST = [pytest.param([], id="serial"), pytest.param(["-n", "2"], id="xdist")]


@pytest.fixture
def project(pytester: pytest.Pytester):
    pytester.makepyfile(test_kernels=KERNELS)
    pytester.makeini("[pytest]\nnumcheck_golden_dir = golden\n")
    return pytester


def _run(pytester, flags, *args, mode="good", env=None):
    os.environ["KERNEL_MODE"] = mode
    try:
        for k, v in (env or {}).items():
            os.environ[k] = v
        return pytester.runpytest_subprocess(*flags, "-p", "no:cacheprovider", *args)
    finally:
        os.environ.pop("KERNEL_MODE", None)
        for k in env or {}:
            os.environ.pop(k, None)


def _golden(pytester):
    return pytester.path / "golden" / "cpu" / "kernels.parquet"


def _rows(path):
    """Rows in key order, values as repr (NaN == NaN: a NaN stat is a value)."""
    rows = sorted(pq.read_table(path).to_pylist(), key=lambda r: (r["case_id"], r["output"]))
    return [{k: repr(v) for k, v in r.items()} for r in rows]


@pytest.mark.parametrize("flags", XDIST)
def test_lifecycle(project, flags):
    p = project
    gold = _golden(p)

    # 1. strict without golden: fails, writes nothing
    r = _run(p, flags, "--numcheck-strict")
    assert r.ret == 1
    r.stdout.fnmatch_lines(["*missing*no golden row*"])
    assert not gold.exists() and not (p.path / "golden").exists()

    # 2. refresh writes; 3. a normal run passes and rewrites nothing
    r = _run(p, flags, "--numcheck-refresh")
    assert r.ret == 0, r.stdout.str()
    assert gold.exists() and gold.with_suffix(".txt").exists()
    first = gold.read_bytes()
    assert len(_rows(gold)) == 5
    r = _run(p, flags, "--numcheck-strict")
    assert r.ret == 0, r.stdout.str()
    r.stdout.fnmatch_lines(["*golden: 5 same*"])
    assert gold.read_bytes() == first

    # 4. a worse kernel fails with a regression naming the metric
    r = _run(p, flags, "--numcheck-strict", mode="worse")
    assert r.ret == 1
    r.stdout.fnmatch_lines(["*regressed*rel_l2*"])
    assert gold.read_bytes() == first

    # 5. a benign rewrite passes against the old golden
    r = _run(p, flags, "--numcheck-strict", mode="reordered")
    assert r.ret == 0, r.stdout.str()

    # 6. refresh after the change passes again, and prints old -> new
    r = _run(p, flags, "--numcheck-refresh", mode="worse")
    assert r.ret == 0, r.stdout.str()
    r.stdout.fnmatch_lines(["*SQNR dB * -> *"])
    assert gold.read_bytes() != first
    r = _run(p, flags, "--numcheck-strict", mode="worse")
    assert r.ret == 0, r.stdout.str()
    # ... and the good kernel shows as improved, not as a failure
    r = _run(p, flags, mode="good")
    assert r.ret == 0
    r.stdout.fnmatch_lines(["*improved*"])


@pytest.mark.parametrize("flags", XDIST)
def test_corrupt_golden_exit_2_untouched(project, flags):
    p = project
    gold = _golden(p)
    gold.parent.mkdir(parents=True)
    gold.write_bytes(b"PAR1 this is not a parquet file")
    r = _run(p, flags, "--numcheck-refresh")
    assert r.ret == pytest.ExitCode.USAGE_ERROR  # `numcheck run` maps it to exit 2
    r.stdout.fnmatch_lines([f"*{gold}*not a readable parquet file*git checkout*"])
    assert gold.read_bytes() == b"PAR1 this is not a parquet file"
    # told in full once per process (and in the run's summary), not a traceback per case
    out = r.stdout.str()
    assert "Traceback" not in out and "GoldenError" not in out, out[-3000:]
    # pytest's short summary echoes the first failure's message, cut to the terminal's width
    # (whole under CI's wide terminal): count what numcheck prints, above that echo
    told = out.split("short test summary info")[0]
    assert told.count("not a readable parquet file") <= 2 + len(flags) * 2, out[-3000:]


@pytest.mark.parametrize("point", ["parquet-written", "before-rename"])
def test_refresh_killed_mid_write_keeps_old_golden(project, point):
    p = project
    gold = _golden(p)
    assert _run(p, [], "--numcheck-refresh").ret == 0
    before = gold.read_bytes()
    # The controller kills itself (SIGKILL) at a fixed point of the atomic write.
    r = _run(p, [], "--numcheck-refresh", mode="worse", env={"NUMCHECK_TEST_KILL_AT": point})
    assert r.ret == -signal.SIGKILL
    assert gold.read_bytes() == before
    assert len(_rows(gold)) == 5  # readable and complete
    r = _run(p, [], "--numcheck-strict")
    assert r.ret == 0, r.stdout.str()


def test_xdist_refresh_equals_serial(project):
    p = project
    gold = _golden(p)
    assert _run(p, [], "--numcheck-refresh").ret == 0
    serial = _rows(gold)
    gold.unlink()
    assert _run(p, ["-n", "2"], "--numcheck-refresh").ret == 0
    assert _rows(gold) == serial
