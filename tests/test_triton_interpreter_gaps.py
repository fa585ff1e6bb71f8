"""What Triton 3.9.0's interpreter (TRITON_INTERPRET=1) cannot run as compiled Triton runs it,
beyond its float conversions (tests/test_triton_interpreter_findings.py): docs/findings.md,
"Triton's CPU interpreter: float scalar arguments, libdevice, bf16 arithmetic" (issue 30). Each
a minimal kernel against bare Triton, pinned to the version measured, so that a fix upstream (or
in numcheck.kernels.triton_interp) is noticed. Subprocess: TRITON_INTERPRET must be set before
triton is imported and must not leak into this process."""
from __future__ import annotations

import pytest

from _support import run_interpreted


_SCRIPT = r"""
import json, torch, triton, triton.language as tl
from triton.language.extra import libdevice

@triton.jit
def add_eps(X, Y, eps, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i) + eps.to(tl.float32))

@triton.jit
def rsqrt(X, Y, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, libdevice.rsqrt(tl.load(X + i)))

@triton.jit
def affine(X, Y, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i) * 1.25 - 1.25)

@triton.jit
def total(X, Y, BLOCK: tl.constexpr):
    tl.store(Y, tl.sum(tl.load(X + tl.arange(0, BLOCK)), axis=0))

out = {}
def attempt(name, run):
    try:
        out[name] = run()
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"

def eps_case():
    y = torch.empty(4)
    add_eps[(1,)](torch.ones(4), y, 1e-6, BLOCK=4)
    return y.tolist()

def rsqrt_case():
    y = torch.empty(4)
    rsqrt[(1,)](torch.full((4,), 4.0), y, BLOCK=4)
    return y.tolist()

def affine_case():
    y = torch.empty(4, dtype=torch.bfloat16)
    affine[(1,)](torch.full((4,), 1.5, dtype=torch.bfloat16), y, BLOCK=4)
    return y.float().tolist()

def total_case():
    y = torch.empty(1, dtype=torch.bfloat16)
    total[(1,)](torch.ones(8, dtype=torch.bfloat16), y, BLOCK=8)
    return y.float().tolist()

@triton.autotune(configs=[triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})], key=["n"])
@triton.jit
def copy_tuned(X, Y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n), mask=i < n)

def tuned_case():
    y = torch.empty(8)
    copy_tuned[lambda meta: (triton.cdiv(8, meta["BLOCK"]),)](torch.ones(8), y, 8)
    return y.tolist()

for name, run in (("eps", eps_case), ("rsqrt", rsqrt_case), ("affine", affine_case),
                  ("total", total_case), ("tuned", tuned_case)):
    attempt(name, run)
print(json.dumps({"triton": triton.__version__, **out}))
"""


@pytest.fixture(scope="module")
def bare():
    return run_interpreted(_SCRIPT)


def test_a_python_float_argument_stays_a_python_float(bare):
    """Compiled Triton types a float argument as an fp32 scalar (``eps.to(tl.float32)`` is
    fine); the interpreter hands the kernel the Python float itself."""
    assert "'float' object has no attribute 'to'" in bare["eps"], bare["eps"]


def test_libdevice_functions_return_none(bare):
    """``triton.language.extra.libdevice`` functions are not patched by the interpreter: they
    return None, and the store that follows fails."""
    assert "cannot convert None" in bare["rsqrt"], bare["rsqrt"]


def test_an_autotuned_kernel_asks_for_a_gpu_to_time_its_configs(bare):
    """@triton.autotune with two configs benchmarks them through the active driver, which the
    interpreter does not provide (numcheck's support takes the first config instead:
    tests/test_triton_limits.py)."""
    assert "0 active drivers" in bare["tuned"], bare["tuned"]


def test_bf16_arithmetic_runs_on_the_raw_bits(bare):
    """numpy has no bf16: the interpreter stores bf16 as uint16 and adds and multiplies those
    integers. 1.5 * 1.25 - 1.25 is 0.625 in bf16 (every step exact); the interpreter gives
    about -9.9e14. tl.sum of eight bf16 ones (8, exact) gives about -2.7e36."""
    assert bare["affine"] != [0.625] * 4 and abs(bare["affine"][0]) > 1e14, bare["affine"]
    assert bare["total"] != [8.0] and abs(bare["total"][0]) > 1e30, bare["total"]


