"""Softmax family: references (gradcheck, an mpmath oracle), torch's kernels pass, planted faults
are caught, benign rewrites pass, and torch's measured behaviour is pinned as findings."""
from __future__ import annotations

import re

import mpmath
import pytest
import torch
import torch.nn.functional as F

from numcheck import formats
from numcheck.cases import inputs
from numcheck.catalog import get_op, kernels
from numcheck.registry import Kernel
from numcheck.ops.softmax import (DIMS, cross_entropy_baseline, cross_entropy_reference,
                                  log_softmax_reference, softmax_reference)
from numcheck.ops.variants import (cross_entropy_unfused, log_softmax_two_pass_fp32,
                               softmax_blocked_sum, softmax_cascaded_sum, softmax_fp32_upcast,
                               softmax_online)
from _support import Finding, gen, quiet_verify

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype")

OPS = ["softmax", "log_softmax", "cross_entropy"]


_gen, _verify = gen, quiet_verify


# ---- references -----------------------------------------------------------------------------

def test_references_gradcheck():
    x = (3 * _gen(3, 7)).requires_grad_()
    for dim in (-1, -2, 0):
        assert torch.autograd.gradcheck(lambda x: softmax_reference(x, dim), (x,))
        assert torch.autograd.gradcheck(lambda x: log_softmax_reference(x, dim), (x,))
    t = torch.tensor([0, 6, 3])
    assert torch.autograd.gradcheck(lambda x: cross_entropy_reference(x, t), (x,))
    # large logits: the max subtraction keeps the reference (and its gradient) finite
    big = (90 + _gen(2, 5, seed=1)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: softmax_reference(x), (big,))
    t2 = torch.tensor([4, 0])
    assert torch.autograd.gradcheck(lambda x: cross_entropy_reference(x, t2), (big,))


def test_references_against_mpmath():
    """The references to ~1e-15 against 50-digit arithmetic, large logits and tiny p included."""
    mpmath.mp.dps = 50
    x = torch.tensor([[100.0, 99.5, 51.25, -60.0, 0.0], [1e-3, -2.0, 3.0, 3.0, -0.5]],
                     dtype=torch.float64)
    sm, lsm = softmax_reference(x), log_softmax_reference(x)
    for i in range(x.shape[0]):
        row = [mpmath.mpf(v) for v in x[i].tolist()]
        lse = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in row))
        for j, v in enumerate(row):
            assert float(v - lse) == pytest.approx(lsm[i, j].item(), rel=1e-14, abs=1e-14)
            assert float(mpmath.exp(v - lse)) == pytest.approx(sm[i, j].item(), rel=1e-13)
    t = torch.tensor([0, 2])
    want = sum(float(mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(v)) for v in x[i].tolist()))
                     - mpmath.mpf(x[i, t[i]].item())) for i in range(2)) / 2
    assert cross_entropy_reference(x, t).item() == pytest.approx(want, rel=1e-14)


def test_references_match_torch_in_float64():
    """Sanity only (torch in float64 as an oracle, never inside the references)."""
    x = 5 * _gen(4, 33)
    for dim in (-1, -2):
        torch.testing.assert_close(softmax_reference(x, dim), torch.softmax(x, dim))
        torch.testing.assert_close(log_softmax_reference(x, dim), torch.log_softmax(x, dim))
    t = torch.tensor([0, 32, 5, 7])
    torch.testing.assert_close(cross_entropy_reference(x, t), F.cross_entropy(x, t))


def test_baselines_backward_is_the_textbook_formula():
    x = _gen(3, 9).float().requires_grad_()
    g = _gen(3, 9, seed=2).float()
    from numcheck.ops.softmax import log_softmax_baseline, softmax_baseline
    for base, ref in [(softmax_baseline, torch.softmax), (log_softmax_baseline, torch.log_softmax)]:
        (gb,) = torch.autograd.grad(base(x, -1), x, g)
        x2 = x.detach().clone().requires_grad_()
        (gt,) = torch.autograd.grad(ref(x2, -1), x2, g)
        torch.testing.assert_close(gb, gt)
    t = torch.tensor([1, 8, 0])
    (gb,) = torch.autograd.grad(cross_entropy_baseline(x, t), x)
    x2 = x.detach().clone().requires_grad_()
    (gt,) = torch.autograd.grad(F.cross_entropy(x2, t), x2)
    torch.testing.assert_close(gb, gt)


