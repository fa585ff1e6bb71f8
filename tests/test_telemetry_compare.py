"""``nc.telemetry.compare`` (issue 34): two configurations of one model, the same batches, every
module's output and output gradient compared (SQNR of B against A); the first layer below the
threshold named. A planted fp8 fault in one layer of a uniformly fp8 model is named against
bf16; uniform recipes (bf16, fp8, mxfp4) name nobody."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from numcheck import telemetry
from numcheck.convergence.models import build
from numcheck.errors import UsageError

from _support import WrongWgradScale, fp8_with_a_fault

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _compare(name, a, b, batches=2):
    model, task, _ = build(name, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return telemetry.compare(model, [task.batch_at(0, s) for s in range(batches)], a, b)


@pytest.mark.parametrize("name,module", [("tiny_lm", "blocks.1.w_up"),
                                         ("tiny_dit", "blocks.0.fc1")])
def test_a_planted_fp8_fault_is_named_against_bf16(name, module):
    got = _compare(name, "bf16", fp8_with_a_fault(module))
    assert got and (got.first["batch"], got.first["module"], got.first["role"]) == \
        (0, module, "output"), got.summary()
    assert got.first["sqnr_db"] < 15   # 25% off: ~12 dB; its fp8 neighbours ~25-30 dB
    rows = got.rows
    fwd = rows[(rows.batch == 0) & (rows.role == "output")]
    ahead = fwd.iloc[:list(fwd.module).index(module)]
    assert (ahead.sqnr_db > got.first["threshold_db"]).all()   # nobody before it
    assert {"output", "grad_output", "grad_weight"} <= set(rows.role)
    assert f"the first below it: batch 0 {module} output" in got.summary()


# tiny_dit's blocks start gated shut (adaLN-Zero: zero modulation weights), so their linears'
# weight gradients are exactly 0 at step 0, in A and B alike; its modulation layer's are not
@pytest.mark.parametrize("name,module", [("tiny_lm", "blocks.1.w_up"),
                                         ("tiny_dit", "blocks.0.ada")])
def test_a_fault_in_the_weight_gradient_gemm_alone_is_named(name, module):
    """Forward and input gradients untouched: only the layer's weight gradient shows it
    (tiny_lm blocks.1.w_up: 10.8 dB, the other weight gradients 19-31 dB)."""
    got = _compare(name, "bf16", fp8_with_a_fault(module, WrongWgradScale))
    assert got and (got.first["module"], got.first["role"]) == (module, "grad_weight"), \
        got.summary()
    rows = got.rows
    assert not (rows[rows.role.isin(("output", "grad_output"))].sqnr_db <
                got.first["threshold_db"]).any()


@pytest.mark.parametrize("name", ["tiny_lm", "tiny_dit"])
@pytest.mark.parametrize("a,b", [("bf16", "fp8_tensor"), ("bf16", "mxfp4"), ("fp32", "bf16")])
def test_a_uniform_recipe_names_nobody(name, a, b):
    """Every layer loses to the recipe about alike: no layer 10 dB below the batch's median
    (measured spread: 3-9 dB for mxfp4, less for the others)."""
    got = _compare(name, a, b)
    assert not got and got.first is None, got.summary()
    finite = got.rows.sqnr_db[got.rows.sqnr_db.abs() != math.inf]
    assert len(finite) and (finite > 0).all()


def test_the_same_configuration_is_bitwise_equal():
    got = _compare("tiny_lm", "fp32", "fp32", batches=1)
    assert not got and (got.rows.sqnr_db == math.inf).all()


def test_an_absolute_threshold_and_a_model_without_a_loss_method():
    class Wrapped(nn.Module):   # forward returns (loss, logits), the model-library way
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **batch):   # called as model(**batch)
            return self.inner.loss(batch), None

    model, task, _ = build("tiny_lm", 0)
    got = telemetry.compare(Wrapped(model), [task.batch_at(0, 0)], "bf16", "fp8_tensor",
                            threshold_db=35.0)
    assert got and got.first["module"] == "inner.blocks.0.qkv", got.summary()
    assert got.threshold == "35 dB"


def test_bad_configurations_are_usage_errors():
    model, task, _ = build("mlp", 0)
    batch = [task.batch_at(0, 0)]
    with pytest.raises(UsageError, match="recipe 'nvfp5'"):
        telemetry.compare(model, batch, "fp32", "nvfp5")
    with pytest.raises(UsageError, match="returned int, not the model"):
        telemetry.compare(model, batch, "fp32", lambda m: 3)
    with pytest.raises(UsageError, match="no batches"):
        telemetry.compare(model, [], "fp32", "bf16")
    with pytest.raises(UsageError, match="must be an nn.Module"):
        telemetry.compare(torch.zeros(2), batch)
