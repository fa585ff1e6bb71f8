"""nc.fingerprint on kernels of our own whose accumulation is known by construction.

Each kernel below is a matmul written from its definition: products of bf16 inputs (exact in
fp32), summed over K in a stated order with a stated rounding. The fingerprint must name what
the kernel was built to do. The trees and roundings are written here, independently of
numcheck.forensics.kernel_fingerprint' own hypotheses.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import numcheck as nc
from numcheck.errors import UsageError
from numcheck.forensics.kernel_fingerprint import Fingerprint, fingerprint


def _rne(x, y):
    return x + y  # float32 tensors: one IEEE addition, round to nearest even


def _rz(x, y):
    """fp32 addition rounded toward zero: the RNE sum moved one step toward zero where the
    exact sum lies below it in magnitude (TwoSum gives the exact error in fp32)."""
    s = x + y
    bb = s - x
    err = (x - (s - bb)) + (y - bb)
    toward_zero = (err != 0) & (torch.sign(err) != torch.sign(s))
    return torch.where(toward_zero, torch.nextafter(s, torch.zeros_like(s)), s)


def _seq(xs, add):
    acc = xs[0]
    for x in xs[1:]:
        acc = add(acc, x)
    return acc


def _pair(xs, add):
    if len(xs) == 1:
        return xs[0]
    h = len(xs) // 2
    return add(_pair(xs[:h], add), _pair(xs[h:], add))


def _blocks(k):
    return lambda xs, add: _seq([_seq(xs[i:i + k], add) for i in range(0, len(xs), k)], add)


def _splits(s):
    return lambda xs, add: _blocks(-(-len(xs) // s))(xs, add)


def _pair_swapped(block):
    """A bf16 dot-product instruction that adds a pair's second product before its first
    (VDPBF16PS), one accumulator, K cut in blocks of ``block(K)`` whose sums add in order
    (a GEMM library's K blocking)."""
    def tree(xs, add):
        k = block(len(xs))
        sums = []
        for i in range(0, len(xs), k):
            part = xs[i:i + k]
            swapped = [x for q in range(0, len(part), 2) for x in part[q:q + 2][::-1]]
            sums.append(_seq(swapped, add))
        return _seq(sums, add)
    return tree


def _tiles(k, lanes, carry):
    """K tiles of k, each summed in ``lanes`` interleaved accumulators (element i into lane
    i mod lanes) that are then added in order; the tiles' sums added in order, or (carry) the
    running sum fed into lane 0 of the next tile."""
    def tree(xs, add):
        acc = None
        for i in range(0, len(xs), k):
            tile = xs[i:i + k]
            ls = [list(tile[q::lanes]) for q in range(lanes)]
            if carry and acc is not None:
                ls[0].insert(0, acc)
            part = _seq([_seq(lane, add) for lane in ls], add)
            acc = part if acc is None or carry else add(acc, part)
        return acc
    return tree


def _bf16_partials(k):
    """Partial sums of k products in fp32, each rounded to bf16, added into an fp32 total."""
    def tree(xs, add):
        parts = [_seq(xs[i:i + k], add).bfloat16().float() for i in range(0, len(xs), k)]
        return _seq(parts, add)
    return tree


def _kernel(tree, add=_rne):
    def matmul(a, b):
        prods = a.float()[:, :, None] * b.float()[None, :, :]  # (M, K, N), exact for bf16
        return tree(list(prods.unbind(1)), add).to(a.dtype)
    return matmul


def _batch_dependent(a, b):
    """Split-K in two halves when the batch has 16 rows or more, one sequential sum below."""
    return _kernel(_splits(2) if a.shape[0] >= 16 else _seq)(a, b)


def _random_order(a, b):
    perm = torch.randperm(a.shape[1])  # a new order on every call
    return _kernel(_seq)(a[:, perm], b[perm])


@pytest.mark.parametrize("tree,order", [(_seq, "sequential"), (_pair, "pairwise"),
                                        (_blocks(64), "blocked:64"), (_splits(4), "split:4"),
                                        (_blocks(16), "blocked:16")])
def test_summation_orders_told_apart(tree, order):
    fp = fingerprint("matmul", _kernel(tree), dtype="bf16", device="cpu")
    assert fp.order == order, fp.evidence["order"]
    assert (fp.acc_bits, fp.acc_rounding, fp.promote_every) == (23, "rne", None), fp
    assert fp.deterministic and fp.batch_invariant


@pytest.mark.parametrize("tree,order", [
    (_pair_swapped(lambda n: n), "sequential:permuted"),
    (_pair_swapped(lambda n: min(n, 256)), "blocked:128,256,256:permuted"),
    (_blocks(96), "blocked:96,96,96"),
    (_tiles(32, 2, False), "blocked:32/strided:2"),
    (_tiles(32, 2, True), "blocked:32/strided:2+carry"),
    (_tiles(16, 4, False), "blocked:16/strided:4")])
def test_gemm_library_orders(tree, order):
    """What CPU GEMMs were seen doing (docs/fingerprints.md): oneDNN's bf16 dot instruction
    with K blocked by K, tiles of interleaved lanes (a matrix unit's or a SIMD kernel's)."""
    fp = fingerprint("matmul", _kernel(tree), dtype="bf16", device="cpu")
    assert fp.order == order, fp.evidence["order"]
    assert (fp.acc_bits, fp.acc_rounding) == (23, "rne"), fp


def test_bf16_partial_sums_every_16():
    fp = fingerprint("matmul", _kernel(_bf16_partials(16)), dtype="bf16", device="cpu")
    assert (fp.acc_bits, fp.promote_every, fp.order) == (7, 16, "blocked:16"), fp
    assert fp.acc_rounding == "rne"


def test_truncating_accumulation():
    fp = fingerprint("matmul", _kernel(_seq, _rz), dtype="bf16", device="cpu")
    assert (fp.acc_bits, fp.acc_rounding, fp.order) == (23, "rz", "sequential"), fp


def _fp16_acc(x, y):
    """An fp16 accumulator: each partial sum rounded once to fp16 (RNE, inf beyond 65504) from
    its float64 sum, exact for the probes' operands."""
    return (x.double() + y.double()).half()


def _rz_via_fp64(x, y):
    """An fp32 accumulator that truncates each partial sum: the float64 sum with its 29 lowest
    fraction bits cleared (toward zero). Unlike _rz, an addend beyond float64's 53 bits below
    the other is lost in the float64 sum, as in an adder whose alignment window drops it."""
    s = (x.double() + y.double()).view(torch.int64) & -(1 << 29)
    return s.view(torch.float64).float()


@pytest.mark.parametrize("tree,order", [(_seq, "sequential"), (_pair, "pairwise")])
@pytest.mark.parametrize("add,bits,mode,dtype", [(_fp16_acc, 10, "rne", "bf16"),
                                                 (_fp16_acc, 10, "rne", "fp16"),
                                                 (_rz_via_fp64, 23, "rz", "bf16")])
def test_plain_loops_in_fp16_or_truncating_accumulators(tree, order, add, bits, mode, dtype):
    """The probes must fit the measured accumulator: an fp16 one overflows on B = 2^100 (from
    fp16 inputs, on the precision probe's 1.5 2^15 + 2^14 too), and one that drops addends
    beyond a window never sees a unit 2^105 below B."""
    fp = fingerprint("matmul", _kernel(tree, add), dtype=dtype, device="cpu")
    assert (fp.acc_bits, fp.acc_rounding, fp.promote_every) == (bits, mode, None), fp
    assert fp.order == order, fp.evidence["order"]


def test_batch_dependent_split_is_not_batch_invariant():
    fp = fingerprint("matmul", _batch_dependent, dtype="bf16", device="cpu")
    assert not fp.batch_invariant and fp.deterministic, fp
    assert "differ" in fp.evidence["batch_invariant"]
    assert fp.order == "split:2"  # the probes run 256 rows a call


def test_random_order_is_not_deterministic():
    torch.manual_seed(0)
    fp = fingerprint("matmul", _random_order, dtype="bf16", device="cpu")
    assert not fp.deterministic, fp
    assert "ULP" in fp.evidence["deterministic"]
    assert fp.order == "unknown"  # a different order on every probe call


def _trunc_bits(x: torch.Tensor, p: int) -> torch.Tensor:
    """float64 values truncated (toward zero) to p fraction bits."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.trunc(torch.ldexp(m, torch.full_like(e, p + 1))), e - (p + 1))


def _promoted(block: int):
    """A GEMM whose partial sums of ``block`` products are kept in 13 fraction bits by
    truncation, each block sum then added into an fp32 accumulator (round to nearest even);
    bf16 output. block = 128: an FP8 GEMM as measured on Hopper (the issue's finding)."""
    def gemm(a, b):
        prods = a.double()[:, :, None] * b.double()[None, :, :]
        total = None
        for k0 in range(0, prods.shape[1], block):
            part = prods[:, k0]
            for k in range(k0 + 1, min(k0 + block, prods.shape[1])):
                part = _trunc_bits(part + prods[:, k], 13)  # exact in float64, then truncated
            part = part.float()
            total = part if total is None else total + part
        return total.to(torch.bfloat16)
    return gemm


_fp8_gemm_hopper_like = _promoted(128)


def test_fp8_gemm_with_a_narrow_promoted_accumulator():
    fp = fingerprint("matmul", _fp8_gemm_hopper_like, dtype="e4m3", device="cpu")
    assert (fp.acc_bits, fp.promote_every, fp.acc_rounding) == (13, 128, "rz"), fp
    assert fp.order == "blocked:128", fp.evidence["order"]


def test_fp8_gemm_with_fp32_accumulation():
    def fp32_acc(a, b):
        prods = a.float()[:, :, None] * b.float()[None, :, :]  # e4m3 products: exact in fp32
        return _seq(list(prods.unbind(1)), _rne).to(torch.bfloat16)
    fp = fingerprint("matmul", fp32_acc, dtype="e4m3", device="cpu")
    assert (fp.acc_bits, fp.promote_every, fp.acc_rounding, fp.order) == \
        (23, None, "rne", "sequential"), fp


def test_torch_cpu_matmul_fingerprints():
    """torch's CPU GEMMs (docs/fingerprints.md says what they mean): fp32 accumulation with
    round to nearest even in every dtype, deterministic."""
    for dtype in ("fp32", "bf16", "fp16"):
        fp = nc.fingerprint("matmul", torch.matmul, dtype=dtype, device="cpu")
        assert (fp.acc_bits, fp.acc_rounding, fp.promote_every) == (23, "rne", None), fp
        assert fp.deterministic
        assert fp.order != "unknown", fp.evidence["order"]


def test_linear_and_sdpa_probes_run():
    fp = fingerprint("linear", F.linear, dtype="bf16", device="cpu")
    assert fp.acc_bits == 23 and fp.op == "linear"
    fp = fingerprint("sdpa", F.scaled_dot_product_attention, dtype="fp32", device="cpu")
    assert fp.acc_bits == 23 and fp.deterministic


def test_fp16_probes_are_exact():
    fp = fingerprint("matmul", _kernel(_pair), dtype="fp16", device="cpu")
    assert (fp.order, fp.acc_bits) == ("pairwise", 23), fp


def test_registered_kernel_by_name_and_as_dict():
    fp = fingerprint("matmul", "torch", dtype="bf16", device="cpu")
    d = fp.as_dict()
    assert d["kernel"] == "torch" and set(fp.properties()) <= set(d)
    assert isinstance(fp, Fingerprint) and "acc_bits" in str(fp)


@pytest.mark.parametrize("args,match", [(("gelu", F.gelu), "no probe"),
                                        (("sdpa", F.scaled_dot_product_attention, "fp16"),
                                         "dtype"),
                                        (("matmul", "no_such_kernel"), "no kernel")])
def test_usage_errors(args, match):
    op, fn, *dt = args
    with pytest.raises(UsageError, match=match):
        fingerprint(op, fn, dtype=dt[0] if dt else "bf16", device="cpu")


def test_failing_kernel_is_named():
    def broken(a, b):
        raise RuntimeError("boom")
    with pytest.raises(UsageError, match="matmul kernel raised RuntimeError.*boom"):
        fingerprint("matmul", broken, dtype="bf16", device="cpu")


@pytest.mark.parametrize("mode", ["rne", "rz", "rd", "ru"])
def test_order_simulation_rounds_like_fp32_hardware(mode):
    """The hypotheses' simulated accumulator (p = 23) against fp32 additions rounded by torch
    (RNE) and nextafter (directed), powers of two approached from both sides included."""
    from numcheck.forensics.summation_orders import round_bits as _round_bits
    g = torch.Generator().manual_seed(0)
    n = 50_000
    a = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 30, (n,), generator=g).float())
    b = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 30, (n,), generator=g).float())
    a[:64], b[:64] = torch.exp2(torch.arange(64.0) - 32), -(2.0 ** -40)
    a[64:128], b[64:128] = -torch.exp2(torch.arange(64.0) - 32), 2.0 ** -40
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    step = {"rne": torch.zeros_like(s), "rz": torch.zeros_like(s),
            "rd": torch.full_like(s, -torch.inf), "ru": torch.full_like(s, torch.inf)}[mode]
    move = {"rne": torch.zeros_like(s, dtype=torch.bool),
            "rz": (err != 0) & (torch.sign(err) != torch.sign(s)),
            "rd": err < 0, "ru": err > 0}[mode]
    want = torch.where(move, torch.nextafter(s, step), s).double()
    A, B = a.double(), b.double()
    S = A + B
    bb64 = S - A
    got = _round_bits(S, (A - (S - bb64)) + (B - bb64), 23, mode)
    assert torch.equal(got, want)


