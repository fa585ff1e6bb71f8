"""Third-party quantizers against numcheck's references (docs/quant-findings.md).

* torch's casts to float8 (exhaustive over bf16): bit-exact with ``round_to`` under the
  documented saturation semantics (docs/formats.md finding (b): e4m3 saturates on torch 2.13 CPU,
  e5m2 overflows to inf). torch._scaled_mm tensor-wise and row-wise is already checked against
  ``scaled_matmul_reference`` in tests/test_quant_recipe.py (not repeated here).
* torchao (skipped when not importable): MX ``to_mx`` for every element type and the FLOOR and
  RCEIL scale modes, bit-exact E8M0 scale codes and element values on the input zoo; NVFP4
  ``nvfp4_quantize`` with a per-tensor scale; and three MX findings and one NVFP4 finding where
  the rules differ, each pinned on its input.
"""
from __future__ import annotations

import pytest
import torch

import numcheck as nc
import numcheck.quant as Q
from numcheck.cases import inputs
from _support import Finding

# Where each third-party finding was measured (docs/findings.md, "Which versions and platforms")
E4M3_SATURATES = Finding("fp32 -> e4m3fn saturates (formats.md (b))", {"torch": ("2.13",)},
                         "CPU (x86 measured)")
_AO, _CPU = {"torchao": ("0.18",)}, "CPU, torch 2.13 (eager; x86 measured)"
MX1 = Finding("torchao MX-1: FLOOR code-0 block elements use 2^-126", _AO, _CPU)
MX2 = Finding("torchao MX-2: inf in a block becomes a finite value", _AO, _CPU)
MX3 = Finding("torchao MX-3: RCEIL log2 rounds the scale down", _AO, _CPU)
NV1 = Finding("torchao NV-1: NVFP4 block scales clamped to 2^-6", _AO, _CPU)

# ---- torch float8 casts: exhaustive bf16 -------------------------------------------------------

_BF16 = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("fmt,dtype,saturate", [("e4m3", torch.float8_e4m3fn, True),
                                                ("e5m2", torch.float8_e5m2, False)])
def test_torch_float8_cast_exhaustive_bf16(fmt, dtype, saturate):
    """Every bf16 value (NaNs by class) cast by torch equals numcheck's RNE rounding; e4m3 with
    saturation (torch 2.13 CPU, finding (b)), e5m2 with its own overflow to inf."""
    x = _BF16
    if fmt == "e4m3":  # bit-exact with whichever semantics torch has; saturating where measured
        saturate = bool(torch.tensor(480.0).to(dtype).float() == 448)
        E4M3_SATURATES.expect(saturate, "torch's bf16 -> e4m3fn cast saturates")
    ours = nc.round_to(x.double(), fmt, saturate=saturate)
    theirs = x.to(dtype).double()
    nan = torch.isnan(ours)
    assert torch.equal(nan, torch.isnan(theirs))
    assert torch.equal(ours[~nan], theirs[~nan])
    # signed zeros too: compare the sign bits of the finite results
    assert torch.equal(torch.signbit(ours[~nan]), torch.signbit(theirs[~nan]))


# ---- torchao -----------------------------------------------------------------------------------

ao_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor",
                            reason="torchao (the optional extra) is not installed")
from torchao.prototype.mx_formats.config import ScaleCalculationMode as Mode  # noqa: E402
from torchao.prototype.mx_formats.constants import (DTYPE_FP6_E2M3,  # noqa: E402
                                                    DTYPE_FP6_E3M2)
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize as ao_nvfp4  # noqa: E402
from torchao.prototype.mx_formats.nvfp4_tensor import per_tensor_amax_to_scale  # noqa: E402

ELEM = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m3": DTYPE_FP6_E2M3,
        "e3m2": DTYPE_FP6_E3M2, "e2m1": torch.float4_e2m1fn_x2}
MODE = {"floor": Mode.FLOOR, "rceil": Mode.RCEIL}


def ao_mx_quant(x, elem, mode):
    """torchao's (E8M0 codes as uint8, dequantized fp32 values) for MX blocks of 32."""
    s, d = ao_mx.to_mx(x, ELEM[elem], 32, MODE[mode])
    return s.view(torch.uint8), ao_mx.to_dtype(d, s, ELEM[elem], 32, torch.float32)


# Distributions where the rules agree (no E8M0 code 0 block with nonzero elements, no Inf).
_SAME = ("normal", "outlier_channels", "student_t", "zero_blocks", "wide_range", "lognormal",
         "near_overflow")


@pytest.mark.parametrize("mode", list(MODE))
@pytest.mark.parametrize("elem", list(ELEM))
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_torchao_to_mx_bit_exact(elem, mode, dtype):
    for dist in _SAME:
        x = inputs.cast(inputs.draw(dist, (32, 256), seed=3, fmt=dtype, stream="ao"),
                        nc.formats.get(dtype).torch)[0]
        codes, deq = ao_mx_quant(x, elem, mode)
        q = Q.mx_quantize(x, elem, 32, mode)
        assert torch.equal(codes, q.scale_code), (dist, elem, mode)
        assert torch.equal(deq.double(), Q.mx_dequantize(q)), (dist, elem, mode)


