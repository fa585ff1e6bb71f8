"""numcheck's built-in Triton kernels (the ``triton`` kernels of their ops; docs/triton.md).

Fused RMSNorm, forward and backward: one program per row, the row in one block of the next
power of two (masked tail), loads in the input dtypes, arithmetic in fp32, stores in the
output dtypes. The weight gradient is reduced in two steps (a per-row fp32 partial in the
kernel, their sum over rows on the host), as fused RMSNorm kernels do.

Written for the interpreter too: reductions are trees of builtins (``_tree_sum``), not the
library's ``tl.sum`` (a ``@triton.jit`` helper that only runs interpreted when TRITON_INTERPRET
was set before triton's import) nor ``tl.reduce`` with a combine function (which the
interpreter runs element by element in Python). On the CPU numcheck loads this file a second
time with the interpreter switched on for its decorators only (numcheck.kernels.triton_interp.module);
on CUDA it is imported as it is and compiled.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tree_sum(x, LOG2: tl.constexpr):
    """Sum of a power-of-two block as a pairwise tree of builtins (adjacent pairs first): shape
    (1,). The interpreter runs tl.reduce with a combine function one element at a time in
    Python (0.19 s for 2048 elements); reshape/split/add are whole-array numpy operations."""
    for _ in tl.static_range(LOG2):
        a, b = tl.split(tl.reshape(x, (x.shape[0] // 2, 2)))
        x = a + b
    return x


@triton.jit
def _rms_fwd(X, W, Y, R, D, sxr, sxc, syr, eps, BLOCK: tl.constexpr, LOG2: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    x = tl.load(X + row * sxr + cols * sxc, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(_tree_sum(x * x, LOG2) / D + eps)  # shape (1,)
    tl.store(R + row + tl.arange(0, 1), r)
    tl.store(Y + row * syr + cols, (x * r * w).to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _rms_bwd(G, X, W, R, DX, DWP, D, sgr, sxr, sxc, sdr, BLOCK: tl.constexpr,
             LOG2: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    x = tl.load(X + row * sxr + cols * sxc, mask=inside, other=0.0).to(tl.float32)
    g = tl.load(G + row * sgr + cols, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    r = tl.load(R + row + tl.arange(0, 1))
    xhat = x * r  # normalized first: g * x would underflow on tiny rows before r scales it up
    gw = g * w
    c = _tree_sum(gw * xhat, LOG2) / D
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
        block = triton.next_power_of_2(d)
        _rms_fwd[(n,)](x2, weight, y, r, d, x2.stride(0), x2.stride(1), y.stride(0), eps,
                       BLOCK=block, LOG2=block.bit_length() - 1)
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
        log2 = block.bit_length() - 1
        _rms_fwd[(n,)](x2, weight, scratch, r, d, x2.stride(0), x2.stride(1),
                       scratch.stride(0), eps, BLOCK=block, LOG2=log2)
        _rms_bwd[(n,)](g2, x2, weight, r, dx, dwp, d, g2.stride(0), x2.stride(0),
                       x2.stride(1), dx.stride(0), BLOCK=block, LOG2=log2)
    return dx.reshape(x.shape), dwp.sum(0).to(weight.dtype)


@triton.jit
def _tree_max(x, LOG2: tl.constexpr):
    """Maximum of a power-of-two block, as _tree_sum (shape (1,)); NaN handled by the caller."""
    for _ in tl.static_range(LOG2):
        a, b = tl.split(tl.reshape(x, (x.shape[0] // 2, 2)))
        x = tl.maximum(a, b)
    return x


@triton.jit
def _fp8_row_qdq(X, Y, D, sxr, sxc, syr, FMAX: tl.constexpr, E5M2: tl.constexpr,
                 POW2: tl.constexpr, BLOCK: tl.constexpr, LOG2: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    x = tl.load(X + row * sxr + cols * sxc, mask=inside, other=0.0).to(tl.float32)
    a = tl.abs(x)
    amax = _tree_max(a, LOG2)
    bad = _tree_sum(tl.where(a != a, 1.0, 0.0), LOG2) + tl.where(amax == float("inf"), 1.0, 0.0)
    scale = tl.minimum(FMAX / amax, 3.4028234663852886e38)  # fp32 division, clamped (spec)
    scale = tl.where(amax == 0.0, 1.0, scale)
    if POW2:  # rounded down to a power of two: the exponent bits alone (scale >= 2^-126 here)
        scale = (scale.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    scale = tl.where(bad > 0.0, float("nan"), scale)  # NaN or inf in the row: all NaN (spec)
    q = x * scale  # the fp32 product, then one RNE rounding to fp8, saturating
    if E5M2:
        c = q.to(tl.float8e5).to(tl.float32)
    else:
        c = q.to(tl.float8e4nv).to(tl.float32)
    tl.store(Y + row * syr + cols, (c / scale).to(Y.dtype.element_ty), mask=inside)


def fp8_qdq(x: torch.Tensor, fmt: str = "e4m3", granularity: str = "row", dim: int = -1,
            pow2_scale: bool = False) -> torch.Tensor:
    """FP8 current scaling, one scale per row (granularity "row" along the last dim): the
    numcheck.quant.fp8 spec step by step (fp32 amax, fp32 scale = max / amax, fp32 product,
    one RNE rounding to fmt with saturation, fp32 dequantization, one rounding to x's dtype)."""
    if granularity != "row" or dim not in (-1, x.dim() - 1) or fmt not in ("e4m3", "e5m2"):
        raise ValueError(f"triton fp8_qdq: row scaling along the last dim of e4m3/e5m2 only "
                         f"(got {fmt}, {granularity}, dim={dim})")
    x2 = _rows(x)
    n, d = x2.shape
    y = torch.empty((n, d), dtype=x.dtype, device=x.device)
    if n:
        block = triton.next_power_of_2(d)
        fmax = 57344.0 if fmt == "e5m2" else 448.0  # e5m2 / e4m3 largest finite values
        _fp8_row_qdq[(n,)](x2, y, d, x2.stride(0), x2.stride(1), y.stride(0), FMAX=fmax,
                           E5M2=fmt == "e5m2", POW2=bool(pow2_scale), BLOCK=block,
                           LOG2=block.bit_length() - 1)
    return y.reshape(x.shape)


@triton.jit
def _softmax_online(X, Y, D, sxr, sxc, syr, TILE: tl.constexpr, LOG2: tl.constexpr):
    """One pass for the running max and the rescaled running sum over tiles of the row (online
    softmax), a second for the outputs."""
    row = tl.program_id(0)
    m = tl.full((1,), float("-inf"), tl.float32)
    s = tl.full((1,), 0.0, tl.float32)  # (tl.zeros is a library @jit helper)
    for t0 in range(0, D, TILE):
        cols = t0 + tl.arange(0, TILE)
        x = tl.load(X + row * sxr + cols * sxc, mask=cols < D, other=float("-inf"))
        x = x.to(tl.float32)
        m_new = tl.maximum(m, _tree_max(x, LOG2))
        s = s * tl.exp(m - m_new) + _tree_sum(tl.exp(x - m_new), LOG2)
        m = m_new
    for t0 in range(0, D, TILE):
        cols = t0 + tl.arange(0, TILE)
        x = tl.load(X + row * sxr + cols * sxc, mask=cols < D, other=float("-inf"))
        y = tl.exp(x.to(tl.float32) - m) / s
        tl.store(Y + row * syr + cols, y.to(Y.dtype.element_ty), mask=cols < D)


_SOFTMAX_TILE = 128  # rows longer than a tile take the online path (rescaled partial sums)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(x, dim) by an online (single-pass statistics) kernel over tiles of 128."""
    xt = x.movedim(dim, -1)
    x2 = xt.reshape(-1, xt.shape[-1])
    n, d = x2.shape
    y = torch.empty((n, d), dtype=x.dtype, device=x.device)
    if n and d:
        tile = min(triton.next_power_of_2(d), _SOFTMAX_TILE)
        _softmax_online[(n,)](x2, y, d, x2.stride(0), x2.stride(1), y.stride(0), TILE=tile,
                              LOG2=tile.bit_length() - 1)
    return y.reshape(xt.shape).movedim(-1, dim)


@triton.jit
def _pow2(n):
    """2^n in fp32 for integer tensors n in [-126, 127], from the exponent bits (exact)."""
    return ((n + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _floor_log2(a):
    """floor(log2(a)) of positive fp32 a, subnormals included (scaled by 2^64 first: exact),
    and whether a is not a power of two."""
    sub = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) == 0
    b = tl.where(sub, a * 18446744073709551616.0, a).to(tl.int32, bitcast=True)
    return ((b >> 23) & 0xFF) - 127 - tl.where(sub, 64, 0), (b & 0x7FFFFF) != 0


@triton.jit
def _mx_qdq(X, Y, D, sxr, sxc, syr, EMAX: tl.constexpr, FMAX: tl.constexpr,
            E5M2: tl.constexpr, RCEIL: tl.constexpr, BLOCK: tl.constexpr, LOG2: tl.constexpr):
    """One program per MX block of BLOCK elements along the row (numcheck.quant.mx's spec)."""
    pid = tl.program_id(0)
    nb = D // BLOCK
    row, blk = pid // nb, pid % nb
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row * sxr + cols * sxc).to(tl.float32)
    a = tl.abs(x)
    bad = _tree_sum(tl.where((a != a) | (a == float("inf")), 1.0, 0.0), LOG2)
    amax = _tree_max(tl.where(a != a, 0.0, a), LOG2)
    if RCEIL:  # the fp32 quotient amax / max_elem rounded up to a power of two
        q = amax / FMAX
        fl, frac = _floor_log2(q)
        e = fl + tl.where(frac, 1, 0)
        e = tl.where(q == 0.0, -127, e)
    else:  # OCP MX v1.0 Algorithm 1
        fl, frac = _floor_log2(amax)
        e = tl.where(amax == 0.0, -127, fl - EMAX)
    e = tl.minimum(tl.maximum(e, -127), 127)  # E8M0's range
    ne = -e
    v = x * _pow2(ne >> 1) * _pow2(ne - (ne >> 1))  # x / 2^e, exact: two normal powers of two
    if E5M2:
        c = v.to(tl.float8e5).to(tl.float32)
    else:
        c = v.to(tl.float8e4nv).to(tl.float32)
    y = c * _pow2(e >> 1) * _pow2(e - (e >> 1))
    y = tl.where(bad > 0.0, float("nan"), y)  # NaN or Inf in the block: the NaN scale
    tl.store(Y + row * syr + cols, y.to(Y.dtype.element_ty))


def mx_qdq(x: torch.Tensor, elem: str = "e4m3", block: int = 32, scale_mode: str = "floor",
           dim: int = -1) -> torch.Tensor:
    """MXFP8 fake quantization (e4m3/e5m2 elements, E8M0 scales, floor or rceil) along the last
    dim, as numcheck.quant.mx specifies it."""
    if elem not in ("e4m3", "e5m2") or dim not in (-1, x.dim() - 1) or \
            scale_mode not in ("floor", "rceil") or x.shape[-1] % block or block & (block - 1):
        raise ValueError(f"triton mx_qdq: e4m3/e5m2 along the last dim in power-of-two blocks "
                         f"dividing it (got {elem}, {scale_mode}, block={block}, dim={dim})")
    x2 = _rows(x)
    n, d = x2.shape
    y = torch.empty((n, d), dtype=x.dtype, device=x.device)
    if n and d:
        emax, fmax = (15, 57344.0) if elem == "e5m2" else (8, 448.0)
        _mx_qdq[(n * (d // block),)](x2, y, d, x2.stride(0), x2.stride(1), y.stride(0),
                                     EMAX=emax, FMAX=fmax, E5M2=elem == "e5m2",
                                     RCEIL=scale_mode == "rceil", BLOCK=block,
                                     LOG2=block.bit_length() - 1)
    return y.reshape(x.shape)
