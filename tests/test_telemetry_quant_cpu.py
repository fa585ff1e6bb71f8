"""numcheck.telemetry._quant_numba.quant_fields (one numba pass) against fields.quant_stats (the
float64 reference quantizers plus torch reductions): every recipe quantizer's format, every
input dtype, shapes that are not whole blocks, adversarial values."""
from __future__ import annotations

import math
import zlib

import pytest
import torch

from numcheck.quant.fp8 import FP8Format
from numcheck.quant.intq import IntFormat
from numcheck.quant.mx import MXFormat
from numcheck.quant.nvfp4 import NVFP4Format
from numcheck.quant.recipe import RECIPES, ROLES
from numcheck.telemetry import _quant_numba as qc
from numcheck.telemetry import fields

pytest.importorskip("numba")

U = 2.0 ** -53  # float64 unit roundoff: the float sums differ from the reference only by order

# Integers (counts) and the scale extremes: the same bits as the reference.
EXACT = ("q_n", "q_underflow", "q_saturated", "blk_n", "blk_scaled_n", "blk_log2_min",
         "blk_log2_max", "blk_clip", "blk_scale_sat", "blk_nan")


def _recipe_formats():
    seen = {}
    for r in RECIPES.values():
        for role in ROLES:
            q = getattr(r, role)
            if q is not None:
                pow2 = "_pow2" if getattr(q.format, "pow2_scale", False) else ""
                seen.setdefault(q.format.name + pow2, q.format)
    return seen


# The formats the recipes reach, and the others of those families a user recipe may build.
FORMATS = {**_recipe_formats(),
           "mx_e5m2_floor": MXFormat("e5m2"), "mx_e3m2_rceil": MXFormat("e3m2", 32, "rceil"),
           "mx_e2m1_rceil": MXFormat("e2m1", 32, "rceil"), "mx_e4m3_k16": MXFormat("e4m3", 16),
           "fp8_e5m2_row": FP8Format("e5m2", "row"),
           "fp8_e5m2_block128x128_pow2": FP8Format("e5m2", "block128x128", True),
           "fp8_e4m3_tensor_pow2": FP8Format("e4m3", "tensor", True),
           "int4_g128": IntFormat(4, 128), "int4_g32": IntFormat(4, 32)}

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
DISTS = ("normal", "student_t", "outliers", "zero_blocks", "near_overflow", "tiny", "ties",
         "nan_inf", "inf_only", "all_tiny")
SHAPES = ((3, 45), (130, 257), (77,), (2, 5, 40), (16, 32), (1, 1), (33, 128))


def _values(dist: str, shape, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)

    def randn(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64)

    def where(p):  # a random subset of about p of the elements
        return torch.rand(n, generator=g, dtype=torch.float64) < p

    x = randn(n)
    fi = torch.finfo(dtype)
    if dist == "student_t":  # df = 2: infinite variance
        x = x / torch.sqrt((randn(n) ** 2 + randn(n) ** 2) / 2)
    elif dist == "outliers":
        x[where(0.02)] *= 1e4
        x[int(torch.randint(n, (1,), generator=g))] = 3e6  # flushes NVFP4 blocks far below it
    elif dist == "zero_blocks":
        x = x.reshape(-1, shape[-1])
        x[:, :32] = 0
        x[::2] = 0
        x = x.flatten()
    elif dist == "near_overflow":  # top of the scaled binade (MX floor saturates) and the
        # dtype's own top (fp64: beyond fp32, so scales clamp and fp32 amaxes overflow)
        k = torch.randint(-3, 4, (n,), generator=g, dtype=torch.float64)
        x = torch.sign(x) * 2.0 ** k * (1.5 + 0.5 * torch.rand(n, generator=g,
                                                                dtype=torch.float64))
        top = 1e300 if dtype == torch.float64 else fi.max
        x[where(0.05)] = 0.75 * top
    elif dist == "tiny":  # the dtype's subnormals (fp64: below fp32's), some normal rows
        low = 1e-310 if dtype == torch.float64 else fi.smallest_normal
        x = x * low * torch.rand(n, generator=g, dtype=torch.float64)
        x[where(0.1)] *= 2.0 ** 40
        x[:min(n, 7)] = randn(min(n, 7))
    elif dist == "all_tiny":  # the whole tensor subnormal: for fp32/bf16/fp64, NVFP4's and
        # FP8's encode scales overflow fp32 and clamp to its max
        low = 1e-310 if dtype == torch.float64 else fi.smallest_normal
        x = x * low
    elif dist == "ties":  # exact binary fractions: midpoints of the low-precision grids
        k = torch.randint(0, 12, (n,), generator=g, dtype=torch.float64)
        x = torch.randint(-4096, 4096, (n,), generator=g, dtype=torch.float64) / 2.0 ** k
    elif dist == "nan_inf":
        x[where(0.01)] = math.nan
        x[where(0.01)] = math.inf
        x[where(0.01)] = -math.inf
    elif dist == "inf_only":
        x[where(0.02)] = -math.inf
    return x.reshape(shape).to(dtype)  # values beyond the dtype's range become inf


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _assert_matches(got: dict, ref: dict, where: str) -> None:
    assert set(got) == set(ref), where
    for k in EXACT:
        if k in ref:
            assert _same(got[k], ref[k]), f"{where}: {k} {got[k]!r} != {ref[k]!r}"
    n = ref["q_n"]  # terms summed (the padding adds exact zeros)
    for k in ("q_sig_sq", "q_err_sq"):
        # sums of non-negative terms in two orders: each within (n - 1) u of the exact sum
        a, b = got[k], ref[k]
        assert _same(a, b) or abs(a - b) <= 2 * n * U * abs(b), f"{where}: {k} {a!r} {b!r}"
    if "blk_n" not in ref:
        return
    m = ref["blk_scaled_n"]
    top = max([abs(ref[k]) for k in ("blk_log2_min", "blk_log2_max") if m] + [0.0])
    for k, mag in (("blk_log2_sum", m * top), ("blk_log2_sumsq", m * top * top)):
        # order of summation ((m - 1) u each) and libm's log2 against torch's (1 ulp a term)
        a, b = got[k], ref[k]
        assert _same(a, b) or abs(a - b) <= (2 * m + 4) * U * mag, f"{where}: {k} {a!r} {b!r}"
    a, b = got["blk_sqnr_min_db"], ref["blk_sqnr_min_db"]
    # block sums of <= 16384 terms in another order (rel. 4 * 16384 u on the ratio, x 10/ln 10
    # dB) and libm's log10 against torch's
    assert _same(a, b) or abs(a - b) <= 1e-10 + 1e-13 * abs(b), f"{where}: sqnr {a!r} {b!r}"


