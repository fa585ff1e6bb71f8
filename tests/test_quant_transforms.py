"""Transforms (numcheck/quant/transforms.py): stochastic rounding through sr_qdq and the random
Hadamard transform.

SR: inputs x = lo + f*ulp with f in {1/3, 1/7} (DESIGN rule 10: non-midpoint fractions) and
f = 1/2 (exact midpoints), 10^6 draws each; the count of up-roundings is tested with
scipy.stats.binomtest against the exact p (Fraction arithmetic). Family-wise false-alarm rate
ALPHA = 1e-3 over all SR cases, Bonferroni per case. Up-rounding is the only random quantity (the
result is lo or hi), so the binomial test on it is the test of E[sr(x)] = x (unbiasedness):
E[sr(x)] = lo + p*ulp = x exactly when p = (x - lo)/ulp. A faulty SR (plain RNE) is rejected.
"""
from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from scipy.stats import binomtest

from numcheck.errors import UsageError
from numcheck.quant import hadamard, inverse_hadamard, sr_qdq
from numcheck.quant import transforms as T

N_DRAWS = 10**6  # DESIGN rule 10: >= 10^6 draws
ALPHA = 1e-3  # family-wise false-alarm rate over all SR cases (Bonferroni below)
# (fmt, lo, ulp): e4m3 normal binade [1, 2) step 1/8; e2m1 [2, 4) step 1; bf16 [1, 2) step 2^-7;
# e4m3 subnormal step 2^-9
BRACKETS = [("e4m3", 1.25, 0.125), ("e2m1", 2.0, 1.0), ("bf16", 1.0, 2.0**-7),
            ("e4m3", 3 * 2.0**-9, 2.0**-9)]
FRACS = [Fraction(1, 3), Fraction(1, 7), Fraction(1, 2)]
CASES = [(b, f) for b in BRACKETS for f in FRACS]
THRESHOLD = ALPHA / len(CASES)


def _draws(fmt, lo, ulp, fr, impl, seed):
    x = lo + float(fr) * ulp  # the double nearest lo + f*ulp; p computed exactly from it
    p = float((Fraction(x) - Fraction(lo)) / Fraction(ulp))
    xs = torch.full((N_DRAWS,), x, dtype=torch.float64)
    out = impl(xs, fmt, torch.Generator().manual_seed(seed))
    assert bool(((out == lo) | (out == lo + ulp)).all())
    k = int((out == lo + ulp).sum())
    return k, p, out


@pytest.mark.parametrize("case", CASES, ids=[f"{b[0]}-{b[1]}-{f}" for b, f in CASES])
def test_sr_up_fraction_and_unbiased_mean(case):
    (fmt, lo, ulp), fr = case
    k, p, out = _draws(fmt, lo, ulp, fr, sr_qdq, 100 + CASES.index(case))
    res = binomtest(k, N_DRAWS, p)
    assert res.pvalue > THRESHOLD, (k, p, res.pvalue)
    if fr == Fraction(1, 2):  # midpoints: 50% inside the binomial interval at the same level
        ci = res.proportion_ci(confidence_level=1 - THRESHOLD)
        assert ci.low <= 0.5 <= ci.high


def test_sr_rejects_rne_impostor():
    def rne(x, fmt, g):
        import numcheck as nc
        return nc.round_to(x, fmt)
    k, p, _ = _draws("e4m3", 1.25, 0.125, Fraction(1, 3), rne, 7)
    assert binomtest(k, N_DRAWS, p).pvalue < THRESHOLD


def test_sr_qdq_dtype_and_generator():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = sr_qdq(x, "e4m3", torch.Generator().manual_seed(1))
    assert out.dtype == torch.bfloat16
    with pytest.raises(UsageError, match="generator"):
        sr_qdq(x, "e4m3", None)


# ---- Hadamard ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [16, 32, 128])
def test_sylvester_is_exactly_orthogonal(n):
    h = T.sylvester(n)
    assert bool((h.abs() == 1).all())
    assert torch.equal(h, h.T)
    assert torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))  # integers: exact


@pytest.mark.parametrize("n", [16, 32, 128])
def test_rht_matrix_orthogonal_and_round_trip(n):
    q = T.rht_matrix(n, T.rht_signs(n, seed=3))
    # float64 roundoff of an n-term dot product of +-1/n terms: n=16 is exact (1/4 scaling)
    assert float((q @ q.T - torch.eye(n, dtype=torch.float64)).abs().max()) < 4 * n * 2.0**-53
    x = torch.randn(8, 4 * n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    y = hadamard(x, n, seed=3)
    assert not torch.allclose(y, x)
    back = inverse_hadamard(y, n, seed=3)
    assert float((back - x).abs().max()) < 8 * n * 2.0**-53 * float(x.abs().max())
    # norms preserved per block (orthogonal)
    assert torch.allclose(y.reshape(8, 4, n).norm(dim=-1), x.reshape(8, 4, n).norm(dim=-1),
                          rtol=1e-14)


def test_rht_dim0_is_the_transpose_and_gemm_invariant():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(5, 64, dtype=torch.float64, generator=g)
    b = torch.randn(64, 7, dtype=torch.float64, generator=g)
    s = T.rht_signs(16, seed=9)
    assert torch.equal(hadamard(b, 16, dim=0, signs=s), hadamard(b.T, 16, dim=-1, signs=s).T)
    prod = hadamard(a, 16, -1, signs=s) @ hadamard(b, 16, 0, signs=s)
    assert torch.allclose(prod, a @ b, rtol=0, atol=1e-13)


def test_rht_spreads_an_outlier():
    x = torch.zeros(1, 16, dtype=torch.float64)
    x[0, 5] = 100.0
    y = hadamard(x, 16, seed=0)
    assert torch.allclose(y.abs(), torch.full_like(y, 25.0))  # 100 / sqrt(16) everywhere


def test_rht_seed_generator_and_errors():
    x = torch.randn(2, 32, dtype=torch.float64)
    assert torch.equal(hadamard(x, 16, seed=5), hadamard(x, 16, seed=5))
    assert not torch.equal(hadamard(x, 16, seed=5), hadamard(x, 16, seed=6))
    assert torch.equal(hadamard(x, 16, generator=torch.Generator().manual_seed(5)),
                       hadamard(x, 16, seed=5))
    with pytest.raises(UsageError, match="multiple of block=16"):
        hadamard(torch.ones(2, 24), 16)
    with pytest.raises(UsageError, match="block=64"):
        hadamard(torch.ones(2, 64), 64)