_FIXED = r"""
import json, math, torch, triton, triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.libdevice import rsqrt as imported_rsqrt  # as real kernels import it
from numcheck.kernels import triton_interp
assert triton_interp.install()

@triton.jit
def add_eps(X, Y, eps, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i) + eps.to(tl.float32))

@triton.jit
def unary(X, Y, WHICH: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(X + i)
    if WHICH == 0:
        y = libdevice.rsqrt(x)
    elif WHICH == 1:
        y = libdevice.tanh(x)
    elif WHICH == 2:
        y = libdevice.erf(x)
    elif WHICH == 3:
        y = libdevice.exp(x)
    elif WHICH == 4:
        y = libdevice.log2(x)
    elif WHICH == 5:
        y = libdevice.pow(x, 1.5)
    else:
        y = imported_rsqrt(x)
    tl.store(Y + i, y)

y = torch.empty(4)
add_eps[(1,)](torch.ones(4), y, 1e-6, BLOCK=4)
x = torch.linspace(0.01, 4.0, 64)
out = {"eps": y.tolist(), "x": x.tolist()}
for which in range(7):
    for dtype in (torch.float32, torch.float64):
        xd = x.to(dtype)
        yd = torch.empty_like(xd)
        unary[(1,)](xd, yd, WHICH=which, BLOCK=64)
        out[f"{which}-{dtype}"] = yd.double().tolist()
print(json.dumps(out))
"""


def test_numcheck_closes_the_scalar_and_libdevice_gaps():
    """Under numcheck.kernels.triton_interp.install(): a float argument is an fp32 scalar, and
    libdevice's functions give the float64 result rounded once to the argument's format (the
    oracle: Python's math in float64, rounded by torch's cast; in fp64 itself both are within
    an ulp of the true value)."""
    import math

    import torch

    got = run_interpreted(_FIXED)
    assert got["eps"] == [float(torch.tensor(1.0 + 1e-6, dtype=torch.float32))] * 4
    x = torch.tensor(got["x"], dtype=torch.float64)
    fns = [lambda v: 1 / math.sqrt(v), math.tanh, math.erf, math.exp, math.log2,
           lambda v: v ** 1.5, lambda v: 1 / math.sqrt(v)]
    for which, fn in enumerate(fns):
        for dtype in (torch.float32, torch.float64):
            xs = x.to(dtype).double()
            want = torch.tensor([fn(v) for v in xs.tolist()], dtype=torch.float64).to(dtype)
            have = torch.tensor(got[f"{which}-{dtype}"], dtype=torch.float64)
            if dtype == torch.float32:  # a float64 value (within an ulp of it) rounded once
                assert have.tolist() == want.double().tolist(), (which, dtype)
            else:  # numpy's and Python's float64 maths are each within an ulp of the truth
                ulp = torch.finfo(torch.float64).eps * want.abs()
                assert ((have - want).abs() <= 2 * ulp).all(), (which, dtype)


