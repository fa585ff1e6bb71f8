"""GEMM family (numcheck/ops/matmul.py): references, grids, built-in kernels, planted faults.

Planted faults are realistic buggy GEMMs, each asserted CAUGHT on a subtle case and by the rule
expected to catch it; benign rewrites (blocked, split-K in another order, fp32 accumulation by
hand, unfused bias) are asserted to PASS every quick case.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from numcheck import formats
from numcheck.cases import inputs
from numcheck.catalog import get_op, kernels
from numcheck.ops import matmul as mm
from numcheck.run import run_case
from numcheck.verification import verify
from numcheck.ops.variants import linear_row_tiles as _linear_row_tiles
from numcheck.ops.variants import linear_unfused as _linear_unfused
from numcheck.ops.variants import matmul_blocked_fp32 as _blocked_fp32
from numcheck.ops.variants import matmul_fp32_accumulate as _fp32_accumulate
from numcheck.ops.variants import matmul_split_k_reversed as _split_k_reversed

COMPONENTWISE = "componentwise error"
BASELINE = "x baseline"  # the baseline rule's message: "rel_l2 ... > 2 x baseline ..."


def _ids(op: str, pred) -> list[str]:
    ids = [c.id for c in get_op(op).grid("quick") if pred(c)]
    assert ids, f"no quick {op} case matches the predicate"
    return ids


def _out_records(v, case_ids=None):
    return [r for r in v.records if r.output == "out"
            and (case_ids is None or r.case_id in case_ids)]


def _assert_passed(v):
    assert v.passed, v.summary()


def _assert_caught(v, rule: str, case_ids: list[str]):
    """Every listed case's forward output failed, each naming ``rule``."""
    assert not v.passed, v.summary()
    for r in _out_records(v, set(case_ids)):
        assert r.status == "failed", f"{r.case_id} not caught:\n{v.summary()}"
        assert rule in r.reason, f"{r.case_id} caught by another rule: {r.reason}"


# ---- references -------------------------------------------------------------------------------

def test_reference_gradcheck_matmul():
    g = torch.Generator().manual_seed(0)
    for a_shape, b_shape in [((3, 5), (5, 4)), ((2, 3, 7), (2, 7, 2)), ((2, 3, 4), (4, 5)),
                             ((1, 1), (1, 1))]:
        a = torch.randn(a_shape, generator=g, dtype=torch.float64, requires_grad=True)
        b = torch.randn(b_shape, generator=g, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(mm.matmul_reference, (a, b))


def test_reference_gradcheck_linear():
    g = torch.Generator().manual_seed(1)
    for x_shape in [(3, 5), (2, 3, 5)]:
        x = torch.randn(x_shape, generator=g, dtype=torch.float64, requires_grad=True)
        w = torch.randn(4, 5, generator=g, dtype=torch.float64, requires_grad=True)
        b = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(mm.linear_reference, (x, w, b))
        assert torch.autograd.gradcheck(lambda x, w: mm.linear_reference(x, w, None), (x, w))


def test_reference_chunks_over_k(monkeypatch):
    """The chunked K sum (several chunks, a ragged last one) is the same sum."""
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3, 4, 37, generator=g, dtype=torch.float64)
    b = torch.randn(3, 37, 5, generator=g, dtype=torch.float64)
    whole = mm.matmul_reference(a, b)
    monkeypatch.setattr(mm, "_CHUNK_PRODUCTS", 3 * 4 * 5 * 8)  # 8 of K per chunk: 5 chunks
    chunked = mm.matmul_reference(a, b)
    # Another summation order: equal within FP64's own error, 2 K 2^-53 |A||B|.
    assert bool(((chunked - whole).abs() <= 2 * 37 * 2.0**-53 * (a.abs() @ b.abs())).all())
    assert torch.equal(mm.matmul_reference(a[:, :, :0], b[:, :0]), torch.zeros(3, 4, 5,
                                                                              dtype=torch.float64))


