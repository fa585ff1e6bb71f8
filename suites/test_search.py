"""Hypothesis search beside the grid: one search per op, against its eager torch kernel.

Profile follows --numcheck-cases (quick: 20 derandomized examples per op; full: 200 random).
Gates on the absolute and baseline rules only; failures print a one-line repro.
"""
from __future__ import annotations

import pytest

from numcheck.catalog import get_op, kernels, ops
from numcheck.frontends.plugin import suite_device
from numcheck.frontends.search import search_test

SEARCHED = [s.name for s in ops("ops") if "torch" in kernels(s.name)]


@pytest.mark.filterwarnings("ignore:Mismatch dtype")
@pytest.mark.parametrize("op", SEARCHED)
def test_search(op, request):
    search_test(get_op(op), kernels(op)["torch"], suite_device(request.config))()
