"""The textbook fp32 GEMM loop of ``ops.matmul.naive_gemm32``, compiled (numba) for CPU tensors.

Same arithmetic as the torch loop it replaces, so the same bits: for each output element the
recursion acc = p_0, acc = acc + p_k (k = 1 .. K-1) with every product a[i, k] * b[k, j] and
every sum rounded to fp32 separately (no fastmath: LLVM neither reassociates nor contracts them
into FMAs); the loop runs over j innermost, so it vectorizes across outputs without changing
any element's order of summation, on any vector width. The torch loop it replaces makes K
passes over an (M, N) buffer and records K autograd nodes; this one makes none (its backward is
``naive_gemm32`` of the upstream gradient, see ops.matmul).

ops.matmul imports this module lazily; where numba is missing or fails, the torch loop runs
(tested equal bit for bit in tests/test_ops_matmul.py).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from numcheck.measure.backend import njit


@njit()
def _loop(a, b, out):  # pragma: no cover - compiled; tested through gemm()
    lead, m, k = a.shape
    n = b.shape[2]
    for t in range(lead):
        for i in range(m):
            row = out[t, i]
            if k == 0:
                row[:] = np.float32(0.0)
                continue
            a0 = a[t, i, 0]
            b0 = b[t, 0]
            for j in range(n):
                row[j] = a0 * b0[j]
            for kk in range(1, k):
                aik = a[t, i, kk]
                bk = b[t, kk]
                for j in range(n):
                    row[j] = row[j] + aik * bk[j]


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 C = A B of CPU tensors a (..., M, K), b (..., K, N) by the recursion over K; leading
    dims broadcast. No autograd (ops.matmul wraps it)."""
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    (m, k), n, t = a.shape[-2:], b.shape[-1], math.prod(lead)
    a3 = a.detach().float().expand(*lead, m, k).reshape(t, m, k).contiguous()
    b3 = b.detach().float().expand(*lead, k, n).reshape(t, k, n).contiguous()
    out = torch.empty((t, m, n), dtype=torch.float32)
    _loop(a3.numpy(), b3.numpy(), out.numpy())
    return out.reshape(*lead, m, n)