@pytest.mark.parametrize("op", ["matmul", "linear"])
def test_reference_matches_float64_gemm(op):
    """Oracle check (tests only): the explicit reference agrees with float64 ``@`` on every quick
    case's inputs to within FP64's own GEMM error, 4 K 2^-53 |A||B|."""
    spec = get_op(op)
    for case in spec.grid("quick"):
        tensors, kwargs = spec.make_inputs(case)
        exact = {n: inputs.cast(x, d)[1] for n, (x, d) in tensors.items()}
        ref = spec.reference(**exact, **kwargs)
        if op == "matmul":
            oracle = exact["a"] @ exact["b"]
        else:
            oracle = F.linear(exact["x"], exact["weight"], exact.get("bias"))
        k = case.shape[-2]
        bound = 4 * k * 2.0**-53 * spec.scale(**exact, **kwargs)
        assert bool(((ref - oracle).abs() <= bound).all()), case.id


def test_baseline_is_the_recursive_fp32_loop():
    """The baseline sums in order in fp32: equal to a scalar Python loop in fp32."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 9, generator=g).to(torch.bfloat16)
    b = torch.randn(9, 3, generator=g).to(torch.bfloat16)
    out = mm.naive_gemm32(a, b)
    for i in range(2):
        for j in range(3):
            acc = torch.tensor(0.0)
            for k in range(9):
                acc = acc + a[i, k].float() * b[k, j].float()
            assert out[i, j].item() == acc.item()
    assert mm.matmul_baseline(a, b).dtype == torch.bfloat16


_GEMM_SHAPES = [((64, 64), (64, 64)), ((7, 1025), (1025, 33)), ((2, 33, 129), (129, 17)),
                ((3, 1, 5, 7), (2, 7, 4)), ((4, 0), (0, 5)), ((0, 3), (3, 2)), ((1, 1), (1, 1))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("sa,sb", _GEMM_SHAPES)
def test_compiled_baseline_equals_the_torch_loop_bitwise(dtype, sa, sb):
    """numcheck.kernels.gemm_cpu is the rank-1 loop's arithmetic: same bits (fp32 products round, so an
    FMA contraction would show), on heavy-tailed values with inf, NaN, -0 and subnormals."""
    pytest.importorskip("numba")
    g = torch.Generator().manual_seed(11)
    a = (torch.randn(sa, generator=g) * torch.exp(3 * torch.randn(sa, generator=g))).to(dtype)
    b = torch.randn(sb, generator=g).to(dtype)
    flat = a.view(-1)
    specials = [float("inf"), float("nan"), -0.0, 1e-41 if dtype is torch.float32 else 1e-7]
    flat[: len(specials)] = torch.tensor(specials[: flat.numel()]).to(dtype)
    assert mm._compiled_gemm(a.float(), b.float()) is not None
    out = mm.naive_gemm32(a, b)
    loop = mm._gemm_rank1(a.float(), b.float())
    assert out.shape == loop.shape and out.dtype == torch.float32
    assert torch.equal(out.view(torch.int32), loop.view(torch.int32))


def test_compiled_baseline_gradients_are_the_loop_on_the_upstream_gradient():
    """Backward: grad_a = naive_gemm32(g, b^T), grad_b = naive_gemm32(a^T, g) (broadcast dims
    summed), in the operands' dtype, within gamma_K of float64 autograd; the torch loop's
    autograd agrees within the same bound."""
    pytest.importorskip("numba")
    g = torch.Generator().manual_seed(5)
    a = torch.randn(2, 33, 129, generator=g).to(torch.bfloat16).requires_grad_()
    b = torch.randn(129, 17, generator=g).to(torch.bfloat16).requires_grad_()
    up = torch.randn(2, 33, 17, generator=g)
    ga, gb = torch.autograd.grad(mm.naive_gemm32(a, b), [a, b], up)
    assert ga.dtype == gb.dtype == torch.bfloat16
    af, bf = a.detach().float(), b.detach().float()
    assert torch.equal(ga, mm.naive_gemm32(up, bf.mT).to(torch.bfloat16))
    assert torch.equal(gb, mm.naive_gemm32(af.mT, up).sum(0).to(torch.bfloat16))
    a64, b64 = af.double().requires_grad_(), bf.double().requires_grad_()
    exact = torch.autograd.grad(a64 @ b64, [a64, b64], up.double())
    a32, b32 = af.clone().requires_grad_(), bf.clone().requires_grad_()
    loop = torch.autograd.grad(mm._gemm_rank1(a32, b32), [a32, b32], up)
    # one bf16 rounding of the gradient + gamma_n of its fp32 sum (n = 17 outputs for grad_a,
    # 2 x 33 rows for grad_b), |g| |b^T| and |a^T| |g| the scales
    ua, ub, ug = a64.detach().abs(), b64.detach().abs(), up.double().abs()
    scales = ((ug @ ub.mT), (ua.mT @ ug).sum(0))
    for got, old, e, scale, n in zip((ga, gb), loop, exact, scales, (17, 66)):
        bound = (2.0**-8 + n * 2.0**-24) * scale + 1e-30
        assert bool(((got.double() - e).abs() <= bound).all())
        assert bool(((old.double() - e).abs() <= n * 2.0**-24 * scale + 1e-30).all())


def test_baseline_without_numba_is_the_torch_loop(monkeypatch):
    """Where numba is missing the torch loop runs (and autograd differentiates it)."""
    monkeypatch.setitem(mm._GEMM_CPU, "module", None)
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    out = mm.naive_gemm32(a, b)
    assert out.grad_fn is not None and "NaiveGemm32" not in type(out.grad_fn).__name__
    assert torch.equal(out, mm._gemm_rank1(a.float(), b.float()))


# ---- grids ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["matmul", "linear"])
def test_grid_ids_stable_and_unique(op):
    spec = get_op(op)
    for cases in ("quick", "full"):
        ids = [c.id for c in spec.grid(cases)]
        assert len(ids) == len(set(ids))
        assert ids == [c.id for c in spec.grid(cases)]
    quick, full = spec.grid("quick"), spec.grid("full")
    assert 20 <= len(quick) <= 45 and len(full) <= 10 * len(quick)
    for c in full:
        assert not (c.dtype == "fp16" and c.dist == "wide_range")
        assert not (c.dtype == "fp16" and math.prod(c.shape) > mm._FP16_MAX_MACS)
        assert not (c.dtype == "fp32" and c.param("weight") == "fp32")
    dists = {c.dist for c in quick}
    assert {"normal", "outlier_channels", "positive", "wide_range", "student_t",
            "sparse"} <= dists
    assert {c.param("layout") for c in quick} == {"contiguous", "transposed"}


def test_grid_has_accumulation_probes():
    quick = get_op("matmul").grid("quick")
    for dt in ("bf16", "fp16", "fp32"):
        for k in (64, 1024, 4096):
            assert any(c.dtype == dt and c.dist == "positive" and c.shape[-2] == k
                       for c in quick), (dt, k)


def test_positive_distribution_is_positive():
    case = next(c for c in get_op("matmul").grid("quick") if c.dist == "positive")
    tensors, _ = get_op("matmul").make_inputs(case)
    for x, _dt in tensors.values():
        assert bool((x >= 0).all()) and float(x.max()) <= 1.0


def test_underflow_term_admits_subnormal_rounding():
    """A single-product fp16 output in the subnormal range: correct rounding errs by up to half
    the smallest subnormal, which the bound's eta term admits."""
    a = torch.tensor([[2.0**-8]], dtype=torch.float64)
    b = torch.tensor([[2.0**-10 * 1.37]], dtype=torch.float64)
    ref = mm.matmul_reference(a, b)
    out = formats.round_to(ref, "fp16")
    u = formats.get("fp16").unit_roundoff
    ratio = float(((out - ref).abs() / (u * mm.matmul_scale(a, b))).max())
    assert 0 < ratio <= mm._MM_POLICY.bound_c