def test_finding_mx1_floor_code0_block_elements_use_2_pow_minus_126():
    """Finding MX-1: a block whose E8M0 code is 0 (X = 2^-127) with nonzero elements. torchao's
    FLOOR path stores code 0 but divides the elements by 2^-126 (it clamps the fp32 scale to the
    smallest normal), so its elements decode to half the input. numcheck (OCP MX v1.0 6.3: the
    elements are x / X) keeps them. Input: bf16 block, amax 2^-120, others 2^-125, e4m3."""
    x = torch.full((1, 32), 2.0 ** -125, dtype=torch.bfloat16)
    x[0, 0] = 2.0 ** -120
    s, d = ao_mx.to_mx(x, torch.float8_e4m3fn, 32, Mode.FLOOR)
    q = Q.mx_quantize(x, "e4m3", 32, "floor")
    assert q.scale_code.item() == 0
    assert q.codes[0, :2].tolist() == [128.0, 4.0]  # numcheck: x / 2^-127, exact
    assert Q.mx_dequantize(q)[0, 0].item() == 2.0 ** -120
    _, deq = ao_mx_quant(x, "e4m3", "floor")
    MX1.expect(s.view(torch.uint8).item() == 0  # torchao: code 0, but x / 2^-126
               and d.float()[0, :2].tolist() == [64.0, 2.0]
               and deq[0, 0].item() == 2.0 ** -121,  # decodes to half of 2^-120
               f"code {s.view(torch.uint8).item()}, elements {d.float()[0, :2].tolist()}, "
               f"decoded {deq[0, 0].item()}")


@pytest.mark.parametrize("mode,ao_code", [("floor", 247), ("rceil", 254)])
def test_finding_mx2_inf_in_block(mode, ao_code):
    """Finding MX-2: +inf in a block. numcheck writes the NaN scale 0xFF (microxcaling's rule):
    the block decodes to NaN. torchao writes a finite code (FLOOR: the inf exponent 128 - emax =
    120 -> 247; RCEIL: 0xFE) and saturates inf to 448, the other elements to 0: the overflow
    becomes a finite value. Input: bf16 ones with x[3] = +inf, e4m3."""
    x = torch.ones((1, 32), dtype=torch.bfloat16)
    x[0, 3] = float("inf")
    s, d = ao_mx.to_mx(x, torch.float8_e4m3fn, 32, MODE[mode])
    MX2.expect(s.view(torch.uint8).item() == ao_code
               and d.float()[0, :4].tolist() == [0.0, 0.0, 0.0, 448.0],
               f"code {s.view(torch.uint8).item()}, elements {d.float()[0, :4].tolist()}")
    q = Q.mx_quantize(x, "e4m3", 32, mode)
    assert q.scale_code.item() == 0xFF and bool(torch.isnan(Q.mx_dequantize(q)).all())


@pytest.mark.parametrize("k", [-10, -20, 5])
def test_finding_mx3_rceil_log2_rounds_down(k):
    """Finding MX-3: RCEIL with amax one fp32 ulp above 448 * 2^k. The quotient amax / 448 is
    2^k (1 + 2^-23); rounded up to a power of two it is 2^(k+1) (cuBLAS / cvt.rp, numcheck).
    torchao's eager fallback takes ceil(log2(q)) in fp32, and log2 rounds k + 1.7e-7 to k for
    |k| >= 4: scale 2^k, and the amax element saturates to 448 (k = 0 is still right)."""
    a = torch.nextafter(torch.tensor(448.0 * 2.0 ** k), torch.tensor(1e30))
    x = torch.zeros((1, 32))
    x[0, 0], x[0, 1] = a, 2.0 ** k
    s, d = ao_mx.to_mx(x, torch.float8_e4m3fn, 32, Mode.RCEIL)
    q = Q.mx_quantize(x, "e4m3", 32, "rceil")
    assert q.scale_code.item() == 128 + k and q.codes[0, :2].tolist() == [224.0, 0.5]
    MX3.expect(s.view(torch.uint8).item() == 127 + k and d.float()[0, 0].item() == 448.0,
               f"code {s.view(torch.uint8).item()} (numcheck {128 + k}), amax element "
               f"{d.float()[0, 0].item()}")


def _ao_nvfp4(x):
    pts = per_tensor_amax_to_scale(x.abs().amax())
    bs, _ = ao_nvfp4(x, 16, pts)
    return pts, bs.double()


@pytest.mark.parametrize("dist", ["normal", "outlier_channels", "student_t", "lognormal"])
def test_torchao_nvfp4_scales_bit_exact(dist):
    """Where every block scale is an e4m3 normal (>= 2^-6), torchao and numcheck agree."""
    x = inputs.cast(inputs.draw(dist, (64, 256), seed=1, fmt="fp32"), torch.float32)[0]
    pts, bs = _ao_nvfp4(x)
    q = Q.nvfp4_quantize(x)
    assert float(pts) == float(q.tensor_scale)
    assert bool((q.block_scale >= 2.0 ** -6).all())
    assert torch.equal(bs, q.block_scale)


