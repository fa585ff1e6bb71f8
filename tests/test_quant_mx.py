"""MX reference quantizer (numcheck/quant/mx.py): hand-checked spec vectors, sweeps, oracles.

Every expected number in the spec-vector tests is worked out by hand in the comment beside it
(OCP MX v1.0 section 6.3 Algorithm 1; DESIGN rule 10). ml_dtypes appears only here, as an oracle.
Planted faults (written before any tuning) show that the checker used here, a bit-exact compare
of codes and scales plus an SQNR floor, catches each one, and that nc.verify does too.
"""
from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch

import numcheck as nc
from numcheck import formats
from numcheck.errors import UsageError
from numcheck.quant import mx
from numcheck.quant.mx import mx_dequantize, mx_qdq, mx_quantize

ELEMS = mx.ELEMS
MODES = mx.SCALE_MODES
ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
      "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
      "e2m1": ml_dtypes.float4_e2m1fn}
BITS = {"e4m3": 8, "e5m2": 8, "e2m3": 6, "e3m2": 6, "e2m1": 4}


pytestmark = pytest.mark.usefixtures("one_thread")


def block(*vals, n=32, dtype=torch.float64):
    """One 32-element block: vals first, zeros after."""
    x = torch.zeros(n, dtype=torch.float64)
    x[:len(vals)] = torch.tensor(vals, dtype=torch.float64)
    return x.to(dtype)


# ---- hand-checked spec vectors --------------------------------------------------------------

def test_e4m3_amax_960_floor_saturates_rceil_keeps():
    x = block(960.0, 957.0, 1.0)
    q = mx_quantize(x, "e4m3", scale_mode="floor")
    # floor(log2 960) = 9, emax(e4m3) = 8 -> shared exp 1, scale 2, E8M0 code 128.
    assert q.scale_exp.tolist() == [1] and q.scale_code.tolist() == [128]
    # 960/2 = 480 and 957/2 = 478.5 exceed 448: both saturate to 448 -> 896. 1/2 = 0.5 exact.
    assert mx_dequantize(q)[:3].tolist() == [896.0, 896.0, 1.0]
    r = mx_quantize(x, "e4m3", scale_mode="rceil")
    # 960/448 = 2.142857 (fp32) -> rounded up to 4: exp 2, code 129. 960/4 = 240 (1.875 * 2^7, an
    # e4m3 value); 957/4 = 239.25 -> step 16 in [128, 256) -> 240 -> 960. 1/4 = 0.25 exact.
    assert r.scale_exp.tolist() == [2] and r.scale_code.tolist() == [129]
    assert mx_dequantize(r)[:3].tolist() == [960.0, 960.0, 1.0]


def test_e2m1_amax_2_7_gives_code_126():
    q = mx_quantize(block(2.7, -1.3, 0.1), "e2m1")
    # floor(log2 2.7) = 1, emax(e2m1) = 2 -> exp -1 -> code 126, scale 0.5.
    assert q.scale_code.tolist() == [126] and q.scale_exp.tolist() == [-1]
    # 2.7/0.5 = 5.4 -> nearest of {4, 6} is 6 -> 3.0; -1.3/0.5 = -2.6 -> -3 -> -1.5;
    # 0.1/0.5 = 0.2 -> below 0.25 (half of the subnormal 0.5) -> 0.
    assert q.codes[:3].tolist() == [6.0, -3.0, 0.0]
    assert mx_dequantize(q)[:3].tolist() == [3.0, -1.5, 0.0]


@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("mode", MODES)
def test_zero_block_gives_smallest_scale_and_zeros(elem, mode):
    x = torch.zeros(3, 64)
    x[1, 32:] = torch.linspace(-1, 1, 32)
    q = mx_quantize(x, elem, scale_mode=mode)
    # Zero blocks: exponent -127, code 0x00 (the smallest E8M0), elements 0; never NaN.
    zero = q.scale_code != q.scale_code[1, 1]
    assert q.scale_exp[zero].eq(-127).all() and q.scale_code[zero].eq(0).all()
    out = mx_qdq(x, elem, scale_mode=mode)
    assert not out.isnan().any() and out[0].eq(0).all() and out[1, :32].eq(0).all()


