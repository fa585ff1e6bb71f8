"""rope: the reference is gradcheck'd and agrees with a complex-number oracle, torch's eager
formula passes, planted RoPE bugs are caught by the componentwise bound, benign rewrites pass."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from numcheck.catalog import get_op, kernels
from numcheck.ops.rope import rope_reference, rope_tables, rotate_half
from numcheck.verification import verify
from numcheck.ops.variants import rope_complex_fp32 as complex_multiply_fp32
from numcheck.ops.variants import rope_fma as fused_multiply_add
from numcheck.ops.variants import rope_fp32_round_once as fp32_then_round_once

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype")


def _t(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_reference_gradcheck():
    x = _t(2, 3, 5, 6, seed=1).requires_grad_()
    cos, sin = (t.clone().requires_grad_() for t in rope_tables(5, 6, offset=3))
    assert torch.autograd.gradcheck(rope_reference, (x, cos, sin))


def test_reference_is_a_rotation_of_each_pair():
    """Oracle: (x1 + i x2) * e^(i theta) in complex128 (tests only); the norm of each pair is
    kept."""
    x = _t(2, 3, 9, 8, seed=2)
    cos, sin = rope_tables(9, 8, offset=100)
    out = rope_reference(x, cos, sin)
    z = torch.complex(x[..., :4], x[..., 4:]) * torch.complex(cos[:, :4], sin[:, :4])
    torch.testing.assert_close(out, torch.cat([z.real, z.imag], -1), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(out[..., :4] ** 2 + out[..., 4:] ** 2,
                               x[..., :4] ** 2 + x[..., 4:] ** 2)


def test_tables():
    cos, sin = rope_tables(4, 8)
    assert torch.equal(cos[0], torch.ones(8)) and torch.equal(sin[0], torch.zeros(8))
    assert torch.equal(cos[:, :4], cos[:, 4:])  # the halves share frequencies
    torch.testing.assert_close(torch.atan2(sin[1, :4], cos[1, :4]),
                               10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8))


def test_grid():
    spec = get_op("rope")
    quick = spec.grid("quick")
    assert [c.id for c in quick] == [c.id for c in spec.grid("quick")]
    assert len(quick) <= 20 and len(spec.grid("full")) <= 10 * len(quick)
    assert all(c.shape[-1] % 2 == 0 for c in spec.grid("full"))
    assert not any(c.dist == "wide_range" and c.dtype == "fp16" for c in spec.grid("full"))


@pytest.fixture(scope="module")
def torch_quick():
    return verify("rope", kernels("rope")["torch"], device="cpu")


def test_torch_kernel_passes_quick(torch_quick):
    assert torch_quick.passed, torch_quick.summary()
    assert torch_quick.executed == len(get_op("rope").grid("quick"))


# ---- planted faults ---------------------------------------------------------------------------

def swapped_halves_on_odd_positions(x, cos, sin):
    """A tiled kernel that mixes up the halves for odd positions (rows of a 2-row tile)."""
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], -1)
    odd = (torch.arange(x.shape[-2], device=x.device) % 2 == 1)[:, None]
    xs = torch.where(odd, swapped, x)
    return xs * cos + rotate_half(xs) * sin


def cos_sin_swapped(x, cos, sin):
    return x * sin + rotate_half(x) * cos


def rotate_half_sign_error(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., half:], -x[..., :half]], -1) * sin


def tables_cached_in_bf16(x, cos, sin):
    """fp32 work with the cos/sin cache kept in bf16 (a 2^-9 relative error in every angle)."""
    c, s = cos.to(torch.bfloat16).to(x.dtype), sin.to(torch.bfloat16).to(x.dtype)
    return x * c + rotate_half(x) * s


def interleaved_convention(x, cos, sin):
    """GPT-J's interleaved pairs (x0, x1), (x2, x3), ... applied to rotate-half tables."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[..., 0::2], sin[..., 0::2]
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2)


@pytest.mark.parametrize("fault, expect, dtypes", [
    (swapped_halves_on_odd_positions, "componentwise", None),
    (cos_sin_swapped, "componentwise", None),
    (rotate_half_sign_error, "componentwise", None),
    (tables_cached_in_bf16, "componentwise", ("fp32",)),
    (interleaved_convention, "componentwise", None),
])
def test_planted_fault_is_caught(fault, expect, dtypes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = verify("rope", fault, device="cpu")
    assert not v.passed
    assert any(re.search(expect, r.reason) for r in v.failures), v.summary()
    failed = {r.case_id for r in v.failures}
    for c in get_op("rope").grid("quick"):
        if dtypes is None or c.dtype in dtypes:
            # S == 1 has no odd position; D == 2 has nothing to interleave differently
            exempt = ((fault is swapped_halves_on_odd_positions and c.shape[2] == 1)
                      or (fault is interleaved_convention and c.shape[3] == 2))
            assert exempt or c.id in failed, f"{c.id} not caught\n{v.summary()}"


# ---- benign variants --------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [complex_multiply_fp32, fp32_then_round_once, fused_multiply_add])
def test_benign_variant_passes(fn):
    v = verify("rope", fn, device="cpu")
    assert v.passed, v.summary()


def test_bound_tells_fp32_from_bf16_rounding(torch_quick):
    """The componentwise ratio of torch's formula stays <= 2 (three roundings) in every quick
    case; an fp32 kernel that rounds its result through bf16 lands ~2^16 x higher."""
    ratios = [r.bound_ratio for r in torch_quick.records if r.output == "out"]
    assert max(ratios) <= 2.0

    def via_bf16(x, cos, sin):
        return (x * cos + rotate_half(x) * sin).to(torch.bfloat16).to(x.dtype)
    fp32 = [c.id for c in get_op("rope").grid("quick") if c.dtype == "fp32"]
    v = verify("rope", via_bf16, device="cpu", case_ids=fp32)
    outs = [r for r in v.records if r.output == "out"]
    assert len(outs) == len(fp32)
    assert all(r.status == "failed" and r.bound_ratio > 1e3 for r in outs), v.summary()


@pytest.mark.slow
def test_torch_kernel_passes_full():
    v = verify("rope", kernels("rope")["torch"], device="cpu", cases="full")
    assert v.passed, v.summary()
