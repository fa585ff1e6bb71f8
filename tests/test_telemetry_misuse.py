"""Misuse of ``watch`` gets a clear error or a warning, never a silent other meaning (issue 32):
a string ``what_if`` is one recipe (it was read letter by letter: "unknown recipe 'n'"), a
non-integer ``every`` is refused (2.5 was truncated to 2), ``step()`` after ``close()`` is an
error, and a step that saw no forward of the watched model warns."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import numcheck as nc
from numcheck.errors import UsageError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def _train_step(model, t):
    model(torch.randn(4, 8)).sum().backward()
    t.step()


def test_a_string_what_if_is_one_recipe():
    model = _model()
    with nc.telemetry.watch(model, what_if="mxfp8") as t:
        _train_step(model, t)
        assert [n for n, _, _ in t.recipes] == ["mxfp8"]
        assert set(t.records()["recipe"]) >= {"mxfp8"}


def test_an_unknown_string_what_if_names_the_whole_name():
    with pytest.raises(UsageError, match="nvfp5"):
        nc.telemetry.watch(_model(), what_if="nvfp5")


@pytest.mark.parametrize("every", [2.5, 2.0, "2", True, 0, -1])
def test_every_must_be_a_positive_int(every):
    with pytest.raises(UsageError, match=r"every=.*positive int"):
        nc.telemetry.watch(_model(), every=every)


def test_every_takes_integer_types():
    with nc.telemetry.watch(_model(), every=np.int64(3)) as t:
        assert t.every == 3 and type(t.every) is int


def test_step_after_close_is_an_error():
    model = _model()
    t = nc.telemetry.watch(model)
    _train_step(model, t)
    t.close()
    with pytest.raises(UsageError, match="step\\(\\) after close"):
        t.step()


@pytest.mark.parametrize("every", [1, 3])
def test_a_step_without_a_forward_warns(every):
    model = _model()
    with nc.telemetry.watch(model, every=every) as t:
        for _ in range(4):  # full hooks, then the sentinel's steps (every=3)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a step with a forward never warns
                _train_step(model, t)
        with pytest.warns(UserWarning, match="without a forward of the watched model"):
            t.step()


def test_a_disabled_watch_does_not_warn():
    model = _model()
    with nc.telemetry.watch(model, enabled=False) as t, warnings.catch_warnings():
        warnings.simplefilter("error")
        t.step()