# torchao's E4M3_EPS = torch.finfo(float8_e4m3fn).tiny = 2^-6, e4m3's smallest NORMAL value.
E4M3_MIN_NORMAL = 2.0 ** -6


@pytest.mark.parametrize("block_val,nc_scale", [
    (0.0, 0.0),  # zero block: both decode to zeros (scale 0 vs 2^-6)
    (2.0 ** -6, 2.0 ** -9),  # scale 2^-6 / 6 = 0.0026 rounds to the e4m3 subnormal 2^-9
    (2.0 ** -12, 0.0),  # scale 2^-12/6 < 2^-10: flushes in numcheck
])
def test_finding_nv1_block_scale_clamped_to_e4m3_min_normal(block_val, nc_scale):
    """Finding NV-1: torchao clamps every NVFP4 block scale to at least 2^-6 (e4m3's smallest
    normal) before the cast; numcheck rounds the scale RNE to e4m3, subnormals included
    (2^-9 .. 2^-7), and flushes below half the smallest subnormal (DESIGN rule 10). Blocks whose
    scale falls below 2^-6 (amax_b < 2^-6 * 6 * amax / 2688) get a coarser scale in torchao, or
    a nonzero one where numcheck flushes. Input: fp32 row, block 0 amax 2688 (tensor scale 1),
    block 1 all ``block_val``."""
    x = torch.zeros((1, 32))
    x[0, 0] = 2688.0
    x[0, 16:] = block_val
    pts, bs = _ao_nvfp4(x)
    q = Q.nvfp4_quantize(x)
    assert float(pts) == 1.0 and float(q.tensor_scale) == 1.0
    assert q.block_scale[0, 1].item() == nc_scale
    NV1.expect(bs[0, 1].item() == E4M3_MIN_NORMAL, f"torchao block scale {bs[0, 1].item()}")


def test_finding_nv1_on_wide_range():
    """NV-1 on the input zoo: wide_range (seed 1, fp32 64 x 256) has two blocks whose numcheck
    scales are e4m3 subnormals (0.01171875 = 6 * 2^-9, 0.00390625 = 2^-8); torchao gives 2^-6
    for both. Every other block scale is equal."""
    x = inputs.cast(inputs.draw("wide_range", (64, 256), seed=1, fmt="fp32"), torch.float32)[0]
    _, bs = _ao_nvfp4(x)
    q = Q.nvfp4_quantize(x)
    sub = q.block_scale < E4M3_MIN_NORMAL  # numcheck's subnormal block scales
    assert sorted(q.block_scale[sub].tolist()) == [0.00390625, 0.01171875]
    assert torch.equal(bs[~sub], q.block_scale[~sub])
    NV1.expect(bs[sub].tolist() == [E4M3_MIN_NORMAL] * 2, f"torchao gives {bs[sub].tolist()}")


@pytest.mark.parametrize("dist", ["normal", "outlier_channels", "student_t", "lognormal"])
def test_torchao_nvfp4_elements_within_one_step_of_the_reference(dist):
    """torchao's element codes against numcheck's. torchao scales as x * ((1/ts) / bs) in fp32
    (its Triton kernel's order), rule 10 as x / (bs * ts): the fp32 quotients differ in the last
    bit, which moves elements that sit on an e2m1 midpoint (docs/findings.md: NVFP4 is not
    bit-exact across correct implementations). Measured: at most 0.3% of elements differ, each
    by one e2m1 step; a wrong scale or a truncating cast moves far more, by more than that."""
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4

    from numcheck import round_to

    x = inputs.cast(inputs.draw(dist, (64, 256), seed=1, fmt="fp32"), torch.float32)[0]
    pts = per_tensor_amax_to_scale(x.abs().amax())
    _, packed = ao_nvfp4(x, 16, pts)
    ao = f4_unpacked_to_f32(unpack_uint4(packed.contiguous())).double().reshape(x.shape)
    q = Q.nvfp4_quantize(x)
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    step = (torch.searchsorted(grid, ao.abs()) - torch.searchsorted(grid, q.codes.abs())).abs()
    differ = ao != q.codes
    assert float(differ.double().mean()) <= 0.003, float(differ.double().mean())
    assert int(step.max()) <= 1
    assert torch.equal(torch.sign(ao[differ]) * torch.sign(q.codes[differ]) >= 0,
                       torch.ones_like(ao[differ], dtype=torch.bool))
    # the elements that differ sit (within fp32 rounding) on an e2m1 midpoint of x / scale
    scaled = x.double() / (q.block_scale.repeat_interleave(16, -1) * q.tensor_scale)
    mid = (scaled - round_to(scaled, "e2m1")).abs()
    half_step = torch.where(scaled.abs() < 2, 0.25, torch.where(scaled.abs() < 4, 0.5, 1.0))
    assert bool(((mid[differ] - half_step[differ]).abs() <= 1e-5 * half_step[differ]).all())