def _check(t: torch.Tensor, fmt, where: str) -> dict:
    ref = {k: v.item() for k, v in fields.quant_stats(t, _Q(fmt)).items()}
    got = qc.quant_fields(t, fmt)
    assert got is not None, where
    _assert_matches(got, ref, where)
    return got


class _Q:
    """The one thing quant_stats reads of a Quantizer: its format."""

    def __init__(self, fmt):
        self.format = fmt


@pytest.mark.parametrize("name", list(FORMATS))
def test_matches_the_reference(name, one_thread):
    fmt = FORMATS[name]
    i = 0
    for dtype in DTYPES:
        for dist in DISTS:
            shape = SHAPES[i % len(SHAPES)]
            i += 1
            t = _values(dist, shape, dtype, seed=zlib.crc32(f"{name} {dtype} {dist}".encode()))
            _check(t, fmt, f"{name} {dtype} {dist} {shape}")


@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "nvfp4", "fp8_block", "fp8_row", "int8"])
def test_every_role_of_a_recipe_on_every_shape(name, one_thread):
    r = RECIPES[name]
    for role in ROLES:
        q = getattr(r, role)
        if q is None:
            continue
        for k, shape in enumerate(SHAPES):
            t = _values("student_t", shape, torch.float32, seed=k)
            _check(t, q.format, f"{name}.{role} {shape}")


