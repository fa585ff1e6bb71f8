"""Size classes reach a kernel's second path (DESIGN rule 14): reductions over rows that a
kernel switches to low precision above 32768 rows fail on the 32769-row cases and only there.

Kernels written here for the class (issue 31: a widely used library shipped an RMSNorm backward
that did this; tests/test_ops_norms.py has that op's case): a linear whose weight and bias
gradients, and an adaLN whose shift and scale gradients, are summed row by row in bf16 on their
many-rows path, in fp32 otherwise.
"""
from __future__ import annotations

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