def _rms_norm_split_by_batch(x, weight, eps):
    """RMSNorm whose sum of squares runs in two halves for batches of 16 rows or more."""
    xf = x.float()
    if x.shape[0] >= 16:
        h = x.shape[-1] // 2
        ss = (xf[:, :h] ** 2).sum(-1, keepdim=True) + (xf[:, h:] ** 2).sum(-1, keepdim=True)
    else:
        ss = (xf ** 2).sum(-1, keepdim=True)
    return (xf * torch.rsqrt(ss / x.shape[-1] + eps) * weight.float()).to(x.dtype)


def _softmax_random_order(x, dim=-1):
    perm = torch.randperm(x.shape[-1])
    e = torch.exp(x.double() - x.double().amax(-1, keepdim=True)).float()
    s = e[:, perm[0]]
    for k in perm[1:]:  # one sequential fp32 sum in a new order every call
        s = s + e[:, k]
    return (e / s[:, None]).to(x.dtype)


def test_norm_and_softmax_reductions_determinism_and_batch_invariance():
    fp = fingerprint("rms_norm", _rms_norm_split_by_batch, dtype="fp32", device="cpu")
    assert fp.deterministic and not fp.batch_invariant, fp
    assert (fp.acc_bits, fp.order) == (None, "unknown") and "positive terms" in \
        fp.evidence["order"]
    fp = fingerprint("softmax", _softmax_random_order, dtype="fp32", device="cpu")
    assert not fp.deterministic, fp
    fp = fingerprint("rms_norm", "torch", dtype="bf16", device="cpu")
    assert fp.deterministic and fp.batch_invariant, fp


