"""Quant suite: quantization paths against the FP64 truth, judged and goldened (suite "quant").

* ``test_quant_op_case``: the registered quant ops' kernels (fp8_qdq, mx_qdq, nvfp4_qdq, int8_qdq,
  int4_qdq, scaled_matmul) against their FP64 references, exactly as suites/test_ops.py.
* ``test_roundtrip[path-dist]``: round-trip SQNR (mean and worst block over the path's own
  quantization block), clip and underflow fractions and non-finite count of every quantization
  path (numcheck.quant.paths.PATHS) on the input zoo, with the BF16 rounding of the same input as
  the yardstick. Fails below the path's measured floor for that distribution, or on any NaN/inf.
* ``test_gemm[recipe-dist]``: ``scaled_matmul(a, b, recipe)`` against the FP64 product of the
  un-quantized operands; baseline the BF16 GEMM; fails when the SQNR gap to BF16 exceeds the
  recipe's measured gap plus a margin.

The floors and ceilings, with their measurements and margins, are the quant family's rules
(numcheck/quant/quant_rules.py); this module only enumerates the cases.
"""
from __future__ import annotations

import pytest

from numcheck.cases import inputs
from numcheck.frontends.plugin import case_set
from numcheck.quant import quant_rules as QR
from numcheck.quant import paths as QS
from numcheck.frontends.context import case_param_id, suite_cases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    cs = case_set(metafunc.config)
    if "op_case" in metafunc.fixturenames:
        items = suite_cases(cs, suite="quant")
        metafunc.parametrize("op_case", [pytest.param(i, id=case_param_id(i)) for i in items])
    if "rt_case" in metafunc.fixturenames:
        dists = QR.QUICK_DISTS if cs == "quick" else inputs.DISTRIBUTIONS
        metafunc.parametrize("rt_case", [pytest.param((p, d), id=f"{p}-{d}")
                                         for p in QS.PATHS for d in dists])
    if "gemm_case" in metafunc.fixturenames:
        dists = QR.GEMM_QUICK_DISTS if cs == "quick" else QR.GEMM_FULL_DISTS
        metafunc.parametrize("gemm_case", [pytest.param((r, d), id=f"{r}-{d}")
                                           for r in QS.RECIPE_NAMES for d in dists])


@pytest.mark.filterwarnings("ignore:Mismatch dtype")
def test_quant_op_case(op_case, numcheck):
    numcheck.check_case(op_case)


def test_roundtrip(rt_case, numcheck):
    path, dist = rt_case
    numcheck.check_records([QS.roundtrip_record(path, dist)])


def test_gemm(gemm_case, numcheck):
    recipe, dist = gemm_case
    numcheck.check_records([QS.gemm_record(recipe, dist)])
