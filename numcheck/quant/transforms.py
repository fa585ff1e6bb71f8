"""Transforms used by low-precision recipes: stochastic rounding and the random Hadamard transform.

* ``sr_qdq(x, fmt, generator)``: each element rounded stochastically to ``fmt`` (numcheck's own
  ``round_to(..., rounding="sr")``: up with probability frac(|x| / quantum), unbiased), result in
  x's dtype. No scaling: compose with a quantizer's scale where one is needed.
* ``hadamard(x, block, dim, seed=None, generator=None)``: the random Hadamard transform (RHT)
  along ``dim`` in blocks of ``block`` (16, 32 or 128; the size along dim must be a multiple):
  each block v -> v Q, Q = H_n diag(s) / sqrt(n), H_n the Sylvester Hadamard matrix (+-1,
  H_2n = [[H, H], [H, -H]], symmetric, H H^T = n I) and s a random +-1 vector of length n drawn
  from ``generator`` or ``torch.Generator().manual_seed(seed)`` (seed 0 when neither is given).
  One sign vector serves every block. Q is orthogonal (Q Q^T = I), computed in float64; the
  result is float64 (values no longer lie on x's grid; round them yourself if you need to).
* ``inverse_hadamard``: v -> v Q^T with the same signs; round-trips to float64 roundoff.

For a GEMM A (M, K) B (K, N), hadamard(A, dim=-1) @ hadamard(B, dim=0) = A Q Q^T B = A B with the
same signs on both operands: the transform spreads outliers across a block before quantization
and cancels in the product (QuaRot, NVIDIA's NVFP4 recipe applies it with n = 16 to wgrad).
"""
from __future__ import annotations

import math

import torch

from numcheck import formats
from numcheck.errors import UsageError
from numcheck.quant.base import norm_dim, to64

HADAMARD_BLOCKS = (16, 32, 128)  # the block sizes recipes use (NVFP4 RHT: 16; QuaRot-style: 128)


def sr_qdq(x, fmt, generator) -> torch.Tensor:
    """Stochastic rounding of x to ``fmt`` (saturating), result in x's dtype."""
    if generator is None:
        raise UsageError("sr_qdq needs generator=torch.Generator(device=x.device).manual_seed(n):"
                         " stochastic rounding must be reproducible")
    r = formats.round_to(x, fmt, rounding="sr", saturate=True, generator=generator)
    dt = x.dtype if isinstance(x, torch.Tensor) else torch.float64
    if dt == torch.float64:
        return r
    return formats.round_to(r, dt, saturate=False).to(dt)


def sylvester(n: int) -> torch.Tensor:
    """The n x n Sylvester Hadamard matrix (float64, entries +-1); n a power of two."""
    if n < 1 or n & (n - 1):
        raise UsageError(f"block={n}: the Sylvester construction needs a power of two")
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rht_signs(n: int, seed: int | None = None,
              generator: torch.Generator | None = None) -> torch.Tensor:
    """n random signs (+-1.0, float64) from generator, else from seed (default 0)."""
    if generator is None:
        generator = torch.Generator().manual_seed(0 if seed is None else int(seed))
    elif seed is not None:
        raise UsageError("hadamard: pass seed or generator, not both")
    bits = torch.randint(0, 2, (n,), generator=generator, device=generator.device)
    return (1.0 - 2.0 * bits.to(torch.float64)).cpu()


def rht_matrix(n: int, signs: torch.Tensor) -> torch.Tensor:
    """Q = H_n diag(signs) / sqrt(n) (float64, orthogonal)."""
    return sylvester(n) * signs.to(torch.float64) / math.sqrt(n)


def _apply(x, block: int, dim: int, q: torch.Tensor) -> torch.Tensor:
    x64 = to64(x)
    d = norm_dim(x64, dim)
    t = x64.movedim(d, -1)
    n = t.shape[-1]
    if n % block:
        raise UsageError(f"hadamard: x has {n} elements along dim={dim}, not a multiple of "
                         f"block={block}; pad x along dim or choose a block that divides {n}")
    tb = t.reshape(*t.shape[:-1], n // block, block)
    return (tb @ q.to(tb.device)).reshape(t.shape).movedim(-1, d)


def _check_block(block: int) -> int:
    if block not in HADAMARD_BLOCKS:
        raise UsageError(f"block={block}: use one of {HADAMARD_BLOCKS}")
    return int(block)


def hadamard(x, block: int = 16, dim: int = -1, seed: int | None = None,
             generator: torch.Generator | None = None, signs: torch.Tensor | None = None):
    """Random Hadamard transform along ``dim`` in blocks (module doc); float64 result.
    ``signs`` (length block) overrides seed/generator, e.g. to reuse one draw for two operands."""
    n = _check_block(block)
    s = rht_signs(n, seed, generator) if signs is None else signs
    return _apply(x, n, dim, rht_matrix(n, s))


def inverse_hadamard(y, block: int = 16, dim: int = -1, seed: int | None = None,
                     generator: torch.Generator | None = None,
                     signs: torch.Tensor | None = None):
    """The inverse of ``hadamard`` with the same signs: y Q^T."""
    n = _check_block(block)
    s = rht_signs(n, seed, generator) if signs is None else signs
    return _apply(y, n, dim, rht_matrix(n, s).T)
