"""Known disagreements between numcheck's rounding and library casts (torch 2.13, ml_dtypes 0.6
and 0.7), each pinned down so that a change in a library is noticed. docs/formats.md, "Findings", has the
prose and the measured numbers; the letters match.

(a) torch and ml_dtypes < 0.7 cast fp64 -> bf16 / fp16 / fp8 / fp6 / fp4 through fp32: double
    rounding. ml_dtypes 0.7.0 casts fp64 directly and agrees with numcheck.
(b) torch 2.13's fp32 -> float8_e4m3fn cast saturates (to +-448); ml_dtypes gives NaN on
    overflow, and so does torch 2.11.0+cu130 (measured on the GPU machine).
(c) e8m0 zero and negatives: torch ignores the sign and maps 0 to 0x00; ml_dtypes gives NaN.
(d) e8m0 from fp32 subnormals in (2^-127, 1.5*2^-127): torch and ml_dtypes < 0.7 round up to
    2^-126; ml_dtypes 0.7.0 rounds to the nearer 2^-127, as numcheck.
(e) NaN into e2m1 / e2m3 / e3m2 (no NaN encoding): ml_dtypes writes a zero whose sign is the
    NaN's sign bit inverted (+NaN -> -0, -NaN -> +0); numcheck keeps NaN.

Each finding states the versions it was measured on (tests/_support.Finding): there a change
fails; on other versions it is a FindingChanged warning (an error in the newest-deps job). Either
way the library changed: update the finding (and the masks in test_formats_rounding.py), do not
loosen numcheck.
"""
from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

import numcheck as nc
from numcheck import formats
from _support import Finding

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.cuda)]
# ml_dtypes 0.7.0 fixed findings (a) and (d): fp64 casts round once, e8m0 rounds fp32 subnormals
# to nearest (measured with 0.7.0; 0.6.0 had both). The tests assert each version's behaviour.
ML_DTYPES_FIXED = tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2]) >= (0, 7)

# torch-side findings (and ml_dtypes' (c), (e)): where they were measured (docs/findings.md table)
TORCH_FP64_DR = Finding("fp64 casts double-round through fp32 (formats.md (a))",
                        {"torch": ("2.13", "2.11")}, "any CPU (2.11.0+cu130: CUDA too)")
E4M3_SATURATES = Finding("fp32 -> e4m3fn saturates (formats.md (b))", {"torch": ("2.13",)},
                         "CPU (x86 measured)")
E8M0_ZERO_SIGN = Finding("e8m0 zero and negatives (formats.md (c))",
                         {"torch": ("2.13",), "ml-dtypes": ("0.6", "0.7")}, "CPU (x86 measured)")
E8M0_SUBNORMAL = Finding("e8m0 from fp32 subnormals rounds up (formats.md (d))",
                         {"torch": ("2.13",)}, "CPU (x86 measured)")
ML_NAN_TO_ZERO = Finding("NaN into e2m1/e2m3/e3m2 becomes a zero of inverted sign (formats.md (e))",
                         {"ml-dtypes": ("0.6", "0.7")}, "CPU (x86 measured)")


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def nc_round(x, fmt, device="cpu", **kw) -> np.ndarray:
    t = torch.from_numpy(np.asarray(x, dtype=np.float64)).to(device)
    return nc.round_to(t, fmt, **kw).cpu().numpy()


def nearest_by_fraction(x: float, lo: float, hi: float) -> float:
    X, L, H = Fraction(x), Fraction(lo), Fraction(hi)
    assert L < X < H
    assert abs(X - L) != abs(H - X)
    return lo if abs(X - L) < abs(H - X) else hi


# --- (a) double rounding through fp32 -------------------------------------------------------------

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.float8_e4m3fn,
         "e5m2": torch.float8_e5m2}
ML = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
      "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
      "e2m1": ml_dtypes.float4_e2m1fn}
DR = [("torch", f) for f in TORCH] + [("ml_dtypes", f) for f in ML]


def torch_cast(x: np.ndarray, fmt) -> np.ndarray:
    return torch.from_numpy(np.asarray(x, dtype=np.float64)).to(TORCH[fmt]).double().numpy()


def ml_cast(x: np.ndarray, fmt) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(ML[fmt]).astype(np.float64)


