"""numcheck's built-in Triton kernels (the ``triton`` kernels of their ops; docs/triton.md).

Fused RMSNorm, forward and backward: one program per row, the row in one block of the next
power of two (masked tail), loads in the input dtypes, arithmetic in fp32, stores in the
output dtypes. The weight gradient is reduced in two steps (a per-row fp32 partial in the
kernel, their sum over rows on the host), as fused RMSNorm kernels do.

Written for the interpreter too: reductions use ``tl.reduce`` with combine functions of this
module (the library's ``tl.sum`` is a ``@triton.jit`` helper that only runs interpreted when
TRITON_INTERPRET was set before triton's import). On the CPU numcheck loads this file a second
time with the interpreter switched on for its decorators only (numcheck._triton_interp.module);
on CUDA it is imported as it is and compiled.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _rms_fwd(X, W, Y, R, D, sxr, sxc, syr, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    x = tl.load(X + row * sxr + cols * sxc, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.reduce(x * x, 0, _add) / D + eps)
    tl.store(R + row, r)
    tl.store(Y + row * syr + cols, (x * r * w).to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _rms_bwd(G, X, W, R, DX, DWP, D, sgr, sxr, sxc, sdr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    x = tl.load(X + row * sxr + cols * sxc, mask=inside, other=0.0).to(tl.float32)
    g = tl.load(G + row * sgr + cols, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    r = tl.load(R + row)
    xhat = x * r  # normalized first: g * x would underflow on tiny rows before r scales it up
    gw = g * w
    c = tl.reduce(gw * xhat, 0, _add) / D
    tl.store(DX + row * sdr + cols, (r * (gw - xhat * c)).to(DX.dtype.element_ty), mask=inside)
    tl.store(DWP + row * D + cols, g * xhat, mask=inside)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])  # a view where the layout allows: the kernel takes strides


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x, weight, eps) over the last dim; returns x's dtype."""
    x2 = _rows(x)
    n, d = x2.shape
    y = torch.empty((n, d), dtype=x.dtype, device=x.device)
    r = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        _rms_fwd[(n,)](x2, weight, y, r, d, x2.stride(0), x2.stride(1), y.stride(0), eps,
                       BLOCK=triton.next_power_of_2(d))
    return y.reshape(x.shape)


def rms_norm_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight) of rms_norm for the upstream gradient; the row statistic is
    recomputed by the forward kernel."""
    x2, g2 = _rows(x), _rows(grad_out.contiguous())
    n, d = x2.shape
    r = torch.empty(n, dtype=torch.float32, device=x.device)
    scratch = torch.empty((n, d), dtype=x.dtype, device=x.device)
    dx = torch.empty((n, d), dtype=x.dtype, device=x.device)
    dwp = torch.empty((n, d), dtype=torch.float32, device=x.device)
    if n:
        block = triton.next_power_of_2(d)
        _rms_fwd[(n,)](x2, weight, scratch, r, d, x2.stride(0), x2.stride(1),
                       scratch.stride(0), eps, BLOCK=block)
        _rms_bwd[(n,)](g2, x2, weight, r, dx, dwp, d, g2.stride(0), x2.stride(0),
                       x2.stride(1), dx.stride(0), BLOCK=block)
    return dx.reshape(x.shape), dwp.sum(0).to(weight.dtype)
