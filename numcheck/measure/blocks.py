"""The block geometry of ``error_stats``: a tensor as B stacks of R x C tiled by tr x tc blocks
(``blocks``: None, a length along the last dim, or a (rows, cols) tile over the last two), the
chunks of whole tiles the passes walk, and sums over blocks (numcheck.verdicts.conditioning's
per-block bound uses the same blocks)."""
from __future__ import annotations

import math

import torch

from numcheck.errors import UsageError

DEFAULT_BLOCK = 1024  # flat block size when the caller gives none: 1 bad element in 1024 costs >= 30 dB
# Elements per CPU step (one worker thread's job). The fast route makes ~35 torch calls a chunk,
# each a pass over its ~20 bytes an element of buffers and ~3 us of dispatch: 2^17 measured
# fastest on an AMD EPYC (512 KiB L2 a core), 8.4 ns an element on one thread, 9.7 at 2^18;
# under load 11.1 against 13.0 at 2^16.
CHUNK = 1 << 17
# The CUDA fallback (no Triton): each step is a few dozen kernel launches and host syncs; 2^17
# measured 150x slower than assert_close on an H200 and 2^21 24x, but 2^21 peaked at 209 MiB
# (> 3x a 64 MiB output); 2^20 halves the temporaries (~15 x 8 MiB).
CHUNK_CUDA = 1 << 20

def block_spec(shape: torch.Size, blocks) -> tuple[int, int, int, int, int]:
    """(B, R, C, tr, tc): the tensor seen as B stacks of R x C, tiled by tr x tc blocks."""
    n = math.prod(shape)
    if blocks is None:
        return 1, 1, n, 1, DEFAULT_BLOCK
    if isinstance(blocks, int):
        blocks = (blocks,)
    blocks = tuple(int(b) for b in blocks)
    if not 1 <= len(blocks) <= 2 or min(blocks) < 1:
        raise UsageError(f"blocks={blocks!r}: give a positive block length along the last dim "
                         "(e.g. 32 for MX) or a (rows, cols) tile over the last two dims")
    if len(shape) < len(blocks):
        raise UsageError(f"blocks={blocks!r} needs a tensor of at least {len(blocks)} dims, "
                         f"got shape {tuple(shape)}")
    c = shape[-1] if shape else 1
    if len(blocks) == 1:
        return 1, n // max(c, 1), c, 1, blocks[0]
    r = shape[-2]
    return n // max(r * c, 1), r, c, blocks[0], blocks[1]


def grid(shape: torch.Size, blocks) -> tuple[int, int, int, int, int]:
    """block_spec with stacks folded into rows where no tile is split (fewer, bigger chunks)."""
    b, r, c, tr, tc = block_spec(shape, blocks)
    if tr == 1 or r % tr == 0:
        r, b = r * b, 1
    return b, r, c, tr, tc


def n_blocks(shape: torch.Size, blocks) -> int:
    b, r, c, tr, tc = grid(shape, blocks)
    return b * -(-r // tr) * -(-c // tc)


def tile_sizes(shape: torch.Size, blocks) -> torch.Tensor:
    """Elements per block (ragged edge blocks are smaller), flat, in block order; float64."""
    b, r, c, tr, tc = grid(shape, blocks)
    rows = torch.full((-(-r // tr),), float(tr), dtype=torch.float64)
    cols = torch.full((-(-c // tc),), float(tc), dtype=torch.float64)
    rows[-1:] = r - (rows.numel() - 1) * tr
    cols[-1:] = c - (cols.numel() - 1) * tc
    return torch.outer(rows, cols).flatten().repeat(b)


def chunks(out: torch.Tensor, ref: torch.Tensor, blocks, chunk: int | None = None):
    """Yield (out_chunk, ref_chunk, (tr, tc)): 2-D views (copies if strided).

    Chunks hold whole tiles and come in row-major tile order, so the tiles of consecutive chunks
    concatenate to the row-major tile grid.
    """
    if out.numel() == 0:
        return
    b, r, c, tr, tc = grid(out.shape, blocks)
    o3, r3 = out.reshape(b, r, c), ref.reshape(b, r, c)
    chunk = chunk or (CHUNK_CUDA if out.device.type == "cuda" else CHUNK)
    if c * tr <= chunk:
        cstep = c
        rstep = max(tr, (chunk // max(c, 1)) // tr * tr)
    else:
        cstep, rstep = max(tc, chunk // tr // tc * tc), tr
    for i in range(b):
        for r0 in range(0, r, rstep):
            for c0 in range(0, c, cstep):
                yield (o3[i, r0:r0 + rstep, c0:c0 + cstep], r3[i, r0:r0 + rstep, c0:c0 + cstep],
                       (tr, tc))


def tile_sums(x: torch.Tensor, tr: int, tc: int) -> torch.Tensor:
    """Sum x (rows x cols) over tr x tc tiles, zero-padding ragged edges; flat, row-major."""
    rows, cols = x.shape
    pr, pc = -rows % tr, -cols % tc
    if pr or pc:
        x = torch.nn.functional.pad(x, (0, pc, 0, pr))
    return x.reshape((rows + pr) // tr, tr, (cols + pc) // tc, tc).sum(dim=(1, 3)).flatten()


def tile_sumsq(x: torch.Tensor, tr: int, tc: int, out: torch.Tensor) -> None:
    """out[:] = sums of x^2 over x's tr x tc tiles, without a temporary where the tiles fit."""
    rows, cols = x.shape
    if rows % tr or cols % tc:
        out.copy_(tile_sums(x * x, tr, tc))
        return
    if tr == 1 and x.is_contiguous():  # one reduced dim: 4x less dispatch than two
        torch.linalg.vector_norm(x.view(-1, tc), dim=-1, out=out)
    else:
        torch.linalg.vector_norm(x.view(rows // tr, tr, cols // tc, tc), dim=(1, 3),
                                 out=out.view(rows // tr, cols // tc))
    out.square_()


def block_sums(x: torch.Tensor, blocks=None) -> torch.Tensor:
    """Sums of ``x`` over the blocks ``error_stats`` uses (``blocks`` as there), flat and in
    the same row-major order as ``ErrorStats.worst_block``."""
    b, r, c, tr, tc = grid(x.shape, blocks)
    x3 = x.reshape(b, r, c)
    return torch.cat([tile_sums(x3[i], tr, tc) for i in range(b)]) if b else x.new_zeros(0)


def block_index(shape: torch.Size, blocks=None) -> torch.Tensor:
    """The flat block index (``block_sums`` order) of every element of a tensor of ``shape``."""
    b, r, c, tr, tc = grid(shape, blocks)
    rt, ct = -(-r // tr), -(-c // tc)
    rows = torch.arange(r).div(tr, rounding_mode="floor").view(1, r, 1)
    cols = torch.arange(c).div(tc, rounding_mode="floor").view(1, 1, c)
    stack = torch.arange(b).view(b, 1, 1)
    return (stack * rt * ct + rows * ct + cols).reshape(shape)
