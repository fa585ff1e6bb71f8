"""Tensor digests (``watch(..., digests=True)``; docs/telemetry.md, "Where two runs part
ways"): 48 bits of a tensor's bit pattern, computed on its device from integer sums whose
value does not depend on the order of the reduction, so equal bits give equal digests on any
device, thread count or kernel that computes it, and different bits differ but by chance
(about 2^-31 for a random change).

The tensor's bits as non-negative integers b (its same-width integer view; 8-byte elements as
two 4-byte halves), laid out as a (rows, cols) matrix over its last dim in logical order:

    D_c = sum_j w_j (sum_i b_ij mod P)  mod P,    D_r = sum_i v_i (sum_j b_ij mod P)  mod P

with P = 2^31 - 1 (a prime) and weights w, v drawn from a fixed multiplicative sequence, so
that a value moved within its row changes D_c and one moved within its column changes D_r;
the digest is D_c * 2^17 + (D_r mod 2^17) (< 2^48: exact in the float64 rows). No int64 sum
overflows: b < 2^32, each sum has fewer than 2^31 terms, each product < 2^62. A row's calls
in one step merge by summing their digests (fields.FIELDS' rule; exact up to 32 calls).
"""
from __future__ import annotations

import torch

P = (1 << 31) - 1
# multipliers of the column and row weight sequences (Knuth's golden-ratio hash; any odd
# constants would do): w_j = (j A + 1) mod P + 1, v_i = (i B + 1) mod P + 1
A, B = 2654435761, 40503
LOW = 1 << 17   # D_r's part of the digest: D_c * LOW + D_r mod LOW
_VIEWS = {1: (torch.uint8, 0xFF), 2: (torch.int16, 0xFFFF), 4: (torch.int32, 0xFFFFFFFF),
          8: (torch.int32, 0xFFFFFFFF)}


def _weights(n: int, mult: int, device) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.int64, device=device) * mult + 1) % P + 1


def digest(t: torch.Tensor) -> torch.Tensor:
    """The 48-bit digest of t's bits, a 0-d float64 tensor on t's device (no host sync): the
    torch route (about ten ops), the CUDA route and the reference of the compiled CPU pass
    (numcheck/telemetry/_fields_numba.py ``digest``, one loop)."""
    x = t.detach()
    if x.dim() == 0:
        x = x.reshape(1)
    x = x.contiguous()
    size = x.element_size()
    if size not in _VIEWS:
        raise ValueError(f"digest: {x.dtype} has {size}-byte elements")
    view, mask = _VIEWS[size]
    b = x.view(view).to(torch.int64) & mask
    cols = b.shape[-1]
    b = b.reshape(-1, cols)
    dc = ((b.sum(0) % P) * _weights(cols, A, b.device) % P).sum() % P
    dr = ((b.sum(1) % P) * _weights(b.shape[0], B, b.device) % P).sum() % P
    return (dc * LOW + dr % LOW).to(torch.float64)