# ---- built-in kernels -------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["matmul", "linear"])
def test_builtin_torch_kernel_passes_quick(op):
    v = verify(op, kernels(op)["torch"], device="cpu", cases="quick")
    _assert_passed(v)
    # Positive inputs, same-dtype operands: fp32 accumulation keeps bf16/fp16 within one rounding
    # of |AB| plus gamma_K, 1 + K 2^-24 / u (measured <= 0.999).
    spec = get_op(op)
    for case in spec.grid("quick"):
        if case.dist == "positive" and case.dtype != "fp32" and case.param("weight") != "fp32":
            r = next(r for r in _out_records(v, {case.id}))
            assert r.bound_ratio <= 1.0 + mm._acc_len(case), case.id


@pytest.mark.parametrize("op", ["matmul", "linear"])
def test_tf32_kernel_is_cuda_only(op):
    k = kernels(op)["torch_tf32"]
    assert k.devices == ("cuda",) and k.dtypes == ("fp32",)
    v = verify(op, k, device="cpu", cases="quick")
    assert v.executed == 0 and not v.passed  # DESIGN rule 11: nothing ran
    assert all("cuda" in r.reason for r in v.records)


def test_tf32_context_restores_the_knob():
    m = torch.backends.cuda.matmul
    before = m.fp32_precision
    with mm._tf32_matmul():
        assert m.fp32_precision == "tf32"
    assert m.fp32_precision == before