def test_nvfp4_flushes_underflowing_block_scales():
    """DESIGN rule 10: a block ~2^18 or more below the tensor's amax has an e4m3 block scale
    below half of e4m3's smallest subnormal: it flushes to zeros (scale 0, at the range end)."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    x[0, 0] = 1e8
    for fmt in (NVFP4Format(), NVFP4Format(two_d=True)):
        got = _check(x, fmt, fmt.name)
        assert got["blk_scale_sat"] > 0 and got["q_underflow"] > 0
        assert got["blk_scaled_n"] == got["blk_n"] - got["blk_scale_sat"]


def test_fp8_product_is_rounded_to_fp32_before_the_cast():
    """tests/test_quant_fp8.py's pinned element: fp32(0.2373046875 * scale) is the e5m2
    midpoint 4608 (ties to 4096); the exact product would round to 5120."""
    x = torch.tensor([2.953125, 0.2373046875], dtype=torch.bfloat16)
    got = _check(x, FP8Format("e5m2"), "fp8 product")
    scale = 19418.07421875  # fp32(57344 / 2.953125)
    q = [float(torch.tensor(c / scale, dtype=torch.float32)) for c in (57344.0, 4096.0)]
    want = (q[0] - 2.953125) ** 2 + (q[1] - 0.2373046875) ** 2
    assert got["q_err_sq"] == pytest.approx(want, rel=4 * U)  # two terms: two roundings


def test_scales_at_their_range_ends():
    """MX exponents clamp to [-127, 127] (fp64 values beyond fp32's range and below it); FP8
    block scales clamp to the fp32 max (block amax below 448 / fp32 max); INT8's scale of an
    fp32-subnormal amax underflows to the smallest fp32 subnormal, or rounds so far down that
    codes clamp at 127."""
    x = torch.randn(2, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x[0, :32] *= 1e300
    x[0, 32:64] *= 1e-300
    got = _check(x, MXFormat("e4m3"), "mx clamp")
    assert got["blk_scale_sat"] >= 2 and got["blk_log2_max"] == 127
    y = torch.randn(2, 256, generator=torch.Generator().manual_seed(3))
    y[1, 128:] *= 1e-37
    got = _check(y, FP8Format("e4m3", "block128"), "fp8 clamp")
    assert got["blk_scale_sat"] == 1
    z = torch.full((3, 8), 1.4e-45)
    z[1] = 189 * 2.0 ** -149  # amax / 127 rounds down to 2^-149: x / scale = 189 clamps to 127
    got = _check(z, IntFormat(8), "int8 tiny")
    assert got["q_underflow"] == 0 and got["q_saturated"] == 8


def test_all_zero_and_non_finite_tensors():
    for fmt in FORMATS.values():
        for t in (torch.zeros(5, 70), torch.full((2, 33), math.nan),
                  torch.full((2, 33), -math.inf), torch.tensor([0.0, math.inf, 1.0])):
            _check(t, fmt, f"{fmt.name} {t.flatten()[:2].tolist()}")


def test_empty_scalar_unsupported_and_other_devices():
    fmt = MXFormat("e4m3")
    assert qc.quant_fields(torch.zeros(0, 32), fmt) == {} == \
        fields.quant_stats(torch.zeros(0, 32), _Q(fmt))
    assert qc.quant_fields(torch.tensor(1.0), fmt) == {}

    class Other(MXFormat):  # a subclass may change any rule: the reference decides
        pass

    x = torch.randn(4, 32)
    assert qc.quant_fields(x, Other("e4m3")) is None
    assert qc.quant_fields(x, object()) is None
    assert qc.quant_fields(x.to(torch.float8_e4m3fn), fmt) is None  # a dtype it does not read
    assert qc.quant_fields(torch.randn(4, 32, device="meta"), fmt) is None
    # a non-contiguous view and a Parameter read like the tensor they are
    p = torch.nn.Parameter(torch.randn(40, 64))
    _check(p, fmt, "parameter")
    _check(p.detach().t(), fmt, "transposed")


def test_a_loop_that_fails_falls_back(monkeypatch):
    """numba present but failing (a CPU or version it cannot compile for): warned once, None
    (the caller runs quant_stats), and None from then on without another warning."""
    monkeypatch.setattr(qc, "_STATE", {"broken": None})

    def broken(*args):
        raise RuntimeError("no LLVM target")

    monkeypatch.setattr(qc, "_mx", broken)
    monkeypatch.setattr(qc, "_PLANS", {})  # plans hold the loop they run
    x = torch.randn(4, 32)
    with pytest.warns(RuntimeWarning, match="compiled loop failed"):
        assert qc.quant_fields(x, MXFormat("e4m3")) is None
    assert not qc.available()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert qc.quant_fields(x, NVFP4Format()) is None


def test_without_numba(monkeypatch):
    monkeypatch.setattr(qc, "_STATE", {"broken": None})
    monkeypatch.setattr(qc, "numba", None)
    with pytest.warns(RuntimeWarning, match="numba is missing"):
        assert qc.quant_fields(torch.randn(4, 32), MXFormat("e4m3")) is None


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_soak_many_seeds(seed, one_thread):
    """Every format x dtype x distribution again on other seeds and bigger ragged shapes
    (~3 s a seed): rare ties and near-boundary scales the quick grid may not reach."""
    shapes = ((64, 96), (3, 45), (130, 257), (256, 130), (7, 33, 16))
    i = 0
    for name, fmt in FORMATS.items():
        for dtype in DTYPES:
            for dist in DISTS:
                shape = shapes[(seed + i) % len(shapes)]
                t = _values(dist, shape, dtype, seed=1_000_003 * (seed + 1) + i)
                i += 1
                _check(t, fmt, f"{name} {dtype} {dist} {shape} seed {seed} #{i - 1}")


def test_a_negative_bit_view_is_left_to_the_reference():
    """A tensor with the negative bit set (torch._neg_view) has no numpy view: None (the
    caller runs quant_stats), never an exception out of quant_fields."""
    x = torch._neg_view(torch.randn(4, 32, generator=torch.Generator().manual_seed(4)))
    assert x.is_neg()
    assert qc.quant_fields(x, MXFormat("e4m3")) is None
    assert fields.quant_stats(x, _Q(MXFormat("e4m3")))["q_n"].item() == 128
