"""Built-in op suite: every op x built-in kernel x case of the case set (--numcheck-cases).

Each item runs one case against the FP64 reference and the same-precision baseline, and its
records against the goldens in golden/<device_class>/ops.parquet; compiled
kernels share one xdist group (run with --dist loadgroup) so generated code does not depend on
which worker ran which test first.
"""
from __future__ import annotations

import pytest

from numcheck.frontends.plugin import case_set
from numcheck.frontends.context import case_param_id, suite_cases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "op_case" in metafunc.fixturenames:
        params = []
        for item in suite_cases(case_set(metafunc.config)):
            marks = [pytest.mark.xdist_group("compiled")] if item[1].compiled else []
            params.append(pytest.param(item, id=case_param_id(item), marks=marks))
        metafunc.parametrize("op_case", params)


@pytest.mark.filterwarnings("ignore:Mismatch dtype")
def test_op_case(op_case, numcheck):
    numcheck.check_case(op_case)