def test_large_logits_distribution():
    spec = get_op("softmax")
    case = next(c for c in spec.grid("quick") if c.dist == "large_logits")
    x = spec.make_inputs(case)[0]["x"][0]
    assert x.abs().min() >= 50 and x.abs().max() <= 100
    assert (x > 88.73).any() and (x < 0).any()  # exp overflows fp32 without max subtraction
    assert torch.equal(x, spec.make_inputs(case)[0]["x"][0])  # deterministic


def test_cross_entropy_targets():
    spec = get_op("cross_entropy")
    for case in spec.grid("quick"):
        t64, kw = spec.make_inputs(case)
        t = kw["target"]
        logits = formats.round_to(t64["logits"][0], case.dtype)
        assert t.dtype == torch.int64 and t.shape == (case.shape[0],)
        assert int(t.min()) >= 0 and int(t.max()) < case.shape[1]
        if case.param("target") == "argmax":
            assert torch.equal(logits.gather(1, t.view(-1, 1)).flatten(), logits.amax(1))


# ---- torch's kernels ------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_torch_kernels_pass_quick(op):
    v = _verify(op, kernels(op)["torch"])
    assert v.passed, v.summary()
    assert v.executed == len(get_op(op).grid("quick"))


# ---- planted faults -------------------------------------------------------------------------

def softmax_no_max_subtraction(x, dim=-1):
    """exp(x) / sum exp(x) in fp32: exp overflows above 88.72 (inf / inf = NaN)."""
    e = torch.exp(x.float())
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def softmax_skips_ragged_tail(x, dim=-1):
    """A kernel vectorized by 32 whose normalizer forgets the last D % 32 elements."""
    xf = x.float().movedim(dim, -1)
    d = xf.shape[-1]
    body = d // 32 * 32 or d
    e = torch.exp(xf - xf.amax(-1, keepdim=True))
    return (e / e[..., :body].sum(-1, keepdim=True)).movedim(-1, dim).to(x.dtype)


def softmax_ignores_dim(x, dim=-1):
    return torch.softmax(x, -1)


def log_softmax_as_log_of_softmax(x, dim=-1):
    """log(softmax(x)): -inf where p underflows (a logit ~88 below the max in fp32)."""
    return torch.log(torch.softmax(x, dim))


def log_softmax_folded_lse(x, dim=-1):
    """x - logsumexp(x) in fp32: m + log(s) is rounded as one number, costing u |m| absolute
    (shift-dependent; 6e-6 at logits of 100, where the log-probability near 0 needs ~1e-7)."""
    xf = x.float()
    return (xf - torch.logsumexp(xf, dim, keepdim=True)).to(x.dtype)


def cross_entropy_no_logsumexp(logits, target):
    """log(sum(exp(x))) - x_t without the max shift, in fp32: inf for logits above 88.72."""
    x = logits.float()
    t = target.to(x.device).view(-1, 1)
    return (torch.log(torch.exp(x).sum(-1)) - x.gather(-1, t).flatten()).mean().to(logits.dtype)


def cross_entropy_sum_reduction(logits, target):
    return F.cross_entropy(logits, target.to(logits.device), reduction="sum")


def cross_entropy_label_smoothing(logits, target):
    """A training-config default leaking into the loss kernel (label_smoothing=0.1)."""
    return F.cross_entropy(logits, target.to(logits.device), label_smoothing=0.1)