@pytest.mark.parametrize("lib,fmt", DR, ids=[f"{a}-{b}" for a, b in DR])
def test_a_fp64_cast_double_rounds_at_midpoint_plus_2e_30_ulp(lib, fmt):
    """x = 1 + ulp/2 + 2^-30 ulp: the nearest value is 1 + ulp (Fraction); fp32 rounds x to the
    midpoint 1 + ulp/2 and the second rounding ties to even, 1.0."""
    f = formats.get(fmt)
    ulp = f.eps
    x = 1 + ulp / 2 + ulp * 2.0**-30
    assert Fraction(x) == 1 + Fraction(ulp) / 2 + Fraction(ulp) / 2**30  # exact in float64
    right = nearest_by_fraction(x, 1.0, 1 + ulp)
    assert right == 1 + ulp
    assert nc_round([x], fmt)[0] == right
    cast = torch_cast if lib == "torch" else ml_cast
    if lib == "ml_dtypes" and ML_DTYPES_FIXED:  # rounds once, right: no finding any more
        assert cast([x], fmt)[0] == right
        return
    got = cast([x], fmt)[0]
    if lib == "torch":
        assert got in (1.0, right)  # once or through fp32: nothing else
        if not TORCH_FP64_DR.expect(got == 1.0, f"torch fp64->{fmt} double-rounds to 1.0"):
            return
    assert got == 1.0, f"{lib} fp64->{fmt} no longer double-rounds: update finding (a)"
    # the mechanism: the library result is exactly fp64 -> fp32 -> fmt
    assert cast([x], fmt)[0] == cast(np.float32(x).astype(np.float64).reshape(1), fmt)[0]


def test_a_numpy_fp64_to_fp16_is_direct():
    """numpy's own float64 -> float16 cast rounds once (it agrees with numcheck)."""
    x = 1 + 2.0**-11 + 2.0**-40
    assert np.float16(x) == 1 + 2.0**-10 == nc_round([x], "fp16")[0]


N_SAMPLES = 10**6
# Expected rates (normal range, x uniform within a binade): the fp32 rounding lands on a target
# midpoint for a fraction 2^-(23-mbits) of inputs, and half of those tie the wrong way:
# bf16 2^-17 = 7.6e-6, fp16 2^-14 = 6.1e-5. Bounds: > 0 and < 4x the expected rate.
RATE = {"bf16": (2.0**-17, torch.bfloat16), "fp16": (2.0**-14, torch.float16)}


@pytest.fixture(scope="module")
def normal_samples():
    return np.random.default_rng(0).standard_normal(N_SAMPLES)


@pytest.mark.parametrize("fmt", list(RATE))
def test_a_torch_fp64_cast_differs_on_a_small_fraction(normal_samples, fmt, capsys):
    x = normal_samples
    expected, dt = RATE[fmt]
    ours = nc_round(x, fmt)
    t = torch.from_numpy(x)
    theirs = t.to(dt).double().numpy()
    two_step = t.float().to(dt).double().numpy()
    dr = TORCH_FP64_DR.expect(np.array_equal(theirs, two_step),
                              f"torch fp64->{fmt} is fp64->fp32->{fmt}")
    diff = ours != theirs
    rate = diff.mean()
    lines = [f"torch fp64->{fmt}: {diff.sum()} of {x.size} N(0,1) samples differ from nc.round_to "
             f"(rate {rate:.2e}; expected ~{expected:.2e})"]
    if fmt == "bf16":
        ml = x.astype(ml_dtypes.bfloat16).astype(np.float64)
        lines.append(f"ml_dtypes fp64->bf16: {(ml != ours).sum()} differ "
                     f"(rate {(ml != ours).mean():.2e})")
        # ml_dtypes < 0.7 double-rounds the same way; 0.7 rounds once, as numcheck
        assert np.array_equal(ml, ours if ML_DTYPES_FIXED else two_step)
    else:
        assert np.array_equal(x.astype(np.float16).astype(np.float64), ours)  # numpy: direct
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert rate < 4 * expected
    if dr:
        TORCH_FP64_DR.expect(rate > 0, f"torch fp64->{fmt} differs on some N(0,1) samples")
    # numcheck is the right one on every differing element (Fraction: the nearer neighbour)
    for xi, o, th in zip(x[diff], ours[diff], theirs[diff]):
        lo, hi = min(o, th), max(o, th)
        assert nearest_by_fraction(float(xi), lo, hi) == o
    # and the library is right everywhere else: differences are double roundings only
    assert np.array_equal(ours[~diff], theirs[~diff])


# --- (b) torch's e4m3fn cast saturates ------------------------------------------------------------