_BF16 = r"""
import json, torch, triton, triton.language as tl
from numcheck.kernels import triton_interp
assert triton_interp.install()

@triton.jit
def elementwise(A, B, OUT, WHICH: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(A + i)
    b = tl.load(B + i)
    if WHICH == 0:
        y = a + b
    elif WHICH == 1:
        y = a - b
    elif WHICH == 2:
        y = a * b
    elif WHICH == 3:
        y = a / b
    elif WHICH == 4:
        y = tl.maximum(a, b)
    elif WHICH == 5:
        y = tl.where(a < b, a, -b)
    elif WHICH == 6:
        y = tl.abs(a) + b  # (tl.exp, tl.sqrt take fp32/fp64 only, compiled or not)
    elif WHICH == 7:
        y = tl.minimum(a, b) * a
    else:
        y = -a * 1.5
    tl.store(OUT + i, y)

@triton.jit
def reductions(A, S, MX, MN, AM, CS, N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(A + i)
    tl.store(S, tl.sum(a, axis=0))
    tl.store(MX, tl.max(a, axis=0))
    tl.store(MN, tl.min(a, axis=0))
    tl.store(AM, tl.argmax(a, axis=0))
    tl.store(CS + i, tl.cumsum(a, axis=0))

@triton.jit
def dot(A, B, C, M: tl.constexpr):
    r = tl.arange(0, M)
    a = tl.load(A + r[:, None] * M + r[None, :])
    b = tl.load(B + r[:, None] * M + r[None, :])
    tl.store(C + r[:, None] * M + r[None, :], tl.dot(a, b))

g = torch.Generator().manual_seed(0)
N = 64
a = (torch.randn(N, generator=g) * 3).to(torch.bfloat16)
b = (torch.randn(N, generator=g) * 3).to(torch.bfloat16)
out = {"a": a.float().tolist(), "b": b.float().tolist()}
for which in range(9):
    y = torch.empty(N, dtype=torch.bfloat16)
    elementwise[(1,)](a, b, y, WHICH=which, N=N)
    out[f"e{which}"] = y.float().tolist()
s, mx, mn = (torch.empty(1, dtype=torch.bfloat16) for _ in range(3))
am, cs = torch.empty(1, dtype=torch.int32), torch.empty(N, dtype=torch.bfloat16)
reductions[(1,)](a, s, mx, mn, am, cs, N=N)
out.update(sum=s.float().item(), max=mx.float().item(), min=mn.float().item(),
           argmax=am.item(), cumsum=cs.float().tolist())
M = 16
A = (torch.randn(M, M, generator=g)).to(torch.bfloat16)
B = (torch.randn(M, M, generator=g)).to(torch.bfloat16)
C = torch.empty(M, M)
dot[(1,)](A, B, C, M=M)
out.update(A=A.float().tolist(), B=B.float().tolist(), dot=C.tolist())
A16, B16 = (torch.randn(M, M, generator=g) * 100).half(), (torch.randn(M, M, generator=g) * 100).half()
dot[(1,)](A16, B16, C, M=M)  # fp16 products up to ~1e5 summed: past fp16's range, not fp32's
out.update(A16=A16.float().tolist(), B16=B16.float().tolist(), dot16=C.tolist())
print(json.dumps(out))
"""


def test_numcheck_computes_bf16_as_compiled_triton_does():
    """Under install(): each bf16 op on fp32-decoded operands, rounded once to bf16 (torch's bf16
    ops on the CPU do the same: the oracle); tl.sum and tl.cumsum of bf16 round each add in
    order (Triton keeps bf16 as the sum's type), max/min/argmax compare values, tl.dot of bf16
    and of fp16 accumulates in fp32."""
    import torch

    got = run_interpreted(_BF16)
    a, b = (torch.tensor(got[k]).to(torch.bfloat16) for k in "ab")
    want = [a + b, a - b, a * b, a / b, torch.maximum(a, b), torch.where(a < b, a, -b),
            a.abs() + b, torch.minimum(a, b) * a, -a * 1.5]
    for which, w in enumerate(want):
        assert got[f"e{which}"] == w.float().tolist(), which
    acc, running = torch.tensor(0.0, dtype=torch.bfloat16), []
    for v in a:  # one bf16 rounding per add, in order
        acc = v.clone() if not running else acc + v
        running.append(acc.float().item())
    assert got["sum"] == running[-1] and got["cumsum"] == running
    assert got["max"] == a.max().float().item() and got["min"] == a.min().float().item()
    assert got["argmax"] == int(a.float().argmax())
    A, B = (torch.tensor(got[k], dtype=torch.float64) for k in "AB")
    assert torch.allclose(torch.tensor(got["dot"], dtype=torch.float64), A @ B, rtol=1e-6,
                          atol=1e-6)
    # fp16 operands: an fp32 accumulator as compiled Triton's default (sums past 65504 stay
    # finite and within fp32 rounding of the float64 product)
    A, B = (torch.tensor(got[k], dtype=torch.float64) for k in ("A16", "B16"))
    ref = A @ B
    assert ref.abs().max() > 65504
    assert torch.allclose(torch.tensor(got["dot16"], dtype=torch.float64), ref, rtol=1e-5,
                          atol=1e-2)
