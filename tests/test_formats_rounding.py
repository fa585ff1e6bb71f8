"""nc.round_to against independent oracles.

* Exhaustive sweeps: all 65,536 bf16 and fp16 bit patterns into every small format, bit for bit
  against ml_dtypes (fp32 -> target is one rounding there, and bf16/fp16 values are exact in fp32).
* 10^6 random fp32 values, every midpoint between adjacent values +-1 fp32 ulp, and the subnormal
  edges, against ml_dtypes and torch's casts.
* Double rounding: float64 inputs 2^-30 ulp (2^-28 for fp32/tf32) off a midpoint, expected values
  from fractions.Fraction (library casts go through fp32 and get these wrong: see findings).
* The conventions of formats.py's docstring (saturation, rz, NaN, signed zero, input dtypes).

Oracles compare encodings: numcheck's float64 result is cast into the ml_dtypes type (exact: it is
on the grid, asserted) and the uint8/uint16 views are compared, so a wrong sign of zero fails.
NaN is compared by class. Known library disagreements are excluded by the named masks of
``known_disagreements`` and pinned down in test_formats_findings.py, never silently.
"""
from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

import numcheck as nc
from numcheck import formats

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.cuda)]
SMALL = ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0"]
NO_NAN = ("e2m3", "e3m2", "e2m1")
# torch casts that exist. bf16/fp16/e5m2 overflow to inf (saturate=False). e4m3fn depends on the
# torch build: 2.13.0+cpu saturates (PLATFORM.md), 2.11.0+cu130 gives NaN like ml_dtypes (finding
# (b)); torch_e4m3fn_saturates probes it and the cast is compared with that variant of numcheck.
TORCH_CAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.float8_e4m3fn,
              "e5m2": torch.float8_e5m2}


def torch_e4m3fn_saturates(device) -> bool:
    t = torch.tensor([1e9, float("inf"), -1e9], device=device).to(torch.float8_e4m3fn)
    t = t.float().cpu().tolist()
    assert t == [448.0, 448.0, -448.0] or all(map(np.isnan, t)), f"neither variant: {t}"
    return t[0] == 448.0


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


# --- helpers --------------------------------------------------------------------------------------

def md_type(name):
    f = formats.get(name)
    return getattr(ml_dtypes, f.ml_dtypes_dtype, None) or np.dtype(f.ml_dtypes_dtype).type