@pytest.mark.parametrize("op, fault, expect", [
    ("softmax", softmax_no_max_subtraction, "non-finite"),
    ("softmax", softmax_skips_ragged_tail, "componentwise|rel_l2"),
    ("softmax", softmax_ignores_dim, "componentwise|rel_l2|shape"),
    ("log_softmax", log_softmax_as_log_of_softmax, "non-finite"),
    ("log_softmax", log_softmax_folded_lse, "componentwise"),
    ("cross_entropy", cross_entropy_no_logsumexp, "non-finite"),
    ("cross_entropy", cross_entropy_sum_reduction, "rel_l2|componentwise"),
    ("cross_entropy", cross_entropy_label_smoothing, "rel_l2|componentwise"),
])
def test_planted_fault_is_caught(op, fault, expect):
    v = _verify(op, fault)
    assert not v.passed, v.summary()
    assert any(re.search(expect, r.reason) for r in v.failures), v.summary()


def test_planted_faults_are_caught_where_expected():
    """The overflow faults are caught on large_logits, and only rule 3 is needed for it."""
    for op, fault in [("softmax", softmax_no_max_subtraction),
                      ("log_softmax", log_softmax_as_log_of_softmax),
                      ("cross_entropy", cross_entropy_no_logsumexp)]:
        v = _verify(op, fault)
        hit = {r.case_id for r in v.failures if "non-finite" in r.reason}
        assert any("large_logits" in c for c in hit), v.summary()
    # the ragged-tail fault: caught on the ragged sizes, silent on the aligned one
    v = _verify("softmax", softmax_skips_ragged_tail)
    failed = {r.case_id for r in v.failures}
    assert any("x129-" in c or "x33-" in c or "x1025-" in c for c in failed)
    # the forward, where the fault is: autograd through this kernel's max shift leaves ~u |g|
    # in one-hot rows (outlier_channels draws with logit gaps of ~50: reference gradient 2e-20,
    # this kernel's 8e-20 off, torch's 3e-26), which the worst-row rule of grad_x sees
    assert not any("4x128-" in r.case_id and "-last" in r.case_id for r in v.failures
                   if r.output == "out")


def _ce_backward_rounding_softmax_first(grad_out, logits, target):
    """softmax rounded to the logits' dtype, then "- 1" at the target (issue 31: a fused kernel's
    early rounding; in bf16 p_t > 1 - 2^-9 rounds to 1 and the target's gradient becomes 0)."""
    t = target.to(logits.device).view(-1, 1)
    p = torch.softmax(logits.float(), -1).to(logits.dtype)
    d = p.scatter(-1, t, p.gather(-1, t) - 1)
    return ((d.float() * (grad_out.float() / logits.shape[0])).to(logits.dtype),)


def test_an_early_rounded_target_gradient_is_caught():
    """The baseline computes its softmax in fp32 and rounds once (DESIGN rule 4): a kernel that
    rounds the softmax before subtracting 1 fails its gradient on confident (argmax-target)
    rows in bf16 and fp16. With a baseline that rounded the same way (the first releases), it
    passed: the baseline shared the loss."""
    kern = Kernel("cross_entropy", "early_rounded_grad",
                  lambda logits, target: F.cross_entropy(logits.float(), target.to(
                      logits.device)).to(logits.dtype),
                  backward=_ce_backward_rounding_softmax_first)
    v = _verify("cross_entropy", kern)
    hit = [r for r in v.failures if r.output == "grad_logits"]
    assert hit and not v.passed, v.summary()
    assert {r.dtype for r in hit} <= {"bf16", "fp16"} and any("argmax" in r.params for r in hit)
    assert not [r for r in v.failures if r.output == "out"], v.summary()


# ---- benign variants ------------------------------------------------------------------------

def cross_entropy_fp32_loss(logits, target):
    """fp32 loss from bf16/fp16 logits (an allowed output dtype)."""
    return F.cross_entropy(logits.float(), target.to(logits.device))


