"""ErrorStats against hand-computed cases and an independent numpy implementation."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import numcheck as nc
from numcheck.measure import blocks, stats

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _bf16_ordinal(v: np.ndarray) -> np.ndarray:
    """Signed ordinal of bf16 values from their sign-magnitude bits (independent of numcheck)."""
    bits = v.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int64)
    mag = bits & 0x7FFF
    return np.where(bits & 0x8000, -mag, mag)


def _np_stats(out: np.ndarray, ref32: np.ndarray) -> dict:
    """Independent numpy version for finite bf16 out and fp32-exact references.

    ml_dtypes rounds fp32 -> bf16 once (exact oracle here since ref is fp32-exact).
    """
    o, r = out.astype(np.float64).ravel(), ref32.astype(np.float64).ravel()
    err = o - r
    d = _bf16_ordinal(o) - _bf16_ordinal(ref32.ravel().astype(ml_dtypes.bfloat16).astype(np.float64))
    u = np.abs(d)
    e2 = math.fsum(err**2)
    return {
        "max_abs": np.abs(err).max(), "mean_abs": np.abs(err).mean(),
        "rel_l2": math.sqrt(math.fsum(err**2) / math.fsum(r**2)),
        "sqnr_db": 10 * math.log10(math.fsum(r**2) / e2) if e2 else math.inf,
        "cosine": math.fsum(o * r) / math.sqrt(math.fsum(o**2) * math.fsum(r**2)),
        "bias": math.fsum(err) / math.fsum(np.abs(r)),
        "max_ulp": int(u.max()), "mean_ulp": u.mean(),
        "p99_ulp": int(np.percentile(u, 99, method="inverted_cdf")),
        "bias_ulp": d.mean(), "mag_bias_ulp": (d * np.sign(r)).mean(),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("noise", [0.0, 3e-3, 0.05])
def test_matches_independent_numpy(device, noise):
    rng = np.random.default_rng(1)
    ref32 = (rng.standard_normal((64, 500)) * np.exp(rng.standard_normal((64, 1)))).astype(np.float32)
    out = (ref32 * (1 + noise * rng.standard_normal(ref32.shape))).astype(ml_dtypes.bfloat16)
    s = nc.error_stats(torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).to(device),
                       torch.from_numpy(ref32.astype(np.float64)).to(device))
    want = _np_stats(out, ref32)
    for key, value in want.items():
        assert getattr(s, key) == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert s.n == s.n_compared == ref32.size and s.nonfinite_mismatch == 0


def test_hand_computed_small_case():
    ref = torch.tensor([1.0, -2.0, 3.0, 4.0], dtype=torch.float64)
    out = torch.tensor([1.0, -2.0, 3.0, 4.0 + 2 * 2**-5], dtype=torch.bfloat16)  # 4 + 2 ulp
    s = nc.error_stats(out, ref)
    assert (s.max_abs, s.max_ulp, s.mean_ulp, s.bias_ulp, s.mag_bias_ulp) == (
        2**-4, 2, 0.5, 0.5, 0.5)
    assert s.sqnr_db == pytest.approx(10 * math.log10(30 / 2**-8))
    assert s.bias == pytest.approx(2**-4 / 10)
    assert s.p99_ulp == 2  # nearest rank: ceil(0.99 * 4) = 4th smallest of (0, 0, 0, 2)


def test_fast_and_general_paths_agree(monkeypatch):
    """The fast route (fp32 bit arithmetic) must equal the general route."""
    g = torch.Generator().manual_seed(3)
    cases = []
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        ref = torch.randn(200, 700, generator=g, dtype=torch.float64) * 5
        cases.append((ref, (ref * (1 + 1e-2 * torch.randn(ref.shape, generator=g,
                                                          dtype=torch.float64))).to(dt)))
    fast = [nc.error_stats(o, r, blocks=32).as_dict() for r, o in cases]
    monkeypatch.setattr(stats, "_fast_route", lambda *a: None)
    slow = [nc.error_stats(o, r, blocks=32).as_dict() for r, o in cases]
    for a, b in zip(fast, slow):
        assert a.pop("fmt") == b.pop("fmt")
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-12), k


def test_nonfinite_by_class_against_rounded_reference():
    big = 2.0**128  # overflows bf16 in round-to-nearest: the rounded reference is inf
    ref = torch.tensor([big, big, float("nan"), 1.0, float("inf"), 2.0, -big], dtype=torch.float64)
    out = torch.tensor([float("inf"), 3.0e38, -float("nan"), float("nan"), -float("inf"), 2.0,
                        -float("inf")], dtype=torch.bfloat16)
    s = nc.error_stats(out, ref)
    # matches: inf==inf(rounded), NaN vs NaN (sign ignored), 2==2, -inf==-inf(rounded)
    # mismatches: finite vs inf, NaN vs 1, -inf vs +inf
    assert s.nonfinite_mismatch == 3
    assert (s.n_nan, s.n_inf, s.n_compared) == (2, 3, 1)
    assert s.max_abs == 0 and s.max_ulp == 0


def test_zero_reference_is_defined_never_nan():
    z = torch.zeros(100, dtype=torch.float64)
    exact = nc.error_stats(torch.zeros(100, dtype=torch.bfloat16), z)
    assert (exact.sqnr_db, exact.rel_l2, exact.cosine, exact.bias) == (math.inf, 0.0, 1.0, 0.0)
    wrong = nc.error_stats(torch.full((100,), 1e-3, dtype=torch.bfloat16), z)
    assert (wrong.sqnr_db, wrong.rel_l2, wrong.cosine, wrong.bias) == (
        -math.inf, math.inf, 0.0, math.inf)
    empty = nc.error_stats(torch.zeros(0, dtype=torch.bfloat16), torch.zeros(0, dtype=torch.float64))
    for s in (exact, wrong, empty):
        assert not any(isinstance(v, float) and math.isnan(v) for v in s.as_dict().values())


def test_four_corrupted_elements_show_in_blocks():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(1 << 22, generator=g, dtype=torch.float64)
    clean = nc.error_stats(ref.to(torch.bfloat16), ref)
    bad = ref.to(torch.bfloat16)
    idx = torch.tensor([12345, 999_999, 2_500_000, 4_000_001])
    bad[idx] = bad[idx] * 1.25  # a wrong mantissa bit or two in 4 of 4M elements
    s = nc.error_stats(bad, ref)
    assert abs(s.sqnr_db - clean.sqnr_db) < 0.5  # lost in the whole-tensor number
    assert s.min_block_sqnr_db < clean.min_block_sqnr_db - 10
    assert s.worst_block in set((idx // blocks.DEFAULT_BLOCK).tolist())


def test_tiles_and_ragged_blocks():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 300, 257, generator=g, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    assert nc.error_stats(out, ref, blocks=32).n_blocks == 3 * 300 * 9
    out[1, 130, 200] *= 2  # tile (1, 130 // 128, 200 // 128) = (1, 1, 1) of 3 x 3 x 3
    s = nc.error_stats(out, ref, blocks=(128, 128))
    assert s.n_blocks == 27 and s.worst_block == 1 * 9 + 1 * 3 + 1
    rows = nc.error_stats(out, ref, blocks=257)  # one block per row
    assert rows.n_blocks == 900 and rows.worst_block == 300 + 130


def test_block_floor_follows_median_not_outlier_block():
    """NVFP4 flush case: one block 1e6x louder; other blocks zeroed must read ~0 dB."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 256, generator=g, dtype=torch.float64)
    ref[0, :16] *= 1e6
    out = torch.zeros_like(ref, dtype=torch.bfloat16)
    out[0, :16] = ref[0, :16].to(torch.bfloat16)
    s = nc.error_stats(out, ref, blocks=16)
    assert s.sqnr_db > 40  # the loud block dominates the whole-tensor energy
    assert s.min_block_sqnr_db < 0.5  # every other block lost all its signal