def test_amax_1e_38_clamps_to_minus_127():
    x = block(1e-38, dtype=torch.float32)
    q = mx_quantize(x, "e4m3")
    # fp32(1e-38) = 0x1.b38fb8p-127: floor(log2) = -127, minus 8 = -135 -> clamped to -127.
    assert q.scale_exp.tolist() == [-127] and q.scale_code.tolist() == [0]
    # element = 0x1.b38fb8 = 1.7014 -> e4m3 step 0.125 in [1, 2): 1.75 (0.049 away; 1.625 is 0.076).
    assert q.codes[0].item() == 1.75
    assert mx_qdq(x, "e4m3")[0].item() == 1.75 * 2.0 ** -127  # exact in fp32 (a subnormal)


def test_subnormal_amax_exact():
    x = block(2.0 ** -130, 2.0 ** -131 * 3, dtype=torch.float32)  # fp32 subnormals
    assert x[0].item() == 2.0 ** -130
    q = mx_quantize(x, "e4m3")
    # floor(log2 2^-130) = -130 (from the bits, exact), -130 - 8 -> clamped -127: elements are
    # 2^-3 and 3 * 2^-4 (e4m3 values), dequantized exactly.
    assert q.scale_exp.tolist() == [-127]
    assert q.codes[:2].tolist() == [0.125, 0.1875]
    assert mx_qdq(x, "e4m3")[:2].tolist() == [2.0 ** -130, 3 * 2.0 ** -131]
    # e2m1: the same elements are below 0.25 (half its subnormal 0.5): they round to 0.
    assert mx_qdq(x, "e2m1")[:2].tolist() == [0.0, 0.0]


def test_rne_midpoints():
    # e4m3, amax 256 -> floor(log2 256) - 8 = 0: scale 1. In [16, 32) the step is 2: 17 is the
    # midpoint of 16 (mantissa 000) and 18 (001) -> 16; 19 of 18 (001) and 20 (010) -> 20.
    q = mx_quantize(block(256.0, 17.0, 19.0, -17.0, -19.0, 2.0 ** -10, 3 * 2.0 ** -10), "e4m3")
    assert q.scale_exp.tolist() == [0]
    # 2^-10 is half of e4m3's smallest subnormal 2^-9: tie to even -> 0; 3 * 2^-10 = 1.5 steps
    # -> 2 steps = 2^-8.
    assert q.codes[:7].tolist() == [256.0, 16.0, 20.0, -16.0, -20.0, 0.0, 2.0 ** -8]
    # e2m1, amax 6 -> exp 2 - 2 = 0: midpoints 0.25 -> 0, 0.75 -> 1 (0.5 has mantissa 1),
    # 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
    q = mx_quantize(block(6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0), "e2m1")
    assert q.scale_exp.tolist() == [0]
    assert q.codes[:9].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0]


def test_nan_and_inf_blocks():
    x = torch.randn(4, 64, dtype=torch.float64)
    x[0, 5] = math.nan
    x[2, 40] = -math.inf
    q = mx_quantize(x, "e4m3")
    # NaN or Inf in a block -> E8M0 0xFF (its only NaN), the whole block NaN; others untouched.
    assert q.scale_code[0, 0] == 0xFF and q.scale_code[2, 1] == 0xFF
    assert (q.scale_code == 0xFF).sum() == 2
    out = mx_dequantize(q)
    assert out[0, :32].isnan().all() and out[2, 32:].isnan().all()
    assert not out[0, 32:].isnan().any() and not out[2, :32].isnan().any()
    assert not out[1].isnan().any() and not out[3].isnan().any()