def test_tf32_autograd_plumbing():
    """The TF32 wrapper's custom backward gives the right gradients (on the CPU the TF32 knob has
    no effect, so float64 gradcheck checks the plumbing: broadcasting, a missing bias)."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mm._tf32_matmul_kernel, (a, b))
    w = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mm._tf32_linear_kernel, (a, w, bias))
    assert torch.autograd.gradcheck(lambda x, w: mm._tf32_linear_kernel(x, w, None), (a, w))


def test_tf32_emulated_fails_the_fp32_policy():
    """Why torch_tf32 is an expected failure: operands rounded to tf32 (round-to-nearest-away,
    as NVIDIA's conversion), fp32 accumulation, judged as fp32 -> caught by the baseline rule,
    on the K = 4096 probe too (there the recursive fp32 baseline is at its loosest)."""
    def tf32_emulated(a, b):
        def tf32(t):  # rounded values forward, identity gradient (as the hardware's cast)
            return t + (formats.round_to(t.detach(), "tf32", "rna").float() - t).detach()
        return tf32(a) @ tf32(b)
    ids = _ids("matmul", lambda c: c.dtype == "fp32" and c.shape[-2] in (64, 4096)
               and c.dist == "positive")
    v = verify("matmul", tf32_emulated, device="cpu", case_ids=ids)
    _assert_caught(v, BASELINE, ids)


# ---- planted faults ---------------------------------------------------------------------------

def _low_precision_accumulation(chunk: int):
    """A GEMM that keeps its running sum in the compute dtype: partial products over `chunk` of K
    (fp32 inside each chunk), added into a bf16/fp16 accumulator."""
    def kernel(a, b):
        acc = torch.zeros((*a.shape[:-1], b.shape[-1]), dtype=a.dtype)
        for k0 in range(0, a.shape[-1], chunk):
            acc = acc + a[..., k0:k0 + chunk] @ b[..., k0:k0 + chunk, :]
        return acc
    return kernel


@pytest.mark.parametrize("chunk", [1, 8])
def test_fault_low_precision_accumulation_caught_at_k64(chunk):
    """DESIGN rule 5: bf16/fp16 accumulation shows on positive inputs already at K = 64."""
    ids = _ids("matmul", lambda c: c.dtype in ("bf16", "fp16") and c.dist == "positive"
               and c.shape == (64, 64, 64) and c.param("layout") == "contiguous")
    assert len(ids) == 2
    v = verify("matmul", _low_precision_accumulation(chunk), device="cpu", case_ids=ids)
    _assert_caught(v, COMPONENTWISE, ids)
    # ... and the correct kernel passes exactly these cases.
    _assert_passed(verify("matmul", kernels("matmul")["torch"], device="cpu", case_ids=ids))


def test_fault_low_precision_accumulation_caught_at_k1024():
    ids = _ids("matmul", lambda c: c.dtype == "bf16" and c.dist == "positive"
               and c.shape == (64, 1024, 64))
    v = verify("matmul", _low_precision_accumulation(8), device="cpu", case_ids=ids)
    _assert_caught(v, COMPONENTWISE, ids)


def _drop_k_tail(a, b):
    """A tiled kernel whose K loop runs over whole 32-wide tiles only: the K % 32 tail is lost."""
    k = a.shape[-1] - a.shape[-1] % 32
    return a[..., :k] @ b[..., :k, :]


def test_fault_dropped_k_tail_caught_on_ragged_k():
    ragged = _ids("matmul", lambda c: c.shape == (127, 1025, 33))  # one column of 1025 lost
    v = verify("matmul", _drop_k_tail, device="cpu", case_ids=ragged)
    assert not v.passed
    for r in _out_records(v):
        assert r.status == "failed", r.case_id
        assert COMPONENTWISE in r.reason or BASELINE in r.reason
    # On whole tiles the same kernel is right: the fault is the tail, nothing else.
    aligned = _ids("matmul", lambda c: c.shape[-2] % 32 == 0 and c.shape[-2] <= 1024
                   and c.dtype != "fp16")
    _assert_passed(verify("matmul", _drop_k_tail, device="cpu", case_ids=aligned))


def _bias_skips_last_row_tile(x, weight, bias=None, tile=64):
    """Linear tiled over rows whose epilogue adds the bias to every row tile but the last."""
    dt = x.dtype
    x2 = x.reshape(-1, x.shape[-1])
    w = weight.to(dt)
    outs = []
    for r0 in range(0, x2.shape[0], tile):
        o = x2[r0:r0 + tile] @ w.mT
        if bias is not None and r0 + tile < x2.shape[0]:
            o = o + bias.to(dt)
        outs.append(o)
    return torch.cat(outs).reshape(*x.shape[:-1], weight.shape[0])


def test_fault_bias_missing_on_last_row_tile():
    # 129 rows: only the last of them (1 row in 129) lacks the bias; 2x33 = 66 rows: 2 rows.
    ids = _ids("linear", lambda c: c.dtype == "fp32" and c.param("bias")
               and math.prod(c.shape[:-2]) in (129, 66) and c.dist in ("normal", "student_t"))
    v = verify("linear", _bias_skips_last_row_tile, device="cpu", case_ids=ids)
    _assert_caught(v, COMPONENTWISE, ids)
    assert any(r.output == "grad_bias" and r.status == "failed" for r in v.records)


def _row_major_b_assumed(a, b):
    """Reads b's storage as if it were row-major (ignores strides)."""
    return a @ torch.as_strided(b, b.shape, torch.empty(b.shape, device="meta").stride())


def test_fault_ignored_strides_caught_on_transposed_layout():
    ids = _ids("matmul", lambda c: c.param("layout") == "transposed" and c.shape[-1] > 1
               and c.dtype != "fp16")
    v = verify("matmul", _row_major_b_assumed, device="cpu", case_ids=ids)
    _assert_caught(v, BASELINE, ids)


def _first_batch_b(a, b):
    """A batched GEMM that broadcasts batch 0 of b to every batch (a stride-0 batch bug)."""
    return a @ (b[..., :1, :, :] if b.dim() >= 3 else b)


def test_fault_batch_broadcast_caught():
    ids = _ids("matmul", lambda c: len(c.shape) == 4)
    v = verify("matmul", _first_batch_b, device="cpu", case_ids=ids)
    _assert_caught(v, BASELINE, ids)


# ---- benign variants --------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [_blocked_fp32, _split_k_reversed],
                         ids=["blocked", "split_k_reversed"])
