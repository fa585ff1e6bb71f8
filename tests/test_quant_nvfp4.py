"""NVFP4 reference quantizer (numcheck/quant/nvfp4.py): hand-checked vectors, the scale flush,
oracles, planted faults.

Expected numbers are worked out by hand beside each assert (DESIGN rule 10: tensor encode scale
2688 / amax, stored decode scale amax / 2688 (1 / S_enc where S_enc clamps), block scale
e4m3(block_amax / 6 * S_enc), elements e2m1(x / (block_scale * decode))). ml_dtypes appears only
here, as an oracle.
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
from numcheck.quant import nvfp4 as nv
from numcheck.quant.nvfp4 import nvfp4_dequantize, nvfp4_qdq, nvfp4_quantize

E2M1_VALUES = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)


pytestmark = pytest.mark.usefixtures("one_thread")


def blocks(*rows):
    """A (1, 16 * len(rows)) float64 tensor, each row's values first in its block, zeros after."""
    x = torch.zeros(1, 16 * len(rows), dtype=torch.float64)
    for i, vals in enumerate(rows):
        x[0, 16 * i:16 * i + len(vals)] = torch.tensor(vals, dtype=torch.float64)
    return x


# ---- hand-checked vectors --------------------------------------------------------------------

def test_hand_vector_unit_tensor_scale():
    t = 2.0 ** -10  # half of e4m3's smallest subnormal 2^-9
    x = blocks([2688.0, 1344.0, 1120.0, -224.0, 100.0, 150.0],
               [6.0, 5.0, 0.75, -0.25],
               [0.003, -0.001],
               [6 * t],
               [6 * t * 1.01])
    q = nvfp4_quantize(x)
    # amax 2688: S_enc = 2688/2688 = 1, stored decode scale 1.
    assert q.tensor_scale.item() == 1.0
    # block scales: 2688/6 = 448; 6/6 = 1; 0.003/6 = 0.0005 < 2^-10 -> flush to 0;
    # exactly 2^-10 -> tie between 0 and 2^-9 -> even (0): flush; 1.01 * 2^-10 -> 2^-9.
    assert q.block_scale.tolist() == [[448.0, 1.0, 0.0, 0.0, 2.0 ** -9]]
    c = q.codes[0]
    # block 0 / 448: 6, 3, 2.5 -> tie 2 (mantissa 0), -0.5, 0.223 -> 0, 0.335 -> 0.5
    assert c[:6].tolist() == [6.0, 3.0, 2.0, -0.5, 0.0, 0.5]
    # block 1 / 1: 6, 5 -> tie 4, 0.75 -> tie 1, -0.25 -> tie -0 (0 is even)
    assert c[16:20].tolist() == [6.0, 4.0, 1.0, -0.0]
    assert math.copysign(1.0, c[19].item()) == -1.0  # the sign of a zero is kept
    # flushed blocks: codes 0, dequantized 0 (never x / 0)
    assert c[32:64].eq(0).all()
    out = nvfp4_dequantize(q)[0]
    assert out[:6].tolist() == [2688.0, 1344.0, 896.0, -224.0, 0.0, 224.0]
    assert out[32:64].eq(0).all() and not out.isnan().any()
    # block 4: 6 * 1.01 * 2^-10 / 2^-9 = 3.03 -> 3 -> 3 * 2^-9
    assert out[64].item() == 3 * 2.0 ** -9


def test_hand_vector_fp32_scales():
    x = blocks([1.0, 0.5, -0.3], [0.01])
    q = nvfp4_quantize(x)
    dec = float(np.float32(1.0 / 2688.0))  # the stored decode scale amax / 2688 in fp32
    assert q.tensor_scale.item() == dec
    # block 0: 1/6 * 2688 (S_enc = fp32(2688) exactly) = 448. block 1: 0.01/6*2688 = 4.48 ->
    # e4m3 step 0.5 in [4, 8) -> 4.5.
    assert q.block_scale.tolist() == [[448.0, 4.5]]
    # elements x / (448 dec): 1 -> 6.0000x -> 6; 0.5 -> 3; -0.3 -> -1.8 -> -2;
    # 0.01 / (4.5 dec) = 5.97 -> 6
    assert q.codes[0, :3].tolist() == [6.0, 3.0, -2.0] and q.codes[0, 16].item() == 6.0
    assert nvfp4_dequantize(q)[0, 0].item() == 6.0 * 448.0 * dec