def _torch_version() -> tuple[int, int]:
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def test_b_torch_e4m3_overflow_saturates_or_not_by_version(device, capsys):
    x32 = np.array([448, 463.99997, 464, np.nextafter(np.float32(464), np.float32(1e9)), 480,
                    1e9, np.inf, -464.5, -np.inf, np.nan], dtype=np.float32)
    x = x32.astype(np.float64)
    t = torch.from_numpy(x32).to(device).to(torch.float8_e4m3fn).float().cpu().numpy()
    t = t.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        m = x32.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    # ml_dtypes: 464 ties to 448 (even), anything that rounds beyond 448 and +-inf is NaN
    np.testing.assert_array_equal(m, [448, 448, 448, np.nan, np.nan, np.nan, np.nan, np.nan,
                                      np.nan, np.nan])
    np.testing.assert_array_equal(nc_round(x, "e4m3", device, saturate=False), m)
    saturating = [448, 448, 448, 448, 448, 448, 448, -448, -448, np.nan]
    sat = bool(t[3] == 448)
    np.testing.assert_array_equal(t, saturating if sat else m)  # exactly one of the two variants
    np.testing.assert_array_equal(nc_round(x, "e4m3", device, saturate=sat), t)
    with capsys.disabled():
        print(f"\ntorch {torch.__version__} fp32->float8_e4m3fn on {device}: "
              f"{'saturates to +-448' if sat else 'NaN on overflow (as ml_dtypes)'}")
    # measured: 2.13.0+cpu saturates (PLATFORM.md); 2.11.0+cu130 gives NaN on CPU and CUDA
    if device == "cpu" and _torch_version() >= (2, 13):
        E4M3_SATURATES.expect(sat, "torch's CPU fp32 -> e4m3fn saturates to +-448")


def test_b_torch_e5m2_does_not_saturate():
    x32 = np.array([57344, 61439, 61440, 1e9, np.inf, -1e9], dtype=np.float32)
    t = torch.from_numpy(x32).to(torch.float8_e5m2).float().numpy().astype(np.float64)
    np.testing.assert_array_equal(t, [57344, 57344, np.inf, np.inf, np.inf, -np.inf])
    np.testing.assert_array_equal(nc_round(x32, "e5m2", saturate=False), t)


# --- (c) e8m0: zero, negatives, ties --------------------------------------------------------------

def test_c_e8m0_zero_and_negatives(device):
    x32 = np.array([0.0, -0.0, -1.0, -3.0, -2.0**-130, np.nan, 1.0], dtype=np.float32)
    tcode = torch.from_numpy(x32).to(torch.float8_e8m0fnu).view(torch.uint8).numpy()
    with np.errstate(invalid="ignore"):
        mcode = x32.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    # torch: sign ignored (-1 -> 1.0 = 0x7F, -3 -> 4.0), 0 and -0 -> 0x00 (= 2^-127), NaN 0xFF
    E8M0_ZERO_SIGN.expect(np.array_equal(tcode, [0x00, 0x00, 0x7F, 0x81, 0x00, 0xFF, 0x7F]),
                          f"torch e8m0 codes {tcode.tolist()}")
    # ml_dtypes: NaN for zero and every negative
    E8M0_ZERO_SIGN.expect(np.array_equal(mcode, [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]),
                          f"ml_dtypes e8m0 codes {mcode.tolist()}")
    x = x32.astype(np.float64)
    sat = nc_round(x, "e8m0", device, saturate=True)
    nonsat = nc_round(x, "e8m0", device, saturate=False)
    mn = 2.0**-127
    np.testing.assert_array_equal(sat, [mn, mn, np.nan, np.nan, np.nan, np.nan, 1.0])
    np.testing.assert_array_equal(nonsat, [np.nan] * 6 + [1.0])
    # saturate=True agrees with torch at zero, saturate=False with ml_dtypes everywhere here
    E8M0_ZERO_SIGN.expect(sat[0] == float(torch.tensor(0.0).to(torch.float8_e8m0fnu).double()),
                          "torch's e8m0 of 0 is 2^-127")


