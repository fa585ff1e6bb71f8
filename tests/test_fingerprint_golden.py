"""A fingerprint golden through the pytest plugin: recorded by a refresh, the same kernel
passes, a kernel whose accumulation changed fails the run naming the property, serially and
under pytest-xdist. The kernel switches on KERNEL_MODE: "fp32" (products summed in order in
fp32) or "bf16_partials" (partial sums of 16 products rounded to bf16)."""
from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]

KERNELS = '''
import os

import torch


def mine(a, b):
    prods = (a.float()[:, :, None] * b.float()[None, :, :]).unbind(1)
    k = 16 if os.environ.get("KERNEL_MODE") == "bf16_partials" else len(prods)
    total = None
    for i in range(0, len(prods), k):
        part = prods[i]
        for p in prods[i + 1:i + k]:
            part = part + p
        if k == 16:
            part = part.bfloat16().float()
        total = part if total is None else total + part
    return total.to(a.dtype)


def test_mine_fingerprint(numcheck):
    numcheck.fingerprint("matmul", mine, kernel_name="mine")
'''

XDIST = [pytest.param([], id="serial"), pytest.param(["-n", "2"], id="xdist")]


def _run(pytester, flags, *args, mode="fp32"):
    os.environ["KERNEL_MODE"] = mode
    try:
        return pytester.runpytest_subprocess(*flags, "-p", "no:cacheprovider", *args)
    finally:
        os.environ.pop("KERNEL_MODE", None)


@pytest.mark.parametrize("flags", XDIST)
def test_changed_fingerprint_fails_the_run(pytester, flags):
    pytester.makepyfile(test_kernels=KERNELS)
    pytester.makeini("[pytest]\nnumcheck_golden_dir = golden\n")
    rec = _run(pytester, flags, "--numcheck-refresh")
    assert rec.ret == 0, rec.stdout.str()
    assert (pytester.path / "golden" / "cpu" / "kernels.parquet").exists()
    same = _run(pytester, flags)
    assert same.ret == 0, same.stdout.str()
    assert "1 same" in same.stdout.str()
    changed = _run(pytester, flags, mode="bf16_partials")
    out = changed.stdout.str()
    assert changed.ret == 1, out
    assert "acc_bits 23 -> 7" in out and "promote_every None -> 16" in out
    assert "order sequential -> blocked:16" in out