@pytest.mark.parametrize("block", [96, 256])
def test_promotion_blocks_beyond_and_between_powers_of_two(block):
    fp = fingerprint("matmul", _promoted(block), dtype="bf16", device="cpu")
    assert (fp.acc_bits, fp.promote_every, fp.acc_rounding) == (13, block, "rz"), fp


@pytest.mark.parametrize("name,tree", [("reversed", lambda xs, add: _seq(xs[::-1], add)),
                                       ("butterfly", lambda xs, add: _pair(
                                           [_seq(xs[lane::8], add) for lane in range(8)],
                                           add))])
def test_acc_bits_do_not_depend_on_which_side_the_small_value_meets(name, tree):
    """The small probe value added to -X first (a reversed loop, lanes combined by halving)
    must read the same 23 bits as added to X first."""
    fp = fingerprint("matmul", _kernel(tree), dtype="bf16", device="cpu")
    assert (fp.acc_bits, fp.acc_rounding) == (23, "rne"), fp


def test_fingerprint_runs_under_the_pinned_numerics():
    """A caller's reduced-precision knob does not change what the probes measure."""
    knobs = torch.backends.mkldnn.matmul
    saved = knobs.fp32_precision
    try:
        knobs.fp32_precision = "bf16"
        changed = fingerprint("matmul", torch.matmul, dtype="fp32", device="cpu")
    finally:
        knobs.fp32_precision = saved
    assert changed.properties() == fingerprint("matmul", torch.matmul, dtype="fp32",
                                               device="cpu").properties()


