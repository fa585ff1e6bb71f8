"""Tensor digests (numcheck/telemetry/digest.py): the same bits give the same digest whatever
computes it (layout, thread count, ATen ISA tier), a one-bit change anywhere changes it, and
the value is exact in the float64 rows."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from numcheck.telemetry.digest import digest


def _x(dtype=torch.float32):
    return torch.randn(67, 129, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16,
                                   torch.float64, torch.float8_e4m3fn])
def test_equal_bits_equal_digest_and_one_bit_changes_it(dtype):
    x = _x(dtype)
    d = float(digest(x))
    assert d == int(d) and 0 <= d < 2.0 ** 48
    assert float(digest(x.t().contiguous().t())) == d   # a layout: the same logical values
    assert float(digest(x.clone())) == d
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
            torch.float64: torch.int64, torch.float8_e4m3fn: torch.uint8}[dtype]
    seen = {d}
    for i in range(0, x.numel(), 97):   # the lowest bit of every 97th element, one at a time
        y = x.clone().view(bits).view(-1)
        y[i] ^= 1
        seen.add(float(digest(y.view(x.shape).view(dtype))))
    assert len(seen) == 1 + len(range(0, x.numel(), 97))   # every change seen, no collision


def test_a_move_within_a_row_or_a_column_changes_it():
    x = _x()
    d = float(digest(x))
    for (i, j), (k, m) in (((0, 0), (0, 5)), ((0, 0), (9, 0)), ((3, 4), (60, 100))):
        y = x.clone()
        y[i, j], y[k, m] = x[k, m], x[i, j]
        assert float(digest(y)) != d


# float64 draws: torch's CPU randn in float32 (16 elements and more) differs between ISA tiers
# (docs/findings.md), which would test the generator, not the digest
_SCRIPT = ("import json, torch; from numcheck.telemetry.digest import digest; "
           "x = torch.randn(513, 1031, generator=torch.Generator().manual_seed(1), "
           "dtype=torch.float64).float(); "
           "print(json.dumps([float(digest(x)), float(digest(x.bfloat16()))]))")


def test_the_same_on_every_isa_tier_and_thread_count():
    """Integer sums: no order to depend on (ATEN_CPU_CAPABILITY=default and one thread against
    this process)."""
    x = torch.randn(513, 1031, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64).float()
    here = [float(digest(x)), float(digest(x.bfloat16()))]
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         env=env, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(67, 129), (5,), (), (3, 4, 7)])
def test_the_compiled_cpu_pass_gives_the_torch_routes_digest(dtype, shape):
    """numcheck/telemetry/_fields_numba.py's one loop (what CPU tensors take) against the
    torch ops (the CUDA route and the reference): the same integer, transposed views too."""
    fast = pytest.importorskip("numcheck.telemetry._fields_numba")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64).to(dtype)
    assert fast.digest(x) == float(digest(x))
    xt = torch.randn(7, 9, dtype=torch.float64).to(dtype).t()
    assert fast.digest(xt) == float(digest(xt))
