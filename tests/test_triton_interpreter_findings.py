"""Findings on Triton 3.9.0's interpreter (TRITON_INTERPRET=1), docs/findings.md ("Triton's CPU
interpreter converts floats wrongly"): each pinned, so a fix in Triton is noticed. The right
answers come from numcheck's own rounding (torch's casts agree: an oracle here). The kernels run
in a subprocess: TRITON_INTERPRET is read when a kernel is decorated and when triton is
imported, and must not leak into this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import numcheck as nc

_SCRIPT = r"""
import json, torch, triton, triton.language as tl

@triton.jit
def up(x_ptr, y_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y_ptr + o, tl.load(x_ptr + o).to(tl.float32))

@triton.jit
def down(x_ptr, y_ptr, N: tl.constexpr, FP8: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(x_ptr + o)
    if FP8:
        tl.store(y_ptr + o, x.to(tl.float8e4nv))
    else:
        tl.store(y_ptr + o, x.to(tl.bfloat16))

bits = torch.tensor([0x000B, 0x0003, 0x0001, 0x007F, 0x0080, 0x3F80, 0, 0], dtype=torch.int16)
y = torch.empty(8)
up[(1,)](bits.view(torch.bfloat16), y, N=8)
x = torch.randn(1024, generator=torch.Generator().manual_seed(0))
b = torch.empty(1024, dtype=torch.bfloat16)
down[(1,)](x, b, N=1024, FP8=False)
v = torch.tensor([1.9375, 1.0625, 1.3125, 1.96, 1.1, 3.875, 1.0, 240.0])
f8 = torch.empty(8, dtype=torch.float8_e4m3fn)
down[(1,)](v, f8, N=8, FP8=True)
print(json.dumps({"up": y.tolist(), "down_bf16": b.float().tolist(), "down_e4m3": f8.float().tolist()}))
"""


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_bf16_subnormals_load_wrongly(interpreted):
    """bf16 -> fp32 is exact (bits << 16); the interpreter normalises subnormals and loses the
    leading bit: 0x000B (1.0102e-39) loads as 4.4081e-39, 0x0001 as 0."""
    exact = (torch.tensor([0x000B, 0x0003, 0x0001, 0x007F, 0x0080, 0x3F80], dtype=torch.int32)
             << 16).view(torch.float32).tolist()
    got = interpreted["up"][:6]
    assert got[4:] == exact[4:]  # the smallest normal and 1.0 are right
    assert got[0] == float.fromhex("0x1.8p-128") and exact[0] == float.fromhex("0x1.6p-130")
    assert got[2] == 0.0 and all(g != e for g, e in zip(got[:4], exact[:4]))


def test_fp32_to_bf16_truncates(interpreted):
    """x.to(tl.bfloat16) rounds toward zero; IEEE's default (and compiled Triton's) is RNE."""
    x = torch.randn(1024, generator=torch.Generator().manual_seed(0)).double()
    got = torch.tensor(interpreted["down_bf16"], dtype=torch.float64)
    rne, rz = nc.round_to(x, "bf16"), nc.round_to(x, "bf16", rounding="rz")
    assert torch.equal(x.float().to(torch.bfloat16).double(), rne)  # torch agrees with RNE
    assert torch.equal(got, rz)
    assert 400 < int((got != rne).sum()) < 600  # about half of N(0,1) values


def test_fp32_to_e4m3_rounds_ties_away_and_loses_the_carry(interpreted):
    """e4m3: 1.9375 is the midpoint of 1.875 and 2 (RNE: 2); the interpreter gives 1.0 (the
    carry OR-ed into the exponent); 1.0625 -> 1.125 and 1.3125 -> 1.375 (ties away, RNE: 1.0
    and 1.25); 1.96 -> 1.0 (no tie, the carry again)."""
    v = torch.tensor([1.9375, 1.0625, 1.3125, 1.96, 1.1, 3.875, 1.0, 240.0], dtype=torch.float64)
    rne = nc.round_to(v, "e4m3").tolist()
    assert rne == v.float().to(torch.float8_e4m3fn).double().tolist()  # torch agrees
    assert rne[:4] == [2.0, 1.0, 1.25, 2.0]
    assert interpreted["down_e4m3"][:4] == [1.0, 1.125, 1.375, 1.0]
    assert interpreted["down_e4m3"][4:] == rne[4:]  # 1.1, 3.875 (carry into an even
    # exponent), 1.0 and 240 come out right


_PAIRS = [("fp32", "bf16"), ("fp32", "fp16"), ("fp32", "e4m3"), ("fp32", "e5m2"),
          ("bf16", "fp32"), ("fp16", "fp32"), ("e4m3", "fp32"), ("bf16", "e4m3")]
_TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@pytest.mark.parametrize("src,dst", _PAIRS, ids=lambda p: str(p))
def test_numcheck_conversions_for_the_interpreter_match_torch(src, dst):
    """numcheck.kernels.triton_interp.exact_convert (what nc.verify puts in place of the interpreter's
    routine) against torch's casts as the oracle: every bit pattern of 8/16-bit sources, 2^16
    fp32 values spread over all exponents plus inf/NaN/-0/subnormals; NaN by class."""
    pytest.importorskip("triton")
    from numcheck.kernels.triton_interp import exact_convert
    width = torch.finfo(_TORCH[src]).bits
    if width <= 16:
        raw = torch.arange(2 ** width, dtype=torch.int32).to(torch.int16 if width == 16
                                                              else torch.uint8)
        x = raw.view(_TORCH[src])
    else:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(1 << 16, generator=g) * torch.exp2(
            torch.randint(-140, 128, (1 << 16,), generator=g).float())
        x[:6] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0, 1e-45, 3e38])
    want = x.to(_TORCH[dst])
    if dst in ("e4m3", "e5m2"):  # compiled Triton converts with PTX cvt.rn.satfinite: the
        # largest finite value instead of torch's e5m2 inf
        big = torch.finfo(_TORCH[dst]).max
        want = torch.where(want.double().isinf(), torch.sign(want.double()) * big,
                           want.double()).to(_TORCH[dst])
    bits = exact_convert(x.contiguous().view(torch.uint8).numpy(), src, dst)
    got = torch.from_numpy(bits.copy()).view(torch.uint8).view(_TORCH[dst])
    g64, w64 = got.double(), want.double()
    assert torch.equal(g64.isnan(), w64.isnan())
    ok = g64.isnan() | ((g64 == w64) & (torch.signbit(g64) == torch.signbit(w64)))
    assert bool(ok.all()), (x[~ok][:5], got[~ok][:5], want[~ok][:5])