@pytest.mark.parametrize("op, variant", [
    # The online kernel's own backward is the standard formula from the saved output (judged
    # on torch's kernel); autograd through its rescaling loop is no kernel's backward.
    ("softmax", Kernel("softmax", "online", softmax_online, forward_only=True)),
    ("softmax", softmax_fp32_upcast),
    ("softmax", softmax_cascaded_sum),
    ("softmax", softmax_blocked_sum),
    ("log_softmax", log_softmax_two_pass_fp32),
    ("cross_entropy", cross_entropy_fp32_loss),
    ("cross_entropy", cross_entropy_unfused),
])
def test_benign_variant_passes(op, variant):
    v = _verify(op, variant)
    assert v.passed, v.summary()


def test_fp32_loss_from_bf16_logits_is_judged_in_fp32():
    v = _verify("cross_entropy", cross_entropy_fp32_loss)
    rows = [r for r in v.records if r.dtype == "bf16" and r.output == "out"]
    assert rows and all(r.kernel_stats.fmt == "fp32" for r in rows)


# ---- findings: torch's measured behaviour, pinned (a change means torch changed) ---------------

_X86 = "x86 CPUs (AMD EPYC AVX2 under avx2 and default, AVX512-BF16 measured)"
SOFTMAX_LANES = Finding("softmax sums in 16 fp32 lane accumulators", {"torch": ("2.13",)}, _X86)
SOFTMAX_BACKWARD = Finding("softmax backward y (g - sum(g y)) cancels on near-one-hot rows",
                           {"torch": ("2.13",)}, _X86)
HALF_LOG_SOFTMAX = Finding("bf16/fp16 log_softmax rounds sum(exp) to the input dtype",
                           {"torch": ("2.13",)}, _X86)
FP16_CE_INF = Finding("fp16 cross_entropy is inf near +-65504", {"torch": ("2.13",)}, _X86)


def test_finding_torch_softmax_lane_sum_error_grows_with_rows():
    """torch's CPU softmax sums exp(x - m) in 16 fp32 lane accumulators: at D = 4096 (student_t
    rows) its worst row errs by ~30 u, where torch.sum (cascaded) gives ~5 u and a left-to-right
    fp32 loop (the baselines' seq_sum) reaches ~300 u. Reordered sums being benign, the baselines
    use the loop, and the bound carries bound_per_len."""
    from numcheck.ops.softmax import seq_sum
    x64 = formats.round_to(inputs.draw("student_t", (8, 4096), seed=0, stream="x"), "fp32")
    ref = softmax_reference(x64)
    u = formats.get("fp32").unit_roundoff

    def worst_row(y):
        return float(((y.double() - ref).norm(dim=-1) / ref.norm(dim=-1)).max() / u)
    x = x64.float()
    e = torch.exp(x - x.amax(-1, keepdim=True))
    torch_err = worst_row(torch.softmax(x, -1))
    cascade = worst_row(e / e.sum(-1, keepdim=True))
    loop = worst_row(e / seq_sum(e, -1))
    assert torch_err < loop, (torch_err, cascade, loop)  # any CPU: within the baselines' bound
    SOFTMAX_LANES.expect(torch_err > 3 * cascade and loop > 3 * torch_err,
                         f"worst row {torch_err:.1f} u, cascade {cascade:.1f}, loop {loop:.1f}")


def test_finding_standard_softmax_backward_cancels_on_near_one_hot_rows():
    """y (g - sum(g y)) (torch's backward, and every fused kernel's) on p = 1 - 2.6e-6: the
    dominant element's gradient (9.2e-7) carries an absolute error ~u |g|, 16% here, while
    autograd through the naive forward happens to be accurate; hence the baselines' explicit
    textbook backward."""
    x64 = torch.tensor([[-59.3426971436, -72.2174682617, -81.0022735596]], dtype=torch.float64)
    x64 = formats.round_to(x64, "fp32")
    g = torch.tensor([[-1.1607542038, -1.5203709602, -1.6543680429]]).float()
    xr = x64.clone().requires_grad_()
    (gr,) = torch.autograd.grad(softmax_reference(xr), xr, g.double())
    xt = x64.float().requires_grad_()
    (gt,) = torch.autograd.grad(torch.softmax(xt, -1), xt, g)
    rel = abs(gt[0, 0].item() - gr[0, 0].item()) / abs(gr[0, 0].item())
    SOFTMAX_BACKWARD.expect(rel > 0.05, f"dominant element's gradient {rel:.3f} relative error")