def test_unnamed_kernels_get_distinct_names():
    fp = fingerprint("matmul", _kernel(_seq), dtype="bf16", device="cpu")
    assert fp.kernel == f"{__name__}:_kernel.<locals>.matmul"


def test_suite_item_records_a_known_environment_failure_as_known_any_other_as_error():
    """A kernel that fails the way a documented torch build limitation does (CPU flash SDPA
    in bf16 under ATEN_CPU_CAPABILITY=avx2 on an AMX machine) is a KNOWN record naming the
    finding, as the op suites record it; any other failure stays an ERROR record."""
    from numcheck.forensics.kernel_fingerprint import suite_record
    from numcheck.records import Status

    def build_limit(q, k, v, **kw):
        raise RuntimeError("pack_vnni2 is only supported when avx512 is supported")

    rec = suite_record("sdpa", "sdpa_flash", "bf16", "cpu", None, build_limit)
    assert rec.status == Status.KNOWN and rec.known == "torch-cpu-flash-bf16-avx2-vnni"
    assert "pack_vnni2" in rec.reason

    def broken(q, k, v, **kw):
        raise RuntimeError("index out of range in the kernel")

    rec = suite_record("sdpa", "sdpa_flash", "bf16", "cpu", None, broken)
    assert rec.status == Status.ERROR and not rec.known and "index out of range" in rec.reason
