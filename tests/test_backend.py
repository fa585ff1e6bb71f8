"""numcheck.measure.backend, the one selector of the compiled passes, and its switch: the
environment variable (NUMCHECK_BACKEND=torch), ``force``, ``substitute``; a pass whose compiler
is missing or that breaks at run time falls back to the torch route with one warning."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import types
import warnings

import pytest
import torch

import numcheck as nc
from numcheck.errors import UsageError
from numcheck.measure import backend, stats

KIND = "test-backend"  # a kind no numcheck module uses: these tests own it
INT_FIELDS = ("n", "n_compared", "n_nan", "n_inf", "nonfinite_mismatch", "max_ulp", "p99_ulp",
              "n_blocks", "worst_block", "fmt")


@pytest.fixture(autouse=True)
def clean_kind():
    backend.reset(KIND)
    yield
    backend.reset(KIND)


def _pair() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    ref = torch.randn(3, 257, 130, generator=g, dtype=torch.float64)
    out = (ref * (1 + 0.01 * torch.randn(ref.shape, generator=g, dtype=torch.float64)))
    out = out.to(torch.bfloat16)
    out.view(-1)[::997] = math.nan
    return out, ref


def _assert_same_stats(a: dict, b: dict) -> None:
    """Integer statistics bitwise; float ones to the routes' summation order (the compiled loop
    sums in element order, the torch route by torch's reductions: float64 sums of ~10^5 terms,
    far below 1e-12 relative apart; a wrong element moves them by >= 1e-7)."""
    assert a.keys() == b.keys()
    for k in a:
        if k in INT_FIELDS or not isinstance(a[k], float):
            assert a[k] == b[k], k
        else:
            assert a[k] == pytest.approx(b[k], rel=1e-12, abs=1e-15), k


def _counting(monkeypatch) -> list:
    """Calls of the compiled CPU loop's chunk function (the loop loaded: numba present)."""
    pytest.importorskip("numba")
    loop = stats._cpu_loop()
    assert loop is not None
    calls = []
    chunk = loop.chunk
    monkeypatch.setattr(loop, "chunk", lambda *a: calls.append(1) or chunk(*a))
    return calls


def test_forced_torch_route_gives_the_same_error_stats(monkeypatch):
    out, ref = _pair()
    calls = _counting(monkeypatch)
    compiled = nc.error_stats(out, ref, blocks=32).as_dict()
    assert calls, "the compiled loop did not run"
    calls.clear()
    with backend.force("torch"):
        assert backend.mode() == "torch" and stats._cpu_loop() is None
        forced = nc.error_stats(out, ref, blocks=32).as_dict()
    assert not calls, "the compiled loop ran under force('torch')"
    _assert_same_stats(forced, compiled)
    assert compiled["n_nan"] > 0 and compiled["max_ulp"] > 0
    # the block ends: the compiled loop again
    assert backend.mode() == "auto" and stats._cpu_loop() is not None
    nc.error_stats(out, ref, blocks=32)
    assert calls


def test_broken_and_missing_passes_warn_once_and_stay_off_until_reset():
    fake = types.SimpleNamespace(name="the pass")
    imports = []

    def importer():
        imports.append(1)
        return fake
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert backend.load(KIND, importer) is fake
        assert backend.load(KIND, importer) is fake and len(imports) == 1  # imported once
        backend.broken(KIND, "the pass failed")
        backend.broken(KIND, "the pass failed again")  # e.g. a second worker thread
        assert backend.load(KIND, importer) is None
        backend.reset(KIND)
        assert backend.load(KIND, importer) is fake and len(imports) == 2  # tried again

        backend.reset(KIND)

        def missing():
            raise ImportError("No module named 'numba'")
        assert backend.load(KIND, missing, "no numba ({}); the torch route") is None
        assert backend.load(KIND, missing, "no numba ({}); the torch route") is None
    msgs = [str(w.message) for w in caught]
    assert msgs == ["the pass failed", "no numba (No module named 'numba'); the torch route"]


