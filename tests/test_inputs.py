"""numcheck.cases.inputs: distributions keep their promises, casts are exact, grids cover, ids are stable.

Determinism is checked in-process and across two fresh interpreters with different
PYTHONHASHSEED values (a sha256 of the tensors' bytes and of a pairwise grid over strings), since
goldens store digests of the inputs and case ids are parquet keys.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import subprocess
import sys

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import numcheck as nc
from numcheck import formats
from numcheck.cases import inputs
from numcheck.errors import NumcheckError, UsageError
from numcheck.cases.design import ALIGNED_SIZES, RAGGED_SIZES, case_id, full_product, pairwise
from numcheck.cases.inputs import DISTRIBUTIONS, LAYOUTS, cast, draw, seed_for, with_layout
from numcheck.cases.strategies import distributions, register_profiles, seeds, shapes

register_profiles()
QUICK = settings.get_profile("quick")

# Sample size for the distribution checks: the tolerances below are >= 5 standard errors at it.
N = 100_000
STORAGE = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.float8_e4m3fn,
           "e5m2": torch.float8_e5m2, "fp32": torch.float32}


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


# ---------------------------------------------------------------------------------------------
# seeds and determinism

def test_seed_for_is_pinned_63_bit_and_unambiguous():
    # Pinned: changing the hashing scheme would change every input of every golden.
    assert seed_for(0, "", "normal") == seed_for(0, "", "normal")
    assert seed_for("a", 1) == int.from_bytes(hashlib.sha256(
        (1).to_bytes(8, "big") + b"a" + (1).to_bytes(8, "big") + b"1").digest()[:8], "big") >> 1
    assert seed_for("ab", "c") != seed_for("a", "bc")
    assert seed_for() != seed_for("")
    for parts in [(), (0,), (2**40, "q", "normal"), ("x" * 1000,)]:
        assert 0 <= seed_for(*parts) < 2**63


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_draw_is_deterministic_and_seed_dependent(dist):
    fmt = "bf16"
    a = draw(dist, (7, 33), seed=3, fmt=fmt, stream="q")
    b = draw(dist, (7, 33), seed=3, fmt=fmt, stream="q")
    assert a.dtype == torch.float64 and a.device.type == "cpu" and a.shape == (7, 33)
    assert bits(a) == bits(b)
    assert bits(a) != bits(draw(dist, (7, 33), seed=4, fmt=fmt, stream="q"))
    assert bits(a) != bits(draw(dist, (7, 33), seed=3, fmt=fmt, stream="k"))


def test_streams_are_independent():
    q, k, v = (draw("normal", (N,), seed=11, stream=s) for s in "qkv")
    for a, b in [(q, k), (q, v), (k, v)]:
        r = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
        assert abs(r) < 5 / math.sqrt(N)  # 5 standard errors of a correlation under independence


_CHILD = r"""
import hashlib, json, sys, torch
from numcheck.cases import inputs
from numcheck.cases.design import pairwise
h = hashlib.sha256()
for d in inputs.DISTRIBUTIONS:
    x = inputs.draw(d, (5, 33), seed=7, fmt="bf16", stream="q")
    t, c = inputs.cast(x, torch.bfloat16)
    h.update(x.numpy().tobytes()); h.update(t.view(torch.uint8).numpy().tobytes())
grid = pairwise({"dtype": ["bf16", "fp16", "e4m3"], "layout": list(inputs.LAYOUTS),
                        "dist": ["normal", "sparse", "lognormal"], "causal": [True, False]})
