"""The baseline rule rank by rank (DESIGN rule 4, numcheck.measure.paired): the kernel's r-th
worst block against the baseline's r-th worst, so that one block where the baseline is bad for
a reason of its own (a cancelling row) cannot hide the kernel's errors in the other blocks, and
two equally accurate kernels still pass against each other block noise and all."""
from __future__ import annotations

import torch

import numcheck as nc
from numcheck.measure.paired import block_rel, worst_rank
from numcheck.verdicts.policy import Policy, judge

ROWS, COLS = 64, 32


def _noisy(ref: torch.Tensor, rel: torch.Tensor, seed: int) -> torch.Tensor:
    """ref with a random error of relative l2 size ``rel`` per row."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    e = e / e.norm(dim=1, keepdim=True) * ref.norm(dim=1, keepdim=True) * rel[:, None]
    return (ref + e).float()


def _ref(seed: int = 0) -> torch.Tensor:
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def test_block_rel_is_the_per_row_relative_error():
    ref = _ref()
    rel = torch.linspace(1e-3, 1e-1, ROWS, dtype=torch.float64)
    out = _noisy(ref, rel, 1)
    kr, br = block_rel(out, ref.float(), ref, (1, COLS))
    exact = ((out.double() - ref).norm(dim=1) / ref.norm(dim=1)).numpy()
    assert abs(kr - exact).max() < 1e-6 * exact.max()
    assert br.max() < 1e-6  # ref rounded to fp32: u_fp32 at most


def test_a_bad_baseline_block_no_longer_hides_the_kernels_errors():
    """Baseline: 1e-3 everywhere but one cancelling row (0.5); kernel: 3e-2 in half the rows.
    Worst against worst passes (3e-2 <= 2 x 0.5); rank 2 onward fails."""
    ref = _ref()
    base_rel = torch.full((ROWS,), 1e-3, dtype=torch.float64)
    base_rel[5] = 0.5
    kern_rel = torch.full((ROWS,), 1e-3, dtype=torch.float64)
    kern_rel[::2] = 3e-2
    base, kern = _noisy(ref, base_rel, 1), _noisy(ref, kern_rel, 2)
    blocks = (1, COLS)
    ks, bs = (nc.error_stats(t, ref, blocks=blocks) for t in (kern, base))
    floor = 2.0 * 2.0 ** -24
    without = judge(Policy(), ks, bs)
    assert without.passed, without.failures  # what the rule said before ranks
    v = judge(Policy(), ks, bs,
              block_ranks=lambda k, f: worst_rank(kern, base, ref, k, f, blocks))
    assert not v.passed and v.block_ratio > 1
    (msg,) = v.failures
    w = worst_rank(kern, base, ref, 2.0, floor, blocks)
    assert f"worst block no. {w.rank} (#{w.block})" in msg, msg
    # any of the 31 ranks behind the baseline's bad one: a row the kernel got wrong
    assert 2 <= w.rank <= ROWS // 2 and w.block % 2 == 0 and abs(w.kernel_rel - 3e-2) < 1e-3


def test_equally_accurate_kernels_pass_against_each_other():
    """Two fp32 matmuls summing K = 512 in opposite orders (equally accurate, their errors
    random), rows of 16 as blocks, 20 draws: neither fails against the other. (Measured over
    100 draws: none at 16 elements a block; at 4, 4% fail worst against worst and 4% rank by
    rank; at 1, 11.5% and 16.5%: ranks add little noise to the rule that was there.)"""
    blocks, floor = (1, 16), 2 * 2.0 ** -24
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(64, 512, generator=g, dtype=torch.float64)
        w = torch.randn(512, 16, generator=g, dtype=torch.float64)
        ref = x @ w
        a = x.float() @ w.float()
        b = x.float().flip(1) @ w.float().flip(0)
        assert not torch.equal(a, b)
        for p, q in ((a, b), (b, a)):
            assert worst_rank(p, q, ref, 2.0, floor, blocks).ratio <= 1.0, seed


class _SoftmaxSumInBf16(torch.autograd.Function):
    """A softmax whose backward forms sum(dy * y) in the input dtype, one rounded add at a
    time (what a Triton kernel's tl.sum of bf16 products does): the class of bug the rank rule
    exists for. Plain torch, so it runs everywhere."""

    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x.float(), -1).to(x.dtype)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        prod = dy * y
        dot = torch.zeros_like(prod[..., :1])
        for j in range(prod.shape[-1]):
            dot = dot + prod[..., j:j + 1]
        return y * (dy - dot)


def test_a_softmax_backward_summing_in_bf16_fails_by_rank():
    """On the quick case where the fp32 baseline's worst row cancels (a near-one-hot row,
    SQNR ~12 dB), the bf16 sum passed worst against worst; the rank rule names it."""
    def softmax(x, dim=-1):
        return _SoftmaxSumInBf16.apply(x.transpose(dim, -1)).transpose(dim, -1)

    case = "bf16-2x7x33-student_t-s0-contiguous-last"
    v = nc.verify("softmax", softmax, device="cpu", case_ids=[case])
    (rec,) = [r for r in v.records if r.output == "grad_x"]
    assert rec.status == "failed", rec.reason
    assert "worst block no. " in rec.reason and rec.block_ratio > 1, rec.reason
    fp32 = nc.verify("softmax", softmax, device="cpu",
                     case_ids=["fp32-3x129-student_t-s0-contiguous-last"])
    assert fp32.passed, [r.reason for r in fp32.failures]  # fp32 sums: nothing to see


def test_a_record_read_back_is_judged_the_same():
    """Results files carry ``block_ratio``: a record read back (numcheck report, compare) keeps
    its verdict by rank, and a row without it (NaN: not measured, an older file) is not failed
    by the rule."""
    import math

    from numcheck.catalog import get_op
    from numcheck.records import Record
    from numcheck.verdicts.judge import judge as rejudge

    def softmax(x, dim=-1):
        return _SoftmaxSumInBf16.apply(x.transpose(dim, -1)).transpose(dim, -1)

    v = nc.verify("softmax", softmax, device="cpu",
                  case_ids=["bf16-2x7x33-student_t-s0-contiguous-last"])
    policy = get_op("softmax").policy
    for rec in v.records:
        back = rejudge(Record.from_row(rec.as_row()), policy)
        assert back.status == rec.status, (rec.output, back.reason)
        row = rec.as_row()
        row["block_ratio"] = math.nan
        if rec.output == "grad_x":   # failed by rank alone: without the ratio, nothing to fail
            assert rec.status == "failed" and rec.block_ratio > 1
            assert rejudge(Record.from_row(row), policy).status == "passed"
