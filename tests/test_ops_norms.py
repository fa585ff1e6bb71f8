"""Norm ops: references checked with gradcheck, torch's kernels pass, planted faults are caught."""
from __future__ import annotations

import warnings

import pytest
import torch

import numcheck as nc
from numcheck.catalog import get_op, kernels
from numcheck.ops.norms import EPS, adaln_reference, layer_norm_reference, rms_norm_reference
from numcheck.verification import verify
from numcheck.ops.variants import adaln_unfused_fp32, ln_welford, rms_reversed_fp32_sum

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype")


def _gen(*shape):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(
        sum(shape))).requires_grad_()


def test_references_gradcheck():
    x, w, b = _gen(3, 9), _gen(9), _gen(9)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm_reference(x, w, EPS), (x, w))
    assert torch.autograd.gradcheck(lambda x, w, b: layer_norm_reference(x, w, b, EPS), (x, w, b))
    s, sc = _gen(2, 1, 9), _gen(2, 1, 9)
    x3 = _gen(2, 4, 9)
    assert torch.autograd.gradcheck(lambda x, s, c: adaln_reference(x, s, c, EPS), (x3, s, sc))


def test_references_match_torch_in_float64():
    """A sanity check of the references (torch in float64 as an oracle, never inside them)."""
    x = torch.randn(5, 33, dtype=torch.float64)
    w, b = torch.randn(33, dtype=torch.float64), torch.randn(33, dtype=torch.float64)
    torch.testing.assert_close(rms_norm_reference(x, w, EPS),
                               torch.nn.functional.rms_norm(x, (33,), w, EPS))
    torch.testing.assert_close(layer_norm_reference(x, w, b, EPS),
                               torch.nn.functional.layer_norm(x, (33,), w, b, EPS))


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "adaln_modulate"])
def test_torch_kernels_pass_quick(op):
    v = verify(op, kernels(op)["torch"], device="cpu")
    assert v.passed, v.summary()
    assert v.executed == len(get_op(op).grid("quick"))


# ---- planted faults: realistic bugs in copies of the kernels ---------------------------------

def rms_no_eps(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True)) * weight.float()).to(x.dtype)


def rms_skips_ragged_tail(x, weight, eps):
    """Vectorized by 32 and forgets the tail: sums only the first D // 32 * 32 squares."""
    xf = x.float()
    d = x.shape[-1]
    body = d // 32 * 32 or d
    ms = (xf[..., :body] ** 2).sum(-1, keepdim=True) / d
    return (xf * torch.rsqrt(ms + eps) * weight.float()).to(x.dtype)


def ln_one_pass_low_precision(x, weight, bias, eps):
    """Variance as E[x^2] - E[x]^2 in the input precision: cancels when mean >> std."""
    mean = x.mean(-1, keepdim=True)
    var = (x * x).mean(-1, keepdim=True) - mean * mean
    return ((x - mean) * torch.rsqrt(var.clamp(min=0) + eps) * weight.to(x.dtype)
            + bias.to(x.dtype)).to(x.dtype)


def ln_unbiased_variance(x, weight, bias, eps):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = xf.var(-1, keepdim=True, unbiased=True)
    return ((xf - mean) * torch.rsqrt(var + eps) * weight.float() + bias.float()).to(x.dtype)


def adaln_scale_without_one(x, shift, scale, eps):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), None, None, eps) * scale + shift


def rms_output_truncated(x, weight, eps):
    """Computes in fp32 but casts the result by truncation (drops mantissa bits)."""
    xf = x.float()
    y = (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps) * weight.float()).double()
    return nc.round_to(y, nc.formats.get(x.dtype), "rz").to(x.dtype)


@pytest.mark.parametrize("op, fault, expect", [
    ("rms_norm", rms_no_eps, "non-finite"),
    ("rms_norm", rms_skips_ragged_tail, "rel_l2"),
    ("rms_norm", rms_output_truncated, "rel_l2|block"),
    ("layer_norm", ln_one_pass_low_precision, "rel_l2|non-finite|componentwise"),
    ("layer_norm", ln_unbiased_variance, "rel_l2"),
    ("adaln_modulate", adaln_scale_without_one, "rel_l2"),
])
def test_planted_fault_is_caught(op, fault, expect):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = verify(op, fault, device="cpu")
    assert not v.passed
    import re
    assert any(re.search(expect, r.reason) for r in v.failures), v.summary()


# ---- benign variants: other correct algorithms must pass ---------------------------------------

