"""Real Triton kernels from libraries installed from PyPI, verified on the CPU under Triton's
interpreter with numcheck's interpreter support (issue 30; docs/triton.md, "Kernels written
elsewhere"): liger-kernel (`pip install 'numcheck[corpus]'`) and torchao's Triton kernels
(`numcheck[torchao]`). Their code is never copied here: each kernel is adapted with nc.adapt,
and each planted fault is a one-line edit of the installed library's source, loaded as a
separate module at test time (``mutant``). --numcheck-slow (a few minutes interpreted).
Subprocess: TRITON_INTERPRET must be set before triton is imported and must not leak."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from _support import run_interpreted

pytestmark = pytest.mark.slow

# A copy of an installed module with source edits (old, new, how many times old occurs), loaded
# under a sibling name so that its relative imports resolve and the original stays untouched.
# torch ops the module registers (torch.library namespace ``ops``) move to a namespace of their
# own: registered again under the same name, the dispatcher would keep calling the original.
_MUTANT = r"""
import importlib.util, itertools, os, pathlib, tempfile
_serial = itertools.count()
DEVICE = os.environ.get("NUMCHECK_CORPUS_DEVICE", "cpu")

def mutant(module, *edits, ops=None):
    spec = importlib.util.find_spec(module)
    src = pathlib.Path(spec.origin).read_text()
    for old, new, count in edits:
        assert src.count(old) == count, (module, old, src.count(old))
        src = src.replace(old, new)
    if ops:
        ns = f"{ops}_mutant{next(_serial)}"
        src = src.replace(f'"{ops}::', f'"{ns}::').replace(f"torch.ops.{ops}.", f"torch.ops.{ns}.")
    path = pathlib.Path(tempfile.mkdtemp()) / pathlib.Path(spec.origin).name
    path.write_text(src)  # Triton's @jit reads the kernel's source from the file
    name = module + "_mutant"
    m = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
    m.__package__ = module.rpartition(".")[0]
    m.__spec__.loader.exec_module(m)
    return m

def summary(v):
    return {"passed": v.passed, "executed": v.executed,
            "errors": [r.reason[:300] for r in v.records if r.status == "error"][:3],
            "failed": [(r.case_id, r.output, r.dtype, r.shape, r.dist) for r in v.failures],
            "known": sorted({r.case_id for r in v.records if r.status == "known"})}
"""

_LIGER = _MUTANT + r"""
import json
import numcheck as nc
from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
from liger_kernel.ops.layer_norm import LigerLayerNormFunction
from liger_kernel.ops.rope import LigerRopeFunction
from liger_kernel.ops.softmax import LigerSoftmaxFunction
from liger_kernel.ops.swiglu import LigerSiLUMulFunction

def llama_cast(case, device, output):  # docs/findings.md, liger-kernel's RMSNorm
    if output == "grad_weight" and case.dtype in ("bf16", "fp16"):
        return ("liger-kernel 0.8.5: rms_norm casting_mode='llama' forms grad_weight from "
                "x * rstd rounded to the input dtype (Hugging Face Llama's cast, on purpose)")
    return None

def rms_norm_of(Function, casting_mode="llama"):  # apply(X, W, eps, offset, casting_mode, in_place)
    fn = nc.adapt(Function, lambda x, weight, eps: (x, weight, eps, 0.0, casting_mode, False))
    return nc.kernel("rms_norm", name=f"liger_rms_norm_{casting_mode}",
                     known_failure=llama_cast if casting_mode == "llama" else None)(fn)

def bf16_backward_sum(case, device, output):  # docs/findings.md, liger-kernel's softmax
    if output == "grad_x" and case.dtype in ("bf16", "fp16"):
        return "liger-kernel 0.8.5: softmax backward sums dy * y with tl.sum in the input dtype"
    return None

def one_block(case, device):  # liger_kernel.ops.utils.calculate_settings raises above it
    if case.shape[-1] > 65536:
        return "liger-kernel 0.8.5 softmax: rows longer than 65536 raise (one Triton block)"
    return None

@nc.kernel("softmax", name="liger_softmax", known_failure=bf16_backward_sum, supports=one_block)
def softmax(x, dim=-1):  # the kernel reduces over the last dim: move dim there and back
    return LigerSoftmaxFunction.apply(x.transpose(dim, -1).contiguous()).transpose(dim, -1)

