"""torchao float8 training (convert_to_float8_training's casts, tensorwise and rowwise) against
numcheck's FP8 current-scaling reference (DESIGN rule 10), bit for bit: scales and codes.

torchao computes the scale as fp32(float64(448) / float64(amax)) (one rounding of the exact
quotient) and the codes as fp8(fp32(x * scale)), numcheck as fp32(448 / amax) and the same
product: identical wherever amax > 0 (an fp32 division is correctly rounded). amax = 0 differs
by convention (torchao clamps amax to 1e-12, numcheck uses scale 1; the codes are 0 either way).
"""
from __future__ import annotations

import warnings

import pytest
import torch

from numcheck import round_to
from numcheck.cases import inputs
from numcheck.quant import fp8_quantize

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    tao = pytest.importorskip("torchao.float8")
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

DISTS = ["normal", "outlier_channels", "wide_range", "student_t", "lognormal"]


def _x(dist, dtype, seed=0):
    x64 = inputs.draw(dist, (64, 256), seed=seed, stream="torchao-float8")
    return inputs.cast(x64, dtype, "cpu")[0]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("gran", ["tensor", "row"])
def test_casts_match_reference_bit_for_bit(dist, dtype, gran):
    x = _x(dist, dtype)
    kw = ({"scaling_granularity": ScalingGranularity.AXISWISE, "axiswise_dim": -1}
          if gran == "row" else {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, LinearMMConfig(), **kw)
    ref = fp8_quantize(x, "e4m3", gran, dim=-1)
    assert torch.equal(t._scale.float().reshape(-1), ref.scale.float().reshape(-1))
    assert torch.equal(t._data.double(), ref.codes)


def test_zero_tensor_convention_differs_codes_agree():
    x = torch.zeros(4, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, LinearMMConfig())
    ref = fp8_quantize(x, "e4m3", "tensor")
    assert float(ref.scale) == 1.0 and float(t._scale) == pytest.approx(448 / 1e-12)
    assert torch.equal(t._data.double(), ref.codes)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_converted_linear_forward_within_fp32_accumulation_of_the_reference(recipe):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(256, 64, bias=False))
    x = _x("normal", "fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = convert_to_float8_training(lin, config=Float8LinearConfig.from_recipe_name(recipe))
        y = m(x).detach().double()
    # torchao's rowwise recipe rounds its scales down to powers of two (numcheck: pow2_scale)
    gran, pow2 = ("tensor", False) if recipe == "tensorwise" else ("row", True)
    qx = fp8_quantize(x, "e4m3", gran, dim=-1, pow2_scale=pow2)
    qw = fp8_quantize(lin[0].weight.detach(), "e4m3", gran, dim=-1, pow2_scale=pow2)
    exact = (qx.codes / qx.scale.double().reshape(-1, 1)) @ \
        (qw.codes / qw.scale.double().reshape(-1, 1)).T
    mag = (qx.codes.abs() / qx.scale.double().reshape(-1, 1)) @ \
        (qw.codes.abs() / qw.scale.double().reshape(-1, 1)).T
    if recipe == "tensorwise":
        # fp32 accumulation over K = 256 and a final scaling: |err| <= (K+2) u32 |A||B| (Higham)
        bound = (256 + 2) * 2.0 ** -24 * mag
        assert bool(((y - exact).abs() <= bound).all()), float(((y - exact).abs() / mag).max())
    else:
        # Finding TAO-F8-1 (docs/quant-findings.md): the rowwise Float8Linear's fp32 output on
        # the CPU is the exact product of the quantized operands rounded to bf16, element for
        # element: 16 bits of the fp32 output lost (relative error up to 2^-9).
        assert torch.equal(y, round_to(exact, "bf16"))
        assert not torch.equal(y, exact.float().double())
    # ... and the quantization itself is visible: far from the unquantized product
    assert float((y - x.double() @ lin[0].weight.detach().double().T).abs().max()) > 1e-3
