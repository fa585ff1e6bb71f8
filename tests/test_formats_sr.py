"""Stochastic rounding (rounding="sr"): a statistical test with a stated false-alarm rate that
accepts nc.round_to and rejects three planted faulty implementations.

Each case is an input x = lo + f*ulp (f in {1/3, 1/7}, float64) between adjacent values lo < hi of
a format; the exact probability of rounding up is p = (x - lo)/ulp, computed with Fraction (x is
the float64 nearest to lo + f*ulp, so p is close to but not exactly f). One call rounds 10^6 copies
of x with a seeded torch.Generator; every result must be lo or hi, and the count of hi is tested
with scipy.stats.binomtest (two-sided) against p.

False alarms: the family of all cases in one parametrization (one device) is tested at a
family-wise rate ALPHA = 1e-3 with Bonferroni: each case passes when its p-value > ALPHA / n_cases.
The seeds are fixed, so the outcome is deterministic; ALPHA is the chance that a correct
implementation would fail for an arbitrary seed. The same threshold must reject the faulty ones.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

import numcheck as nc
from numcheck import formats

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.cuda)]
N_DRAWS = 10**6  # >= 10^6 draws per case (DESIGN rule 10)
ALPHA = 1e-3  # family-wise false-alarm rate over all SR cases of one device (Bonferroni below)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def _case(fmt: str, lo: float, tag: str, sign: float = 1.0):
    """lo is a value of fmt (magnitude); ulp = the step from lo to the next value up."""
    f = formats.get(fmt)
    if f.min_subnormal is None:  # e8m0: the next value is 2*lo
        ulp = lo
    else:
        e = max(int(np.floor(np.log2(lo))) if lo > 0 else f.emin, f.emin)
        ulp = 2.0 ** (e - f.mbits)
    return fmt, lo, ulp, tag, sign


# (format, lo, ulp, binade tag, sign): normal binades low and high, the subnormal range (where the
# quantum is the subnormal step), lo = 0, the top binade next to max, one negative case each.
BASE = [
    _case("bf16", 1.0, "normal"), _case("bf16", 2.0**100 * 1.5, "high"),
    _case("bf16", 37 * 2.0**-133, "subnormal"), _case("bf16", 0.0, "zero"),
    _case("bf16", 3.0, "negative", -1.0),
    _case("fp16", 1.0, "normal"), _case("fp16", 2.0**-24 * 513, "subnormal"),
    _case("fp16", 65472.0, "max-1ulp"), _case("fp16", 0.0, "zero"),
    _case("e4m3", 1.25, "normal"), _case("e4m3", 5 * 2.0**-9, "subnormal"),
    _case("e4m3", 416.0, "max-1ulp"), _case("e4m3", 0.75, "negative", -1.0),
    _case("e5m2", 1.5, "normal"), _case("e5m2", 2.0**-16, "subnormal"),
    _case("e5m2", 49152.0, "max-1ulp"),
    _case("e2m3", 1.125, "normal"), _case("e2m3", 0.375, "subnormal"),
    _case("e2m3", 7.0, "max-1ulp"),
    _case("e3m2", 2.5, "normal"), _case("e3m2", 0.125, "subnormal"),
    _case("e2m1", 1.0, "normal"), _case("e2m1", 0.0, "subnormal"), _case("e2m1", 4.0, "max-1ulp"),
    _case("e2m1", 1.5, "negative", -1.0),
    _case("tf32", 1.0, "normal"), _case("tf32", 2.0**-136 * 77, "subnormal"),
    _case("fp32", 1.0, "normal"), _case("fp32", 2.0**-149 * 12345, "subnormal"),
    _case("e8m0", 1.0, "normal"), _case("e8m0", 2.0**-127, "min"), _case("e8m0", 2.0**100, "high"),
]
FRACTIONS = [Fraction(1, 3), Fraction(1, 7)]
CASES = [(fmt, lo, ulp, tag, sign, fr) for (fmt, lo, ulp, tag, sign) in BASE for fr in FRACTIONS]
THRESHOLD = ALPHA / len(CASES)  # Bonferroni: per-case significance level


def _ids(c):
    fmt, lo, ulp, tag, sign, fr = c
    return f"{fmt}-{tag}-{fr.numerator}/{fr.denominator}"


def case_inputs(c):
    """x (float64 scalar), exact p = P(round up), lo, hi (signed)."""
    fmt, lo, ulp, tag, sign, fr = c
    f = formats.get(fmt)
    hi = lo + ulp
    assert hi <= f.max
    x = lo + float(fr) * ulp  # float64: exact lo plus the nearest double to f*ulp
    p = (Fraction(x) - Fraction(lo)) / Fraction(ulp)
    assert abs(p - fr) < Fraction(1, 2**28) and 0 < p < 1  # fp32 at 1.0: x's ulp is 2^-29 ulp
    # lo and hi really are adjacent values of fmt (independently of "sr": rz/ru by rne bracketing)
    t = torch.tensor([lo, hi, x], dtype=torch.float64)
    assert nc.round_to(t, fmt, "rz").tolist() == [lo, hi, lo]
    return sign * x, p, sign * lo, sign * hi


# --- the implementation under test and three planted faulty ones ----------------------------------

def sr_numcheck(x, fmt, generator):
    return nc.round_to(x, fmt, rounding="sr", generator=generator)


def _bracket(x, fmt):
    """lo, hi (magnitudes, adjacent values of fmt around |x|) and frac = (|x|-lo)/(hi-lo)."""
    lo = nc.round_to(x.abs(), fmt, "rz")
    f = formats.get(fmt)
    if f.min_subnormal is None:
        ulp = lo
    else:
        e = torch.floor(torch.log2(lo.clamp(min=f.min_normal))).clamp(min=f.emin)
        ulp = torch.exp2(e - f.mbits)
    return lo, lo + ulp, (x.abs() - lo) / ulp


def sr_single_bit(x, fmt, generator):
    """Faulty: rounds up with probability 1/2 whenever the input is inexact."""
    lo, hi, frac = _bracket(x, fmt)
    coin = torch.randint(0, 2, x.shape, generator=generator, device=x.device).bool()
    return torch.copysign(torch.where((frac > 0) & coin, hi, lo), x)


def sr_three_bits(x, fmt, generator):
    """Faulty: SR with only 3 random bits, so P(up) is quantized to k/8 (ceil(8*frac)/8)."""
    lo, hi, frac = _bracket(x, fmt)
    u = torch.randint(0, 8, x.shape, generator=generator, device=x.device).double() / 8
    return torch.copysign(torch.where(u < frac, hi, lo), x)


def sr_is_rne(x, fmt, generator):
    """Faulty: plain round-to-nearest-even, no randomness."""
    return nc.round_to(x, fmt, rounding="rne")


def sr_pvalue(impl, c, device, seed):
    x, p, lo, hi = case_inputs(c)
    xs = torch.full((N_DRAWS,), x, dtype=torch.float64).to(device)
    g = torch.Generator(device=device).manual_seed(seed)
    out = impl(xs, c[0], g)
    assert out.device.type == device
    out = out.cpu().numpy()
    is_hi, is_lo = out == hi, out == lo
    assert (is_hi | is_lo).all(), f"SR gave values other than lo={lo}, hi={hi}: " \
        f"{np.unique(out[~(is_hi | is_lo)])[:5]}"
    assert not (np.signbit(out) != np.signbit(np.float64(x))).any()
    k = int(is_hi.sum())
    return binomtest(k, N_DRAWS, float(p), alternative="two-sided").pvalue, k, p


@pytest.mark.parametrize("c", CASES, ids=[_ids(c) for c in CASES])
def test_sr_up_probability_is_the_fraction(c, device):
    seed = 1000 + CASES.index(c)
    pv, k, p = sr_pvalue(sr_numcheck, c, device, seed)
    assert pv > THRESHOLD, f"{_ids(c)}: {k}/{N_DRAWS} rounded up, expected p={float(p):.9f}, " \
        f"binomtest p-value {pv:.3g} <= {THRESHOLD:.3g} (alpha={ALPHA} / {len(CASES)} cases)"


FAULTY = {"single_bit": sr_single_bit, "three_bits": sr_three_bits, "rne": sr_is_rne}
# Rejecting a faulty implementation on every case at once is the strong claim; one
# representative per format keeps the time down (the faulty ones are each rejected by a margin
# of > 30 standard deviations, so the choice of case does not matter).
FAULTY_CASES = [c for c in CASES if c[3] in ("normal", "subnormal", "min") or c[4] < 0]


@pytest.mark.parametrize("name", list(FAULTY))
@pytest.mark.parametrize("c", FAULTY_CASES, ids=[_ids(c) for c in FAULTY_CASES])
def test_sr_test_rejects_faulty_implementation(c, name, device):
    pv, k, p = sr_pvalue(FAULTY[name], c, device, 2000 + CASES.index(c))
    assert pv < THRESHOLD, f"the SR test failed to reject {name} on {_ids(c)}: " \
        f"{k}/{N_DRAWS} up vs p={float(p):.6f}, p-value {pv:.3g}"


def test_sr_needs_a_generator():
    x = torch.tensor([1.0 + 2**-9], dtype=torch.float64)
    with pytest.raises(nc.UsageError, match="generator"):
        nc.round_to(x, "bf16", rounding="sr")


def test_sr_same_seed_same_result_other_seed_differs(device):
    x = (torch.randn(100_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
         .to(device))
    def run(seed):
        return nc.round_to(x, "e4m3", rounding="sr",
                           generator=torch.Generator(device=device).manual_seed(seed))
    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # every result is one of the two neighbours: the rz value or the next one up
    lo = nc.round_to(x.abs(), "e4m3", "rz")
    up = nc.round_to(x.abs(), "e4m3", "rz") < a.abs()
    assert bool(((a.abs() == lo) | up).all())
    # exactly representable inputs never move
    v = nc.round_to(x, "e4m3")
    assert torch.equal(nc.round_to(v, "e4m3", rounding="sr",
                                   generator=torch.Generator(device=device).manual_seed(1)), v)


def test_sr_mean_is_unbiased_on_random_inputs(device):
    """E[sr(x)] = x: the mean of 64 independent SR roundings of 2^14 N(0,1) values is within
    6 standard errors of x (the error of one rounding is bounded by one ulp of bf16)."""
    x = torch.randn(2**14, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    xs = x.repeat(64, 1).to(device)
    g = torch.Generator(device=device).manual_seed(3)
    r = nc.round_to(xs, "bf16", rounding="sr", generator=g).cpu()
    ulp = torch.exp2(torch.floor(torch.log2(x.abs())) - 7)
    assert bool(((r - x).abs() < ulp).all())
    # sd of one draw <= ulp/2; the mean of 64 draws has sd <= ulp/16. Max of 2^14 |z|: 6.5 sd
    # (false alarm < 2^14 * 1e-10).
    z = ((r - x).mean(0) / (ulp / 16)).abs()
    assert float(z.max()) < 6.5
    # the grand mean of all 2^20 errors: se <= sqrt(sum (ulp/2)^2 * 64) / 2^20
    se = float(torch.sqrt((ulp**2 / 4).sum() * 64)) / xs.numel()
    assert abs(float((r - x).mean())) < 6 * se
