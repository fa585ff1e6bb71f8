"""pytest plugin (entry point ``pytest11: numcheck``): thin glue over the library.

For now it declares the ``cuda`` and ``slow`` markers and skips ``cuda`` tests, with the reason,
on a machine without a CUDA device. Golden and case-set options arrive with the goldens issue.
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("numcheck")
    group.addoption("--numcheck-slow", action="store_true", default=False,
                    help="also run tests marked slow (long sweeps, big tensors)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device; skipped with the reason without one")
    config.addinivalue_line("markers", "slow: long-running; run with --numcheck-slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    no_cuda = None if torch.cuda.is_available() else pytest.mark.skip(
        reason="needs a CUDA device: torch.cuda.is_available() is False on this machine")
    no_slow = None if config.getoption("--numcheck-slow") else pytest.mark.skip(
        reason="slow: run with --numcheck-slow")
    for item in items:
        if no_cuda and "cuda" in item.keywords:
            item.add_marker(no_cuda)
        if no_slow and "slow" in item.keywords:
            item.add_marker(no_slow)