@pytest.mark.parametrize("two_d", [False, True])
def test_all_zero_tensor_gives_zeros(two_d):
    q = nvfp4_quantize(torch.zeros(32, 32), two_d=two_d)
    assert q.tensor_scale.item() == 1.0  # amax = 0: S_enc = decode = 1
    out = nvfp4_qdq(torch.zeros(32, 32, dtype=torch.bfloat16), two_d=two_d)
    assert out.dtype == torch.bfloat16 and out.eq(0).all() and not out.isnan().any()


def test_nan_poisons_tensor():
    x = torch.randn(4, 32)
    x[1, 3] = math.nan
    assert nvfp4_qdq(x).isnan().all()


def test_usage_errors():
    with pytest.raises(UsageError, match=r"x.shape\[1\] = 40 .*multiple of 16.*pad .* to 48"):
        nvfp4_quantize(torch.zeros(2, 40))
    with pytest.raises(UsageError, match=r"x.shape\[0\] = 8 .*pad .* to 16"):
        nvfp4_quantize(torch.zeros(8, 32), two_d=True)
    with pytest.raises(UsageError, match="two_d=True"):
        nvfp4_quantize(torch.zeros(32), two_d=True)


# ---- the scale flush: one block 1e6x larger --------------------------------------------------

def test_outlier_block_flushes_the_others():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 256, generator=g, dtype=torch.float64)
    x[3, 32:48] *= 1e6
    x = x.float()
    q = nvfp4_quantize(x)
    # tensor amax ~3e6: the other blocks' scales are ~3 / 6 * 2688 / 3e6 ~ 4.5e-4 < 2^-10 = 9.8e-4
    flushed = q.block_scale == 0
    assert int(flushed.sum()) == 255 and not bool(flushed[3, 2])
    out = nvfp4_qdq(x)
    assert out[~flushed.repeat_interleave(16, dim=-1)].ne(0).any()
    assert out[flushed.repeat_interleave(16, dim=-1)].eq(0).all()
    s = nc.error_stats(out, x.double(), blocks=16)
    # whole-tensor SQNR stays that of e2m1 on the one loud block (~21 dB; 21.97 measured) ...
    assert 18.0 < s.sqnr_db < 26.0
    # ... while the worst 16-element block has lost everything: 0 dB (error = signal)
    assert s.min_block_sqnr_db == pytest.approx(0.0, abs=1e-9)
    assert s.n_blocks == 256
    # without the outlier every block keeps ~17 dB or more
    y = x.clone()
    y[3, 32:48] /= 1e6
    assert nc.error_stats(nvfp4_qdq(y), y.double(), blocks=16).min_block_sqnr_db > 12.0


# ---- layouts ---------------------------------------------------------------------------------

def test_dim0_equals_transpose():
    x = torch.randn(32, 48, dtype=torch.float64)
    a, b = nvfp4_quantize(x, dim=0), nvfp4_quantize(x.T.contiguous(), dim=-1)
    assert torch.equal(a.codes, b.codes.T) and torch.equal(a.block_scale, b.block_scale.T)
    assert torch.equal(nvfp4_qdq(x, dim=0), nvfp4_qdq(x.T.contiguous()).T)


def test_two_d_tiles_are_transpose_invariant():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 32, 48, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randn(2, 32, 1, generator=g) * 3)
    q = nvfp4_quantize(x, two_d=True)
    assert q.block_scale.shape == (2, 2, 3)
    qt = nvfp4_quantize(x.transpose(-1, -2).contiguous(), two_d=True)
    assert torch.equal(q.block_scale, qt.block_scale.transpose(-1, -2))
    assert torch.equal(nvfp4_qdq(x, two_d=True),
                       nvfp4_qdq(x.transpose(-1, -2).contiguous(), two_d=True).transpose(-1, -2))
    # each tile's scale is its own amax's: a tile scaled by 2 (exactly) gets twice the scale
    y = x.clone()
    y[0, :16, :16] /= 2
    qy = nvfp4_quantize(y, two_d=True)
    assert qy.block_scale[0, 0, 0] == q.block_scale[0, 0, 0] / 2 or q.block_scale[0, 0, 0] < 2 ** -5
    assert torch.equal(qy.block_scale[0, 1:], q.block_scale[0, 1:])


