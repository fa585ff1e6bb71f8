"""What Triton 3.9.0's interpreter (TRITON_INTERPRET=1) cannot run as compiled Triton runs it,
beyond its float conversions (tests/test_triton_interpreter_findings.py): docs/findings.md,
"Triton's CPU interpreter: float scalar arguments, libdevice, bf16 arithmetic" (issue 30). Each
a minimal kernel against bare Triton, pinned to the version measured, so that a fix upstream (or
in numcheck.kernels.triton_interp) is noticed. Subprocess: TRITON_INTERPRET must be set before
triton is imported and must not leak into this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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

for name, run in (("eps", eps_case), ("rsqrt", rsqrt_case), ("affine", affine_case),
                  ("total", total_case)):
    attempt(name, run)
print(json.dumps({"triton": triton.__version__, **out}))
"""


@pytest.fixture(scope="module")
def bare():
    triton = pytest.importorskip("triton")
    if not triton.__version__.startswith("3.9."):
        pytest.skip(f"measured on triton 3.9.0; this is {triton.__version__}")
    res = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_python_float_argument_stays_a_python_float(bare):
    """Compiled Triton types a float argument as an fp32 scalar (``eps.to(tl.float32)`` is
    fine); the interpreter hands the kernel the Python float itself."""
    assert "'float' object has no attribute 'to'" in bare["eps"], bare["eps"]


def test_libdevice_functions_return_none(bare):
    """``triton.language.extra.libdevice`` functions are not patched by the interpreter: they
    return None, and the store that follows fails."""
    assert "cannot convert None" in bare["rsqrt"], bare["rsqrt"]


def test_bf16_arithmetic_runs_on_the_raw_bits(bare):
    """numpy has no bf16: the interpreter stores bf16 as uint16 and adds and multiplies those
    integers. 1.5 * 1.25 - 1.25 is 0.625 in bf16 (every step exact); the interpreter gives
    about -9.9e14. tl.sum of eight bf16 ones (8, exact) gives about -2.7e36."""
    assert bare["affine"] != [0.625] * 4 and abs(bare["affine"][0]) > 1e14, bare["affine"]
    assert bare["total"] != [8.0] and abs(bare["total"][0]) > 1e30, bare["total"]
