"""nc.ulp_distance against independent counts.

* fp32, fp16, fp64: pairs built by stepping np.nextafter k times (k <= 50, random direction):
  random values, across zero, across binades, subnormals, up to inf. The steps are counted with a
  vectorized loop (a step that does not move, at inf, is not counted).
* e4m3, e5m2, e2m3, e3m2, e2m1, e8m0: every encoding enumerated through ml_dtypes, NaNs dropped,
  sorted, +0/-0 merged into one ordinal; ulp_distance of ALL pairs == |index difference|.
* bf16, tf32: the ordinal of an IEEE-like value is its magnitude bits with the sign applied
  (bf16 = fp32 bits >> 16, tf32 = fp32 bits >> 13 for tf32 values).
* +0 vs -0 is 0, NaN vs NaN 0, NaN vs a number INT64_MAX; off-grid values raise UsageError naming
  the format.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import numcheck as nc
from numcheck import formats

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.cuda)]
INT64_MAX = np.iinfo(np.int64).max


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def ulp(a, b, fmt, device="cpu") -> np.ndarray:
    ta = torch.from_numpy(np.asarray(a, dtype=np.float64)).to(device)
    tb = torch.from_numpy(np.asarray(b, dtype=np.float64)).to(device)
    d = nc.ulp_distance(ta, tb, fmt)
    assert d.dtype == torch.int64 and d.device.type == device
    return d.cpu().numpy()


def step(a: np.ndarray, k: np.ndarray, up: np.ndarray, kmax: int):
    """Step each a[i] k[i] times with np.nextafter towards +inf (up) or -inf; returns (b, steps
    actually taken): a step that leaves the value unchanged (at +-inf) is not counted."""
    inf = np.array(np.inf, dtype=a.dtype)
    target = np.where(up, inf, -inf)
    b, n = a.copy(), np.zeros(a.shape, np.int64)
    for s in range(kmax):
        act = s < k
        with np.errstate(over="ignore"):
            nb = np.where(act, np.nextafter(b, target), b)
        n += act & (nb != b)
        b = nb
    return b, n


def start_values(dt, rng, n) -> np.ndarray:
    fi = np.finfo(dt)
    tiny, sub, mx = float(fi.smallest_normal), float(fi.smallest_subnormal), float(fi.max)
    parts = [
        rng.standard_normal(n),  # ordinary values
        # powers of 2: stepping down from 2^k crosses a binade at the first step
        np.exp2(rng.integers(int(np.log2(tiny)), int(np.log2(mx)), n)) * rng.choice([-1, 1], n),
        rng.integers(-60, 60, n) * sub,  # subnormals and zero: stepping crosses zero
        tiny * rng.choice([-1, 1], n),  # the subnormal/normal boundary
        mx * rng.choice([-1, 1], n),  # max: stepping outwards reaches inf
    ]
    return np.concatenate(parts).astype(dt)


@pytest.mark.parametrize("dt,fmt", [(np.float32, "fp32"), (np.float16, "fp16"),
                                    (np.float64, "fp64")])
def test_ulp_distance_counts_nextafter_steps(dt, fmt, device):
    rng = np.random.default_rng({"fp32": 1, "fp16": 2, "fp64": 3}[fmt])
    a = start_values(dt, rng, 20_000)
    k = rng.integers(0, 51, a.size)
    up = rng.random(a.size) < 0.5
    b, n = step(a, k, up, 50)
    assert (n == k).mean() > 0.8 and np.isinf(b).any() and (np.sign(a) * np.sign(b) < 0).any()
    d = ulp(a.astype(np.float64), b.astype(np.float64), fmt, device)
    bad = d != n
    assert not bad.any(), f"{fmt}: {bad.sum()} wrong, e.g. a={a[bad][:3]}, b={b[bad][:3]}, " \
        f"steps {n[bad][:3]}, ulp_distance {d[bad][:3]}"
    assert np.array_equal(ulp(b.astype(np.float64), a.astype(np.float64), fmt, device), n)


SMALL = ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0"]


def encodings(fmt) -> np.ndarray:
    f = formats.get(fmt)
    mdt = getattr(ml_dtypes, f.ml_dtypes_dtype)
    with np.errstate(invalid="ignore"):
        v = np.arange(2**f.bits, dtype=np.uint8).view(mdt).astype(np.float64)
    return v[~np.isnan(v)]


@pytest.mark.parametrize("fmt", SMALL)
def test_ulp_distance_all_pairs_equals_ordinal_difference(fmt, device):
    v = encodings(fmt)
    u = np.unique(v)  # sorted; +0 and -0 compare equal and merge into one ordinal
    assert u.size == v.size - (1 if formats.get(fmt).signed else 0)
    idx = np.searchsorted(u, v)
    want = np.abs(idx[:, None] - idx[None, :])
    got = ulp(v[:, None], v[None, :], fmt, device)
    assert got.shape == want.shape
    bad = got != want
    assert not bad.any(), f"{fmt}: {bad.sum()} pairs wrong, e.g. " + ", ".join(
        f"({v[i]}, {v[j]}): {got[i, j]} vs {want[i, j]}" for i, j in np.argwhere(bad)[:5])


def _signed_bits_ordinal(x32: np.ndarray, shift: int) -> np.ndarray:
    bits = x32.view(np.uint32)
    mag = ((bits & np.uint32(0x7FFFFFFF)) >> np.uint32(shift)).astype(np.int64)
    return np.where(bits >> np.uint32(31) == 1, -mag, mag)


@pytest.mark.parametrize("fmt,shift", [("bf16", 16), ("tf32", 13)])
def test_ulp_distance_bits_ordinal(fmt, shift, device):
    rng = np.random.default_rng(11)
    n = 200_000
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    bits &= np.uint32((0xFFFFFFFF >> shift) << shift)  # a value of fmt: low bits cleared
    x32 = bits.view(np.float32)
    x32 = x32[np.isfinite(x32)]
    a, b = x32[: x32.size // 2], x32[x32.size // 2: 2 * (x32.size // 2)]
    # also neighbours: small distances, across zero and binades
    a2 = a[:5000]
    b2 = (a2.view(np.uint32) + np.uint32(1 << shift)).view(np.float32)
    b2 = np.where(np.isnan(b2), a2, b2)  # stepping past inf gives a NaN pattern: skip those
    a, b = np.concatenate([a, a2]), np.concatenate([b, b2])
    want = np.abs(_signed_bits_ordinal(a, shift) - _signed_bits_ordinal(b, shift))
    got = ulp(a.astype(np.float64), b.astype(np.float64), fmt, device)
    assert np.array_equal(got, want)


def test_bf16_exhaustive_adjacent_values():
    with np.errstate(invalid="ignore"):
        v = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    u = np.unique(v[~np.isnan(v)])  # -inf .. inf, +-0 merged
    d = ulp(u[:-1], u[1:], "bf16")
    assert (d == 1).all()
    assert int(ulp(u[:1], u[-1:], "bf16")[0]) == u.size - 1


def test_zero_nan_and_inf_conventions(device):
    for fmt in formats.FORMATS:
        f = formats.get(fmt)
        one = 1.0
        if f.signed:
            assert ulp([0.0], [-0.0], fmt, device)[0] == 0
        assert ulp([np.nan], [np.nan], fmt, device)[0] == 0
        assert ulp([np.nan], [one], fmt, device)[0] == INT64_MAX
        assert ulp([one], [-np.nan], fmt, device)[0] == INT64_MAX
        if f.has_inf:
            assert ulp([f.max], [np.inf], fmt, device)[0] == 1
            if fmt != "fp64":  # fp64: 2 * ordinal(inf) > INT64_MAX: saturates, tested below
                assert ulp([-np.inf], [np.inf], fmt, device)[0] == \
                    2 * ulp([0.0], [np.inf], fmt, device)[0]


def test_broadcasting_and_scalars():
    a = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 1.5, 2.0], dtype=torch.float64)
    d = nc.ulp_distance(a, b, "e2m1")
    assert d.shape == (2, 3) and d.dtype == torch.int64
    assert d.tolist() == [[0, 1, 2], [2, 1, 0]]


OFF_GRID = [("bf16", 1.0 + 2**-9), ("fp16", 2.0**-25), ("fp16", 70000.0), ("e4m3", 500.0),
            ("e4m3", np.inf), ("e4m3", 1.0625), ("e5m2", 1.125), ("e2m1", 2.5), ("e2m1", 8.0),
            ("e2m3", np.inf), ("e3m2", 0.03125), ("e8m0", 3.0), ("e8m0", -1.0), ("e8m0", 0.0),
            ("e8m0", 2.0**-128), ("tf32", 1.0 + 2**-11), ("fp32", 0.1)]


@pytest.mark.parametrize("fmt,v", OFF_GRID, ids=[f"{f}-{v}" for f, v in OFF_GRID])
def test_off_grid_values_raise_usage_error_naming_format(fmt, v):
    with pytest.raises(nc.UsageError) as ei:
        nc.ulp_distance(torch.tensor([1.0, v], dtype=torch.float64),
                        torch.tensor([1.0, 1.0], dtype=torch.float64), fmt)
    assert fmt in str(ei.value) and repr(float(v)) in str(ei.value)
    with pytest.raises(nc.UsageError):  # either argument
        nc.ulp_distance(torch.tensor([1.0], dtype=torch.float64),
                        torch.tensor([v], dtype=torch.float64), fmt)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0",
                                 "tf32", "fp32"])
def test_ulp_distance_of_roundings_is_at_most_one(fmt, device):
    """The two directed neighbours of any x are 0 or 1 ulp apart, rne is one of them."""
    f = formats.get(fmt)
    rng = np.random.default_rng(5)
    x = np.exp2(rng.uniform(np.log2(f.min_normal) - 3, np.log2(f.max), 50_000))
    t = torch.from_numpy(x).to(device)
    rz = nc.round_to(t, fmt, "rz")
    rn = nc.round_to(t, fmt, "rne")
    d = nc.ulp_distance(rz, rn, fmt).cpu().numpy()
    assert set(np.unique(d)) <= {0, 1} and (d == 1).any() and (d == 0).any()
    exact = (rz == t).cpu().numpy()
    assert (d[exact] == 0).all()


def test_ulp_distance_python_floats_fp64():
    assert int(nc.ulp_distance(1.0, 1.0 + 2**-52, "fp64")) == 1


def test_fp64_ulp_distance_does_not_wrap_around():
    a = torch.tensor([-1.0, -np.inf, -formats.FORMATS["fp64"].max], dtype=torch.float64)
    b = torch.tensor([2.0**1000, np.inf, formats.FORMATS["fp64"].max], dtype=torch.float64)
    d = nc.ulp_distance(a, b, "fp64")
    d_half = nc.ulp_distance(torch.zeros(3, dtype=torch.float64), b, "fp64")
    assert bool((d >= d_half).all()), (d, d_half)  # a pair further apart is never closer