from liger_kernel.ops.rms_norm import LigerRMSNormFunction
OPS = {
    "rms_norm": rms_norm_of(LigerRMSNormFunction),  # the library's default, "llama"
    "rms_norm_gemma": rms_norm_of(LigerRMSNormFunction, "gemma"),  # fp32 throughout
    "layer_norm": nc.adapt(LigerLayerNormFunction,  # forward(ctx, X, W, B, eps)
                           lambda x, weight, bias, eps: (x, weight, bias, eps)),
    "swiglu": nc.adapt(LigerSiLUMulFunction),
    "softmax": softmax,
    # rotates q and k together: q of the pair; cos, sin (1, S, D) broadcast over heads
    "rope": nc.adapt(LigerRopeFunction, lambda x, cos, sin: (x, x.clone(), cos.unsqueeze(0),
                                                             sin.unsqueeze(0)), output=0),
    # (loss, z_loss, ...): numcheck's op is the mean loss
    "cross_entropy": nc.adapt(LigerCrossEntropyFunction, lambda logits, target: (
        logits, target, None, -100, 0.0, 0.0, "mean"), output=0),
}
out = {key: summary(nc.verify(key.split("_gemma")[0], fn, device=DEVICE))
       for key, fn in OPS.items()}
faults = {  # planted in the "gemma" mode, which passes everything: nothing declared known
    # the library's own switch: mean of squares and rstd in the input dtype
    "low_precision_reduction": rms_norm_of(LigerRMSNormFunction, "none"),
    # the mean over the padded block instead of the row (zeros in the masked tail)
    "tail": rms_norm_of(mutant("liger_kernel.ops.rms_norm",
                               ("X_row, axis=0) / n_cols", "X_row, axis=0) / BLOCK_SIZE", 1),
                               ("X_row, axis=1) / n_cols", "X_row, axis=1) / BLOCK_SIZE", 1)
                               ).LigerRMSNormFunction, "gemma"),
    # eps added to the reciprocal instead of the mean square
    "eps_placement": rms_norm_of(mutant("liger_kernel.ops.rms_norm",
                                        ("rsqrt(mean_square + eps)", "rsqrt(mean_square) + eps",
                                         2)).LigerRMSNormFunction, "gemma"),
}
for fault, fn in faults.items():
    out[fault] = summary(nc.verify("rms_norm", fn, device=DEVICE))
print(json.dumps(out))
"""

_TORCHAO = _MUTANT + r"""
import json, torch
import numcheck as nc
from numcheck.cases.grid import Case
from torchao.float8.float8_training_tensor import LinearMMConfig
from torchao.prototype.float8nocompile.kernels import fp8_dynamic_tensorwise as tensorwise

def known(case, device, output):  # what the library does on purpose (docs/triton.md)
    if case.dist == "subnormal":
        return "torchao: amax clamped to EPS=1e-12, so blocks of smaller amax quantize to 0"
    return None

