"""FP8 current and delayed scaling (numcheck/quant/fp8.py): hand-checked spec vectors for every
rule of DESIGN rule 10, oracles (torch float8 casts, ml_dtypes) for the element cast, planted
faults that the exact (max ULP 0) comparison catches, and benign rewrites it accepts."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import numcheck as nc
from numcheck import formats
from numcheck.cases import inputs
from numcheck.errors import UsageError
from numcheck.quant import DelayedScaling, fp8_qdq, fp8_quantize
from numcheck.ops import qdq as OQ
from numcheck.quant import fp8 as F

FP32_MAX = float.fromhex("0x1.fffffep127")  # fp32 max: the scale clamp (DESIGN rule 10)


def t(*v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype)


# ---- spec vectors -----------------------------------------------------------------------------

def test_amax_at_max_gives_scale_one_and_exact_codes():
    q = fp8_quantize(t(448.0, -1.0, 0.5, 3.5), "e4m3")  # amax 448 = e4m3 max (OCP FP8 table)
    assert q.scale.item() == 1.0
    assert q.codes.tolist() == [448.0, -1.0, 0.5, 3.5]
    q = fp8_quantize(t(57344.0, 1.0), "e5m2")  # e5m2 max 57344
    assert q.scale.item() == 1.0


@pytest.mark.parametrize("gran", F.GRANULARITIES)
def test_amax_zero_gives_scale_one_and_zeros(gran):
    x = torch.zeros(4, 256)
    q = fp8_quantize(x, "e4m3", gran)
    assert bool((q.scale == 1.0).all())
    out = fp8_qdq(x, "e4m3", gran)
    assert torch.equal(out, x) and not bool(torch.isnan(out).any())


def test_mixed_zero_and_nonzero_rows():
    x = torch.zeros(2, 8)
    x[1, 3] = 2.0
    q = fp8_quantize(x, "e4m3", "row")
    assert q.scale.flatten().tolist() == [1.0, 224.0]  # 448 / 2
    assert torch.equal(fp8_qdq(x, "e4m3", "row"), x)


def test_tiny_amax_scale_clamped_to_fp32_max():
    x = t(1e-38, -5e-39)  # 448 / 1e-38 = 4.5e40 overflows fp32
    q = fp8_quantize(x, "e4m3")
    assert q.scale.item() == FP32_MAX
    out = fp8_qdq(x, "e4m3")
    assert bool(torch.isfinite(out).all())
    # 1e-38 * fp32max = 3.40 -> e4m3 3.5 (step 0.25 in [2, 4)); 3.5 / fp32max in fp32
    assert q.codes[0].item() == 3.5
    assert out[0].item() == pytest.approx(3.5 / FP32_MAX, rel=2**-23)


@pytest.mark.parametrize("amax, want", [(3.0, 128.0), (1.0, 256.0), (1.75, 256.0),
                                        (448.0, 1.0), (449.0, 0.5), (1e-38, 2.0**127)])
def test_pow2_scale_rounds_down(amax, want):
    # 448/3 = 149.3 -> 128; 448/1 -> 256; 448/1.75 = 256 exactly stays; 448/449 < 1 -> 0.5;
    # the clamped fp32 max -> 2^127.
    q = fp8_quantize(t(amax, 0.0), "e4m3", pow2_scale=True)
    assert q.scale.item() == want
    assert float(q.codes.abs().max()) <= 448.0


def test_row_with_twice_the_amax_gets_its_own_scale():
    x = t(1.0, 0.5, 0.25, 0.5, 2.0, 1.0, 0.5, 1.0).reshape(2, 4)
    q = fp8_quantize(x, "e4m3", "row")
    assert q.scale.shape == (2, 1)
    assert q.scale.flatten().tolist() == [448.0, 224.0]
    q0 = fp8_quantize(x, "e4m3", "row", dim=0)  # amax over dim 0: one scale per column
    assert q0.scale.shape == (1, 4)
    assert q0.scale.flatten().tolist() == [224.0, 448.0, 896.0, 448.0]  # column amax 2, 1, .5, 1


@pytest.mark.parametrize("gran", ["row", "block128"])
def test_dim0_agrees_with_transpose(gran):
    x = inputs.draw("outlier_channels", (260, 40), seed=1, fmt="bf16").to(torch.bfloat16)
    assert torch.equal(fp8_qdq(x, "e4m3", gran, dim=0), fp8_qdq(x.T, "e4m3", gran, dim=-1).T)


def test_tiles_are_orientation_free():
    x = inputs.draw("outlier_channels", (2, 260, 130), seed=2, fmt="fp32").float()
    a = fp8_qdq(x, "e4m3", "block128x128")
    assert torch.equal(a, fp8_qdq(x.mT, "e4m3", "block128x128").mT)
    assert fp8_quantize(x, "e4m3", "block128x128").scale.shape == (2, 3, 2)


def test_block_boundaries_1x128_and_partial_block():
    x = torch.ones(1, 258)
    x[0, 130] = 4.0  # second block's amax; first block (0..127) and last partial (256, 257)
    x[0, 257] = 0.5
    q = fp8_quantize(x, "e4m3", "block128")
    assert q.scale.flatten().tolist() == [448.0, 112.0, 448.0]
    assert fp8_quantize(x.T, "e4m3", "block128", dim=0).scale.flatten().tolist() == \
        [448.0, 112.0, 448.0]


def test_block128x128_tiles():
    x = torch.ones(200, 130)
    x[150, 129] = 8.0  # tile (1, 1)
    q = fp8_quantize(x, "e4m3", "block128x128")
    assert q.scale.tolist() == [[448.0, 448.0], [448.0, 56.0]]


def test_rne_at_midpoints_scale_one():
    # amax 448 -> scale 1; e4m3 step 0.125 in [1, 2): 1.0625 ties to 1.0 (even), 1.1875 to 1.25,
    # -1.0625 to -1.0; step 32 in [256, 448]: 272 -> 256, 304 -> 320.
    x = t(448.0, 1.0625, 1.1875, -1.0625, 272.0, 304.0)
    assert fp8_qdq(x, "e4m3").tolist() == [448.0, 1.0, 1.25, -1.0, 256.0, 320.0]


def test_product_is_rounded_to_fp32_before_the_cast():
    """Pinned element (module doc): scale = fp32(57344 / 2.953125) = 19418.07421875; the exact
    product 0.2373046875 * scale = 4608.00037.. rounds to 5120 in e5m2, but fp32 rounds it to the
    midpoint 4608 first, which ties to 4096. The spec (fp32 multiplication) gives 4096."""
    x = t(2.953125, 0.2373046875, dtype=torch.bfloat16)
    q = fp8_quantize(x, "e5m2")
    assert q.scale.item() == 19418.07421875
    assert q.codes.tolist() == [57344.0, 4096.0]
    exact = nc.round_to(x.double() * q.scale.double(), "e5m2")
    assert exact[1].item() == 5120.0  # the single-rounding answer numcheck does not use


def test_nan_and_inf_poison_their_group_only():
    x = torch.ones(2, 4)
    x[0, 1] = float("nan")
    x[1, 2] = float("inf")
    out = fp8_qdq(x, "e4m3", "row")
    assert bool(torch.isnan(out).all())
    y = torch.ones(3, 4)
    y[0, 0] = float("nan")
    out = fp8_qdq(y, "e4m3", "row")
    assert bool(torch.isnan(out[0]).all()) and torch.equal(out[1:], y[1:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_dtype_preserved(dtype):
    x = inputs.draw("normal", (8, 256), seed=3).to(dtype)
    for g in F.GRANULARITIES:
        assert fp8_qdq(x, "e4m3", g).dtype == dtype


def test_usage_errors():
    with pytest.raises(UsageError, match="granularity"):
        fp8_qdq(torch.ones(4), granularity="block32")
    with pytest.raises(UsageError, match="fmt"):
        fp8_qdq(torch.ones(4), fmt="e2m1")
    with pytest.raises(UsageError, match="block128x128"):
        fp8_qdq(torch.ones(4), granularity="block128x128")


# ---- oracles: torch float8 casts and ml_dtypes for the element cast ---------------------------

@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("gran", F.GRANULARITIES)
def test_codes_match_torch_and_ml_dtypes_casts(fmt, gran):
    x = inputs.draw("outlier_channels", (64, 300), seed=4, fmt="bf16").to(torch.bfloat16)
    q = fp8_quantize(x, fmt, gran)
    xs = (x.double() * F.expand(q.scale.double(), x.shape, gran, q.dim)).float()  # fp32 product
    assert torch.equal(q.codes, xs.to(OQ.TORCH_FP8[fmt]).double())  # in range: no overflow
    ml = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]
    assert np.array_equal(q.codes.numpy(), xs.numpy().astype(ml).astype(np.float64))


# ---- delayed scaling --------------------------------------------------------------------------

def test_delayed_scaling_first_call_uses_current_amax_then_history():
    ds = DelayedScaling("e4m3", history_len=2, algo="max")
    x1 = t(1.0, -0.5)
    assert torch.equal(ds.qdq(x1), x1)  # empty history: current amax 1 -> scale 448
    assert ds.scale == 448.0 and ds.history == (1.0,)
    x2 = t(4.0, 0.5)  # scale still 448 (from the history): 4 * 448 saturates to 448 -> 1.0
    out = ds.qdq(x2)
    assert out.tolist() == [1.0, 0.5]
    assert ds.history == (1.0, 4.0)
    ds.qdq(t(0.125))  # history max 4 -> scale 112
    assert ds.scale == 112.0 and ds.history == (4.0, 0.125)  # length 2: the first one dropped
    ds.qdq(t(0.125))
    assert ds.scale == 448.0 / 4.0  # max(4.0, 0.1)


def test_delayed_scaling_most_recent_and_margin():
    ds = DelayedScaling("e4m3", algo="most_recent", margin=1)
    ds.qdq(t(8.0))
    assert ds.scale == 448.0 / 8.0 / 2.0  # TE: (max / amax) / 2^margin
    ds.qdq(t(2.0))
    assert ds.scale == 448.0 / 8.0 / 2.0  # the last amax (8), not this tensor's
    ds.qdq(t(1.0))
    assert ds.scale == 448.0 / 2.0 / 2.0


def test_delayed_scaling_amax_zero_history():
    ds = DelayedScaling("e5m2")
    assert torch.equal(ds.qdq(torch.zeros(4)), torch.zeros(4))
    assert ds.scale == 1.0


# ---- planted faults and benign variants -------------------------------------------------------

def _fault_inverse_scale(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """Fault: the scale computed as amax / max (the decode scale used to encode)."""
    xf = x.float()
    amax = OQ.torch_amax(xf, granularity, dim % x.dim())
    s = torch.where(amax == 0, 1.0, amax / torch.finfo(OQ.TORCH_FP8[fmt]).max)
    codes = (xf * s).to(OQ.TORCH_FP8[fmt]).float()
    return (codes / s).to(x.dtype)


def _fault_rz(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """Fault: the element cast truncates (round toward zero)."""
    xf = x.float()
    s = OQ.torch_fp8_scale(OQ.torch_amax(xf, granularity, dim % x.dim()), fmt, pow2_scale)
    codes = nc.round_to(xf * s, fmt, "rz").float()
    return (codes / s).to(x.dtype)


def _fault_nan_on_zero(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """Fault: no amax == 0 rule (448 / 0 = inf, 0 * inf = NaN)."""
    xf = x.float()
    amax = OQ.torch_amax(xf, granularity, dim % x.dim())
    s = torch.full_like(amax, torch.finfo(OQ.TORCH_FP8[fmt]).max) / amax
    codes = (xf * s).to(OQ.TORCH_FP8[fmt]).float()
    return (codes / s).to(x.dtype)


def _fault_wrong_dim(x, fmt="e4m3", granularity="row", dim=-1, pow2_scale=False):
    """Fault: per-row amax over the other dim."""
    other = 0 if dim % x.dim() == x.dim() - 1 else x.dim() - 1
    return OQ.torch_fp8_qdq(x, fmt, granularity, other, pow2_scale)


def _benign_float64_scale(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """Benign: scale from a float64 division rounded to fp32 (the same correctly rounded value),
    dequantized by a float64 division rounded to fp32 (innocuous double rounding: 53 >= 2*24+2)."""
    xf = x.float()
    amax = OQ.torch_amax(xf, granularity, dim % x.dim()).double()
    s = (torch.finfo(OQ.TORCH_FP8[fmt]).max / torch.where(amax == 0, 1.0, amax)).float()
    s = torch.where(amax == 0, 1.0, s.clamp(max=FP32_MAX))
    if pow2_scale:
        s = torch.exp2(torch.floor(torch.log2(s.double()))).float()
    codes = (xf * s).clamp(-448 if fmt == "e4m3" else -57344, 448 if fmt == "e4m3" else 57344)
    codes = codes.to(OQ.TORCH_FP8[fmt]).double()
    return (codes / s.double()).float().to(x.dtype)


def _benign_loop(x, fmt="e4m3", granularity="tensor", dim=-1, pow2_scale=False):
    """Benign: rows one at a time (row granularity), or the whole tensor otherwise."""
    if granularity != "row" or x.dim() != 2:
        return OQ.torch_fp8_qdq(x, fmt, granularity, dim, pow2_scale)
    xt = x if dim % 2 == 1 else x.T
    out = torch.stack([OQ.torch_fp8_qdq(r[None], fmt, "tensor", -1, pow2_scale)[0] for r in xt])
    return out if dim % 2 == 1 else out.T


# Inputs chosen to exercise every fault: zero rows, outlier channels, 1x128 blocks.
def _probe_inputs():
    x = inputs.draw("outlier_channels", (64, 384), seed=5, fmt="bf16")
    x[3] = 0.0
    x[:, 200:328] = 0.0
    return x.to(torch.bfloat16)


PROBES = [("e4m3", "tensor", -1), ("e4m3", "row", -1), ("e5m2", "row", 0),
          ("e4m3", "block128", -1), ("e4m3", "block128x128", -1), ("e5m2", "block128", 0)]


def _max_ulp(fn, x, fmt, gran, dim, pow2=False):
    ref = F.fp8_qdq_reference(x, fmt, gran, dim, pow2)
    out = fn(x, fmt, gran, dim, pow2)
    return int(nc.ulp_distance(out, nc.round_to(ref, x.dtype), x.dtype).max())


@pytest.mark.parametrize("fault", [_fault_inverse_scale, _fault_rz, _fault_nan_on_zero,
                                   _fault_wrong_dim])
def test_planted_faults_are_caught(fault):
    x = _probe_inputs()
    worst = max(_max_ulp(fault, x, *p) for p in PROBES if fault is not _fault_wrong_dim
                or p[1] == "row")
    assert worst > 0  # the exact policy (max ULP 0) rejects it


@pytest.mark.parametrize("fn", [OQ.torch_fp8_qdq, _benign_float64_scale, _benign_loop])
@pytest.mark.parametrize("pow2", [False, True])
def test_torch_kernel_and_benign_variants_are_bit_exact(fn, pow2):
    x = _probe_inputs()
    for p in PROBES:
        assert _max_ulp(fn, x, *p, pow2) == 0, (fn.__name__, p)


@pytest.mark.slow  # the exact reference on grid cases: ~5 s alone, 30 s on a loaded 2-core box
def test_torch_kernel_verifies_through_nc_verify():
    from numcheck.catalog import get_op
    spec = get_op("fp8_qdq")
    assert spec.policy.max_ulp == 0
    from numcheck.catalog import as_kernel
    from numcheck.run import run_case
    cases = spec.grid("quick")[4:10]  # a slice of the grid keeps this file fast
    for c in cases:
        recs = run_case(spec, as_kernel("fp8_qdq", OQ.torch_fp8_qdq), c, "cpu")
        assert recs[0].status == "passed", recs[0].reason


# ---- grid classes added for issue 12 --------------------------------------------------------------

def _new_fp8_cases(cs="quick"):
    from numcheck.catalog import get_op
    return [c for c in get_op("fp8_qdq").grid(cs)
            if c.dist.startswith("blocks_") or c.shape in ((8, 200), (4, 390), (2, 1000),
                                                           (390, 5))]


def test_grid_has_long_ragged_rows_and_blocks_under_tiny_and_huge_amax():
    cases = _new_fp8_cases()
    rows = [c for c in cases if c.param("granularity") == "row"]
    lengths = {c.shape[c.param("dim")] for c in rows}
    assert all(n > 128 and n & (n - 1) for n in lengths) and len(lengths) >= 3
    assert any(c.param("dim") == 0 for c in rows)  # per-column scales (the wgrad operand)
    for dist in ("blocks_tiny", "blocks_huge"):
        grans = {c.param("granularity") for c in cases if c.dist == dist}
        assert {"block128", "block128x128"} <= grans


def test_new_cases_are_bit_exact_for_the_torch_kernel_and_tiny_ones_clamp():
    """The torch kernel matches the exact reference on every new case; each blocks_tiny case
    has a group whose 448 / amax overflows fp32 (the clamp, DESIGN rule 10), and each block
    granularity an all-zero block (scale 1) beside it."""
    from numcheck.catalog import get_op
    spec = get_op("fp8_qdq")
    for case in _new_fp8_cases():
        tensors, kw = spec.make_inputs(case)
        x = inputs.cast(*tensors["x"])[0]
        assert torch.equal(OQ.torch_fp8_qdq(x, **kw), fp8_qdq(x, kw["fmt"], kw["granularity"],
                                                            kw["dim"], kw["pow2_scale"])), case.id
        if case.dist == "blocks_tiny":
            amax = F.group_amax(x.double().abs(), kw["granularity"], kw["dim"] % x.dim())
            fmax = F.check_fmt(kw["fmt"]).max
            assert bool((fmax / amax[amax > 0] > formats.get("fp32").max).any()), case.id
            if kw["granularity"].startswith("block"):
                assert bool((amax == 0).any()), case.id