def test_usage_errors():
    with pytest.raises(UsageError, match=r"x.shape\[-1\] = 48 .*block=32.*pad .* to 64"):
        mx_quantize(torch.zeros(2, 48))
    with pytest.raises(UsageError, match="elem="):
        mx_quantize(torch.zeros(32), elem="e3m4")
    with pytest.raises(UsageError, match="scale_mode="):
        mx_quantize(torch.zeros(32), scale_mode="ceil")


# ---- sweeps: every binade, max_elem * 2^k and +-1 ulp ----------------------------------------

def _amax_sweep() -> torch.Tensor:
    """fp32 amax values: every binade 2^-149 .. 2^127 times {1, 1.5, next below 2}."""
    ks = torch.arange(-149, 128, dtype=torch.float64)
    base = torch.cat([torch.exp2(ks), 1.5 * torch.exp2(ks), (2 - 2.0 ** -23) * torch.exp2(ks)])
    return formats.round_to(base, "fp32")


def _max_elem_sweep(f) -> torch.Tensor:
    """max_elem * 2^k and its fp32 neighbours (+-1 ulp)."""
    ks = torch.arange(-150, 126, dtype=torch.float64)
    v = torch.tensor(f.max, dtype=torch.float64) * torch.exp2(ks)
    v32 = v.float()
    vals = torch.cat([v32, torch.nextafter(v32, torch.tensor(math.inf)),
                      torch.nextafter(v32, torch.tensor(0.0))]).double()
    return vals[(vals > 0) & torch.isfinite(vals)]


@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("mode", MODES)
def test_sweep_properties(elem, mode):
    f = formats.get(elem)
    amax = torch.cat([_amax_sweep(), _max_elem_sweep(f)])
    x = torch.zeros(len(amax), 32, dtype=torch.float64)
    x[:, 7] = -amax  # the block max, negative and not first
    x[:, 8] = amax * 0.3
    q = mx_quantize(x.float(), elem, scale_mode=mode)
    e = q.scale_exp[:, 0].to(torch.int64)
    s = torch.exp2(e.double())
    quot = amax / s
    # the element the block max became, and what saturation-free rounding would give
    assert torch.equal(q.codes[:, 7], -formats.round_to(quot, elem))
    # E8M0 code matches ml_dtypes' encoding of 2^e
    ml_code = torch.from_numpy(s.numpy().astype(ml_dtypes.float8_e8m0fnu).view(np.uint8).copy())
    assert torch.equal(q.scale_code[:, 0], ml_code)
    # needed: the smallest exponent at which amax / 2^e <= max_elem (no saturation)
    needed = torch.ceil(torch.log2(amax / f.max)).to(torch.int64)
    needed = torch.where(amax / torch.exp2(needed.double()) > f.max, needed + 1, needed)
    needed = torch.where(amax / torch.exp2(needed.double() - 1) <= f.max, needed - 1, needed)
    unclamped = (needed > -126) & (needed < 126)
    if mode == "floor":
        assert torch.equal(e, (torch.floor(torch.log2(amax)).to(torch.int64) - f.emax).clamp(
            -127, 127))
        # never more than one binade below what no-saturation needs, never above it
        assert ((e >= needed - 1) & (e <= needed))[unclamped].all()
        # the block max lands in [2^emax, 2^(emax+1)), inside [max_elem/2, 2 max_elem)
        lo, hi = 2.0 ** f.emax, 2.0 ** (f.emax + 1)
        assert ((quot >= lo) & (quot < hi))[e > -127].all()
        assert (lo >= f.max / 2) and (hi <= 2 * f.max)
    else:
        # rceil never saturates: the scale is at least the fp32 quotient, whose rounding allows
        # at most 2^-24 above max where it is an fp32 normal (an fp32-subnormal quotient, amax <
        # max_elem * 2^-126, has less precision: the 2^-127 clamp reaches that band anyway)
        q32 = formats.round_to(amax / f.max, "fp32")
        assert (q32 <= s).all()
        assert (quot <= f.max * (1 + 2.0 ** -24))[q32 >= 2.0 ** -126].all()
        # ... and is minimal: one binade smaller would saturate
        assert ((e == needed) | (e == needed - 1) & (quot > f.max * (1 - 2.0 ** -24)))[
            unclamped].all()


