"""`--dist loadgroup` keeps an xdist_group on one worker: `numcheck run -n N` relies on it (the
op suite's compiled kernels share one group, so that inductor's generated code does not depend
on which worker compiled which shape first), and so do numcheck's own multi-process tests.
pytest 9.2 with pytest-xdist 3.8 silently stops grouping (pytest-xdist#1386: xdist marks the
group by rewriting ``item._nodeid``, which pytest 9.2 no longer reads); pyproject.toml bounds
pytest below 9.2 until xdist fixes it, and this test is what says when the bound may go."""
from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_a_group_runs_on_one_worker(pytester):
    pytest.importorskip("xdist")
    out = pytester.path / "workers.txt"
    pytester.makepyfile(test_grouped=f"""
        import os, pytest

        @pytest.mark.xdist_group("g")
        @pytest.mark.parametrize("i", range(8))
        def test_in_group(i):
            with open({str(out)!r}, "a") as f:
                f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

        @pytest.mark.parametrize("i", range(8))
        def test_free(i):
            pass
    """)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                        "--dist", "loadgroup")
    res.assert_outcomes(passed=16)
    workers = out.read_text().split()
    assert len(workers) == 8
    assert len(set(workers)) == 1, (
        f"one xdist_group ran on workers {sorted(set(workers))}: --dist loadgroup does not "
        f"group with pytest {pytest.__version__} (pytest-xdist#1386)")