def test_zero_blocks_do_not_give_nan_or_false_alarm():
    ref = torch.randn(32, 64, dtype=torch.float64)
    ref[5] = 0
    s = nc.error_stats(ref.to(torch.bfloat16), ref, blocks=64)
    assert s.min_block_sqnr_db > 45 and math.isfinite(s.min_block_sqnr_db)


@pytest.mark.parametrize("mode, field, want", [
    ("rz", "mag_bias_ulp", -0.5), ("rne", "mag_bias_ulp", 0.0), ("rna", "mag_bias_ulp", 0.0)])
def test_truncation_shows_in_signed_bias(mode, field, want):
    ref = torch.randn(1 << 18, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = nc.round_to(ref, "bf16", mode).to(torch.bfloat16)
    assert getattr(nc.error_stats(out, ref), field) == pytest.approx(want, abs=0.01)


def test_floor_rounding_shows_in_value_bias():
    ref = torch.randn(1 << 18, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    floor = torch.where(ref > 0, nc.round_to(ref, "bf16", "rz"),
                        -nc.round_to(-ref, "bf16", "rz") - 0.0)  # toward zero on both sides
    s = nc.error_stats(floor.to(torch.bfloat16), ref)
    assert s.bias_ulp == pytest.approx(0.0, abs=0.01) and s.mag_bias_ulp < -0.45
    down = torch.floor(ref * 2**7) / 2**7  # toward -inf on a fixed grid, coarser than bf16
    assert nc.error_stats(down.to(torch.bfloat16), ref).bias < -1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_p99_exact_in_radix_path(dtype):
    """Large ULP errors (>= 2^16) take the multi-pass radix select; compare with numpy."""
    g = torch.Generator().manual_seed(5)
    ref = torch.randn(1 << 16, generator=g, dtype=torch.float64)
    scale = 1 + torch.rand(ref.shape, generator=g, dtype=torch.float64) * 0.1
    out = (ref * torch.where(torch.rand(ref.shape, generator=g) < 0.3, scale, 1.0)).to(dtype)
    s = nc.error_stats(out, ref)
    rr = nc.round_to(ref, nc.formats.get(dtype))
    u = nc.ulp_distance(out.double(), rr, dtype).numpy()
    assert s.p99_ulp == int(np.percentile(u, 99, method="inverted_cdf")) > 1 << 16
    assert s.max_ulp == u.max()


def test_fmt_other_grid_and_off_grid_values():
    vals = torch.tensor([0.5, 1.0, 1.5, 6.0, -3.0], dtype=torch.bfloat16)  # e2m1 values
    ref = torch.tensor([0.5, 1.0, 1.0, 4.0, -3.0], dtype=torch.float64)
    s = nc.error_stats(vals, ref, fmt="e2m1")
    assert s.fmt == "e2m1" and s.max_ulp == 1 and s.mean_ulp == pytest.approx(2 / 5)
    with pytest.raises(nc.UsageError, match="e2m1"):
        nc.error_stats(torch.tensor([0.75], dtype=torch.bfloat16), torch.ones(1, dtype=torch.float64),
                       fmt="e2m1")


def test_bad_arguments_name_the_problem():
    with pytest.raises(nc.UsageError, match=r"shape \(3,\).*\(4,\)"):
        nc.error_stats(torch.zeros(3), torch.zeros(4, dtype=torch.float64))
    with pytest.raises(nc.UsageError, match="blocks"):
        nc.error_stats(torch.zeros(3), torch.zeros(3, dtype=torch.float64), blocks=(1, 2, 3))
    with pytest.raises(nc.UsageError, match="not a numcheck format"):
        nc.error_stats(torch.zeros(3), torch.zeros(3, dtype=torch.float64), fmt="fp12")


def test_non_contiguous_equals_contiguous():
    ref = torch.randn(300, 200, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    a = nc.error_stats(out.t(), ref.t(), blocks=16).as_dict()
    b = nc.error_stats(out.t().contiguous(), ref.t().contiguous(), blocks=16).as_dict()
    assert a.pop("fmt") == b.pop("fmt")
    assert a == pytest.approx(b, rel=1e-12)


@pytest.mark.cuda
def test_cuda_equals_cpu():
    ref = torch.randn(1000, 333, dtype=torch.float64)
    ref[3, :5] = torch.tensor([0.0, float("nan"), 1e-40, 1e39, -1e39], dtype=torch.float64)
    out = (ref * 1.001).to(torch.bfloat16)
    cpu = nc.error_stats(out, ref, blocks=32).as_dict()
    gpu = nc.error_stats(out.cuda(), ref.cuda(), blocks=32).as_dict()
    for k in cpu:  # the fused kernel sums in another order: bias's sum cancels to ~1e-13
        assert gpu[k] == pytest.approx(cpu[k], rel=1e-9), k
