"""The device pass of the telemetry's plain statistics: one Triton kernel launch per tensor.

``fields.tensor_stats`` (the torch route) takes ~18 kernel launches per tensor, and a device
vector built and merged per observation ~20 more: on a GPU a tiny model's step is bounded by
its launches, so that route cost ~12 kernel launches per launch of the step itself (measured
by counting aten ops: tiny_lm's training step 639, its watched step 8007). This pass gives the
same eight fields (``fields.PLAIN``) in one launch, with no host synchronization:

* each program reads a run of ``per`` elements through the integer view of their bits (the
  magnitude of an IEEE float orders like the integer it is: NaN ``mag > inf``, Inf
  ``mag == inf``, zero ``mag == 0``; amax and the smallest non-zero magnitude are integer
  max / min over the finite ones, decoded once from their bits: bitwise the torch route's);
* sum_sq: x^2 in float64 over the finite elements, a partial sum per lane, then Triton's tree
  over the lanes (a fixed order for a given launch: the same figure each run; the torch route
  sums in another order, within a relative 2 n 2^-53, the tolerance the tests check);
* it writes one row of the eight fields per program (``calls`` 1 in the first row, 0 in the
  others; ``n`` the program's own elements): rows that merge by fields.FIELDS' rules into the
  tensor's row, which ``Telemetry._flush`` does on the host after the step's one read-back.
  A tensor up to ``_PER`` elements takes one program (every tensor of the tiny models).

watch.py imports this module only for a CUDA tensor (and the tests, on CPU tensors, under
Triton's interpreter); where Triton is missing or the kernel fails, the torch route runs
(warned once), as numcheck._stats_cuda does for error_stats.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from . import fields

# dtype -> (integer view the kernel reads, +inf's bits, the magnitude mask)
_BITS = {
    torch.float64: (torch.int64, 0x7FF0000000000000, 0x7FFFFFFFFFFFFFFF),
    torch.float32: (torch.int32, 0x7F800000, 0x7FFFFFFF),
    torch.bfloat16: (torch.int16, 0x7F80, 0x7FFF),
    torch.float16: (torch.int16, 0x7C00, 0x7FFF),
}
_PER = 1 << 16     # elements per program at least: tensors up to it take one program
_PROGRAMS = 128    # at most, beyond that a program takes more (an H200 has 132 SMs)
_LANES = 1024      # elements a program reads at once (4 warps, 8 per thread)
NF = 8             # fields per row: fields.PLAIN


def handles(t: torch.Tensor) -> bool:
    """A dense tensor of a dtype the kernel reads, not a subclass, not negative (the integer
    view would read the stored bits, not the values). On CUDA, or any device under Triton's
    interpreter (the tests' CPU tensors): watch.py asks for this module by device."""
    return t.dtype in _BITS and type(t) in (torch.Tensor, torch.nn.Parameter) and \
        t.layout is torch.strided and not t.is_neg() and t.numel() > 0


def plain_rows(t: torch.Tensor) -> torch.Tensor:
    """(programs, 8) float64 rows on t's device, fields.PLAIN each, that merge by fields.FIELDS'
    rules into t's plain statistics (``handles(t)`` must hold)."""
    x = t.detach()
    if not x.is_contiguous():
        x = x.contiguous()
    n = x.numel()
    ibits, inf, mask = _BITS[x.dtype]
    per = max(_PER, triton.cdiv(triton.cdiv(n, _PROGRAMS), _LANES) * _LANES)
    programs = triton.cdiv(n, per)
    out = torch.empty(programs, NF, dtype=torch.float64, device=x.device)
    with _on(x):
        _plain[(programs,)](x.view(ibits).reshape(-1), out, n, per, **constants(x.dtype),
                            enable_fp_fusion=False)  # v * v rounded before summed, as on CPU
    return out


def _on(x: torch.Tensor):
    """Launch on x's device and its current stream: Triton launches on the current device's
    (a model spread over two GPUs: a kernel on the wrong stream reads before the writes)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def constants(dtype: torch.dtype) -> dict:
    """The kernel's compile-time constants for tensors of ``dtype``."""
    ibits, inf, mask = _BITS[dtype]
    return dict(INF=inf, MASK=mask, WIDTH=8 * dtype.itemsize, BF16=dtype is torch.bfloat16,
                LANES=_LANES)


@triton.jit
def _value(mag, INF: tl.constexpr, WIDTH: tl.constexpr, BF16: tl.constexpr):
    """float64 value of finite magnitude bits (int32 lanes for 16/32-bit formats, int64 for
    float64), decoded from the bits alone: exact, no float conversion routine involved (Triton's
    interpreter gets bf16 and subnormal conversions wrong, docs/findings.md)."""
    if WIDTH == 64:
        v = mag.to(tl.float64, bitcast=True)
    elif WIDTH == 32:
        v = mag.to(tl.float32, bitcast=True).to(tl.float64)
    elif BF16:
        v = (mag << 16).to(tl.float32, bitcast=True).to(tl.float64)
    else:  # fp16: binade and fraction; subnormals fraction x 2^-24
        e = mag >> 10
        f = (mag & 0x3FF).to(tl.float64)
        v = tl.where(e == 0, f, f + 1024.0) * \
            ((tl.maximum(e, 1) - 25 + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)
    return v


@triton.jit
def _plain(bits_ptr, out_ptr, n, per, INF: tl.constexpr, MASK: tl.constexpr,
           WIDTH: tl.constexpr, BF16: tl.constexpr, LANES: tl.constexpr):
    pid = tl.program_id(0)
    lane = tl.arange(0, LANES)
    start = pid.to(tl.int64) * per
    end = tl.minimum(start + per, n)
    if WIDTH == 64:
        zi = tl.zeros([LANES], dtype=tl.int64)
    else:
        zi = tl.zeros([LANES], dtype=tl.int32)
    n_nan = tl.zeros([LANES], dtype=tl.int32)
    n_inf = tl.zeros([LANES], dtype=tl.int32)
    n_zero = tl.zeros([LANES], dtype=tl.int32)
    mx = zi
    mn = zi + INF
    ss = tl.zeros([LANES], dtype=tl.float64)
    for j in range(start, end, LANES):
        idx = j + lane
        live = idx < end
        b = tl.load(bits_ptr + idx, mask=live, other=0)
        if WIDTH == 64:
            mag = b & MASK
        else:
            mag = b.to(tl.int32) & MASK  # 16-bit lanes widened: the mask clears the sign
        fin = mag < INF
        n_nan += (mag > INF).to(tl.int32)
        n_inf += (mag == INF).to(tl.int32)
        n_zero += (live & (mag == 0)).to(tl.int32)
        mx = tl.maximum(mx, tl.where(fin, mag, 0))
        mn = tl.minimum(mn, tl.where(live & fin & (mag > 0), mag, INF))
        v = tl.where(fin, _value(tl.where(fin, mag, 0), INF, WIDTH, BF16), 0.0)
        ss += v * v
    top = tl.max(mx, axis=0)
    low = tl.min(mn, axis=0)
    row = out_ptr + pid * 8
    tl.store(row + 0, tl.where(pid == 0, 1.0, 0.0).to(tl.float64))
    tl.store(row + 1, (end - start).to(tl.float64))
    tl.store(row + 2, tl.sum(n_nan.to(tl.int64), axis=0).to(tl.float64))
    tl.store(row + 3, tl.sum(n_inf.to(tl.int64), axis=0).to(tl.float64))
    tl.store(row + 4, tl.sum(n_zero.to(tl.int64), axis=0).to(tl.float64))
    tl.store(row + 5, _value(top, INF, WIDTH, BF16))
    tl.store(row + 6, tl.where(low < INF, _value(tl.where(low < INF, low, 0), INF, WIDTH, BF16),
                               float("inf")))
    tl.store(row + 7, tl.sum(ss, axis=0))


# ---- MX quantization statistics -------------------------------------------------------------
# fields.quant_stats for an MXFormat (numcheck/quant/mx.py), one launch: the fields a row holds,
# in this order (q_n, the element count, is the caller's: rows x cols)
MX_FIELDS = ("q_underflow", "q_saturated", "q_sig_sq", "q_err_sq", "blk_n", "blk_scaled_n",
             "blk_log2_min", "blk_log2_max", "blk_log2_sum", "blk_log2_sumsq", "blk_clip",
             "blk_scale_sat", "blk_sqnr_min_db", "blk_nan")
MX_INDEX = tuple(fields.INDEX[k] for k in MX_FIELDS)
_BLOCKS = 64          # MX blocks a program reads at once
_PER_BLOCKS = 2048    # blocks per program at least (64K elements of 32-blocks)


def mx_rows(t: torch.Tensor, fmt) -> torch.Tensor:
    """(programs, len(MX_FIELDS)) float64 rows on t's device that merge by fields.FIELDS' rules
    into ``fields.quant_stats(t, Quantizer(fmt))`` less q_n, for ``type(fmt) is MXFormat`` and
    ``handles(t)`` with t.dim() >= 1: t as (rows, last dim), blocks of fmt.block along the last
    dim, zero-padded as quant_stats pads (lanes past the last column read as zeros), each
    element through the reference's arithmetic (_quant_cpu._mx's, step for step: the E8M0
    exponent from the float64 bits of the block's finite amax, or the rceil quotient rounded to
    fp32; the element rounded as formats._rne does, |y| + c - c; a block holding NaN or Inf
    decodes to NaN). Counts and scale exponents are the reference's bit for bit; float sums
    differ by their order."""
    from .. import formats
    x = t.detach()
    if not x.is_contiguous():
        x = x.contiguous()
    cols = x.shape[-1]
    rows = x.numel() // cols
    k = int(fmt.block)
    nbr = triton.cdiv(cols, k)
    nblocks = rows * nbr
    per = max(_PER_BLOCKS, triton.cdiv(triton.cdiv(nblocks, _PROGRAMS), _BLOCKS) * _BLOCKS)
    programs = triton.cdiv(nblocks, per)
    out = torch.empty(programs, len(MX_FIELDS), dtype=torch.float64, device=x.device)
    f = formats.get(fmt.elem)
    ibits = _BITS[x.dtype][0]
    with _on(x):
        _mx[(programs,)](x.view(ibits).reshape(-1), out, cols, nbr, nblocks, per,
                         **constants(x.dtype), K=k, KP=triton.next_power_of_2(k),
                         BLOCKS=_BLOCKS, EMIN=f.emin, EMAX=f.emax, MBITS=f.mbits, FMAX=f.max,
                         THR=f.overflow_threshold, RCEIL=fmt.scale_mode == "rceil",
                         enable_fp_fusion=False)
    return out


@triton.jit
def _signed(raw, mag, INF: tl.constexpr, WIDTH: tl.constexpr, BF16: tl.constexpr):
    """float64 value of raw bits (NaN and Inf included; ``mag`` the magnitude bits as
    _plain widens them)."""
    if WIDTH == 64:
        v = raw.to(tl.float64, bitcast=True)
    elif WIDTH == 32:
        v = raw.to(tl.float32, bitcast=True).to(tl.float64)
    elif BF16:
        v = (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True).to(tl.float64)
    else:
        a = _value(tl.where(mag < INF, mag, 0), INF, WIDTH, BF16)
        a = tl.where(mag == INF, float("inf"), tl.where(mag > INF, float("nan"), a))
        v = tl.where(raw < 0, -a, a)
    return v


@triton.jit
def _pow2(k):
    """2.0**k, exact, from the bits (k in [-1022, 1023])."""
    return ((k + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _mx(bits_ptr, out_ptr, cols, nbr, nblocks, per, INF: tl.constexpr, MASK: tl.constexpr,
        WIDTH: tl.constexpr, BF16: tl.constexpr, LANES: tl.constexpr, K: tl.constexpr,
        KP: tl.constexpr, BLOCKS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
        MBITS: tl.constexpr, FMAX: tl.constexpr, THR: tl.constexpr, RCEIL: tl.constexpr):
    pid = tl.program_id(0)
    kk = tl.arange(0, KP)
    bi = tl.arange(0, BLOCKS)
    start = pid.to(tl.int64) * per
    end = tl.minimum(start + per, nblocks)
    zf = tl.zeros([BLOCKS], dtype=tl.float64)
    zi = tl.zeros([BLOCKS], dtype=tl.int64)
    und, nsat, blk, clip, ssat, bnan, rnan = zi, zi, zi, zi, zi, zi, zi
    sig, err, lsum, lsq = zf, zf, zf, zf
    lmin = zf + float("inf")
    lmax = zf - float("inf")
    rmin = zf + float("inf")
    for b0 in range(start, end, BLOCKS):
        b = b0 + bi
        bl = b < end
        row = b // nbr
        col = (b % nbr)[:, None] * K + kk[None, :]
        # a block's lanes past the last column are the reference's zero padding: elements
        # (value 0) of the block, which a NaN block decodes to NaN like the others
        m = bl[:, None] & (kk[None, :] < K)
        raw = tl.load(bits_ptr + row[:, None] * cols + col, mask=m & (col < cols), other=0)
        if WIDTH == 64:
            mag = raw & MASK
        else:
            mag = raw.to(tl.int32) & MASK
        fin = mag < INF
        v = _signed(raw, mag, INF, WIDTH, BF16)
        top_bits = tl.max(tl.where(fin, mag, 0), axis=1)
        amax = _value(top_bits, INF, WIDTH, BF16)
        bad = tl.max((m & (mag >= INF)).to(tl.int32), axis=1) > 0
        if RCEIL:
            qq = (amax / FMAX).to(tl.float32)
            qq = tl.where(qq == float("inf"), 3.4028234663852886e38, qq.to(tl.float64))
            qb = qq.to(tl.int64, bitcast=True)
            e = (qb >> 52) - 1023 + ((qb & 0xFFFFFFFFFFFFF) != 0).to(tl.int64)
        else:
            e = (amax.to(tl.int64, bitcast=True) >> 52) - 1023 - EMAX
        e = tl.minimum(tl.maximum(e, -127), 127)
        e = tl.where(bad, 128, e)
        s = _pow2(e)
        y = v * _pow2(-e)[:, None]
        # formats._rne onto the element grid: c = 2^(exponent - MBITS), |y| + c - c
        ya = tl.abs(y)
        be = ya.to(tl.int64, bitcast=True) >> 52
        be = tl.minimum(tl.maximum(be, EMIN + 1023), EMAX + 1024)
        c = ((be + 52 - MBITS) << 52).to(tl.float64, bitcast=True)
        r = (ya + c) - c
        r = tl.where(r > FMAX, FMAX, r)
        q = tl.where(y < 0, -r, r) * s[:, None]
        q = tl.where(bad[:, None], float("nan"), q)
        sat = m & (tl.abs(v) > THR * s[:, None])
        fv = m & fin
        sq = tl.where(fv, v * v, 0.0)
        d = q - v
        eq = tl.where(fv, d * d, 0.0)
        bsig = tl.sum(sq, axis=1)
        berr = tl.sum(eq, axis=1)
        und += tl.sum((m & (v != 0) & (q == 0)).to(tl.int64), axis=1)
        bsat = tl.sum(sat.to(tl.int64), axis=1)
        nsat += bsat
        sig += bsig
        err += berr
        live = bl & (amax > 0) & (bad == 0)
        ef = e.to(tl.float64)
        blk += live.to(tl.int64)
        lmin = tl.minimum(lmin, tl.where(live, ef, float("inf")))
        lmax = tl.maximum(lmax, tl.where(live, ef, -float("inf")))
        lsum += tl.where(live, ef, 0.0)
        lsq += tl.where(live, ef * ef, 0.0)
        clip += (live & (bsat > 0)).to(tl.int64)
        ssat += (live & ((e >= 127) | (e <= -127))).to(tl.int64)
        ratio = bsig / berr   # berr 0 -> +inf, as the reference
        rnan += (live & (ratio != ratio)).to(tl.int64)
        rmin = tl.minimum(rmin, tl.where(live & (ratio == ratio), ratio, float("inf")))
        bnan += (bl & bad).to(tl.int64)
    o = out_ptr + pid * 14
    n_live = tl.sum(blk, axis=0).to(tl.float64)
    tl.store(o + 0, tl.sum(und, axis=0).to(tl.float64))
    tl.store(o + 1, tl.sum(nsat, axis=0).to(tl.float64))
    tl.store(o + 2, tl.sum(sig, axis=0))
    tl.store(o + 3, tl.sum(err, axis=0))
    tl.store(o + 4, n_live)
    tl.store(o + 5, n_live)   # every live MX block has a finite power-of-two scale
    tl.store(o + 6, tl.min(lmin, axis=0))
    tl.store(o + 7, tl.max(lmax, axis=0))
    tl.store(o + 8, tl.sum(lsum, axis=0))
    tl.store(o + 9, tl.sum(lsq, axis=0))
    tl.store(o + 10, tl.sum(clip, axis=0).to(tl.float64))
    tl.store(o + 11, tl.sum(ssat, axis=0).to(tl.float64))
    worst = tl.min(rmin, axis=0)
    # 10 log10 of the smallest ratio (monotone: the worst block's dB); NaN as soon as one is
    db = tl.log2(worst) * 3.0102999566398120
    tl.store(o + 12, tl.where(tl.sum(rnan, axis=0) > 0, float("nan"), db))
    tl.store(o + 13, tl.sum(bnan, axis=0).to(tl.float64))
