"""Size classes reach a kernel's second path (DESIGN rule 14): reductions over rows that a
kernel switches to low precision above 32768 rows fail on the 32769-row cases and only there.

Kernels written here for the class (issue 31: a widely used library shipped an RMSNorm backward
that did this; tests/test_ops_norms.py has that op's case): a linear whose weight and bias
gradients, and an adaLN whose shift and scale gradients, are summed row by row in bf16 on their
many-rows path, in fp32 otherwise; and an attention that, past 8192 keys, splits the key
sequence into 512-key partitions and keeps each partition's log-sum-exp in bf16 to combine them.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from numcheck.catalog import get_op
from numcheck.registry import Kernel
from numcheck.verification import verify

THRESHOLD = 32768  # rows where the kernels below switch path


def _sum_rows(terms: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sum over rows: fp32, or one bf16 add a row beyond the threshold (bf16 inputs)."""
    terms = terms.reshape(-1, terms.shape[-1])
    if terms.shape[0] <= THRESHOLD or like.dtype != torch.bfloat16:
        return terms.sum(0)
    acc = torch.zeros(terms.shape[-1], dtype=torch.bfloat16)
    for row in terms:
        acc = acc + row.to(torch.bfloat16)
    return acc.float()


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        return out.to(x.dtype)  # fp32 compute, one rounding (fp32 weights too)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        gf, xf = g.float(), x.float()
        gx = (gf @ weight.float()).to(x.dtype)
        rows = gf.reshape(-1, gf.shape[-1])
        xr = xf.reshape(-1, xf.shape[-1])
        outer = (rows[:, :, None] * xr[:, None, :]).reshape(rows.shape[0], -1) \
            if rows.shape[0] > THRESHOLD else None  # (rows, N * K): dW's terms, row by row
        gw = _sum_rows(outer, x).reshape(weight.shape) if outer is not None else rows.T @ xr
        gb = _sum_rows(rows, x) if ctx.has_bias else None
        return gx, gw.to(weight.dtype), None if gb is None else gb.to(weight.dtype)


def _linear(x, weight, bias=None):
    return _Linear.apply(x, weight, bias)


class _AdaLN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shift, scale, eps):
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt(((xf - mean) ** 2).mean(-1, keepdim=True) + eps)
        xhat = (xf - mean) * rstd
        ctx.save_for_backward(x, xhat, rstd, scale)
        return (xhat * (1 + scale.float()) + shift.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, xhat, rstd, scale = ctx.saved_tensors
        gf = g.float()
        gxh = gf * (1 + scale.float())
        gx = rstd * (gxh - gxh.mean(-1, keepdim=True)
                     - xhat * (gxh * xhat).mean(-1, keepdim=True))
        b = x.shape[0]
        gshift = torch.stack([_sum_rows(gf[i], x) for i in range(b)])[:, None, :]
        gscale = torch.stack([_sum_rows(gf[i] * xhat[i], x) for i in range(b)])[:, None, :]
        return gx.to(x.dtype), gshift.to(scale.dtype), gscale.to(scale.dtype), None


def _adaln(x, shift, scale, eps):
    return _AdaLN.apply(x, shift, scale, eps)


def _failed(op, fn):
    """Failures over the op's bf16 quick cases (the path switch is bf16's; the rest of the
    grid would only cost time)."""
    ids = [c.id for c in get_op(op).grid("quick") if c.dtype == "bf16"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = verify(op, Kernel(op, "two_paths", fn), device="cpu", case_ids=ids)
    assert len({r.case_id for r in v.records if r.status == "passed"}) > 5, v.summary()
    return {(r.case_id, r.output) for r in v.failures}, v


def test_linear_weight_and_bias_gradients_beyond_32k_rows():
    failed, v = _failed("linear", _linear)
    size = "bf16-32769x16x16-normal-s0-contiguous-same-bias"
    assert failed == {(size, "grad_weight"), (size, "grad_bias")}, v.summary()


def test_adaln_shift_and_scale_gradients_beyond_32k_tokens():
    failed, v = _failed("adaln_modulate", _adaln)
    size = "bf16-1x32769x64-normal-s0-contiguous"
    assert failed == {(size, "grad_shift"), (size, "grad_scale")}, v.summary()


SPLIT_KEYS = 8192  # keys past which the attention below partitions them
PARTITION = 512
SIZE_CASE = "bf16-1x8x2x1x8193x64-normal-s0-contiguous"


def _attention(split_keys):
    """fp32 attention (no mask: the cases below), rounded once; past ``split_keys`` keys,
    partitions of PARTITION keys whose fp32 outputs are combined by their log-sum-exps, which
    are stored in the input dtype (the fault: about one bit at 17 partitions)."""
    def attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
        h = q.shape[-3]
        kf = k.float().repeat_interleave(h // k.shape[-3], dim=-3)
        vf = v.float().repeat_interleave(h // v.shape[-3], dim=-3)
        sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        logits = (q.float() @ kf.transpose(-2, -1)) * sc
        if k.shape[-2] <= split_keys:
            return (torch.softmax(logits, -1) @ vf).to(q.dtype)
        outs, lses = [], []
        for c0 in range(0, k.shape[-2], PARTITION):
            part = logits[..., c0:c0 + PARTITION]
            lse = torch.logsumexp(part, -1, keepdim=True)
            outs.append(torch.exp(part - lse) @ vf[..., c0:c0 + PARTITION, :])
            lses.append(lse.to(q.dtype).float())
        w = torch.softmax(torch.stack(lses), 0)
        return (w * torch.stack(outs)).sum(0).to(q.dtype)
    return attention


def _verify_attention(split_keys, root, **kw):
    ids = [SIZE_CASE, "bf16-1x6x2x129x127x80-uniform-s0-contiguous"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return verify("sdpa", Kernel("sdpa", "mine", _attention(split_keys), forward_only=True),
                      device="cpu", case_ids=ids, golden_dir=root, **kw)


def test_attention_combining_partitions_in_bf16_beyond_8k_keys(tmp_path):
    """The probe reaches the partitioned path, and the bit it loses there regresses against the
    golden of the one-pass kernel. The baseline rule alone lets it pass (40.6 dB against the
    baseline's 46.8: within 4 x its error + the bf16 floor): a fresh kernel with no golden is
    judged by that rule only (docs/grid-audit.md)."""
    assert _verify_attention(math.inf, tmp_path, refresh=True).passed
    v = _verify_attention(SPLIT_KEYS, tmp_path)
    got = {r.case_id: r for r in v.records}
    small = got["bf16-1x6x2x129x127x80-uniform-s0-contiguous"]
    assert (small.status, small.golden) == ("passed", "same"), v.summary()
    size = got[SIZE_CASE]
    assert (size.status, size.golden) == ("failed", "regressed"), v.summary()
    assert size.kernel_stats.sqnr_db < size.baseline_stats.sqnr_db - 3  # a bit lost, not noise
