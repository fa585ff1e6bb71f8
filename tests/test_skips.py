"""nc.skips: the public skip rules (supports= of kernels, skip_grads= of ops) that numcheck's own
kernels use too."""
from __future__ import annotations

import warnings

import pytest
import torch

import numcheck as nc
from numcheck.catalog import get_op, kernels
from numcheck.cases.grid import Case
from numcheck.errors import UsageError
from numcheck.registry import Kernel

CASE = Case("x", "bf16", (4, 128), "normal", 0, (("layout", "transposed"),))


def test_only_names_the_value_and_why():
    rule = nc.skips.only("k", dtype=("fp32",), why="fp32 accumulators only")
    assert rule(CASE, "cpu") == "k runs with dtype in 'fp32' only, not 'bf16' (fp32 accumulators only)"
    assert nc.skips.only("k", shape=[(4, 128)], layout=("transposed",))(CASE, "cpu") is None
    assert "layout in 'contiguous' only, not 'transposed'" in nc.skips.only(
        "k", layout=("contiguous",))(CASE, "cpu")
    assert "not None" in nc.skips.only("k", causal=(True,))(CASE, "cpu")  # a param it lacks
    with pytest.raises(UsageError, match="name at least one field or param"):
        nc.skips.only("k")


def test_contiguous_when_first_and_grads_where():
    assert nc.skips.contiguous("k")(CASE, "cpu") == (
        "k needs inputs with last-dim stride 1, not transposed ones")
    both = nc.skips.first(None, nc.skips.when(lambda c: c.dist == "other", "never"),
                          nc.skips.contiguous("k"))
    assert both(CASE, "cpu").startswith("k needs inputs")
    assert nc.skips.first()(CASE, "cpu") is None
    rule = nc.skips.grads_where(lambda c: c.dtype == "bf16", "x", "w")
    assert rule(CASE) == ("x", "w") and rule(Case("x", "fp32", (4,), "normal", 0)) == ()
    with pytest.raises(UsageError, match="name the arguments"):
        nc.skips.grads_where(lambda c: True)


def test_numchecks_own_kernels_use_them():
    case = next(c for c in get_op("rms_norm").grid("quick")
                if c.shape not in ((4, 128), (3, 129)) and c.dtype != "fp16")
    assert kernels("rms_norm")["compiled"].skip_reason(case, "cpu").startswith(
        "compiled rms_norm runs with shape in (4, 128), (3, 129) only")
    case = next(c for c in get_op("sdpa").grid("full") if c.param("layout") == "transposed")
    assert kernels("sdpa")["sdpa_flash"].skip_reason(case, "cpu") == (
        "sdpa_flash needs inputs with last-dim stride 1, not transposed ones")


def test_a_user_op_and_kernel_with_skip_rules(tmp_path):
    """skip_grads excuses a gradient where the op's doc says so; supports skips cases with the
    reason, and the run still executes the rest."""
    def reference(x):
        return torch.where(x > 0, x, torch.zeros_like(x)) * x  # x*relu(x)

    nc.op("relu_sq_skips", reference=reference, grad_args=("x",),
          skip_grads=nc.skips.grads_where(lambda c: c.dist == "outlier_channels", "x"))

    def mine(x):
        return torch.relu(x) * x

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = nc.verify("relu_sq_skips", Kernel(
            "relu_sq_skips", "mine", mine, supports=nc.skips.only("mine", dtype=("fp32", "bf16"))),
            device="cpu")
    assert v.passed, v.summary()
    skipped = [r for r in v.records if r.status == "skipped"]
    assert skipped and all(r.reason == "mine runs with dtype in 'fp32', 'bf16' only, not 'fp16'"
                           for r in skipped)
    ran = [r for r in v.records if r.status != "skipped"]
    assert {r.output for r in ran if r.dist == "outlier_channels"} == {"out"}
    assert {r.output for r in ran if r.dist == "normal"} == {"out", "grad_x"}