def uint_view(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def nc_round(x64: np.ndarray, fmt, device, **kw) -> np.ndarray:
    """numcheck's rounding of a float64 numpy array on `device`, back as float64 numpy."""
    t = torch.from_numpy(np.ascontiguousarray(x64, dtype=np.float64)).to(device)
    out = nc.round_to(t, fmt, **kw)
    assert out.dtype == torch.float64 and out.device.type == device and out.shape == t.shape
    return out.cpu().numpy()


def encode(ours: np.ndarray, mdt) -> np.ndarray:
    """numcheck's float64 results as encodings of mdt; asserts the cast was exact (on the grid)."""
    enc = ours.astype(mdt)
    back = enc.astype(np.float64)
    fin = ~np.isnan(ours)
    off = fin & ((back != ours) | (np.signbit(back) != np.signbit(ours)))
    assert not off.any(), f"numcheck returned values off the {mdt} grid: {ours[off][:5]}"
    return uint_view(enc)


def known_disagreements(x: np.ndarray, target: str) -> dict[str, np.ndarray]:
    """Named masks of inputs where ml_dtypes is known to differ from numcheck's convention.
    Each one is a finding, asserted in test_formats_findings.py."""
    masks = {}
    if target in NO_NAN:  # ml_dtypes casts NaN into e2m1/e2m3/e3m2 as a zero (+NaN -> -0,
        masks["ML_NAN_TO_ZERO"] = np.isnan(x)  # -NaN -> +0); numcheck keeps NaN
    if target == "e8m0":  # ml_dtypes rounds 2^-127 < x < 1.5*2^-127 up to 2^-126 (fp32 subnormals)
        with np.errstate(invalid="ignore"):
            masks["ML_E8M0_SUBNORMAL_ROUNDS_UP"] = (x > 2.0**-127) & (x < 1.5 * 2.0**-127)
    return masks


def excluded(x, target):
    m = np.zeros(x.shape, bool)
    for v in known_disagreements(x, target).values():
        m |= v
    return m


def _describe(x, ours, other, bad, k=8):
    idx = np.flatnonzero(bad)[:k]
    return ", ".join(f"x={x[i]!r}: numcheck {ours[i]!r} oracle {other[i]!r}" for i in idx)


def assert_same_encoding(x, ours, oracle, mdt, skip=None, what=""):
    """ours (float64) vs oracle (array of mdt): NaN by class, everything else by encoding."""
    o64 = oracle.astype(np.float64)
    o_nan, n_nan = np.isnan(o64), np.isnan(ours)
    enc_n = encode(np.where(n_nan, 1.0, ours), mdt)  # 1.0: a value of every format
    bad = (o_nan != n_nan) | (~o_nan & ~n_nan & (uint_view(oracle) != enc_n))
    if skip is not None:
        bad &= ~skip
    assert not bad.any(), f"{what}: {bad.sum()} mismatches; {_describe(x, ours, o64, bad)}"


def assert_saturating(x, ours_sat, oracle, target, skip=None, what=""):
    """saturate=True against a non-saturating oracle: equal wherever the oracle is finite, +-max
    exactly where it overflowed (inf or NaN from a non-NaN input), NaN for NaN."""
    f = formats.get(target)
    o64 = oracle.astype(np.float64)
    x_nan = np.isnan(x)
    skip = np.zeros(x.shape, bool) if skip is None else skip
    fin = np.isfinite(o64) & ~skip
    assert_same_encoding(x[fin], ours_sat[fin], oracle[fin], oracle.dtype.type,
                         what=what + " (finite)")
    if f.signed:
        over = ~x_nan & ~np.isfinite(o64) & ~skip
    else:  # e8m0: ml_dtypes also gives NaN for zero and negatives; only positives overflow
        with np.errstate(invalid="ignore"):
            over = ~x_nan & ~np.isfinite(o64) & (x > 0) & ~skip
            zero, neg = (x == 0) & ~skip, (x < 0) & ~skip
        assert (ours_sat[zero] == f.min_normal).all(), what + ": e8m0 zero is 2^-127 (saturate)"
        assert np.isnan(ours_sat[neg]).all(), what + ": e8m0 negative is NaN"
    want = np.copysign(f.max, x[over])
    got = ours_sat[over]
    bad = (got != want) | (np.signbit(got) != np.signbit(want))
    assert not bad.any(), f"{what} overflow: {_describe(x[over], got, want, bad)}"
    assert np.isnan(ours_sat[x_nan]).all(), what + ": NaN must stay NaN"


def torch_oracle(x32: np.ndarray, target: str, device):
    """torch's fp32 -> target cast on `device` (as an ml_dtypes array) and the saturate= variant
    of numcheck it is to be compared with."""
    dt = TORCH_CAST[target]
    sat = target == "e4m3" and torch_e4m3fn_saturates(device)
    t = torch.from_numpy(x32).to(device).to(dt).cpu()
    u = t.view(torch.uint8 if t.element_size() == 1 else torch.int16).numpy()
    return u.view(np.uint8 if u.itemsize == 1 else np.uint16).view(md_type(target)), sat


def all_values(target: str) -> np.ndarray:
    """Every encoding of target (bits <= 16) as float64, via ml_dtypes."""
    mdt = md_type(target)
    code = np.uint8 if np.dtype(mdt).itemsize == 1 else np.uint16
    with np.errstate(invalid="ignore"):
        return np.arange(2 ** formats.get(target).bits, dtype=code).view(mdt).astype(np.float64)


# --- 2. exhaustive sweeps -------------------------------------------------------------------------

with np.errstate(invalid="ignore"):
    SOURCES = {"bf16": np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16),
               "fp16": np.arange(65536, dtype=np.uint16).view(np.float16)}