@pytest.mark.parametrize("elem", ELEMS)
def test_dim0_equals_transpose(elem):
    x = torch.randn(64, 3, 5, dtype=torch.float64) * torch.exp2(torch.randn(64, 3, 5) * 6)
    a = mx_quantize(x, elem, dim=0)
    b = mx_quantize(x.movedim(0, -1), elem, dim=-1)
    assert torch.equal(a.codes, b.codes.movedim(-1, 0))
    assert torch.equal(a.scale_code, b.scale_code.movedim(-1, 0))
    assert a.scale_code.shape == (2, 3, 5)
    assert torch.equal(mx_qdq(x, elem, dim=0), mx_qdq(x.movedim(0, -1), elem).movedim(-1, 0))


# ---- ml_dtypes as an oracle ------------------------------------------------------------------

def _all_values(elem) -> np.ndarray:
    """Every finite value of elem, from ml_dtypes' bit patterns."""
    codes = np.arange(2 ** BITS[elem], dtype=np.uint8)
    v = codes.view(ML[elem]).astype(np.float64)
    return v[np.isfinite(v)]


@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("k", [0, -127 + 15, 90])
def test_every_element_value_round_trips(elem, k):
    f = formats.get(elem)
    v = _all_values(elem)
    n = -(-len(v) // 31) * 31
    vals = np.resize(v, n).reshape(-1, 31)
    blocks = np.concatenate([np.full((len(vals), 1), f.max), vals], axis=1)  # amax = max_elem
    x = torch.from_numpy(blocks) * 2.0 ** k
    q = mx_quantize(x, elem)
    # floor(log2 max_elem) = emax: exponent exactly k, every value comes back unchanged
    assert q.scale_exp.eq(k).all()
    assert torch.equal(q.codes, torch.from_numpy(blocks))
    assert torch.equal(mx_dequantize(q), x)


@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("mode", MODES)
def test_codes_match_ml_dtypes_cast(elem, mode):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(256, 64, generator=g) *
         torch.exp2(torch.randint(-60, 60, (256, 1), generator=g).float())).float()
    q = mx_quantize(x, elem, scale_mode=mode)
    f = formats.get(elem)
    s = torch.exp2(q.scale_exp.double()).repeat_interleave(32, dim=-1)
    # x / 2^e is exact in fp32 here, so ml_dtypes' fp32 -> elem cast rounds once; clamp first
    # (ml_dtypes' e4m3/e5m2 overflow to NaN/inf)
    scaled = (x.double() / s).clamp(-f.max, f.max).float().numpy()
    oracle = scaled.astype(ML[elem]).astype(np.float64)
    assert np.array_equal(q.codes.numpy(), oracle)


# ---- exactness of the fake-quant in x's dtype ------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("elem", ELEMS)
def test_qdq_exact_in_input_dtype(dtype, elem):
    """The module docstring's claim: code * 2^e is a value of x's dtype (nothing rounds), also
    at the 2^-127 scale with subnormal elements."""
    g = torch.Generator().manual_seed(2)
    fi = torch.finfo(dtype)
    lo = math.log2(fi.smallest_normal) - 12
    x = (torch.randn(512, 32, generator=g, dtype=torch.float64) *
         torch.exp2(torch.empty(512, 1, dtype=torch.float64).uniform_(lo, math.log2(fi.max) - 1,
                                                                        generator=g)))
    x = x.clamp(-fi.max, fi.max).to(dtype)  # finite inputs (NaN blocks are tested elsewhere)
    for mode in MODES:
        exact = mx_dequantize(mx_quantize(x, elem, scale_mode=mode))
        out = mx_qdq(x, elem, scale_mode=mode)
        assert out.dtype == dtype
        fin = torch.isfinite(out)
        assert torch.equal(out.double()[fin], exact[fin])
        # overflow only in the documented rceil corner: beyond the dtype's max
        assert (exact[~fin].abs() > fi.max).all()


