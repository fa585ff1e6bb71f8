"""Error statistics of a kernel's output against its FP64 reference: ``error_stats`` -> ErrorStats.

One chunked pass over the pair keeps peak extra memory bounded (about 2^17 elements of float64
temporaries at a time, plus one small record per block), on CPU and CUDA alike.

Definitions (each also in ErrorStats' field docs):

* The reference is rounded to ``fmt`` (round-to-nearest-even, the format's own overflow) only to
  classify non-finite values (DESIGN rule 3) and to measure ULPs; every other statistic compares
  ``out`` with the exact float64 ``ref``.
* Elements where ``out`` or the rounded reference is non-finite are left out of every finite
  statistic; ``nonfinite_mismatch`` counts those whose class differs (NaN by class, inf by sign).
* ``p99_ulp`` is the nearest-rank 99th percentile (the smallest u with at least 99% of compared
  elements at or below u), exact, through integer histograms (a radix select), never a sort.
* A zero reference gives defined values, never NaN: sqnr_db = +inf and rel_l2 = 0 when the
  error is zero too, else -inf and +inf; cosine = 1 when both vectors are zero, 0 when only one
  is; bias = 0 when there is no error, else +-inf.
"""
from __future__ import annotations

import math

import torch

from . import formats
from .errors import UsageError
from .errorstats import ErrorStats

DEFAULT_BLOCK = 1024  # flat block size when the caller gives none: 1 bad element in 1024 costs >= 30 dB
BLOCK_ENERGY_EPS = 1e-4  # low-energy floor: blocks 40 dB below the median block are judged at that level
_CHUNK = 1 << 17  # elements per step on CPU: float64 temporaries stay cache-sized
# On CUDA each step is a few dozen kernel launches and host syncs: 2^17 measured 150x slower
# than assert_close on an H200 and 2^21 24x, but 2^21 peaked at 209 MiB (> 3x a 64 MiB
# output); 2^20 halves the temporaries (~15 x 8 MiB).
_CHUNK_CUDA = 1 << 20
_DIGIT = 16  # radix-select digit width for the exact p99


def _block_spec(shape: torch.Size, blocks) -> tuple[int, int, int, int, int]:
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


def _grid(shape: torch.Size, blocks) -> tuple[int, int, int, int, int]:
    """_block_spec with stacks folded into rows where no tile is split (fewer, bigger chunks)."""
    b, r, c, tr, tc = _block_spec(shape, blocks)
    if tr == 1 or r % tr == 0:
        r, b = r * b, 1
    return b, r, c, tr, tc