@pytest.mark.parametrize("target", SMALL + ["bf16", "fp16"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_exhaustive_sweep_matches_ml_dtypes(source, target, device):
    src = SOURCES[source]
    with np.errstate(invalid="ignore"):  # NaN payloads
        x32 = src.astype(np.float32)
        x = x32.astype(np.float64)  # exact: every bf16 / fp16 value is an fp32 value
    nn = ~np.isnan(x)
    assert np.array_equal(uint_view(x[nn].astype(src.dtype)), uint_view(src[nn]))
    mdt = md_type(target)
    with np.errstate(over="ignore", invalid="ignore"):
        oracle = x32.astype(mdt)  # fp32 -> target: one rounding, non-saturating where it can be
    skip = excluded(x, target)
    ours = nc_round(x, target, device, saturate=False)
    assert_same_encoding(x, ours, oracle, mdt, skip, f"{source}->{target} saturate=False")
    ours_sat = nc_round(x, target, device, saturate=True)
    assert_saturating(x, ours_sat, oracle, target, skip, f"{source}->{target} saturate=True")
    # the masks skip exactly what they name: every NaN for the NaN-less formats; for e8m0 the 31
    # bf16 subnormals k * 2^-133 with 64 < k < 96 (fp16 has no values that small)
    n_nan = int(np.isnan(x).sum())
    want_skipped = {"e2m3": n_nan, "e3m2": n_nan, "e2m1": n_nan,
                    "e8m0": 31 if source == "bf16" else 0}.get(target, 0)
    assert skip.sum() == want_skipped


def test_sweep_covers_overflow_and_subnormals():
    """The bf16 sweep reaches overflow, subnormals and signed zero of the fp8 targets (so the
    sweep above can fail on each of them)."""
    with np.errstate(invalid="ignore"):
        x = SOURCES["bf16"].astype(np.float64)
    for t in ("e4m3", "e5m2"):
        f = formats.get(t)
        with np.errstate(invalid="ignore"):
            assert (np.abs(x) > f.max * 1.2).sum() > 1000
            assert ((np.abs(x) < f.min_normal) & (np.abs(x) > 0)).sum() > 100
    assert (np.signbit(x) & (x == 0)).sum() == 1


# --- 3. random fp32 values, midpoints, subnormal edges --------------------------------------------

RANDOM_TARGETS = ["bf16", "fp16", "e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0"]


@pytest.fixture(scope="module")
def random_fp32() -> np.ndarray:
    """10^6 fp32 values: N(0,1), log-uniform magnitudes 2^-150..2^130 with random sign (the ends
    underflow to 0 / overflow to inf in fp32), values near each target's max, and specials."""
    rng = np.random.default_rng(20240611)
    n = 10**6
    near = []
    per = 40_000
    for t in RANDOM_TARGETS:
        mx = formats.get(t).max
        near.append(mx * (1 + rng.uniform(-0.25, 0.25, per)) * rng.choice([-1.0, 1.0], per))
    near = np.concatenate(near)
    n_wide = (n - near.size) // 2
    wide = np.exp2(rng.uniform(-150, 130, n_wide)) * rng.choice([-1.0, 1.0], n_wide)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan])
    normal = rng.standard_normal(n - near.size - n_wide - specials.size)
    with np.errstate(over="ignore"):
        x32 = np.concatenate([normal, wide, near, specials]).astype(np.float32)
    assert x32.size == n
    return x32


@pytest.mark.parametrize("target", RANDOM_TARGETS)
def test_random_fp32_matches_ml_dtypes_and_torch(random_fp32, target, device):
    x32 = random_fp32
    x = x32.astype(np.float64)
    mdt = md_type(target)
    with np.errstate(over="ignore", invalid="ignore"):
        oracle = x32.astype(mdt)
    skip = excluded(x, target)
    ours = nc_round(x, target, device, saturate=False)
    ours_sat = nc_round(x, target, device, saturate=True)
    assert_same_encoding(x, ours, oracle, mdt, skip, f"random fp32->{target} saturate=False")
    assert_saturating(x, ours_sat, oracle, target, skip, f"random fp32->{target} saturate=True")
    if target in TORCH_CAST:
        t_oracle, sat = torch_oracle(x32, target, device)
        assert_same_encoding(x, ours_sat if sat else ours, t_oracle, mdt, None,
                             f"random fp32->{target} vs torch (saturate={sat})")