def test_rceil_overflow_corner():
    x = block(torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)
    # 0x1.fep127 / 448 -> rounded up to 2^120; 0x1.fep127 / 2^120 = 255 -> e4m3 256 -> 2^128:
    # beyond bf16's max, inf (as an fp32 dequantization in hardware)
    assert mx_dequantize(mx_quantize(x, "e4m3", scale_mode="rceil"))[0].item() == 2.0 ** 128
    assert mx_qdq(x, "e4m3", scale_mode="rceil")[0].item() == math.inf
    assert mx_qdq(x, "e4m3", scale_mode="floor")[0].item() == 1.75 * 2.0 ** 127  # saturated


# ---- planted faults and benign variants ------------------------------------------------------

def _sqnr(out, x):
    return float(nc.error_stats(out.double(), x.double(), fmt="fp64").sqnr_db)


def check(x, cand: mx.MXQuantized, elem, mode="floor") -> list[str]:
    """The checker: bit-exact codes and scale codes, and an SQNR floor 0.1 dB below the
    reference's (a correct quantizer has the reference's error exactly)."""
    ref = mx_quantize(x, elem, scale_mode=mode)
    problems = []
    if not torch.equal(cand.scale_code, ref.scale_code):
        problems.append("scale codes differ")
    if not torch.equal(torch.nan_to_num(cand.codes, 99.0), torch.nan_to_num(ref.codes, 99.0)):
        problems.append("codes differ")
    fin = torch.isfinite(x)
    if not (_sqnr(mx_dequantize(cand)[fin], x[fin]) >= _sqnr(mx_dequantize(ref)[fin], x[fin])
            - 0.1):
        problems.append("SQNR below the floor")
    return problems


def _quantize_variant(x, elem, *, exp_shift=0, rounding="rne", zero_nan=False, frexp=False):
    """mx_quantize rewritten with one knob per fault (floor mode)."""
    f = formats.get(elem)
    x64 = x.double()
    xb = x64.reshape(*x64.shape[:-1], -1, 32)
    amax = xb.abs().amax(-1)
    if frexp:  # benign: floor(log2) from torch.frexp instead of the bits
        e = torch.frexp(amax)[1].to(torch.int64) - 1 - f.emax
        e = torch.where(amax == 0, -127, e)
    elif zero_nan:  # fault: log2(0) = -inf, scale 2^-inf = 0, 0/0 = NaN
        e = torch.floor(torch.log2(amax)) - f.emax
    else:
        e = torch.floor(torch.log2(amax)).to(torch.int64) - f.emax
    e = e + exp_shift  # fault: one binade low
    if not zero_nan:
        e = e.clamp(-127, 127)
    s = torch.exp2(e.double())
    codes = formats.round_to(xb / s[..., None], elem, rounding)
    ecode = torch.where(torch.isfinite(e), e, 0).to(torch.int32)
    if zero_nan:
        codes = torch.where(s[..., None] == 0, math.nan, codes)
        ecode = ecode.clamp(-127, 127)
    return mx.MXQuantized(codes.reshape(x64.shape), ecode,
                          (ecode + 127).to(torch.uint8), elem, 32, x64.dim() - 1)


@pytest.fixture(scope="module")
def xs():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 128, generator=g, dtype=torch.float64)
    x[::4, 32:64] = 0.0  # zero blocks
    x[:, ::64] *= 300.0  # outliers
    return x.float().double()


@pytest.mark.parametrize("elem", ELEMS)
def test_benign_frexp_exponent_is_bit_exact(xs, elem):
    assert check(xs, _quantize_variant(xs, elem, frexp=True), elem) == []