@pytest.mark.parametrize("op, variant", [
    ("rms_norm", rms_reversed_fp32_sum),
    ("layer_norm", ln_welford),
    ("adaln_modulate", adaln_unfused_fp32),
])
def test_benign_variant_passes(op, variant):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = verify(op, variant, device="cpu")
    assert v.passed, v.summary()


def test_finding_torch_cpu_layer_norm_half_param_grads():
    """docs/findings.md, torch-cpu-layer-norm-half-param-grads: bf16 input, fp32 weight, rows
    whose weight-gradient sum cancels (outlier channels): torch's CPU backward is ~1e-2 off where
    fp32 intermediates are ~1e-7 off; grad_bias (sum of dy) over 32769 bf16 rows is ~0.15 off,
    as a bf16 accumulator is, where an fp32 sum is ~1e-3 off. Reported as known on the torch
    kernel."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(128, 31, generator=g) * torch.logspace(0, 2, 31)).to(torch.bfloat16)
    w, b = torch.randn(31, generator=g), torch.randn(31, generator=g)
    dy = torch.randn(128, 31, generator=g).to(torch.bfloat16)

    def grad_weight(xx, dtype):
        ww = w.to(dtype).requires_grad_()
        out = torch.nn.functional.layer_norm(xx, (31,), ww, b.to(dtype), EPS)
        return torch.autograd.grad(out, ww, dy.to(out.dtype))[0].double()

    ref = grad_weight(x.double(), torch.float64)
    rel = lambda t: ((t - ref).norm() / ref.norm()).item()  # noqa: E731
    torch_bf16, fp32_inside = rel(grad_weight(x, torch.float32)), rel(grad_weight(x.float(), torch.float32))
    assert fp32_inside < 1e-5 and torch_bf16 > 100 * fp32_inside, (torch_bf16, fp32_inside)
    n, d = 32769, 64
    xb = torch.randn(n, d, generator=g).to(torch.bfloat16).requires_grad_()
    bb = torch.zeros(d, dtype=torch.bfloat16, requires_grad=True)
    dyb = torch.randn(n, d, generator=g).to(torch.bfloat16)
    out = torch.nn.functional.layer_norm(xb, (d,), None, bb, EPS)
    (gb,) = torch.autograd.grad(out, bb, dyb)
    exact = dyb.double().sum(0)
    rel_b = lambda t: ((t.double() - exact).norm() / exact.norm()).item()  # noqa: E731
    assert rel_b(gb) > 30 * rel_b(dyb.float().sum(0).to(torch.bfloat16)), rel_b(gb)
    kern = kernels("layer_norm")["torch"]
    case = next(c for c in get_op("layer_norm").grid("full") if c.dtype == "bf16")
    assert kern.known(case, "cpu", "grad_weight") == "torch-cpu-layer-norm-half-param-grads"
    assert kern.known(case, "cpu", "grad_bias") == "torch-cpu-layer-norm-half-param-grads"
    assert kern.known(case, "cpu", "out") is None


class _RMSBf16WeightGradAbove32k(torch.autograd.Function):
    """A kernel with two paths, as real ones have: up to 32768 rows the weight gradient is an
    fp32 sum, above it the multi-row path accumulates per-row contributions in bf16 (issue 31:
    a widely used library shipped exactly this in its RMSNorm backward)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        r = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, r)
        return (xf * r * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, weight, r = ctx.saved_tensors
        xf, gf, wf = x.float(), g.float(), weight.float()
        xh = xf * r
        gw_rows = (gf * xh).reshape(-1, x.shape[-1])
        if gw_rows.shape[0] > 32768 and x.dtype == torch.bfloat16:
            acc = torch.zeros(x.shape[-1], dtype=torch.bfloat16)
            for row in gw_rows:
                acc = acc + row.to(torch.bfloat16)
            gw = acc
        else:
            gw = gw_rows.sum(0)
        gxh = gf * wf
        gx = r * (gxh - xh * (gxh * xh).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw.to(weight.dtype), None


def test_a_low_precision_reduction_beyond_the_size_threshold_is_caught():
    """The 32769-row size class (DESIGN rule 14) reaches the kernel's second path: its bf16
    weight gradient fails there and only there; every smaller case passes (the grids before
    the size classes never reached it)."""
    kern = nc.kernel("rms_norm", name="two_paths")(
        lambda x, weight, eps: _RMSBf16WeightGradAbove32k.apply(x, weight, eps))
    v = verify("rms_norm", kern, device="cpu")
    failed = {(r.case_id, r.output) for r in v.failures}
    assert failed == {("bf16-32769x64-normal-s0-contiguous-same", "grad_weight")}, v.summary()