# ---- ml_dtypes as an oracle ------------------------------------------------------------------

def test_scales_and_codes_match_ml_dtypes():
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(64, 256, generator=g) * torch.exp2(
        torch.randint(-12, 12, (64, 1), generator=g).float())).float()
    q = nvfp4_quantize(x)
    amax = x.abs().amax().double()
    enc, dec = nv.tensor_scales(amax)
    assert dec.item() == float(np.float32(amax.item() / 2688.0))
    bamax = x.double().reshape(64, 16, 16).abs().amax(-1)
    want = (bamax * enc / 6).numpy().astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert np.array_equal(q.block_scale.numpy(), want)
    codes = q.codes.numpy()
    assert np.isin(codes, E2M1_VALUES).all()
    # ml_dtypes casts through fp32: it agrees except where fp32 rounding lands the quotient on an
    # e2m1 midpoint (double rounding; numcheck rounds once from float64)
    quot = (x.double().reshape(64, 16, 16) / (q.block_scale * dec)[..., None]).reshape(64, 256)
    oracle = quot.float().numpy().astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    near_mid = ((quot.abs()[..., None] - mids).abs() <= 2.0 ** -23 * mids).any(-1).numpy()
    differ = (codes != oracle) & np.isfinite(quot.numpy())  # flushed blocks: tested above
    assert np.isfinite(quot.numpy()).sum() > 8000
    assert (differ <= near_mid).all()  # every disagreement is at a double-rounded midpoint


# ---- planted faults and benign variants ------------------------------------------------------

def check(x, cand: nv.NVFP4Quantized) -> list[str]:
    """The checker: bit-exact codes, block and tensor scales, and an SQNR floor 0.1 dB below the
    exact quantizer's."""
    ref = nvfp4_quantize(x)
    problems = []
    for name in ("codes", "block_scale", "tensor_scale"):
        if not torch.equal(getattr(cand, name), getattr(ref, name)):
            problems.append(f"{name} differ")

    def sqnr(q):
        return nc.error_stats(nvfp4_dequantize(q), x.double(), fmt="fp64").sqnr_db
    if not sqnr(cand) >= sqnr(ref) - 0.1:
        problems.append("SQNR below the floor")
    return problems


def _inverse_confusion(x, two_d=False):
    """Fault: 448 * 6 / amax (the encode scale) stored as the decode scale."""
    q = nvfp4_quantize(x, two_d=two_d)
    enc, _ = nv.tensor_scales(x.double().abs().amax())
    return nv.NVFP4Quantized(q.codes, q.block_scale, enc, q.dim, q.two_d)


@pytest.fixture(scope="module")
def xs():
    g = torch.Generator().manual_seed(6)
    return torch.randn(32, 128, generator=g).float()