def test_c_e8m0_ties_go_up_in_all_three():
    """1.5 * 2^k is the linear midpoint of 2^k and 2^(k+1): torch, ml_dtypes and numcheck all
    round it up, whatever the parity of the code word (the module docstring's "to the even code
    word" holds only for odd k + 127)."""
    k = np.arange(-127, 127)
    x32 = (1.5 * np.exp2(k)).astype(np.float32)
    want = np.exp2(k + 1.0)
    t = torch.from_numpy(x32).to(torch.float8_e8m0fnu).double().numpy()
    m = x32.astype(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    ours = nc_round(x32.astype(np.float64), "e8m0")
    np.testing.assert_array_equal(t, want)
    np.testing.assert_array_equal(m, want)
    np.testing.assert_array_equal(ours, want)
    codes = x32.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert (codes % 2 == 1).any() and (codes % 2 == 0).any()  # odd codes too: ties are "up"
    # just below the midpoint: down, in all three
    below = np.nextafter(x32, np.float32(0))
    ok = below > 2.0**-126  # above the fp32-subnormal range of finding (d)
    np.testing.assert_array_equal(
        below[ok].astype(ml_dtypes.float8_e8m0fnu).astype(np.float64), np.exp2(k[ok] * 1.0))
    np.testing.assert_array_equal(nc_round(below.astype(np.float64), "e8m0"), np.exp2(k * 1.0))


# --- (d) e8m0 from fp32 subnormals ----------------------------------------------------------------

def test_d_e8m0_fp32_subnormal_inputs_round_up_in_torch_and_ml_dtypes():
    bits = np.arange(1, 2**23, dtype=np.uint32)  # every positive fp32 subnormal
    x32 = bits.view(np.float32)
    x = x32.astype(np.float64)
    t = torch.from_numpy(x32).to(torch.float8_e8m0fnu).double().numpy()
    m = x32.astype(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    ours = nc_round(x, "e8m0")
    lo, hi = 2.0**-127, 2.0**-126
    wrong = (x > lo) & (x < 1.5 * lo)
    assert wrong.sum() == 2**21 - 1
    E8M0_SUBNORMAL.expect(bool((t[wrong] == hi).all()), "torch rounds them up to 2^-126")
    assert (m[wrong] == (lo if ML_DTYPES_FIXED else hi)).all()
    assert (ours[wrong] == lo).all()
    # everywhere else in the subnormal range the three agree
    assert np.array_equal(t[~wrong], ours[~wrong]) and np.array_equal(m[~wrong], ours[~wrong])
    # Fraction: e.g. 1.01 * 2^-127 (as fp32) is nearer to 2^-127
    for v in (np.float32(1.01 * lo), np.float32(1.25 * lo), np.nextafter(np.float32(1.5 * lo), 0)):
        assert nearest_by_fraction(float(v), lo, hi) == lo
        assert nc_round([float(v)], "e8m0")[0] == lo
    # the same from fp64 inputs (torch and ml_dtypes < 0.7 go through fp32)
    v64 = np.array([1.01 * lo, 1.25 * lo])
    E8M0_SUBNORMAL.expect(bool((torch.from_numpy(v64).to(torch.float8_e8m0fnu).double().numpy()
                                == hi).all()), "torch rounds fp64 1.01, 1.25 * 2^-127 up")
    assert (v64.astype(ml_dtypes.float8_e8m0fnu).astype(np.float64) ==
            (lo if ML_DTYPES_FIXED else hi)).all()
    # the libraries are right from fp32 normals: 1.01 * 2^-126 -> 2^-126
    assert float(torch.tensor(1.01 * hi, dtype=torch.float32).to(torch.float8_e8m0fnu)) == hi


# --- (e) NaN into formats without NaN -------------------------------------------------------------

@pytest.mark.parametrize("fmt,minus_zero_code", [("e2m1", 0x8), ("e2m3", 0x20), ("e3m2", 0x20)])
def test_e_ml_dtypes_nan_becomes_zero_of_inverted_sign(fmt, minus_zero_code, device):
    mdt = ML[fmt]
    nan32 = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF],
                     dtype=np.uint32).view(np.float32)
    negative = np.array([False, True, False, True, False, True])
    with np.errstate(invalid="ignore"):
        x = np.concatenate([nan32.astype(np.float64), [np.nan, -np.nan]])
        codes = nan32.astype(mdt).view(np.uint8)
        codes64 = np.array([np.nan, -np.nan]).astype(mdt).view(np.uint8)
    # +NaN -> -0 (sign bit set), -NaN -> +0 (code 0)
    ML_NAN_TO_ZERO.expect(np.array_equal(codes, np.where(negative, 0, minus_zero_code)) and
                          np.array_equal(codes64, [minus_zero_code, 0]),
                          f"ml_dtypes {fmt} codes of NaNs {codes.tolist()}, {codes64.tolist()}")
    assert np.array_equal(np.signbit(x), np.concatenate([negative, [False, True]]))
    assert np.isnan(nc_round(x, fmt, device, saturate=False)).all()
    assert np.isnan(nc_round(x, fmt, device, saturate=True)).all()
    # infinities: both saturate to +-max
    inf = np.array([np.inf, -np.inf])
    np.testing.assert_array_equal(inf.astype(np.float32).astype(mdt).astype(np.float64),
                                  nc_round(inf, fmt, device))
