"""numcheck's built-in Triton kernels (numcheck/triton_kernels.py: RMSNorm forward and backward,
online softmax, FP8 row-wise quantize, MXFP8 quantize) on the CPU: run in Triton's interpreter for their own
decorators only (numcheck.kernels.triton_interp.kernels_module), they pass their ops' cases, and nothing leaks: no TRITON_INTERPRET in the environment, the knob off, a
kernel decorated afterwards is a compiled JITFunction. In a subprocess, so that this process's
triton state stays as it was."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r'''
import json, os
import numcheck as nc
from numcheck.catalog import kernels
env_before = os.environ.get("TRITON_INTERPRET")
v = nc.verify("rms_norm", kernels("rms_norm")["triton"], device="cpu",
              case_ids=["bf16-3x129-normal-s0-transposed-fp32",
                        "bf16-3x129-subnormal-s0-transposed-fp32",
                        "fp32-1x7-subnormal-s0-contiguous-same",
                        "bf16-16x33-zero_blocks-s0-contiguous-same",
                        "bf16-2x7x1025-zero_blocks-s0-contiguous-same"])
sm = nc.verify("softmax", kernels("softmax")["triton"], device="cpu",
               case_ids=["fp32-1x1025-normal-s0-transposed-last",
                         "fp32-3x129-large_logits-s0-contiguous-second_last"])
fp8 = nc.verify("fp8_qdq", kernels("fp8_qdq")["triton"], device="cpu",
                case_ids=["bf16-1x4096-wide_range-s0-e4m3-row-_1",
                          "fp32-4x390-outlier_channels-s0-e5m2-row-_1-pow2_scale"])
mx = nc.verify("mx_qdq", kernels("mx_qdq")["triton"], device="cpu",
               case_ids=[c.id for c in nc.catalog.get_op("mx_qdq").grid("quick")
                         if c.param("elem") in ("e4m3", "e5m2")][:4])
import triton, triton.language as tl
from numcheck.kernels import triton_interp as _triton_interp

@triton.jit
def later(X):
    tl.store(X, 1.0)

print(json.dumps({
    "passed": v.passed, "executed": v.executed,
    "softmax": [sm.passed, sm.executed], "fp8": [fp8.passed, fp8.executed],
    "mx": [mx.passed, mx.executed],
    "outputs": sorted({r.output for r in v.records if r.status == "passed"}),
    "skipped": sorted(r.reason for r in v.records if r.status == "skipped"),
    "env": [env_before, os.environ.get("TRITON_INTERPRET")],
    "knob": bool(triton.knobs.runtime.interpret),
    "later": type(later).__name__,
    "interpreted": type(_triton_interp.kernels_module("cpu")._rms_fwd).__name__}))
'''


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    pytest.importorskip("triton")
    script = tmp_path_factory.mktemp("triton") / "builtin.py"  # @triton.jit needs a file
    script.write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_builtin_triton_rms_norm_passes_forward_and_backward(result):
    assert result["passed"] and result["executed"] == 5 and not result["skipped"]
    assert result["outputs"] == ["grad_weight", "grad_x", "out"]


def test_builtin_online_softmax_and_fp8_quantizers_pass(result):
    """The online softmax over 9 tiles of a 1025-wide row (and along the second-last dim), the
    FP8 row quantizer bit-exact on a 4096-wide row and with power-of-two scales, MXFP8."""
    assert result["softmax"] == [True, 2] and result["fp8"] == [True, 2]
    assert result["mx"] == [True, 4]  # MXFP8, bit-exact to numcheck.quant.mx


def test_the_interpreter_does_not_leak(result):
    assert result["env"] == [None, None] and result["knob"] is False
    assert result["later"] == "JITFunction"
    assert result["interpreted"] == "InterpretedFunction"