def _n_blocks(shape: torch.Size, blocks) -> int:
    b, r, c, tr, tc = _grid(shape, blocks)
    return b * -(-r // tr) * -(-c // tc)


def _chunk_size(device: torch.device) -> int:
    return _CHUNK_CUDA if device.type == "cuda" else _CHUNK


def _chunks(out: torch.Tensor, ref: torch.Tensor, blocks):
    """Yield (out_chunk, ref_chunk, (tr, tc)): 2-D views (copies if strided).

    Chunks hold whole tiles and come in row-major tile order, so the tiles of consecutive chunks
    concatenate to the row-major tile grid.
    """
    if out.numel() == 0:
        return
    b, r, c, tr, tc = _grid(out.shape, blocks)
    o3, r3 = out.reshape(b, r, c), ref.reshape(b, r, c)
    chunk = _chunk_size(out.device)
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


def _tile_sums(x: torch.Tensor, tr: int, tc: int) -> torch.Tensor:
    """Sum x (rows x cols) over tr x tc tiles, zero-padding ragged edges; flat, row-major."""
    rows, cols = x.shape
    pr, pc = -rows % tr, -cols % tc
    if pr or pc:
        x = torch.nn.functional.pad(x, (0, pc, 0, pr))
    return x.reshape((rows + pr) // tr, tr, (cols + pc) // tc, tc).sum(dim=(1, 3)).flatten()


def block_sums(x: torch.Tensor, blocks=None) -> torch.Tensor:
    """Sums of ``x`` over the blocks ``error_stats`` uses (``blocks`` as there), flat and in
    the same row-major order as ``ErrorStats.worst_block``."""
    b, r, c, tr, tc = _grid(x.shape, blocks)
    x3 = x.reshape(b, r, c)
    return torch.cat([_tile_sums(x3[i], tr, tc) for i in range(b)]) if b else x.new_zeros(0)


def block_index(shape: torch.Size, blocks=None) -> torch.Tensor:
    """The flat block index (``block_sums`` order) of every element of a tensor of ``shape``."""
    b, r, c, tr, tc = _grid(shape, blocks)
    rt, ct = -(-r // tr), -(-c // tc)
    rows = torch.arange(r).div(tr, rounding_mode="floor").view(1, r, 1)
    cols = torch.arange(c).div(tc, rounding_mode="floor").view(1, 1, c)
    stack = torch.arange(b).view(b, 1, 1)
    return (stack * rt * ct + rows * ct + cols).reshape(shape)


def _out_ordinal(o: torch.Tensor, o64: torch.Tensor, f: formats.Format) -> torch.Tensor:
    """Signed ordinal of out's values; straight from the bits when out is stored in fmt itself."""
    if f.torch is o.dtype and o.dtype in _INT_VIEW:
        raw = o.view(_INT_VIEW[o.dtype]).to(torch.int64)
        return _apply_sign(raw & ((1 << (f.bits - 1)) - 1), raw)
    return formats.ordinal(torch.where(torch.isfinite(o64), o64, 0.0), f)


_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _apply_sign(mag: torch.Tensor, signed_bits: torch.Tensor) -> torch.Tensor:
    """mag negated where signed_bits is negative, branch-free (two's complement: (m ^ s) - s)."""
    s = signed_bits >> 63  # int64: -1 where negative, 0 elsewhere
    return (mag ^ s) - s


def _classes(v: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +inf, 3 -inf."""
    cls = torch.isnan(v).to(torch.int8)
    cls = torch.where(v == math.inf, 2, cls)
    return torch.where(v == -math.inf, 3, cls)


# Per-chunk partial sums, in this order (one device tensor per chunk, summed on the host once).
_SUMS = ("n_compared", "n_nan", "n_inf", "mismatch", "s", "e2", "dot", "o2", "abs", "err",
         "absref", "ulp", "sulp", "mulp")


def _chunk_fast(o, o64, r64, f, tr, tc):
    """The common case, all finite and the reference inside f's normal range: pure bit arithmetic.

    The reference's RNE ordinal comes from its float64 bits by the classic carry trick: add half a
    quantum minus one plus the kept LSB, shift the dropped bits out; carries walk into the
    exponent as they should. Valid because min_normal <= |ref| <= max in this chunk.
    """
    k = 52 - f.mbits
    bits = r64.view(torch.int64)
    mag_bits = bits & 0x7FFFFFFFFFFFFFFF
    r_ord = ((mag_bits + ((1 << (k - 1)) - 1) + ((mag_bits >> k) & 1)) >> k) \
        - ((1023 + f.emin - 1) << f.mbits)
    d = _out_ordinal(o, o64, f) - _apply_sign(r_ord, bits)
    u = d.abs()
    err = o64 - r64
    e2, s2 = err * err, r64 * r64
    abs_err = err.abs()
    n = o64.numel()
    sums = torch.stack([
        torch.tensor(float(n), dtype=torch.float64, device=o64.device), *(
            torch.zeros((), dtype=torch.float64, device=o64.device) for _ in range(3)),
        s2.sum(), e2.sum(), (o64 * r64).sum(), (o64 * o64).sum(), abs_err.sum(), err.sum(),
        r64.abs().sum(), u.sum().double(), d.sum().double(), _apply_sign(d, bits).sum().double()])
    ones = torch.ones_like(s2)
    return sums, abs_err.max(), u.max(), u, (_tile_sums(s2, tr, tc), _tile_sums(e2, tr, tc),
                                             _tile_sums(ones, tr, tc))


def _chunk_general(o, o64, r64, f, tr, tc):
    """Any values: non-finite classes, overflow, subnormals, zeros, off-format outputs."""
    if f.name == "fp64":
        rr, r_ord = r64, formats.ordinal(torch.where(torch.isfinite(r64), r64, 0.0), f)
    else:
        rr, r_ord = formats.round_with_ordinal(r64, f, "rne", False)
    oc, rc = _classes(o64), _classes(rr)
    fin = (oc == 0) & (rc == 0)
    err = torch.where(fin, o64 - r64, 0.0)
    sig = torch.where(fin, r64, 0.0)
    ov = torch.where(fin, o64, 0.0)
    e2, s2 = err * err, sig * sig
    abs_err = err.abs()
    d = torch.where(fin, _out_ordinal(o, o64, f) - r_ord, 0)
    u = d.abs()
    sums = torch.stack([t.double() for t in (
        fin.sum(), (oc == 1).sum(), (oc >= 2).sum(), (oc != rc).sum(), s2.sum(), e2.sum(),
        (ov * sig).sum(), (ov * ov).sum(), abs_err.sum(), err.sum(), sig.abs().sum(), u.sum(),
        d.sum(), (d * torch.sign(r64).to(torch.int64)).sum())])
    return sums, abs_err.max(), u.max(), u[fin], (
        _tile_sums(s2, tr, tc), _tile_sums(e2, tr, tc), _tile_sums(fin.to(torch.float64), tr, tc))


def _fast_ok(o64, r64, f) -> bool:
    if f.min_subnormal is None or f.name == "fp64" or r64.numel() == 0:
        return False
    a = r64.abs()
    lo, hi = float(a.min()), float(a.max())
    return f.min_normal <= lo and hi <= f.max and math.isfinite(float(o64.sum()))


def _histogram_rank(hist: torch.Tensor, rank: int) -> int:
    """Smallest bin index whose cumulative count reaches rank (1-based)."""
    return int(torch.searchsorted(torch.cumsum(hist, 0), rank))


def error_stats(out: torch.Tensor, ref: torch.Tensor, fmt=None, *, blocks=None) -> ErrorStats:
    """Error statistics of ``out`` against the float64 reference ``ref`` (same shape).

    fmt: the format whose ULPs are counted (default: out's dtype). Give it when out's values lie
    on another grid (a bf16 tensor holding e2m1 values). blocks: None (flat blocks of
    DEFAULT_BLOCK), an int k (k consecutive elements along the last dim: 32 for MX, the row length
    for norms) or (rows, cols) tiles over the last two dims (GEMM output tiles). Ragged edge
    blocks are kept, smaller.
    """
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise UsageError("error_stats(out, ref): both must be torch tensors")
    if out.shape != ref.shape:
        raise UsageError(f"error_stats: out has shape {tuple(out.shape)} but ref has "
                         f"{tuple(ref.shape)}; compare tensors of the same shape")
    if not out.is_floating_point():
        raise UsageError(f"error_stats: out has dtype {out.dtype}; give a floating-point output")
    f = formats.get(fmt if fmt is not None else out.dtype)
    ref = ref.to(out.device)

    dev = out.device
    sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=dev)
    max_abs = torch.zeros((), dtype=torch.float64, device=dev)
    max_ulp = torch.zeros((), dtype=torch.int64, device=dev)
    low_hist = torch.zeros(1 << _DIGIT, dtype=torch.int64, device=dev)
    # Block sums go into one buffer allocated up front: small tensors kept alive between the
    # chunks' temporaries fragment glibc's heap (measured: +380 MiB peak RSS at 2^25 elements).
    blk = torch.zeros(3, _n_blocks(out.shape, blocks), dtype=torch.float64, device=dev)
    at = 0
    for o, r, (tr, tc) in _chunks(out, ref, blocks):
        o64, r64 = o.to(torch.float64), r.to(torch.float64)
        chunk = _chunk_fast if _fast_ok(o64, r64, f) else _chunk_general
        part, mabs, mulp, u, blk_part = chunk(o, o64, r64, f, tr, tc)
        sums += part
        if u.numel():
            max_abs = torch.maximum(max_abs, mabs)
            max_ulp = torch.maximum(max_ulp, mulp)
            low_hist += torch.bincount(u.flatten().clamp(max=(1 << _DIGIT) - 1),
                                       minlength=1 << _DIGIT)
        k = blk_part[0].numel()
        for row, part_sums in zip(blk, blk_part):
            row[at:at + k] = part_sums
        at += k

    acc = dict(zip(_SUMS, sums.tolist()))
    nc_ = int(acc["n_compared"])
    mx_ulp = int(max_ulp)
    p99 = _p99(out, ref, f, blocks, low_hist, nc_, mx_ulp)
    mbs, worst, nblocks = _min_block_sqnr(*blk)
    s, e2 = acc["s"], acc["e2"]

    def mean(key: str) -> float:
        return acc[key] / nc_ if nc_ else 0.0

    return ErrorStats(
        fmt=f.name, n=out.numel(), n_compared=nc_, n_nan=int(acc["n_nan"]),
        n_inf=int(acc["n_inf"]), nonfinite_mismatch=int(acc["mismatch"]),
        max_abs=float(max_abs), mean_abs=mean("abs"),
        rel_l2=_ratio(math.sqrt(e2), math.sqrt(s)), sqnr_db=_sqnr_db(s, e2),
        cosine=_cosine(acc["dot"], acc["o2"], s),
        bias=_ratio(acc["err"], acc["absref"], signed=True),
        max_ulp=mx_ulp, mean_ulp=mean("ulp"), p99_ulp=p99, bias_ulp=mean("sulp"),
        mag_bias_ulp=mean("mulp"), min_block_sqnr_db=mbs, worst_block=worst, n_blocks=nblocks)


def _ratio(num: float, den: float, signed: bool = False) -> float:
    if den > 0:
        return num / den
    if num == 0:
        return 0.0
    return math.copysign(math.inf, num) if signed else math.inf


def _sqnr_db(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _cosine(dot: float, o2: float, r2: float) -> float:
    if o2 == 0 and r2 == 0:
        return 1.0
    if o2 == 0 or r2 == 0:
        return 0.0
    return max(-1.0, min(1.0, dot / math.sqrt(o2 * r2)))


def _min_block_sqnr(s: torch.Tensor, e: torch.Tensor, cnt: torch.Tensor) -> tuple[float, int, int]:
    """Worst per-element-normalized block SQNR, its flat block index, and the block count."""
    nblocks = int(s.numel())
    live = cnt > 0
    if not bool(live.any()):
        return math.inf, -1, nblocks
    per_s = torch.where(live, s / cnt.clamp(min=1), 0.0)
    per_e = torch.where(live, e / cnt.clamp(min=1), 0.0)
    # The floor follows the median block, not the mean: one block 1e6x louder would lift the
    # mean by 120 dB and hide every other block's error (the NVFP4 scale-flush case).
    floor = BLOCK_ENERGY_EPS * float(per_s[live].median())
    signal = per_s.clamp(min=floor)
    sq = torch.where(per_e > 0, 10.0 * torch.log10(signal / per_e.clamp(min=1e-300)), math.inf)
    sq = torch.where(live, sq, math.inf)
    worst = int(torch.argmin(sq))
    return float(sq[worst]), worst, nblocks


def _p99(out, ref, f, blocks, low_hist: torch.Tensor, n_compared: int, max_ulp: int) -> int:
    """Exact nearest-rank p99 of the ULP distances: radix select, 16 bits per pass.

    The first pass (in error_stats) already holds the exact histogram below 2^16 ULPs, which is
    where p99 lies unless the kernel is badly broken; only then are more passes made.
    """
    if n_compared == 0:
        return 0
    rank = math.ceil(0.99 * n_compared)
    if rank <= int(low_hist[:-1].sum()):
        return _histogram_rank(low_hist, rank)
    # Radix select, top digit first, over the tail u >= 2^16 - 1 (the clamped last bin).
    rank -= int(low_hist[:-1].sum())
    tail = (1 << _DIGIT) - 1
    prefix, shift = 0, max(_DIGIT, (max_ulp.bit_length() - 1) // _DIGIT * _DIGIT)
    while True:
        hist = torch.zeros(1 << _DIGIT, dtype=torch.int64, device=out.device)
        for u in _abs_ulps(out, ref, f, blocks):
            u = u[u >= tail]
            if shift + _DIGIT < 63:
                u = u[(u >> (shift + _DIGIT)) == prefix]
            hist += torch.bincount((u >> shift) & tail, minlength=1 << _DIGIT)
        digit = _histogram_rank(hist, rank)
        rank -= int(hist[:digit].sum())
        prefix = (prefix << _DIGIT) | digit
        if shift == 0:
            return prefix
        shift -= _DIGIT


def _abs_ulps(out, ref, f, blocks):
    """Re-derive |ULP| of the compared elements, chunk by chunk (for the rare extra passes)."""
    for o, r, (tr, tc) in _chunks(out, ref, blocks):
        yield _chunk_general(o, o.to(torch.float64), r.to(torch.float64), f, tr, tc)[3]