def test_substitutes_win_nest_and_restore():
    real, planted = types.SimpleNamespace(), types.SimpleNamespace()
    assert backend.load(KIND, lambda: real) is real
    with backend.substitute(KIND, planted):
        assert backend.load(KIND, lambda: real) is planted
        with backend.force("torch"):  # a substitute is more specific than the mode
            assert backend.load(KIND, lambda: real) is planted
        with backend.substitute(KIND, None):
            assert backend.load(KIND, lambda: real) is None
        assert backend.load(KIND, lambda: real) is planted
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            backend.broken(KIND, "planted pass failed")
        assert backend.load(KIND, lambda: real) is None  # broken: off until the block ends
    assert backend.load(KIND, lambda: real) is real
    # a kind only substitutes serve (no importer): None, and nothing remembered
    assert backend.load(KIND + "-cpu") is None
    with backend.substitute(KIND + "-cpu", planted):
        assert backend.load(KIND + "-cpu") is planted
    assert backend.load(KIND + "-cpu") is None


def test_the_environment_variable_is_honoured(monkeypatch):
    real = types.SimpleNamespace()
    try:
        for value in ("torch", "TORCH ", "auto", ""):
            monkeypatch.setenv(backend.ENV, value)
            backend.reset()  # read again at the next choice
            off = value.strip().lower() == "torch"
            assert backend.load(KIND, lambda: real) is (None if off else real), value
            if off:
                assert stats._cpu_loop() is None and stats._cuda_kernel() is None
            with backend.force("auto"):
                assert backend.load(KIND, lambda: real) is real
        monkeypatch.setenv(backend.ENV, "numba")
        backend.reset()
        with pytest.raises(UsageError, match="NUMCHECK_BACKEND='numba': use one of auto, torch"):
            backend.load(KIND, lambda: real)
        with pytest.raises(UsageError, match="use one of"):
            backend.force("triton")
    finally:
        monkeypatch.delenv(backend.ENV)
        backend.reset()


_RUN = """
import sys, warnings
warnings.simplefilter("error")  # no warning: the switch is a choice, not a failure
import torch, numcheck as nc
from numcheck.measure import stats
ref = torch.randn(4, 1000, dtype=torch.float64)
s = nc.error_stats(ref.to(torch.bfloat16), ref, blocks=32)
assert stats._cpu_loop() is None and s.n == 4000 and s.max_ulp <= 1
print("numba" in sys.modules, "ok")
"""


def test_numcheck_backend_torch_runs_error_stats_without_loading_numba():
    """NUMCHECK_BACKEND=torch set before the process starts: the torch route, silently; numba is
    never imported (the selector and njit load it only where a compiled pass is chosen)."""
    env = {**os.environ, backend.ENV: "torch"}
    res = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-2:] == ["False", "ok"], res.stdout


_NO_NUMBA = """
import sys, warnings
sys.modules["numba"] = None  # import numba raises ImportError: numba missing
import torch, numcheck as nc
from numcheck.measure import backend, stats
ref = torch.randn(4, 1000, dtype=torch.float64)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    s = [nc.error_stats(ref.to(torch.bfloat16), ref, blocks=32) for _ in range(2)]
msgs = [str(w.message) for w in caught]
assert len(msgs) == 1 and "no numba" in msgs[0], msgs
assert s[0] == s[1] and s[0].n == 4000 and stats._cpu_loop() is None
print("ok")
"""


def test_without_numba_the_selector_loads_and_warns_once():
    """numba missing: numcheck.measure.backend still imports (numba only where njit decorates),
    error_stats warns once and takes the torch route."""
    res = subprocess.run([sys.executable, "-c", _NO_NUMBA], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16,
                                   torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_the_bit_constants_the_compiled_passes_read_are_the_encodings(dtype):
    """formats' bit-layout constants (what the compiled passes decode with) against the
    encodings torch stores: +inf's bits, the magnitude and fraction masks, max's ordinal."""
    f = nc.formats.get(dtype)

    def bits(v: float) -> int:
        return int(torch.tensor(v, dtype=torch.float64).to(dtype).view(_INT[dtype.itemsize]))
    width = 8 * dtype.itemsize
    assert f.abs_mask == (1 << (width - 1)) - 1  # every bit but the sign
    assert f.inf_bits == (bits(math.inf) if f.has_inf else None)
    if f.has_inf:
        assert f.exp_mask == f.inf_bits >> f.mbits
    assert f.frac_mask == bits(2.0 - f.eps) - bits(1.0)  # 1.111...1 minus 1.0: all fraction bits
    assert f.max_ordinal == bits(f.max) and bits(-f.max) & f.abs_mask == f.max_ordinal
    assert f.max_significand == (f.max_ordinal & f.frac_mask) | (1 << f.mbits)