def midpoint_and_edge_inputs(target: str) -> np.ndarray:
    """Every midpoint between adjacent non-negative values of target (and the overflow midpoint
    between max and the next value of an unbounded exponent range), the subnormal edges, each
    +-1 fp32 ulp, both signs; as fp32."""
    f = formats.get(target)
    v = np.unique(all_values(target))
    v = v[np.isfinite(v) & (v >= 0)]
    nxt = 2 * f.max if f.mbits == 0 else f.max + (f.max - v[-2])
    pts = np.concatenate([(v[:-1] + v[1:]) / 2, [(f.max + nxt) / 2]])
    mn = f.min_normal
    if f.min_subnormal is not None:
        s = f.min_subnormal
        edges = [s, s / 2, mn - s, mn, mn - s / 2]
    else:
        edges = [mn, mn / 2, 1.5 * mn, 2 * mn]
    pts = np.concatenate([pts, edges])
    p32 = pts.astype(np.float32)
    assert np.array_equal(p32.astype(np.float64), pts), "midpoints must be exact in fp32"
    allp = np.concatenate([p32, np.nextafter(p32, np.float32(np.inf)),
                           np.nextafter(p32, np.float32(-np.inf))])
    return np.concatenate([allp, -allp])


@pytest.mark.parametrize("target", RANDOM_TARGETS)
def test_midpoints_and_subnormal_edges_match_oracles(target, device):
    x32 = midpoint_and_edge_inputs(target)
    x = x32.astype(np.float64)
    mdt = md_type(target)
    with np.errstate(over="ignore", invalid="ignore"):
        oracle = x32.astype(mdt)
    skip = excluded(x, target)
    ours = nc_round(x, target, device, saturate=False)
    ours_sat = nc_round(x, target, device, saturate=True)
    assert_same_encoding(x, ours, oracle, mdt, skip, f"midpoints->{target} saturate=False")
    assert_saturating(x, ours_sat, oracle, target, skip, f"midpoints->{target} saturate=True")
    if target in TORCH_CAST:
        t_oracle, sat = torch_oracle(x32, target, device)
        assert_same_encoding(x, ours_sat if sat else ours, t_oracle, mdt, None,
                             f"midpoints->{target} vs torch (saturate={sat})")
    for mode in ("rz", "rna"):  # the other modes on the same inputs: results stay on the grid
        r = nc_round(x, target, device, rounding=mode, saturate=True)
        encode(r, mdt)


# --- 4. double rounding: float64 inputs 2^-30 ulp off a midpoint ----------------------------------

