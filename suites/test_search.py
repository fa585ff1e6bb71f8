"""Hypothesis search beside the grid: one search per op, against its eager torch kernel.

Profile follows --numcheck-cases (quick: 20 derandomized examples per op; full: 200 random).
Gates on the absolute and baseline rules only; failures print a one-line repro.
"""
from __future__ import annotations

import pytest

from numcheck.ops import OPS, _load_builtins, family, kernels
from numcheck.plugin import suite_device
from numcheck.search import search_test

_load_builtins()
SEARCHED = sorted(op for op in OPS if "torch" in kernels(op) and family(OPS[op]) == "ops")


@pytest.mark.filterwarnings("ignore:Mismatch dtype")
@pytest.mark.parametrize("op", SEARCHED)
def test_search(op, request):
    search_test(OPS[op], kernels(op)["torch"], suite_device(request.config))()