def test_benign_matmul_variants_pass(fn):
    _assert_passed(verify("matmul", fn, device="cpu", cases="quick"))


def test_benign_fp32_accumulation_by_hand_passes():
    # For fp32 cases this is torch's own kernel; the bf16/fp16 cases are the point.
    ids = _ids("matmul", lambda c: c.dtype != "fp32")
    _assert_passed(verify("matmul", _fp32_accumulate, device="cpu", case_ids=ids))


def _linear_promoted(x, weight, bias=None):
    """Mixed bf16 x / fp32 weight promoted to fp32 and returned in fp32 (allowed out dtype)."""
    if weight.dtype == x.dtype:
        return F.linear(x, weight, bias)
    return F.linear(x.float(), weight, None if bias is None else bias.float())


@pytest.mark.parametrize("fn", [_linear_unfused, _linear_row_tiles],
                         ids=["unfused", "row_tiles"])
def test_benign_linear_variants_pass(fn):
    _assert_passed(verify("linear", fn, device="cpu", cases="quick"))


def test_benign_linear_promoted_to_fp32_passes():
    ids = _ids("linear", lambda c: c.param("weight") == "fp32")
    v = verify("linear", _linear_promoted, device="cpu", case_ids=ids)
    _assert_passed(v)
    assert all(r.kernel_stats.fmt == "fp32" for r in _out_records(v))


def test_records_carry_bound_ratio_and_tiles():
    spec = get_op("matmul")
    case = next(c for c in spec.grid("quick") if c.shape == (127, 1025, 33))
    recs = run_case(spec, kernels("matmul")["torch"], case, "cpu")
    out = recs[0]
    assert out.output == "out" and out.status == "passed"
    assert out.kernel_stats.n_blocks == 1  # one 127 x 33 tile
    assert 0 < out.bound_ratio < math.inf
    assert {r.output for r in recs} == {"out", "grad_a", "grad_b"}