def test_planted_inverse_confusion_is_caught(xs):
    cand = _inverse_confusion(xs)
    assert not torch.equal(nvfp4_dequantize(cand), nvfp4_dequantize(nvfp4_quantize(xs)))
    assert "tensor_scale differ" in check(xs, cand) and "SQNR below the floor" in check(xs, cand)

    def planted_inverse(x, two_d=False):
        return nvfp4_dequantize(_inverse_confusion(x, two_d)).to(x.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = nc.verify("nvfp4_qdq", planted_inverse, device="cpu")
    assert not v.passed and len(v.failures) == v.executed


def test_planted_zero_tensor_nan_is_caught():
    """Fault: S_enc = 2688 / amax without the amax = 0 rule: inf, then 0 * inf = NaN scales."""
    def planted(x):
        amax = x.abs().amax()
        enc = 2688.0 / amax
        bs = formats.round_to(x.reshape(-1, 16).abs().amax(-1) * enc / 6, "e4m3")
        return (x.reshape(-1, 16) / bs[:, None]).reshape(x.shape)
    x = torch.zeros(4, 32, dtype=torch.float64)
    assert planted(x).isnan().all()
    assert nc.error_stats(planted(x), nvfp4_qdq(x)).nonfinite_mismatch == x.numel()


def test_benign_dequant_association_is_bit_exact(xs):
    q = nvfp4_quantize(xs)
    s = q.block_scale.repeat_interleave(16, dim=-1)
    a = (q.codes * s) * q.tensor_scale  # exact in float64: 2 + 4 + 24 bits
    assert torch.equal(a, nvfp4_dequantize(q))
    assert check(xs, q) == []


def test_torch_kernel_passes_sqnr_gap():
    """The built-in torch kernel (Transformer Engine's fp32 order) is not bit-exact with the
    exact quantizer but matches its error: it passes the op's k = 1.25 SQNR-gap policy."""
    from numcheck.catalog import kernels
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = nc.verify("nvfp4_qdq", kernels("nvfp4_qdq")["torch"], device="cpu")
    assert v.passed, [r.reason for r in v.failures][:3]
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    k = kernels("nvfp4_qdq")["torch"].fn(x)
    diff = (k != nvfp4_qdq(x)).double().mean().item()
    assert 0 < diff < 0.01  # near-midpoint elements only (measured 0.1-0.3 %)


# ---- grid classes added for issue 12 --------------------------------------------------------------

def _blocks_cases():
    from numcheck.catalog import get_op
    spec = get_op("nvfp4_qdq")
    return spec, [c for c in spec.grid("quick") if c.dist.startswith("blocks_")]


def test_grid_blocks_under_tiny_amax_clamp_the_encode_scale():
    """The blocks_tiny rows: 2688 / amax overflows fp32 (S_enc clamps to the fp32 max, DESIGN
    rule 10) and amax / 2688 is an fp32 subnormal; every row, tiny or huge, 1-D or 16 x 16, has
    all-zero blocks beside live ones."""
    from numcheck.cases import inputs
    spec, cases = _blocks_cases()
    assert {(c.dist, c.param("two_d")) for c in cases} == {
        (d, t) for d in ("blocks_tiny", "blocks_huge") for t in (False, True)}
    fp32 = formats.get("fp32")
    for case in cases:
        tensors, kw = spec.make_inputs(case)
        x = inputs.cast(*tensors["x"])[1]
        q = nvfp4_quantize(x, two_d=kw["two_d"])
        assert bool((q.block_scale == 0).any()) and bool((q.block_scale > 0).any()), case.id
        amax = float(x.abs().max())
        if case.dist == "blocks_tiny":
            assert nv.TENSOR_RANGE / amax > fp32.max, case.id
            assert float(q.tensor_scale) < fp32.min_normal, case.id


def test_finding_tiny_amax_decode_scale_follows_the_clamped_encode_scale():
    """Finding (issue 12, fixed): below amax = 2688 / fp32 max (~2^-116.6) rule 10 clamps S_enc,
    and the reference now decodes with fp32(1 / S_enc) = 2^-128 there, the inverse of the encode
    it used: the blocks_tiny rows keep ~21 dB, as the same tensor at amax ~1 does. Decoding with
    amax / 2688 instead (the old reference) makes x / (block_scale * tensor_scale) ~2^3.4 too
    large: it saturates, ~1 dB. The torch kernel (Transformer Engine's arithmetic: elements
    scaled with 1 / S_enc, decoded with amax / 2688) gives ~0.8 dB, reported known as
    te-nvfp4-tiny-amax-decode."""
    from numcheck.cases import inputs
    from numcheck.catalog import kernels
    spec, cases = _blocks_cases()
    case = next(c for c in cases if c.dist == "blocks_tiny" and not c.param("two_d"))
    x = inputs.cast(*spec.make_inputs(case)[0]["x"])[1]

    def sqnr(y):
        return 10 * math.log10(float((x ** 2).sum() / ((x - y) ** 2).sum()))
    unit = 2.0 ** -(math.frexp(float(x.abs().max()))[1] - 1)
    assert sqnr(nvfp4_qdq(x * unit) / unit) > 18
    assert sqnr(nvfp4_qdq(x)) > 18
    enc, dec = nv.tensor_scales(x.abs().max())
    assert enc.item() == formats.get("fp32").max and dec.item() == 2.0 ** -128
    t = x.reshape(*x.shape[:-1], -1, 16)
    bs = formats.round_to(t.abs().amax(-1, keepdim=True) * enc / 6, "e4m3", "rne", saturate=True)
    old = bs * float(np.float32(x.abs().max().item() / 2688.0))  # rule 10's amax / 2688 decode
    codes = formats.round_to(t / torch.where(old == 0, 1.0, old), "e2m1", "rne", saturate=True)
    assert sqnr((codes * old).reshape(x.shape)) < 4
    torch_kernel = kernels("nvfp4_qdq")["torch"]
    assert sqnr(torch_kernel.fn(x.float()).double()) < 2
    assert torch_kernel.known(case, "cpu", "out") == "te-nvfp4-tiny-amax-decode"


# ---- tiny global amax: 2^-80 .. 2^-120 (the amax param of the grid) ----------------------------

TINY_AMAX = (-80, -88, -96, -104, -112, -116, -117, -118, -120)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_keeps_its_sqnr_at_tiny_amax(dtype):
    """The same N(0,1) tensor rescaled to amax 2^k: the reference's SQNR stays that of amax 1
    (20.4 dB measured) on both sides of the clamp at 2^-116.6; the stored decode scale is
    amax / 2688 above it (rule 10, unchanged) and 1 / S_enc = 2^-128 below."""
    g = torch.Generator().manual_seed(8)
    base = torch.randn(16, 1024, generator=g, dtype=torch.float64)
    base = base / base.abs().max()

    def sqnr(k):
        x = (base * 2.0 ** k).to(dtype)
        return nc.error_stats(nvfp4_qdq(x), x.double(), fmt="fp64").sqnr_db
    unit = sqnr(0)
    assert unit > 19.5
    for k in TINY_AMAX:
        assert sqnr(k) == pytest.approx(unit, abs=0.1), k
        dec = nvfp4_quantize((base * 2.0 ** k).to(dtype)).tensor_scale.item()
        assert dec == (float(np.float32(2.0 ** k / 2688.0)) if k >= -116 else 2.0 ** -128), k


def _tiny(case) -> bool:
    """A quick-grid case whose tensor amax is below 2^-88 (the amax param, or blocks_tiny)."""
    k = case.param("amax")
    return case.dist == "blocks_tiny" or (k is not None and int(k.split("^")[1]) < -88)


def test_grid_covers_tiny_amax():
    from numcheck.cases import inputs
    from numcheck.catalog import get_op
    spec = get_op("nvfp4_qdq")
    quick = [c for c in spec.grid("quick") if c.param("amax")]
    full = [c for c in spec.grid("full") if c.param("amax")]
    assert {c.param("amax") for c in full} == {f"amax=2^{k}" for k in TINY_AMAX}
    assert {c.param("amax") for c in quick} >= {"amax=2^-116", "amax=2^-117", "amax=2^-120"}
    for case in quick:  # the drawn inputs have exactly the amax the case says
        x = inputs.cast(*spec.make_inputs(case)[0]["x"])[1]
        assert float(x.abs().max()) == 2.0 ** int(case.param("amax").split("^")[1]), case.id


def test_planted_flush_of_tiny_tensors_is_caught():
    """Fault: a kernel that returns zeros for a whole tensor whose amax is below 2^-88. It
    passed while no case lay between 2^-89 and 2^-116 and the reference decoded blocks_tiny
    (~2^-121) with amax / 2688 (~1 dB: zeros were within 1.25x of its error); with the old
    reference it would still pass the 2^-120 and fp32 blocks_tiny cases (measured). Now every
    quick case below 2^-88 fails, and the reference-faithful kernel passes them all."""
    def faithful(x, two_d=False):
        return nvfp4_qdq(x, two_d=two_d)

    def flush_tiny(x, two_d=False):
        out = nvfp4_qdq(x, two_d=two_d)
        return torch.zeros_like(out) if float(x.abs().amax()) < 2.0 ** -88 else out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = nc.verify("nvfp4_qdq", flush_tiny, device="cpu")
        good = nc.verify("nvfp4_qdq", faithful, device="cpu")
    from numcheck.catalog import get_op
    want = {c.id for c in get_op("nvfp4_qdq").grid("quick") if _tiny(c)}
    assert len(want) >= 5
    assert not bad.passed and {r.case_id for r in bad.failures} == want
    assert good.passed and not good.failures, [r.reason for r in good.failures][:3]