@pytest.mark.parametrize("fault", ["binade_low", "rz", "zero_nan"])
@pytest.mark.parametrize("elem", ["e4m3", "e2m1"])
def test_planted_faults_differ_and_are_caught(xs, fault, elem):
    kw = {"binade_low": {"exp_shift": -1}, "rz": {"rounding": "rz"},
          "zero_nan": {"zero_nan": True}}[fault]
    cand = _quantize_variant(xs, elem, **kw)
    ref = mx_quantize(xs, elem)
    assert not torch.equal(torch.nan_to_num(mx_dequantize(cand), 99.0),
                           torch.nan_to_num(mx_dequantize(ref), 99.0))
    problems = check(xs, cand, elem)
    assert problems, fault
    if fault == "zero_nan":
        assert mx_dequantize(cand).isnan().any()


def _faulty_kernel(fault):
    def fn(x, elem="e4m3", block=32, scale_mode="floor"):
        kw = {"binade_low": {"exp_shift": -1}, "rz": {"rounding": "rz"},
              "zero_nan": {"zero_nan": True}, "benign": {"frexp": True}}[fault]
        if scale_mode != "floor":
            return mx_qdq(x, elem, block, scale_mode)
        return mx_dequantize(_quantize_variant(x, elem, **kw)).to(x.dtype)
    fn.__name__ = f"planted_{fault}"
    return fn


@pytest.mark.parametrize("fault", ["binade_low", "rz", "zero_nan", "benign"])
def test_verify_catches_planted_faults(fault):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = nc.verify("mx_qdq", _faulty_kernel(fault), device="cpu")
    assert v.passed == (fault == "benign"), [r.reason for r in v.failures][:3]
    if fault == "zero_nan":
        assert any("non-finite" in r.reason for r in v.failures)


def test_torch_kernel_passes_bit_exact():
    from numcheck.catalog import kernels
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = nc.verify("mx_qdq", kernels("mx_qdq")["torch"], device="cpu")
    assert v.passed, [r.reason for r in v.failures][:3]
    ran = [r for r in v.records if r.status == "passed"]
    assert ran and all(r.kernel_stats.max_ulp == 0 for r in ran)
    skipped = [r for r in v.records if r.status == "skipped"]
    assert skipped and all("no conversion" in r.reason for r in skipped)


# ---- grid classes added for issue 12 --------------------------------------------------------------

def test_grid_blocks_under_tiny_amax_clamp_the_scale_and_the_torch_kernel_is_exact():
    """The blocks_tiny / blocks_huge rows: each has an all-zero block, each tiny e4m3/e5m2 one
    a block whose shared exponent floor(log2 amax) - emax_elem lies below E8M0's -127 (the
    clamp); the
    torch kernel (e4m3/e5m2) matches the exact quantizer bit for bit on all of them."""
    from numcheck.cases import inputs
    from numcheck.catalog import get_op
    from numcheck.ops.qdq import torch_mx_qdq
    spec = get_op("mx_qdq")
    cases = [c for c in spec.grid("quick") if c.dist.startswith("blocks_")]
    assert {c.dist for c in cases} == {"blocks_tiny", "blocks_huge"}
    for case in cases:
        tensors, kw = spec.make_inputs(case)
        x = inputs.cast(*tensors["x"])[0]
        q = mx_quantize(x, kw["elem"], kw["block"], kw["scale_mode"])
        blocks = x.double().reshape(-1, kw["block"])
        assert bool((blocks == 0).all(-1).any()), case.id
        assert int(q.scale_exp.min()) == -127  # the zero blocks' scale
        emax = math.frexp(formats.get(kw["elem"]).max)[1] - 1
        if case.dist == "blocks_tiny" and emax >= 8:  # e4m3, e5m2 (e2m1's emax is 2)
            amax = blocks.abs().amax(-1)
            unclamped = formats.floor_log2(amax[amax > 0]) - emax
            assert bool((unclamped < -127).any()), case.id
        if kw["elem"] in ("e4m3", "e5m2"):
            assert torch.equal(torch_mx_qdq(x, **kw), mx_qdq(x, **kw)), case.id
