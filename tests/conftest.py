"""Fixtures shared by numcheck's own tests."""
from __future__ import annotations

import pytest

from numcheck.frontends import process as _process  # first: it sets OMP_WAIT_POLICY before torch loads OpenMP

import torch  # noqa: E402, I001


def pytest_configure(config):
    _process.tune()  # the allocator `numcheck run` gives the suites (numcheck/_process.py)


@pytest.fixture(scope="module")
def one_thread():
    """Small tensors: one intra-op thread is 30x faster than two on a loaded 2-core CI runner."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