h.update(json.dumps(grid).encode())
h.update(str(inputs.seed_for(1, "k", "normal")).encode())
print(h.hexdigest())
"""


def test_same_values_in_fresh_processes():
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": salt})
             for salt in ("0", "4242")]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out.strip())
    assert len(outs[0]) == 64 and outs[0] == outs[1]


# ---------------------------------------------------------------------------------------------
# shapes and errors

@pytest.mark.parametrize("dist", DISTRIBUTIONS)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 0, 5), (1, 1), (2, 3, 33), (1, 1, 1, 65)])
def test_draw_any_shape(dist, shape):
    x = draw(dist, shape, seed=0, fmt="fp16")
    assert x.shape == shape and x.dtype == torch.float64 and x.is_contiguous()
    assert bool(torch.isfinite(x).all())


def test_draw_rejects_bad_arguments():
    with pytest.raises(UsageError, match=r"'gaussian'.*normal, uniform"):
        draw("gaussian", (3,), seed=0)
    with pytest.raises(UsageError, match="shape"):
        draw("normal", (3, -1), seed=0)
    with pytest.raises(UsageError, match="shape"):
        draw("normal", 3, seed=0)
    with pytest.raises(UsageError, match="fp12"):
        draw("normal", (3,), seed=0, fmt="fp12")
    with pytest.raises(UsageError, match="e8m0 has no subnormal"):
        draw("subnormal", (3,), seed=0, fmt="e8m0")


def test_fmt_accepts_torch_dtype():
    a = draw("near_overflow", (64,), seed=1, fmt=torch.float16)
    assert bits(a) == bits(draw("near_overflow", (64,), seed=1, fmt="fp16"))


# ---------------------------------------------------------------------------------------------
# each distribution keeps its promise

def test_normal_uniform_lognormal_moments():
    x = draw("normal", (N,), seed=0)
    assert abs(float(x.mean())) < 0.02 and abs(float(x.std()) - 1) < 0.02
    u = draw("uniform", (N,), seed=0)
    assert float(u.min()) >= -1 and float(u.max()) < 1 and abs(float(u.mean())) < 0.01
    ln = draw("lognormal", (N,), seed=0)
    logs = ln.abs().log()
    assert abs(float(logs.mean())) < 0.02 and abs(float(logs.std()) - 1) < 0.02
    assert 0.48 < float((ln > 0).double().mean()) < 0.52


def test_student_t_has_a_heavy_tail():
    t = draw("student_t", (2 * N,), seed=0)
    # P(|t_3| > 5) = 0.01539; for N(0,1) it is 5.7e-7. Bounds are > 5 standard errors wide.
    tail = float((t.abs() > 5).double().mean())
    assert 0.0125 < tail < 0.0185
    assert abs(float(t.median())) < 0.02


def test_outlier_channels():
    x = draw("outlier_channels", (512, 256), seed=5)
    rms = x.pow(2).mean(0).sqrt()
    big = rms > 10
    assert int(big.sum()) == 256 // 64
    assert float(rms[big].min()) > 80 and float(rms[big].max()) < 1200  # 100x..1000x of ~1
    assert float(rms[~big].max()) < 1.3
    # channels depend on the seed; fewer than 64 channels still get one
    other = draw("outlier_channels", (512, 256), seed=6).pow(2).mean(0).sqrt() > 10
    assert not torch.equal(big, other)
    assert int((draw("outlier_channels", (64, 10), seed=0).abs().amax(0) > 50).sum()) == 1


def test_sparse_zero_fraction():
    x = draw("sparse", (N,), seed=0)
    assert 0.88 < float((x == 0).double().mean()) < 0.92
    assert not bool(torch.signbit(x[x == 0]).any())  # +0.0


def test_zero_blocks():
    x = draw("zero_blocks", (64, 100), seed=2)  # 64 rows, blocks of 32, 32, 32, 4
    blocks = [x[:, 0:32], x[:, 32:64], x[:, 64:96], x[:, 96:100]]
    zero = torch.stack([(b == 0).all(1) for b in blocks], 1)
    some = torch.stack([(b == 0).any(1) for b in blocks], 1)
    assert torch.equal(zero, some)  # zeros come in whole aligned blocks (N(0,1) is never 0)
    dead_rows = 64 // 4
    assert int(zero.all(1).sum()) >= dead_rows
    assert int(zero.sum()) == dead_rows * 4 + (64 - dead_rows) * 4 // 4
    one_row = draw("zero_blocks", (1, 256), seed=0)  # a single row is never zeroed whole
    assert int((one_row.view(8, 32) == 0).all(1).sum()) == 2


def test_constant_rows_have_zero_variance():
    x = draw("constant_rows", (6, 5, 33), seed=1)
    assert torch.equal(x, x[..., :1].expand_as(x))
    assert bool((x.var(-1) == 0).all())
    assert x[..., 0].unique().numel() == 30


def test_large_mean():
    x = draw("large_mean", (N,), seed=0)
    assert abs(float(x.mean()) - 64) < 0.002 and abs(float(x.std()) - 0.125) < 0.002


@pytest.mark.parametrize("name", list(STORAGE))
def test_near_overflow_is_near_max_but_finite_after_cast(name):
    f = formats.get(name)
    x = draw("near_overflow", (4096,), seed=0, fmt=name)
    t, c = cast(x, STORAGE[name])
    back = t.to(torch.float64)
    assert bool(torch.isfinite(back).all()) and bool(torch.isfinite(c).all())
    assert float(c.abs().max()) <= f.max / 2 and float(c.abs().min()) >= f.max / 16
    assert float(c.abs().max()) >= f.max / 2.5  # the top binade is reached
    assert bool((c > 0).any()) and bool((c < 0).any())


def test_near_overflow_unsigned_format_is_positive():
    x = draw("near_overflow", (256,), seed=0, fmt="e8m0")
    assert bool((x > 0).all()) and float(x.max()) <= 2.0**126


@pytest.mark.parametrize("name", list(STORAGE))
def test_subnormal_stays_subnormal_after_cast(name):
    f = formats.get(name)
    x = draw("subnormal", (4096,), seed=0, fmt=name)
    t, c = cast(x, STORAGE[name])
    back = t.to(torch.float64)
    assert torch.equal(back, c)
    assert bool((back != 0).all()) and bool((back.abs() < f.min_normal).all())
    assert bool((back.abs() >= f.min_subnormal).all())
    assert bool((c > 0).any()) and bool((c < 0).any())
    if f.mbits >= 3:  # log-uniform: both the bottom and the top binade of the subnormals occur
        lg = back.abs().log2()
        assert float(lg.min()) < math.log2(f.min_subnormal) + 1
        assert float(lg.max()) >= math.log2(f.min_normal) - 1


def test_subnormal_fp64_and_tiny_formats():
    x = draw("subnormal", (1000,), seed=0, fmt="fp64")
    assert bool((x != 0).all()) and bool((x.abs() < 2.0**-1022).all())
    e21 = draw("subnormal", (10,), seed=0, fmt="e2m1")  # e2m1 has one subnormal: 0.5
    assert bool((e21.abs() == 0.5).all())


def test_wide_range_span():
    x = draw("wide_range", (N,), seed=0).abs()
    assert float(x.min()) >= 2.0**-20 and float(x.max()) <= 2.0**20
    assert math.log2(float(x.max()) / float(x.min())) > 39.5


# ---------------------------------------------------------------------------------------------
# cast

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16,
                                   torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dist", ["normal", "wide_range", "lognormal"])
def test_cast_is_exact_and_is_numchecks_rounding(dtype, dist):
    x = draw(dist, (3, 1000), seed=9)
    t, c = cast(x, dtype)
    assert t.dtype == dtype and t.device.type == "cpu" and t.shape == x.shape
    assert c.dtype == torch.float64 and c.device.type == "cpu"
    assert bits(t.to(torch.float64)) == bits(c)
    assert bits(c) == bits(nc.round_to(x, dtype, "rne", saturate=True))


def test_cast_float64_is_a_copy():
    x = draw("normal", (5, 7), seed=0)
    t, c = cast(x, torch.float64)
    assert bits(t) == bits(x) and bits(c) == bits(x)
    assert t.data_ptr() != x.data_ptr() and c.data_ptr() != x.data_ptr()
    assert t.data_ptr() != c.data_ptr()


def test_cast_avoids_double_rounding():
    # 1 + 2^-8 is the bf16 midpoint between 1 and 1 + 2^-7; 2^-40 above it rounds up. torch rounds
    # float64 -> fp32 first (losing the 2^-40) and then breaks the tie to even: 1.0.
    x = torch.tensor([1 + 2.0**-8 + 2.0**-40], dtype=torch.float64)
    assert x.to(torch.bfloat16).item() == 1.0  # torch's double rounding, the reason cast exists
    t, c = cast(x, torch.bfloat16)
    assert t.item() == c.item() == 1 + 2.0**-7
    y = torch.tensor([1 + 2.0**-11 + 2.0**-40], dtype=torch.float64)  # the same for fp16
    assert cast(y, torch.float16)[1].item() == 1 + 2.0**-10


def test_cast_saturates_and_keeps_nan():
    x = torch.tensor([1e6, -math.inf, math.nan, -0.0], dtype=torch.float64)
    t, c = cast(x, torch.float8_e4m3fn)
    assert c[:2].tolist() == [448.0, -448.0] and math.isnan(c[2]) and math.copysign(1, c[3]) < 0
    back = t.to(torch.float64)
    assert back[:2].tolist() == [448.0, -448.0] and math.isnan(back[2])
    assert cast(x, torch.bfloat16)[1][1].item() == -formats.get("bf16").max


def test_cast_accepts_names_and_rejects_other_dtypes():
    x = draw("normal", (8,), seed=0)
    assert bits(cast(x, "bf16")[0]) == bits(cast(x, torch.bfloat16)[0])
    with pytest.raises(UsageError, match="not supported"):
        cast(x, torch.int32)
    with pytest.raises(UsageError, match="not supported"):
        cast(x, "tf32")  # no storage dtype: round with nc.round_to and keep fp32
    with pytest.raises(UsageError, match="floating-point"):
        cast(torch.arange(3), torch.float32)


def test_cast_refuses_flush_denormal():
    x = draw("subnormal", (16,), seed=0, fmt="fp32")
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        with pytest.raises(NumcheckError, match="flush_denormal"):
            cast(x, torch.float32)
    finally:
        torch.set_flush_denormal(False)


# ---------------------------------------------------------------------------------------------
# layouts

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16,
                                   torch.float8_e4m3fn, torch.int64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(3, 5, 7), (4, 33), (6,), (5, 1), (1, 1, 9)])
def test_layouts_keep_values_and_change_memory(dtype, layout, shape):
    x = draw("normal", shape, seed=0)
    x = (x * 100).to(torch.int64) if dtype == torch.int64 else cast(x, dtype)[0]
    y = with_layout(x, layout)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    assert bits(y) == bits(x)
    possible = {"contiguous": False, "sliced": x.numel() > 1,
                "transposed": x.dim() >= 2 and shape[-1] > 1 and shape[-2] > 1}[layout]
    assert y.is_contiguous() is not possible
    if layout == "sliced":
        assert y.stride(-1) == 2
        if dtype.is_floating_point:  # the gaps hold NaN: a kernel ignoring strides reads them
            assert bool(torch.isnan(y._base[..., 1::2].to(torch.float64)).all())


def test_layouts_of_scalars_and_gradients():
    s = torch.tensor(2.5)
    for layout in LAYOUTS:
        assert with_layout(s, layout).item() == 2.5
    with pytest.raises(UsageError, match="contiguous, transposed, sliced"):
        with_layout(s, "blocked")
    for layout in LAYOUTS:
        y = with_layout(torch.arange(12.0).view(3, 4), layout).requires_grad_()
        (y * y).sum().backward()
        assert torch.equal(y.grad, 2 * y.detach())


# ---------------------------------------------------------------------------------------------
# grids

def _pairs_missing(rows: list[dict], factors: dict) -> list:
    names = list(factors)
    missing = []
    for i, j in itertools.combinations(range(len(names)), 2):
        a, b = names[i], names[j]
        for ia, ib in itertools.product(range(len(factors[a])), range(len(factors[b]))):
            va, vb = factors[a][ia], factors[b][ib]
            if not any(r[a] == va and r[b] == vb and type(r[a]) is type(va)
                       and type(r[b]) is type(vb) for r in rows):
                missing.append((a, va, b, vb))
    return missing


VALUE_POOL = [0, 1, 2, 7, "bf16", "fp16", "e4m3", None, True, False, (4, 127, 64), (1,), 0.5,
              "normal", "sparse", ("q", 3)]


def test_pairwise_covers_every_pair_on_random_factor_sets():
    rng = random.Random(1234)
    for _ in range(40):
        factors = {}
        for f in range(rng.randint(1, 6)):
            n = rng.randint(1, 6)
            factors[f"f{f}"] = rng.sample(VALUE_POOL[:4] + VALUE_POOL[4:], n)
        rows = pairwise(factors)
        assert not _pairs_missing(rows, factors), factors
        for r in rows:
            assert list(r) == list(factors)
            assert all(any(v is w or (type(v) is type(w) and v == w) for w in factors[k])
                       for k, v in r.items())
        assert len(rows) <= math.prod(len(v) for v in factors.values())


@pytest.mark.parametrize("sizes,bound", [
    ((4, 4, 4, 4), 16),          # an orthogonal array: optimal
    ((3, 3, 3, 3), 9),           # optimal
    ((2,) * 10, 10),             # product 1024
    ((5, 4, 3, 2, 2), 20),       # 5*4 is a lower bound
    ((3,) * 13, 24),             # product 1.6e6
    ((8, 6, 4, 3, 3, 2, 2), 48),  # 8*6 is a lower bound
])
def test_pairwise_is_small(sizes, bound):
    factors = {f"f{i}": list(range(n)) for i, n in enumerate(sizes)}
    rows = pairwise(factors)
    assert not _pairs_missing(rows, factors)
    assert len(rows) <= bound < math.prod(sizes)


def test_pairwise_is_deterministic_and_edge_cases():
    f = {"dtype": ["bf16", "fp16", "e4m3"], "shape": [(1, 3), (4, 127, 64), (16,)],
         "dist": list(DISTRIBUTIONS[:5]), "causal": [True, False], "scale": [None, 0.125]}
    assert pairwise(f) == pairwise(dict(f))
    assert pairwise({"a": [1, 2, 3]}) == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert pairwise({}) == [{}] and full_product({}) == [{}]
    two = {"a": [1, 2], "b": ["x", "y", "z"]}
    assert pairwise(two) == full_product(two)
    assert full_product(two)[:3] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"}]
    assert len(full_product(f)) == 3 * 3 * 5 * 2 * 2
    with pytest.raises(UsageError, match="'b' has no values"):
        pairwise({"a": [1], "b": []})
    with pytest.raises(UsageError, match="twice"):
        full_product({"a": [1, 1]})
    with pytest.raises(UsageError, match="must be a list"):
        pairwise({"a": "abc"})


def test_case_id():
    assert case_id(dtype="bf16", shape=(4, 127, 64), dist="normal", seed=0,
                   causal=True) == "bf16-4x127x64-normal-s0-causal"
    assert case_id(dtype=torch.bfloat16, shape=(4, 127, 64), dist="normal", seed=0,
                   causal=False, mask=None) == "bf16-4x127x64-normal-s0"
    assert case_id(op="sdpa", scale=0.125, eps=1e-05, shape=(), layout="sliced") == \
        "sdpa-0.125-1e_05-scalar-sliced"
    assert case_id(dtypes=(torch.bfloat16, torch.float32), kernel="my kernel/v2:fast") == \
        "bf16_fp32-my_kernel_v2_fast"
    assert case_id(k=-1, gqa=True) == "_1-gqa"
    assert case_id() == ""
    ident = case_id(a="x=1", shape=(1, 1))
    assert ident == "x=1-1x1"


# ---------------------------------------------------------------------------------------------
# hypothesis

def test_profiles():
    register_profiles()
    register_profiles()  # idempotent
    q, f = settings.get_profile("quick"), settings.get_profile("full")
    assert q.derandomize and q.max_examples == 20 and q.deadline is None and q.database is None
    assert Phase.shrink not in q.phases
    assert not f.derandomize and f.max_examples == 200 and f.deadline is None
    assert Phase.shrink in f.phases


@settings(QUICK)
@given(shape=shapes(2), dist=distributions(), seed=seeds())
def test_strategies_feed_draw(shape, dist, seed):
    assert len(shape) == 2 and all(1 <= s <= 130 for s in shape)
    assert 0 <= seed < 2**31
    x = draw(dist, shape, seed=seed, fmt="bf16")
    t, c = cast(x, torch.bfloat16)
    assert x.shape == shape and bits(t.to(torch.float64)) == bits(c)


@settings(QUICK)
@given(data=st.data())
def test_shape_strategy_options(data):
    rank = data.draw(st.integers(0, 4))
    s = data.draw(shapes(rank, min_side=0, max_side=1100))
    assert len(s) == rank and all(0 <= v <= 1100 for v in s)
    a = data.draw(shapes(3, ragged=False, max_side=300))
    assert all(v % 16 == 0 and 16 <= v <= 300 for v in a)
    big = data.draw(shapes(1, min_side=100, max_side=2000))
    assert 100 <= big[0] <= 2000
    d = data.draw(distributions(exclude=("subnormal", "near_overflow")))
    assert d in DISTRIBUTIONS and d not in ("subnormal", "near_overflow")


def test_strategy_arguments_are_checked():
    with pytest.raises(UsageError):
        shapes(-1)
    with pytest.raises(UsageError):
        shapes(2, min_side=5, max_side=4)
    with pytest.raises(UsageError, match="multiple of 16"):
        shapes(2, min_side=1, max_side=15, ragged=False)
    with pytest.raises(UsageError, match="gauss"):
        distributions(exclude=("gauss",))
    with pytest.raises(UsageError, match="every distribution"):
        distributions(exclude=DISTRIBUTIONS)
    assert set(RAGGED_SIZES).isdisjoint(ALIGNED_SIZES)
    assert json.dumps(inputs.__all__)  # the public names are plain strings


# ---------------------------------------------------------------------------------------------
# blocks_tiny / blocks_huge (grid classes of the block-scaled formats; issue 12)

BLOCK_DISTS = inputs.BLOCK_SCALE_DISTRIBUTIONS


def test_block_scale_distributions_stay_out_of_the_zoo():
    """draw() makes them; DISTRIBUTIONS (hypothesis, the quant round-trip floors) is unchanged."""
    assert set(BLOCK_DISTS) == {"blocks_tiny", "blocks_huge"}
    assert set(BLOCK_DISTS).isdisjoint(DISTRIBUTIONS)
    assert len(DISTRIBUTIONS) == 12 and DISTRIBUTIONS[-1] == "wide_range"


@pytest.mark.parametrize("dist", BLOCK_DISTS)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 0, 5), (1, 1), (2, 3, 33), (1, 1, 1, 65)])
def test_block_dists_any_shape_and_deterministic(dist, shape):
    x = draw(dist, shape, seed=0, fmt="bf16")
    assert x.shape == shape and x.dtype == torch.float64 and x.is_contiguous()
    assert bool(torch.isfinite(x).all())
    assert torch.equal(x, draw(dist, shape, seed=0, fmt="bf16"))
    if x.numel() > 1:
        assert not torch.equal(x, draw(dist, shape, seed=1, fmt="bf16"))


@pytest.mark.parametrize("fmt, tiny, huge", [("fp32", -121, 120), ("bf16", -121, 120),
                                             ("fp16", -9, 8)])
def test_block_dists_put_the_amax_in_their_binade(fmt, tiny, huge):
    for shape in [(4, 390), (130, 257), (16, 1024), (2, 3, 96), (7,)]:
        t = draw("blocks_tiny", shape, seed=3, fmt=fmt, stream="x")
        h = draw("blocks_huge", shape, seed=3, fmt=fmt, stream="x")
        assert 2.0 ** tiny <= float(t.abs().max()) < 2.0 ** (tiny + 1)
        assert 2.0 ** huge <= float(h.abs().max()) < 2.0 ** (huge + 1)
        assert torch.equal(t * 2.0 ** (huge - tiny), h)  # one tensor, two exact global scales
        for x in (t, h):  # finite and never all zero after the cast
            stored = cast(x, fmt)[1]
            assert bool(torch.isfinite(stored).all()) and bool((stored != 0).any())


def test_block_dists_zero_tiles_blocks_and_constant_blocks():
    x = draw("blocks_huge", (2, 260, 384), seed=1, fmt="fp32")  # 3 x 3 tiles of 128 per matrix
    z = x == 0
    t128 = torch.nn.functional.pad(z, (0, 0, 0, 124), value=True).reshape(2, 3, 128, 3, 128)
    assert int(t128.all(dim=(2, 4)).sum()) >= 18 // 4  # whole 128 x 128 tiles (edges partial)
    t16 = z[:, :256].reshape(2, 16, 16, 24, 16)
    assert int(t16.all(dim=(2, 4)).sum()) > int(t128.all(dim=(2, 4)).sum()) * 64  # and 16 x 16
    b32 = x.reshape(2, 260, 12, 32)
    zero32 = (b32 == 0).all(-1)
    const32 = (b32 == b32[..., :1]).all(-1) & ~zero32
    live = ~(b32 == 0).any(-1)
    assert int(zero32.sum()) > 0 and int(const32.sum()) >= int(live.sum()) // 9
    one = draw("blocks_tiny", (1, 4096), seed=0, fmt="bf16")  # a vector: 1 x 128 groups zero
    assert int((one.view(32, 128) == 0).all(-1).sum()) == 32 // 4


def test_block_dists_reject_unsigned_formats():
    with pytest.raises(UsageError, match="unsigned"):
        draw("blocks_tiny", (4, 32), seed=0, fmt="e8m0")
    with pytest.raises(UsageError, match="blocks_huge"):
        draw("gauss", (4, 32), seed=0)