DR_TARGETS = ["bf16", "fp16", "e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "tf32", "fp32"]


def bracket_pairs(f: formats.Format, rng) -> tuple[np.ndarray, np.ndarray]:
    """(k, qexp): lo = k * 2^qexp and hi = (k+1) * 2^qexp are adjacent values of f (hi <= max),
    sampled over many binades (all of them for small formats) and the subnormal range."""
    p = 2**f.mbits
    nb = f.emax - f.emin + 1
    if nb <= 40:
        exps = np.arange(f.emin, f.emax + 1)
    else:
        exps = np.unique(np.concatenate([[f.emin, f.emin + 1, -1, 0, 1, f.emax - 1, f.emax],
                                         rng.integers(f.emin, f.emax + 1, 25)]))
    ks, qs = [], []
    per = 64
    for e in exps:  # normal binade e: k in [p, 2p-1]
        k = np.arange(p, 2 * p) if p <= per else np.unique(np.concatenate(
            [[p, p + 1, 2 * p - 2, 2 * p - 1], rng.integers(p, 2 * p, per)]))
        ks.append(k)
        qs.append(np.full(k.shape, e - f.mbits))
    # subnormal range: k in [0, p-1] with the quantum of the lowest binade
    k = np.arange(0, p) if p <= 4 * per else np.unique(np.concatenate(
        [[0, 1, 2, p - 2, p - 1], rng.integers(0, p, 4 * per)]))
    ks.append(k)
    qs.append(np.full(k.shape, f.emin - f.mbits))
    k, q = np.concatenate(ks).astype(np.int64), np.concatenate(qs).astype(np.int64)
    hi = np.ldexp((k + 1).astype(np.float64), q)
    keep = hi <= f.max
    return k[keep], q[keep]


@pytest.mark.parametrize("target", DR_TARGETS)
def test_double_rounding_near_midpoints_fraction_oracle(target, device):
    f = formats.get(target)
    rng = np.random.default_rng(7 + DR_TARGETS.index(target))
    k, q = bracket_pairs(f, rng)
    D = 28 if target in ("fp32", "tf32") else 30  # keeps mid +- 2^-D ulp exact in float64
    lo = np.ldexp(k.astype(np.float64), q)
    hi = np.ldexp((k + 1).astype(np.float64), q)
    mid = np.ldexp((2 * k + 1).astype(np.float64), q - 1)
    delta = np.ldexp(1.0, q - D)
    xp, xm = mid + delta, mid - delta
    assert (lo < f.min_normal).sum() >= 2 and len(np.unique(q)) >= 3
    if f.ml_dtypes_dtype and f.bits <= 8:  # small formats: every adjacent pair, exhaustively
        v = np.unique(all_values(target))
        assert k.size == (np.isfinite(v) & (v >= 0)).sum() - 1
    else:
        assert k.size > 1000

    # The oracle, with Fraction: the inputs are exactly mid +- 2^-D ulp, the answer is the nearer
    # neighbour (rne/rna) or the lower magnitude (rz); ties: rne to the even k, rna away from 0.
    exp_p, exp_m = np.empty_like(lo), np.empty_like(lo)
    for i in range(k.size):
        quantum = Fraction(2) ** int(q[i])
        L, H = int(k[i]) * quantum, (int(k[i]) + 1) * quantum
        d = (H - L) / 2**D
        M = (L + H) / 2
        assert Fraction(float(xp[i])) == M + d and Fraction(float(xm[i])) == M - d
        assert Fraction(float(lo[i])) == L and Fraction(float(hi[i])) == H
        assert Fraction(float(mid[i])) == M
        XP, XM = M + d, M - d
        exp_p[i] = float(H if abs(H - XP) < abs(XP - L) else L)
        exp_m[i] = float(H if abs(H - XM) < abs(XM - L) else L)
    assert np.array_equal(exp_p, hi) and np.array_equal(exp_m, lo)  # the obvious answer, too

    def check(x, want, mode, what):
        for sgn in (1.0, -1.0):
            got = nc_round(sgn * x, target, device, rounding=mode)
            w = sgn * want
            bad = (got != w) | (np.signbit(got) != np.signbit(w))
            assert not bad.any(), f"{target} {mode} {what} sign {sgn}: " \
                f"{_describe(sgn * x, got, w, bad)}"

    for mode in ("rne", "rna"):
        check(xp, exp_p, mode, "mid+2^-D ulp")
        check(xm, exp_m, mode, "mid-2^-D ulp")
    check(xp, lo, "rz", "mid+2^-D ulp")
    check(xm, lo, "rz", "mid-2^-D ulp")
    # exact midpoints
    even = np.where(k % 2 == 0, lo, hi)
    check(mid, even, "rne", "tie")
    check(mid, hi, "rna", "tie")
    check(mid, lo, "rz", "tie")
    # the fourth mode: sr gives one of the two neighbours, never anything else
    for x in (xp, xm, mid):
        t = torch.from_numpy(-x).to(device)
        got = nc.round_to(t, target, "sr", generator=torch.Generator(device=device).manual_seed(0))
        got = got.cpu().numpy()
        assert ((got == -lo) | (got == -hi)).all() and np.signbit(got).all()


# --- conventions of the module docstring ----------------------------------------------------------

NON_FP64 = [n for n in formats.FORMATS if n != "fp64"]


@pytest.mark.parametrize("name", NON_FP64)
def test_saturate_true_clamps_infinities_and_overflow(name, device):
    f = formats.get(name)
    x = np.array([np.inf, -np.inf, f.max * 4, -f.max * 4, 1e300, f.max])
    for mode in ("rne", "rna", "rz"):
        got = nc_round(x, name, device, rounding=mode, saturate=True)
        want = np.array([f.max, -f.max, f.max, -f.max, f.max, f.max])
        if not f.signed:
            want = np.where(x < 0, np.nan, want)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", NON_FP64)
def test_saturate_false_is_the_formats_own_overflow(name, device):
    f = formats.get(name)
    over = np.inf if f.has_inf else (np.nan if f.has_nan else f.max)
    x = np.array([np.inf, f.max * 4, 1e300])
    for mode in ("rne", "rna"):
        got = nc_round(x, name, device, rounding=mode, saturate=False)
        np.testing.assert_array_equal(got, [over, over, over])
        if f.signed:
            np.testing.assert_array_equal(nc_round(-x, name, device, rounding=mode, saturate=False),
                                          [-over, -over, -over])
    # round toward zero never overflows a finite input (IEEE 754-2019 7.4): it gives max
    got = nc_round(x, name, device, rounding="rz", saturate=False)
    np.testing.assert_array_equal(got, [over, f.max, f.max])


@pytest.mark.parametrize("name", NON_FP64)
def test_overflow_threshold_is_half_an_ulp_above_max(name):
    """Just below max + ulp/2 rounds to max; at/above it overflows (rne ties go to the even
    neighbour beyond max for IEEE formats, to max for e4m3, where 480 would be the NaN code)."""
    f = formats.get(name)
    ulp_max = f.max - float(np.nextafter(f.max, 0)) if name == "fp64" else \
        2.0 ** (f.emax - f.mbits)
    thr = f.max + ulp_max / 2
    below = np.nextafter(thr, 0)
    got = nc_round(np.array([below, thr, np.nextafter(thr, np.inf)]), name, "cpu", saturate=False)
    assert got[0] == f.max
    over = np.inf if f.has_inf else (np.nan if f.has_nan else f.max)
    tie_to_max = name == "e4m3" or f.always_saturates  # e4m3: max 1.75*2^8 has the even k
    np.testing.assert_array_equal(got[1:], [f.max if tie_to_max else over, over])


@pytest.mark.parametrize("name", NON_FP64)
def test_nan_stays_nan_every_mode(name, device):
    x = np.array([np.nan, -np.nan, 1.0])
    for mode in ("rne", "rna", "rz"):
        for sat in (True, False):
            got = nc_round(x, name, device, rounding=mode, saturate=sat)
            assert np.isnan(got[:2]).all() and got[2] == 1.0


@pytest.mark.parametrize("name", [n for n in NON_FP64 if n != "e8m0"])
def test_signed_zero_is_kept(name, device):
    f = formats.get(name)
    tiny = f.min_subnormal / 4
    x = np.array([-0.0, 0.0, -tiny, tiny])
    for mode in ("rne", "rna", "rz"):
        got = nc_round(x, name, device, rounding=mode)
        np.testing.assert_array_equal(np.signbit(got), [True, False, True, False])
        assert (got == 0).all()


@pytest.mark.parametrize("name", list(formats.FORMATS))
def test_values_on_the_grid_are_fixed_points(name, device):
    f = formats.get(name)
    if f.bits <= 16:
        v = all_values(name)
        v = v[np.isfinite(v)]
    else:  # fp32/tf32/fp64: a sample of exact values, subnormals and extremes included
        rng = np.random.default_rng(3)
        v = rng.standard_normal(5000)
        v = np.concatenate([v, v * 2.0**-120, v * 2.0**120, [f.max, -f.max, f.min_normal]])
        v = v if name == "fp64" else v.astype(np.float32).astype(np.float64)
        if name == "tf32":
            v = v.astype(np.float32)
            v = (v.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
        v = np.concatenate([v, [f.min_subnormal, -f.min_subnormal]])
    for mode in ("rne", "rna", "rz"):
        got = nc_round(v, name, device, rounding=mode, saturate=False)
        np.testing.assert_array_equal(got, v)
        assert np.array_equal(np.signbit(got), np.signbit(v))


def test_integer_inputs_and_bad_inputs():
    for dt in (torch.int8, torch.int16, torch.int32):
        got = nc.round_to(torch.tensor([3, -5, 100], dtype=dt), "e2m1")
        np.testing.assert_array_equal(got.numpy(), [3.0, -4.0, 6.0])  # -5: tie, to even -4
    with pytest.raises(nc.UsageError, match="int64"):
        nc.round_to(torch.tensor([1, 2]), "bf16")
    with pytest.raises(nc.UsageError):
        nc.round_to(torch.tensor([True]), "bf16")


def test_low_precision_tensor_inputs_are_converted_exactly(device):
    x = torch.tensor([1.0 + 2**-7, -3.5, 2.0**-133], dtype=torch.bfloat16).to(device)
    got = nc.round_to(x, "bf16")
    assert got.dtype == torch.float64 and got.device.type == device
    np.testing.assert_array_equal(got.cpu().numpy(), x.double().cpu().numpy())


def test_fp64_is_identity():
    x = torch.tensor([0.1, -1e-310, 1e308, -0.0, np.nan], dtype=torch.float64)
    got = nc.round_to(x, "fp64")
    assert got.data_ptr() != x.data_ptr()
    assert torch.equal(got[:4], x[:4]) and torch.isnan(got[4])
    assert torch.signbit(got[3])


def test_fp64_saturate_true_clamps_inf_like_every_other_format():
    got = nc.round_to(torch.tensor([np.inf, -np.inf], dtype=torch.float64), "fp64", saturate=True)
    mx = formats.FORMATS["fp64"].max
    np.testing.assert_array_equal(got.numpy(), [mx, -mx])


def test_python_float_is_rounded_once():
    x = 1 + 2**-8 + 2**-40  # just above the bf16 midpoint between 1 and 1 + 2^-7
    assert float(nc.round_to(x, "bf16")) == 1 + 2**-7
    assert nc.round_to([x], "bf16").tolist() == [1 + 2**-7]


def _grid_probes(f) -> torch.Tensor:
    """Every binade from below the subnormals to beyond overflow: grid points, midpoints and
    their float64 neighbours (up to 512 per binade), random magnitudes over 2^-160..2^160, and
    the special values; both signs."""
    g = torch.arange(0, 1 << min(f.mbits + 1, 9), dtype=torch.float64) * 0.5
    xs = []
    for e in range(f.emin - f.mbits - 3, f.emax + 3):
        v = (g * 2.0 ** (e - f.mbits) + 2.0**e)
        xs += [v, v.nextafter(torch.tensor(0.0, dtype=torch.float64)),
               v.nextafter(torch.tensor(float("inf"), dtype=torch.float64))]
    gen = torch.Generator().manual_seed(0)
    xs.append(torch.randn(20000, generator=gen, dtype=torch.float64)
              * 2.0 ** torch.randint(-160, 160, (20000,), generator=gen).double())
    xs.append(torch.tensor([0.0, float("inf"), float("nan"), f.max, 1e308, 5e-324,
                            f.min_subnormal / 2], dtype=torch.float64))
    x = torch.cat(xs)
    return torch.cat([x, -x])


@pytest.mark.parametrize("name", [n for n, f in formats.FORMATS.items()
                                  if n != "fp64" and formats._has_fast_rne(f, "rne")])
@pytest.mark.parametrize("saturate", [True, False])
def test_fast_rne_equals_the_general_path(name, saturate):
    # round_to's rne path rounds by float64 addition; the general path (kept for rz/rna/sr,
    # e8m0 and unsigned formats) by the integer/fraction split: bit for bit the same values.
    f = formats.get(name)
    x = _grid_probes(f)
    fast, fast_ord = formats.round_with_ordinal(x, f, "rne", saturate)
    slow, slow_ord = formats._round_general(x, f, "rne", saturate, None)
    same = (fast.view(torch.int64) == slow.view(torch.int64)) | (fast.isnan() & slow.isnan())
    assert bool(same.all()), x[~same][:5]
    # ordinals of finite results; the general path gives a saturated inf ordinal 0 (its magnitude
    # is zeroed before rounding), the fast path the ordinal of max, which is the right one.
    check = torch.isfinite(slow) & torch.isfinite(x)
    assert torch.equal(fast_ord[check], slow_ord[check])
    sat_inf = torch.isinf(x) & torch.isfinite(fast)
    assert torch.equal(fast_ord[sat_inf].abs(), formats.ordinal(fast[sat_inf], f).abs())