def quantizers(K):  # K: torchao.prototype.blockwise_fp8_training.kernels, or a mutant of it
    # the op's parameters are taken (a kernel without them skips the cases that set them);
    # `supports` keeps the cases these kernels implement
    def act_lhs(x, fmt, granularity, dim, pow2_scale):  # 1 x 128 groups along the last dim
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y, s = K.triton_fp8_blockwise_act_quant_lhs(x2, 128)
        m, k = x2.shape
        return (y.float().reshape(m, k // 128, 128) * s[..., None]).reshape(x.shape).to(x.dtype)

    def weight_rhs(x, fmt, granularity, dim, pow2_scale):  # 128 x 128 tiles
        y, s = K.triton_fp8_blockwise_weight_quant_rhs(x.contiguous(), 128)
        m, n = x.shape
        d = y.float().reshape(m // 128, 128, n // 128, 128) * s[:, None, :, None]
        return d.reshape(m, n).to(x.dtype)
    return act_lhs, weight_rhs

def tensor_atomic(x, fmt, granularity, dim, pow2_scale):  # one scale per tensor, the amax reduced across programs by atomic_max
    dt = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    t = tensorwise.hp_to_fp8_row_major(x.contiguous(), dt, LinearMMConfig())
    return (t._data.float() / t._scale).to(x.dtype)

def gemm_of(K):
    def gemm(a, b, recipe):  # 1x128 activations x 128x128 weights, fp8 tl.dot, fp32 out
        a8, a_s = K.triton_fp8_blockwise_act_quant_lhs(a.contiguous(), 128)
        b8, b_s = K.triton_fp8_blockwise_weight_quant_rhs(b.contiguous(), 128)
        return K.triton_fp8_gemm_1x128_128x128(a8, b8, a_s, b_s, 128, torch.float32)
    return gemm

def qdq_cases(gran, shapes, fmts=("e4m3",)):
    # bf16 outputs: the adapters dequantize with torchao's fp32 reciprocal scale, within 1 ULP of
    # numcheck's codes / scale, which rounding to bf16 hides (fp32: the codes are compared below).
    # Multi-row shapes: the fp8_qdq grid's cases these kernels take are single-row in bf16.
    return [Case("fp8_qdq", "bf16", shape, dist, 0, (("fmt", fmt), ("granularity", gran),
                                                     ("dim", -1), ("pow2_scale", False)))
            for shape in shapes for fmt in fmts
            for dist in ("normal", "outlier_channels", "student_t", "zero_blocks", "wide_range",
                         "subnormal")]

def check(name, fn, cases, op="fp8_qdq"):
    fn = nc.kernel(op, name=name, known_failure=known)(fn)
    return summary(nc.verify(op, fn, device=DEVICE, adhoc=cases))

import torchao.prototype.blockwise_fp8_training.kernels as K
from numcheck.quant import fp8
act_lhs, weight_rhs = quantizers(K)
ACT = qdq_cases("block128", [(4, 256), (256, 384), (2, 3, 512), (1, 4096)])
WEIGHT = qdq_cases("block128x128", [(256, 384), (128, 256), (384, 128)])
TENSOR = qdq_cases("tensor", [(4, 256), (3, 130, 257), (256, 384)], ("e4m3", "e5m2"))
# the grid's GEMM shapes have N < 128: these add the sizes the kernels take
GEMM = [Case("scaled_matmul", dt, shape, dist, 0, (("recipe", "fp8_block"),))
        for dt in ("bf16", "fp32") for shape in ((64, 256, 128), (130, 384, 256))
        for dist in ("normal", "outlier_channels", "student_t")]
out = {"act_lhs": check("act_lhs", act_lhs, ACT),
       "weight_rhs": check("weight_rhs", weight_rhs, WEIGHT),
       "tensor_atomic": check("tensor_atomic", tensor_atomic, TENSOR),
       "gemm": check("gemm", gemm_of(K), GEMM, "scaled_matmul")}
# fp32 inputs: torchao's codes are numcheck's spec codes bit for bit; the dequantized values
# differ only by the reciprocal scale (codes * fl(1/scale) against codes / scale)
g = torch.Generator().manual_seed(0)
x = (torch.randn(256, 384, generator=g) * torch.logspace(-3, 3, 384)).to(DEVICE)
y, s_inv = K.triton_fp8_blockwise_act_quant_lhs(x, 128)
y, s_inv, x = y.cpu(), s_inv.cpu(), x.cpu()
q = fp8.fp8_quantize(x, "e4m3", "block128")
ours = (q.codes.reshape(256, 3, 128) / q.scale.double()[..., None]).float().reshape(256, 384)
theirs = (y.float().reshape(256, 3, 128) * s_inv[..., None]).reshape(256, 384)
out["fp32_codes_equal"] = bool(torch.equal(y.double(), q.codes))
out["fp32_dequant_max_ulp"] = int(nc.ulp_distance(theirs, ours, "fp32").abs().max())
faults = {
    # the scales written row-major into the column-major scale tensor the GEMM reads
    "stride": mutant("torchao.prototype.blockwise_fp8_training.kernels", (
        "scale_offs = m_offs[:, None] * s_stride_dim_0 + pid_k * s_stride_dim_1",
        "scale_offs = m_offs[:, None] * (K // BLOCK_SIZE) + pid_k", 1), ops="torchao"),
    # one scale per tile of NUM_GROUPS rows instead of one per 1 x 128 group
    "scale_granularity": mutant("torchao.prototype.blockwise_fp8_training.kernels", (
        "amax = tl.clamp(tl.max(tl.abs(x), axis=1), min=EPS",
        "amax = tl.clamp(tl.maximum(tl.max(tl.abs(x), axis=1), tl.max(tl.abs(x))), min=EPS", 1),
        ops="torchao"),
}
for fault, M in faults.items():
    out[fault] = check(f"act_lhs_{fault}", quantizers(M)[0], ACT)
    out[fault + "_gemm"] = check(f"gemm_{fault}", gemm_of(M), GEMM, "scaled_matmul")
print(json.dumps(out))
"""


def _corpus(dist: str, module: str, script: str, extra: str) -> dict:
    """The script's verdicts: interpreted on the CPU, or compiled where NUMCHECK_CORPUS_DEVICE
    is cuda (bench/gpu_run.sh)."""
    pytest.importorskip("triton")
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{dist} is not installed (pip install 'numcheck[{extra}]')")
    compiled = os.environ.get("NUMCHECK_CORPUS_DEVICE", "cpu").startswith("cuda")
    if compiled and not torch.cuda.is_available():
        pytest.skip("NUMCHECK_CORPUS_DEVICE=cuda, but no CUDA device here")
    return run_interpreted(script, timeout=1800, interpret=not compiled)


@pytest.fixture(scope="module")
def liger():
    return _corpus("liger-kernel", "liger_kernel", _LIGER, "corpus")


@pytest.fixture(scope="module")
def torchao():
    return _corpus("torchao", "torchao", _TORCHAO, "torchao")


@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_gemma", "layer_norm", "swiglu",
                                "softmax", "rope", "cross_entropy"])
def test_liger_kernels_run_interpreted_and_pass(liger, op):
    """Correct kernels: every case runs (no interpreter crash: float eps, libdevice rsqrt, bf16
    arithmetic) and passes, forward and backward, bf16 and fp16 included; the softmax's rows
    past its one-block limit skip with the library's reason instead of erroring."""
    got = liger[op]
    assert got["executed"] > 0 and not got["errors"], got
    assert got["passed"], got
    if op not in ("softmax", "rms_norm"):
        assert not got["known"], got


def test_liger_rms_norm_llama_cast_costs_the_weight_gradient(liger):
    """The default "llama" mode rounds x * rstd to the input dtype before the weight gradient
    (Hugging Face Llama's cast): against the fp32-inside baseline it fails grad_weight where
    rows cancel or the weight is fp32 (an fp16 gradient of an fp32 master weight), and only
    there; declared known in the adapter (docs/findings.md). "gemma" passes everything."""
    known = liger["rms_norm"]["known"]
    assert known and all(c.startswith(("bf16", "fp16")) for c in known), known


def test_liger_softmax_backward_sums_in_bf16(liger):
    """The softmax backward's sum(dy * y) is a tl.sum of bf16 products, which Triton keeps in
    bf16: against the careful baseline (fp32 inside, DESIGN rule 4) its bf16 gradient fails
    where the row sum matters; declared known in the adapter (docs/findings.md)."""
    known = liger["softmax"]["known"]
    assert known and all(c.startswith(("bf16", "fp16")) for c in known), known


def test_norm_statistics_in_the_input_dtype_are_caught(liger):
    """The library's own casting_mode="none" (mean of squares and rstd in bf16/fp16, the class
    of bug issue 31 found twice in that library's history) fails on bf16 and fp16 and only
    there (in fp32 it is the same computation as "llama")."""
    got = liger["low_precision_reduction"]
    assert not got["passed"] and {f[2] for f in got["failed"]} == {"bf16", "fp16"}, got


def test_a_mean_over_the_padded_block_is_caught_on_ragged_rows_only(liger):
    """Dividing by BLOCK_SIZE (the next power of two) instead of the row length is exact on
    power-of-two rows and wrong on every ragged one: the failures are those rows."""
    got = liger["tail"]
    widths = {int(f[3].split("x")[-1]) for f in got["failed"]}
    assert not got["passed"] and widths and not got["errors"], got
    assert all(w & (w - 1) for w in widths), widths  # none a power of two


def test_eps_outside_the_square_root_is_caught(liger):
    """rsqrt(ms) + eps: inf + eps on zero rows (NaN outputs), a different value on rows whose
    mean square is near eps."""
    got = liger["eps_placement"]
    assert not got["passed"] and not got["errors"], got
    assert {f[4] for f in got["failed"]} & {"zero_blocks", "subnormal"}, got


@pytest.mark.parametrize("kernel", ["act_lhs", "weight_rhs", "tensor_atomic"])
def test_torchao_quantizers_pass_but_for_their_deliberate_flush(torchao, kernel):
    """torchao's FP8 quantizers (1x128 groups, 128x128 tiles, tensor-wise with a cross-program
    atomic_max): bit-exact to numcheck's FP8 spec on every case but subnormal blocks, which the
    kernels flush on purpose (amax clamped to 1e-12; declared known in the adapter)."""
    got = torchao[kernel]
    assert got["executed"] >= 18 and not got["errors"], got
    assert got["passed"] and not got["failed"], got
    assert got["known"] and all("subnormal" in c for c in got["known"]), got


def test_torchao_fp32_codes_are_the_spec_and_only_the_dequantization_differs(torchao):
    """Where fp32 outputs differ from numcheck's (max ULP 1), the quantized codes are the
    spec's bit for bit: the difference is the reciprocal-scale dequantization."""
    assert torchao["fp32_codes_equal"]
    assert torchao["fp32_dequant_max_ulp"] == 1


def test_torchao_blockwise_fp8_gemm_passes(torchao):
    """fp8 operands through tl.dot, per-block scales applied to the fp32 accumulator: within
    scaled_matmul's componentwise bound of the dequantized operands."""
    got = torchao["gemm"]
    assert got["executed"] == 12 and got["passed"], got


@pytest.mark.parametrize("fault", ["stride", "scale_granularity"])
def test_torchao_planted_faults_are_caught(torchao, fault):
    """A stride ignored (scales written row-major into the column-major tensor) and one scale
    per tile of rows instead of per 1 x 128 group: the quantizer fails on multi-row inputs,
    and so does the GEMM that consumes its output."""
    got, gemm = torchao[fault], torchao[fault + "_gemm"]
    assert not got["passed"] and not got["errors"], got
    assert all(f[3] != "1x4096" for f in got["failed"]), got  # one row: nothing to confuse
    assert not gemm["passed"], gemm
