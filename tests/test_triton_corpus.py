"""Real Triton kernels from a library installed from PyPI, verified on the CPU under Triton's
interpreter with numcheck's interpreter support (issue 30; docs/triton.md, "Kernels written
elsewhere"). Optional: `pip install 'numcheck[corpus]'` (liger-kernel; its code is never copied
here) and --numcheck-slow (a minute or two interpreted). Subprocess: TRITON_INTERPRET must be
set before triton is imported and must not leak into this process."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import json
import numcheck as nc
from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
from liger_kernel.ops.layer_norm import LigerLayerNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
from liger_kernel.ops.rope import LigerRopeFunction
from liger_kernel.ops.softmax import LigerSoftmaxFunction
from liger_kernel.ops.swiglu import LigerSiLUMulFunction

def rms_norm(x, weight, eps):  # positional apply: (X, W, eps, offset, casting_mode, in_place)
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)

def layer_norm(x, weight, bias, eps):
    return LigerLayerNormFunction.apply(x, weight, bias, eps)

def swiglu(a, b):
    return LigerSiLUMulFunction.apply(a, b)

def softmax(x, dim=-1):  # the kernel reduces over the last dim: move dim there and back
    return LigerSoftmaxFunction.apply(x.transpose(dim, -1).contiguous()).transpose(dim, -1)

def rope(x, cos, sin):  # rotates q and k together; cos, sin (1, S, D) broadcast over heads
    return LigerRopeFunction.apply(x, x.clone(), cos.unsqueeze(0), sin.unsqueeze(0))[0]

def cross_entropy(logits, target):  # (loss, z_loss, ...): numcheck's op is the mean loss
    out = LigerCrossEntropyFunction.apply(logits, target, None, -100, 0.0, 0.0, "mean")
    return out[0] if isinstance(out, tuple) else out

def rms_norm_in_input_dtype(x, weight, eps):  # the library's casting_mode "none"
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "none", False)

OPS = {"rms_norm": rms_norm, "layer_norm": layer_norm, "swiglu": swiglu, "softmax": softmax,
       "rope": rope, "cross_entropy": cross_entropy}
out = {}
for op, fn in OPS.items():
    v = nc.verify(op, fn, device="cpu")
    out[op] = {"passed": v.passed, "executed": v.executed,
               "errors": [r.reason for r in v.records if r.status == "error"][:3],
               "failed": [(r.case_id, r.output, r.reason[:300]) for r in v.failures][:3]}
v = nc.verify("rms_norm", rms_norm_in_input_dtype, device="cpu")
out["rms_norm_in_input_dtype"] = {"passed": v.passed,
                                  "failed_dtypes": sorted({r.dtype for r in v.failures})}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def liger():
    pytest.importorskip("triton")
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger-kernel is not installed (pip install 'numcheck[corpus]')")
    res = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=1200, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "swiglu", "softmax", "rope",
                                "cross_entropy"])
def test_liger_kernels_run_interpreted_and_pass(liger, op):
    """Correct kernels: every case runs (no interpreter crash: float eps, libdevice rsqrt, bf16
    arithmetic) and passes, forward and backward, bf16 and fp16 included."""
    got = liger[op]
    assert got["executed"] > 0 and not got["errors"], got
    assert got["passed"], got


def test_norm_statistics_in_the_input_dtype_are_caught(liger):
    """The library's own casting_mode="none" (mean of squares and rstd in bf16/fp16, the class
    of bug issue 31 found twice in that library's history) fails on bf16 and fp16 and only
    there (in fp32 it is the same computation as "llama")."""
    got = liger["rms_norm_in_input_dtype"]
    assert not got["passed"] and got["failed_dtypes"] == ["bf16", "fp16"], got

