"""A user's Triton kernel through ``nc.verify`` on the CPU, in Triton's interpreter: the
documented launcher recipe (docs/triton.md) with an RMSNorm that loads bf16, computes in fp32
and stores bf16 in the kernel. With numcheck's exact interpreter conversions
(numcheck.kernels.triton_interp, installed by ``nc.verify`` when TRITON_INTERPRET is set) the correct
kernel passes, including bf16 subnormal inputs and the in-kernel fp32 -> bf16 store that the
bare interpreter truncates; a missing tail mask and an ignored column stride are caught, and
an FP8 row quantizer whose scale is computed per tile instead of per row. Runs
in a subprocess: TRITON_INTERPRET must be set before triton is imported and must not leak."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r'''
import json, sys
import torch, triton, triton.language as tl
import numcheck as nc

@triton.jit
def rms_fwd(X, W, Y, D, sxr, sxc, syr, eps, BLOCK: tl.constexpr, TAIL: tl.constexpr,
            STRIDED: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    xcol = cols * sxc if STRIDED else cols
    if TAIL:
        x = tl.load(X + row * sxr + xcol, mask=inside, other=0.0).to(tl.float32)
    else:  # the fault: the lanes past D read the next row (or the buffer's end) into the sum
        x = tl.load(X + row * sxr + xcol).to(tl.float32)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    y = (x * rstd * w).to(Y.dtype.element_ty)
    tl.store(Y + row * syr + cols, y, mask=inside)

def launcher(tail=True, strided=True):
    def rms_norm(x, weight, eps):
        d = x.shape[-1]
        x2 = x.reshape(-1, d)  # a view where the layout allows: strides are the kernel's job
        block = triton.next_power_of_2(d)
        if not tail:  # the faulty kernel reads past the last row: give it memory to read
            pad = torch.full((x2.numel() + block,), float("nan"), dtype=x.dtype)
            pad[: x2.numel()] = x2.reshape(-1)
            x2 = pad[: x2.numel()].view(x2.shape)
        y = torch.empty(x2.shape, dtype=x.dtype)
        rms_fwd[(x2.shape[0],)](x2, weight, y, d, x2.stride(0), x2.stride(1), y.stride(0), eps,
                                BLOCK=block, TAIL=tail, STRIDED=strided)
        return y.reshape(x.shape)
    return rms_norm

@triton.jit
def fp8_row(X, Y, D, FMAX: tl.constexpr, E5M2: tl.constexpr, TILE: tl.constexpr,
            PER_TILE: tl.constexpr):
    row = tl.program_id(0)
    amax = 0.0
    if not PER_TILE:  # the row's amax first, tile by tile
        for t0 in range(0, D, TILE):
            cols = t0 + tl.arange(0, TILE)
            x = tl.load(X + row * D + cols, mask=cols < D, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
    for t0 in range(0, D, TILE):
        cols = t0 + tl.arange(0, TILE)
        x = tl.load(X + row * D + cols, mask=cols < D, other=0.0).to(tl.float32)
        if PER_TILE:  # the fault: one scale per tile of the row
            amax = tl.max(tl.abs(x), axis=0)
        scale = tl.where(amax == 0.0, 1.0, FMAX / amax)
        if E5M2:
            c = (x * scale).to(tl.float8e5).to(tl.float32)
        else:
            c = (x * scale).to(tl.float8e4nv).to(tl.float32)
        tl.store(Y + row * D + cols, (c / scale).to(Y.dtype.element_ty), mask=cols < D)

def fp8_launcher(per_tile):
    def fp8_qdq(x, fmt="e4m3", granularity="row", dim=-1):
        assert granularity == "row" and dim in (-1, x.dim() - 1)
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.empty_like(x2)
        fp8_row[(x2.shape[0],)](x2, y, x2.shape[1], FMAX=57344.0 if fmt == "e5m2" else 448.0,
                                E5M2=fmt == "e5m2", TILE=128, PER_TILE=per_tile)
        return y.reshape(x.shape)
    return fp8_qdq

FP8_CASES = ["bf16-1x4096-wide_range-s0-e4m3-row-_1", "bf16-8x200-normal-s0-e4m3-row-_1",
             "bf16-256x384-zero_blocks-s0-e5m2-row-_1"]

CASES = ["bf16-3x129-normal-s0-transposed-fp32", "bf16-2x7x1025-zero_blocks-s0-contiguous-same",
         "bf16-16x33-zero_blocks-s0-contiguous-same", "bf16-3x129-subnormal-s0-transposed-fp32",
         "bf16-4x128-outlier_channels-s0-contiguous-same"]
out = {}
for name, fn in [("correct", launcher()), ("no_tail_mask", launcher(tail=False)),
                 ("ignores_stride", launcher(strided=False))]:
    v = nc.verify("rms_norm", nc.kernel("rms_norm", name=name, forward_only=True)(fn),
                  device="cpu", case_ids=CASES)
    out[name] = {"passed": v.passed, "failed": sorted(r.case_id for r in v.failures)}
for name, per_tile in [("fp8_per_row", False), ("fp8_per_tile", True)]:
    fn = nc.kernel("fp8_qdq", name=name, forward_only=True)(fp8_launcher(per_tile))
    v = nc.verify("fp8_qdq", fn, device="cpu", case_ids=FP8_CASES)
    out[name] = {"passed": v.passed, "failed": sorted(r.case_id for r in v.failures)}
import os
from numcheck.kernels import triton_interp as _triton_interp
_triton_interp.uninstall()  # the bare interpreter, for comparison: verify must not reinstall
os.environ.pop("TRITON_INTERPRET")  # (the kernel stays interpreted: decorated with it set)
bare = nc.kernel("rms_norm", name="bare", forward_only=True)(launcher())
v = nc.verify("rms_norm", bare, device="cpu", case_ids=CASES)
import triton.runtime.interpreter as ti
assert ti._convert_float.__module__ == "triton.runtime.interpreter"
out["correct_bare_interpreter"] = {"passed": v.passed,
                                   "failed": sorted(r.case_id for r in v.failures)}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def verdicts():
    pytest.importorskip("triton")
    res = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_correct_kernel_passes_in_the_interpreter(verdicts):
    assert verdicts["correct"] == {"passed": True, "failed": []}


def test_the_bare_interpreter_fails_the_correct_kernel(verdicts):
    """Without numcheck's conversions the same kernel fails (the interpreter's truncating bf16
    store, its bf16 subnormal loads): what install() is for."""
    failed = verdicts["correct_bare_interpreter"]["failed"]
    assert "bf16-3x129-subnormal-s0-transposed-fp32" in failed  # SQNR -0.2 dB: the loads
    assert len(failed) >= 2  # and the truncating store (mean ULP toward larger magnitude -0.5)


def test_missing_tail_mask_is_caught(verdicts):
    failed = verdicts["no_tail_mask"]["failed"]
    assert failed and all(any(f"x{d}-" in c for d in (1025, 33, 129)) for c in failed)
    assert "bf16-4x128-outlier_channels-s0-contiguous-same" not in failed  # no tail at 128


def test_ignored_stride_is_caught_on_the_transposed_layout(verdicts):
    failed = verdicts["ignores_stride"]["failed"]
    assert failed and all("transposed" in c for c in failed)


def test_fp8_scale_per_tile_instead_of_per_row_is_caught(verdicts):
    """Rows longer than the 128-wide tile: a scale per tile quantizes each tile against its own
    amax (finer than the row's scale allows) and fails the bit-exact rule; the per-row kernel,
    the same code with the row's amax first, passes."""
    assert verdicts["fp8_per_row"] == {"passed": True, "failed": []}
    failed = verdicts["fp8_per_tile"]["failed"]
    assert "bf16-1x4096-wide_range-s0-e4m3-row-_1" in failed and failed


_NOISY = r'''
import json, warnings
import torch, triton, triton.language as tl
import numcheck as nc

@triton.jit
def silu_k(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    x = tl.load(X + i, mask=m, other=0.0).to(tl.float32)
    big = tl.exp(x * 0.0 + 1000.0)  # overflows on purpose: numpy warns, the result is unused
    # an fp16 sum that overflows: numpy warns from its own fromnumeric module, not triton's
    tot = tl.sum((x * 0.0 + 60000.0).to(tl.float16), axis=0)
    y = tl.where(big > 0.0, x / (1.0 + tl.exp(-x)), x)
    y = tl.where(tot != 0.0, y, x)
    tl.store(Y + i, y.to(Y.dtype.element_ty), mask=m)

def silu(x):
    x = x.contiguous()  # (empty_like of a transposed x would keep its strides)
    y = torch.empty_like(x)
    n = x.numel()
    silu_k[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y

def caught(run):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        result = run()
    return result, [str(m.message) for m in w if issubclass(m.category, RuntimeWarning)]

_, bare = caught(lambda: silu(torch.ones(8)))
kern = nc.kernel("silu", name="triton_silu", dtypes=("fp32",), forward_only=True)(silu)
v, through = caught(lambda: nc.verify("silu", kern, device="cpu"))
print(json.dumps({"bare": bare, "verify": through, "passed": v.passed, "n": v.executed}))
'''


def test_numpy_warnings_of_interpreted_kernels_are_silenced_in_verify():
    """Triton's interpreter warns through numpy on each overflow a kernel makes (issue 30: a
    flood on stderr); under nc.verify those RuntimeWarnings are dropped and the verdict stays."""
    pytest.importorskip("triton")
    res = subprocess.run([sys.executable, "-c", _NOISY], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert any("overflow" in m for m in got["bare"]), got  # the interpreter does warn
    assert any("in reduce" in m for m in got["bare"]), got  # numpy's sum, attributed to numpy
    assert got["verify"] == [] and got["passed"] and got["n"] > 0, got