def test_finding_torch_half_log_softmax_rounds_the_sum():
    """torch's CPU log_softmax in bf16/fp16 rounds sum(exp(x - m)) to the input dtype before the
    log: log p = -log(1 + e^-8) = -3.354e-4 (a bf16 number, -3.357e-4) comes out 0, and a row's
    log-probabilities carry up to u of the dtype in absolute error (fp32 inside would give
    ~1e-7). cross_entropy inherits it: a confident row's loss is 0. Declared on the torch
    cross_entropy kernel (known_failure); log_softmax's own bound (absolute u (1 + ...)) admits
    it, since the bound has no format-aware term for fp32-accumulated sums."""
    x = torch.tensor([[0.0, -8.0, -20.0, -20.0]])
    ref = log_softmax_reference(x.double())
    rounds = True
    for dt in (torch.bfloat16, torch.float16):
        got = torch.log_softmax(x.to(dt), -1)[0, 0].item()
        rounds &= HALF_LOG_SOFTMAX.expect(got == 0.0, f"{dt} log p = -3.354e-4 comes out {got}")
        assert torch.log_softmax(x.to(dt).float(), -1)[0, 0].item() == pytest.approx(
            ref[0, 0].item(), abs=2e-7)  # fp32 inside: one fp32 step of the sum
    assert formats.round_to(ref[0, :1], "bf16").item() != 0.0
    # the loss's error (1.7e-4 of a 1.7e-4 loss) is within the floor judge scales by the
    # conditioning; the confident row's target gradient (p_t - 1 = 0) is the known failure
    kern = kernels("cross_entropy")["torch"]
    v = _verify("cross_entropy", kern, case_ids=["bf16-2x4096-outlier_channels-s0-argmax"])
    out = next(r for r in v.records if r.output == "out")
    assert out.status == "passed"
    HALF_LOG_SOFTMAX.expect(out.kernel_stats.rel_l2 == 1.0,
                            f"bf16 confident-row loss is 0 (rel_l2 {out.kernel_stats.rel_l2})")
    v = _verify("cross_entropy", kern, cases="full", case_ids=["fp16-8x128-student_t-s1-argmax"])
    # numcheck's verdict: the declared known failure where torch rounds (else it must pass)
    assert [r.status for r in v.records] == ["passed", "known" if rounds else "passed"], \
        v.summary()


def test_finding_fp16_log_probabilities_overflow():
    """fp16 logits at +-65504 (wide_range saturates there): log-probabilities reach -131008,
    beyond fp16, so torch's fp16 cross_entropy (log_softmax + nll_loss) is inf where the mean
    loss itself is an fp16 number. The grid leaves fp16 wide_range out (_ce_keep)."""
    logits = torch.tensor([[65504.0, -65504.0, 0.0], [1.0, 2.0, 3.0]], dtype=torch.float16)
    t = torch.tensor([1, 2])
    ref = cross_entropy_reference(logits.double(), t)
    assert formats.round_to(ref.view(1), "fp16").isfinite().all() and ref.item() > 60000
    got = F.cross_entropy(logits, t)
    FP16_CE_INF.expect(bool(torch.isinf(got)),
                       f"fp16 cross_entropy {got.item()} (true {ref.item():.0f})")
    assert torch.isfinite(F.cross_entropy(logits.float(), t))
    assert not any(c.dtype == "fp16" and c.dist == "wide_range"
                   for c in get_op("cross_entropy").grid("full"))


def test_dims_param():
    assert DIMS == {"last": -1, "second_last": -2}
    ids = [c.id for c in get_op("softmax").grid("quick")]
    assert any(i.endswith("second_last") for i in ids) and any(i.endswith("-last") for i in ids)
