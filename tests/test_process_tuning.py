"""numcheck.frontends.process's process tuning as pytest loads it: OMP_WAIT_POLICY=PASSIVE in xdist
workers (its docstring says why), never over the user's own setting, never in one process."""
from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

PROBE = """
import os, pathlib
def test_policy():
    pathlib.Path("policy.txt").write_text(str(os.environ.get("OMP_WAIT_POLICY")))
"""


def _policy(pytester: pytest.Pytester, *args: str) -> str:
    pytester.makepyfile(test_probe=PROBE)
    res = pytester.runpytest_subprocess("-p", "numcheck.frontends.process", "-p", "no:cacheprovider",
                                        *args)
    res.assert_outcomes(passed=1)
    return (pytester.path / "policy.txt").read_text()


def test_xdist_workers_wait_passively(pytester, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert _policy(pytester, "-n", "2") == "PASSIVE"


def test_the_users_setting_wins_and_one_process_is_untouched(pytester, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert _policy(pytester, "-n", "2") == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this test may run in a worker
    assert _policy(pytester) == "None"
