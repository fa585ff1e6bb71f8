"""INT8 per channel and INT4 per group (numcheck/quant/intq.py): spec vectors for every rule of
DESIGN rule 10 (range, scale amax/qmax, round half to even, groups), usage errors, planted faults
caught by the exact comparison, and the torch kernel bit-exact."""
from __future__ import annotations

import pytest
import torch

import numcheck as nc
from numcheck.cases import inputs
from numcheck.errors import UsageError
from numcheck.quant import int4_qdq, int4_quantize, int8_qdq, int8_quantize
from numcheck.ops import qdq as OQ
from numcheck.quant import intq as Q


def t(*v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype)


def test_int8_scale_and_half_to_even_codes():
    # amax 127 -> scale 1: x / scale exact; .5 quotients go to the even integer
    x = t(127.0, 63.5, 62.5, 0.5, 1.5, -2.5, -0.5, 3.49)
    q = int8_quantize(x)
    assert q.scale.item() == 1.0
    assert q.codes.tolist() == [127, 64, 62, 0, 2, -2, 0, 3]
    assert q.codes.dtype == torch.int8
    assert int8_qdq(x).tolist() == [127.0, 64.0, 62.0, 0.0, 2.0, -2.0, -0.0, 3.0]


def test_int8_scale_is_amax_over_127_in_fp32():
    x = t(1.0, -0.25)
    q = int8_quantize(x)
    assert q.scale.item() == torch.tensor(1.0 / 127, dtype=torch.float32).item()
    assert q.codes.tolist() == [127, -32]  # 0.25 * 127 = 31.75 -> 32


def test_int8_per_channel_rows_and_dim0():
    x = t(1.0, 0.5, 2.0, -1.0).reshape(2, 2)
    q = int8_quantize(x, dim=-1)  # amax over the last dim: one scale per row
    assert q.scale.shape == (2, 1)  # x's shape, dim of size 1 (one group)
    assert q.scale.flatten().tolist() == pytest.approx([1 / 127, 2 / 127], rel=2**-24)
    q0 = int8_quantize(x, dim=0)  # one scale per column
    assert q0.scale.shape == (1, 2)
    assert q0.scale.flatten().tolist() == pytest.approx([2 / 127, 1 / 127], rel=2**-24)
    y = inputs.draw("outlier_channels", (40, 96), seed=1, fmt="bf16").to(torch.bfloat16)
    assert torch.equal(int8_qdq(y, dim=0), int8_qdq(y.T, dim=-1).T)


def test_int8_range_never_128():
    x = inputs.draw("student_t", (16, 256), seed=2)
    q = int8_quantize(x)
    assert int(q.codes.min()) >= -127 and int(q.codes.max()) <= 127
    assert int(q.codes.abs().max()) == 127


def test_amax_zero_and_tiny():
    z = torch.zeros(2, 128)
    assert torch.equal(int8_qdq(z), z) and torch.equal(int4_qdq(z), z)
    assert bool((int8_quantize(z).scale == 1).all())
    tiny = t(1e-45, 0.0)  # fp32's smallest subnormal: amax / 127 underflows fp32
    out = int8_qdq(tiny)
    assert bool(torch.isfinite(out).all())
    assert out[0].item() == tiny[0].item()


def test_int4_groups_and_boundaries():
    x = torch.zeros(1, 256)
    x[0, :128] = torch.linspace(-7, 7, 128)  # group 0: amax 7 -> scale 1
    x[0, 128] = 14.0  # group 1: amax 14 -> scale 2
    x[0, 129] = 5.0  # 5 / 2 = 2.5 -> 2 (half to even)
    x[0, 130] = 7.0  # 3.5 -> 4
    x[0, 131] = -3.0  # -1.5 -> -2
    q = int4_quantize(x)
    assert q.scale.tolist() == [[1.0, 2.0]]
    assert q.codes[0, 128:132].tolist() == [7, 2, 4, -2]
    assert int(q.codes.abs().max()) <= 7
    assert torch.equal(int4_qdq(x.T, dim=0), int4_qdq(x).T)


def test_int4_group_size_argument():
    x = inputs.draw("normal", (4, 64), seed=3).float()
    q = int4_quantize(x, group=32)
    assert q.scale.shape == (4, 2)


def test_non_divisible_rejected_with_remedy():
    with pytest.raises(UsageError, match=r"group=128.*100.*pad x along dim"):
        int4_qdq(torch.ones(4, 100))
    with pytest.raises(UsageError, match="group"):
        int4_qdq(torch.ones(4, 256), group=96)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_dtype_preserved(dtype):
    x = inputs.draw("normal", (4, 256), seed=4).to(dtype)
    assert int8_qdq(x).dtype == dtype and int4_qdq(x).dtype == dtype


# ---- planted faults and benign variants -------------------------------------------------------

def _fault_half_away(x, dim=-1):
    """Fault: round half away from zero (sign * floor(|q| + 0.5))."""
    xf = x.float().transpose(dim, -1)
    s = xf.abs().amax(-1, keepdim=True) / 127
    s = torch.where(s == 0, 1.0, s)
    v = xf / s
    q = (torch.sign(v) * torch.floor(v.abs() + 0.5)).clamp(-127, 127)
    return (q * s).transpose(dim, -1).to(x.dtype)


def _fault_128(x, dim=-1):
    """Fault: asymmetric range, scale amax / 128 (code -128 usable, +127 clamps)."""
    xf = x.float().transpose(dim, -1)
    s = xf.abs().amax(-1, keepdim=True) / 128
    s = torch.where(s == 0, 1.0, s)
    q = torch.round(xf / s).clamp(-128, 127)
    return (q * s).transpose(dim, -1).to(x.dtype)


def _max_ulp(fn, x, dim=-1):
    ref = Q.int8_qdq_reference(x, dim)
    return int(nc.ulp_distance(fn(x, dim), nc.round_to(ref, x.dtype), x.dtype).max())


def _ties():
    """Rows with amax 127 (scale 1) and .5 quotients, and a random bf16 block."""
    r = torch.tensor([[127.0, 0.5, 1.5, 2.5, -2.5, 100.5]], dtype=torch.bfloat16)
    return r


def test_half_away_fault_caught_on_ties():
    assert _max_ulp(_fault_half_away, _ties()) > 0


def test_asymmetric_range_fault_caught():
    x = inputs.draw("normal", (16, 256), seed=5, fmt="bf16").to(torch.bfloat16)
    assert _max_ulp(_fault_128, x) > 0


@pytest.mark.parametrize("dist", ["normal", "outlier_channels", "zero_blocks", "wide_range"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_torch_kernels_bit_exact(dist, dtype):
    x = inputs.draw(dist, (16, 384), seed=6, fmt=str(dtype).removeprefix("torch.")).to(dtype)
    for dim in (-1, 0):
        assert _max_ulp(OQ.torch_int8_qdq, x, dim) == 0
    assert _max_ulp(OQ.torch_int8_qdq, _ties()) == 0
    ref4 = Q.int4_qdq_reference(x)
    out4 = OQ.torch_int4_qdq(x)
    assert int(nc.ulp_distance(out4, nc.round_to(ref4, dtype), dtype).max()) == 0


def test_ops_registered_exact():
    from numcheck.catalog import get_op, kernels
    for op in ("int8_qdq", "int4_qdq"):
        assert get_op(op).policy.max_ulp == 0
        assert "torch" in kernels(op)
    assert all(c.shape[c.param("dim")] % 128 == 0 for c in get_op("int4_qdq").grid("full"))
