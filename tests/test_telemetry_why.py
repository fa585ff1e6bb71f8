"""``first_nonfinite()`` explains itself (issue 32): where no producer is named it returns a
NoProducer (false, like the None it replaces) saying which of four things the silence means —
all finite, propagated from an input (the data), produced outside any module (a loss cast that
overflows after the model), or never checked — the same at ``every=1`` and ``every=3``; and
rows that hold NaN/Inf with nobody named warn once. A backward consumes what its forward saved as
well as its grad_output: a NaN in the batch was named as the last linear's grad_weight (its
grad_output finite, g^T x not) before the check counted the call's inputs among them."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from numcheck import telemetry

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FAULT = 4   # not a recorded step at every=3


def _run(every: int, fault: str | None, steps: int = 6):
    """A few steps of a small MLP; at FAULT: ``data`` (a NaN in the batch) or ``loss_cast``
    (the logits cast to fp16 for a loss scaled by 2^17 in fp16, after the model: the forward
    and the gradient entering the model overflow)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with telemetry.watch(model, every=every) as t:
            for step in range(steps):
                x = torch.randn(4, 8)
                if step == FAULT and fault == "data":
                    x[0, 0] = float("nan")
                out = model(x)
                if step == FAULT and fault == "loss_cast":
                    out = out.half() * 2.0 ** 17   # past fp16's 65504, outside the model
                out.float().sum().backward()
                t.step()
    return t.first_nonfinite(), [str(w.message) for w in caught]


@pytest.mark.parametrize("every", [1, 3])
def test_all_finite(every):
    why, warned = _run(every, None)
    assert not why and why.reason == "all_finite" and why.step is None
    assert "6 step(s)" in why.detail and not warned


@pytest.mark.parametrize("every", [1, 3])
def test_a_nan_in_the_data_is_propagated(every):
    why, _ = _run(every, "data")
    assert not why and (why.reason, why.step) == ("propagated", FAULT), why
    assert "with the data" in why.detail


@pytest.mark.parametrize("every", [1, 3])
def test_a_loss_cast_overflow_is_produced_outside_any_module(every):
    why, warned = _run(every, "loss_cast")
    assert not why and (why.reason, why.step) == ("outside", FAULT), why
    if every == 1:   # the recorded step's rows hold the infs: told once, with the reason
        told = [w for w in warned if "no producer is named" in w]
        assert len(told) == 1 and "outside any module" in told[0]


def test_a_watch_that_saw_no_forward_says_it_did_not_check():
    model = nn.Linear(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the step without a forward warns (another test)
        with telemetry.watch(model) as t:
            t.step()
    why = t.first_nonfinite()
    assert not why and why.reason == "not_checked" and "no step ran a forward" in why.detail


def test_a_named_producer_is_still_a_true_five_tuple():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with torch.no_grad():
        model[0].weight.fill_(1e38)
    with telemetry.watch(model) as t:
        model(torch.ones(2, 4)).sum().backward()
        t.step()
    nf = t.first_nonfinite()
    assert nf and nf == (0, "0", "linear", "output", "forward")

