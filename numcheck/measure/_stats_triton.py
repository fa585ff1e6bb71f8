"""The fused CUDA pass of ``stats.error_stats``: one Triton kernel reads out and ref once.

Each program takes a run of whole error-stats blocks (about 4096 elements) and leaves, per
block, the signal and noise energies and the compared count, and for itself the partial sums,
maxima, counts and a histogram of the ULP distances; torch then sums those few partials. No
per-element temporary exists, and one launch replaces the chunked path's dozens per 2^20
elements.

The arithmetic is the general route's (``stats._general_totals``): the reference rounded to fmt
as ``formats.round_with_ordinal`` does it (exponent from the float64 bits, an exact power-of-two
scaling, floor, ties to even, the format's own overflow: inf, or NaN where fmt has none); out's
ordinal, class and value decoded from its bits. It serves outputs stored in fmt itself (bf16,
fp16, fp32, fp8).

stats loads this module through numcheck.measure.backend, only for a CUDA tensor; the tests
run the kernel on CPU tensors under TRITON_INTERPRET=1 (set before this module is imported).
The format constants the kernel reads are numcheck.formats' (as tl.constexpr globals).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from numcheck import formats

# The integer view the kernel reads each output dtype through: it decodes the bits itself (the
# same for every format, and no fp8 conversion to depend on).
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
         torch.float8_e4m3fn: torch.int8, torch.float8_e5m2: torch.int8}
_PER_PROGRAM = 4096  # elements a program takes (whole blocks): partials stay ~1/1000 of the input
_NF, _NI = 9, 7  # partial floats and ints a program leaves (see totals; lanes last)
# Elements a program handles at once: each holds ~30 float64 values live, and 256 lanes on 4
# warps (Triton's default) are 2 a thread, within the 255 registers a thread has.
_LANES = 256
# float64's layout, from which the kernel takes exponents and builds powers of two (globals a
# Triton kernel reads must be constexpr): fraction bits and bias
_F64_MBITS = tl.constexpr(formats.get("fp64").mbits)
_F64_BIAS = tl.constexpr(formats.get("fp64").bias)


def supports(dtype: torch.dtype, f: formats.Format) -> bool:
    """Outputs stored in fmt itself, among the dtypes the kernel reads."""
    return f.torch is dtype and dtype in _BITS


def totals(out: torch.Tensor, ref: torch.Tensor, f: formats.Format, grid, top: int):
    """(block sums (3, nb) float64 [signal, noise, compared], float64 [sum out*ref, sum out^2,
    sum err, sum |err|, sum |ref|, max |err|, sum u, sum d, sum d toward larger magnitude], int64
    [compared, NaN, inf, mismatch, max u, nonzero u], histogram of min(u, top) over the compared
    elements) of contiguous ``out`` and float64 ``ref`` on one device. ``grid`` = (B, R, C, tr,
    tc): the tensor as B stacks of R x C, tiled by tr x tc blocks (blocks.grid)."""
    b, r, c, tr, tc = grid
    rt, ct = triton.cdiv(r, tr), triton.cdiv(c, tc)
    nb = b * rt * ct
    per = max(1, _PER_PROGRAM // (tr * tc))  # blocks a program takes
    programs = triton.cdiv(nb, per)
    blk = torch.empty(3, nb, dtype=torch.float64, device=out.device)
    fpart = torch.empty(programs, _NF, dtype=torch.float64, device=out.device)
    ipart = torch.empty(programs, _NI, dtype=torch.int64, device=out.device)
    hist = torch.zeros(top + 1, dtype=torch.int64, device=out.device)
    _kernel[(programs,)](out.view(_BITS[out.dtype]), ref, blk, fpart, ipart, hist, nb, r, c, rt,
                         ct, tr, tc, per, **constants(out.dtype, f, top, tc),
                         enable_fp_fusion=False)  # products rounded before summed, as on CPU
    floats = fpart.sum(dim=0)
    floats[5] = fpart[:, 5].amax()
    counts = ipart.sum(dim=0)
    counts[4] = ipart[:, 4].amax()
    hist[0] -= counts[6] - counts[0]  # lanes that were not compared elements counted as u = 0
    return blk, floats, counts[:6], hist


def constants(dtype: torch.dtype, f: formats.Format, top: int, tc: int) -> dict:
    """The kernel's compile-time constants for outputs of ``dtype`` measured in ``f``."""
    return dict(EMIN=f.emin, EMAX=f.emax, MBITS=f.mbits, MAX_SIG=f.max_significand,
                MAX_ORD=f.max_ordinal, HAS_INF=f.has_inf,
                WIDTH=8 * dtype.itemsize, TOP=top, NBINS=triton.next_power_of_2(top + 1),
                NF=_NF, NI=_NI, BLOCK_C=max(16, min(_LANES, triton.next_power_of_2(tc))))


@triton.jit
def _pow2(k):
    """2.0**k, exact, from the bits (k in [-1022, 1023])."""
    return ((k + _F64_BIAS) << _F64_MBITS).to(tl.float64, bitcast=True)


@triton.jit
def _kernel(bits_ptr, ref_ptr, blk_ptr, fpart_ptr, ipart_ptr, hist_ptr, nb, R, C, rt, ct, tr, tc,
            per, EMIN: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
            MAX_SIG: tl.constexpr, MAX_ORD: tl.constexpr, HAS_INF: tl.constexpr,
            WIDTH: tl.constexpr, TOP: tl.constexpr,
            NBINS: tl.constexpr, NF: tl.constexpr, NI: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    lane = tl.arange(0, BLOCK_C)
    zf = tl.zeros([BLOCK_C], dtype=tl.float64)
    zi = tl.zeros([BLOCK_C], dtype=tl.int64)
    s_dot, s_o2, s_err, s_abs, s_absref, m_abs, s_u, s_d, s_mag = zf, zf, zf, zf, zf, zf, zf, zf, zf
    n_cmp, n_nan, n_inf, n_mis, m_u, n_nz, n_lanes = zi, zi, zi, zi, zi, zi, zi
    hist = tl.zeros([NBINS], dtype=tl.int32)
    for g in range(0, per):
        blk = pid * per + g
        if blk < nb:
            stack, bi, bj = blk // (rt * ct), blk // ct % rt, blk % ct
            rows = tl.minimum(tr, R - bi * tr)
            cols = tl.minimum(tc, C - bj * tc)
            b_sig, b_err, b_cnt = zf, zf, zi
            for i in range(0, rows):
                base = ((stack * R + bi * tr + i).to(tl.int64) * C + bj * tc)
                for j in range(0, cols, BLOCK_C):
                    m = j + lane < cols
                    ob = tl.load(bits_ptr + base + j + lane, mask=m, other=0)
                    r = tl.load(ref_ptr + base + j + lane, mask=m, other=0.0)
                    # out from its bits: ordinal, class (0 finite, 1 NaN, 2 +inf, 3 -inf), value
                    wide = ob.to(tl.int64)  # sign-extended
                    neg = wide < 0
                    mag = wide & ((1 << (WIDTH - 1)) - 1)
                    o_ord = tl.where(neg, -mag, mag)
                    if HAS_INF:  # inf is the code after max's; the codes beyond are NaN
                        oc = tl.where(mag <= MAX_ORD, 0,
                                      tl.where(mag == MAX_ORD + 1, tl.where(neg, 3, 2), 1))
                    else:
                        oc = tl.where(mag <= MAX_ORD, 0, 1)
                    k = mag >> MBITS  # binade, 0 for subnormals (no implicit bit)
                    sig = tl.where(k > 0, (mag & ((1 << MBITS) - 1)) + (1 << MBITS), mag)
                    o = sig.to(tl.float64) * _pow2(tl.maximum(k, 1) - 1 + EMIN - MBITS)
                    o = tl.where(neg, -o, o)
                    # ref rounded to nearest-even on fmt's grid (formats.round_with_ordinal)
                    r_nan = r != r
                    r_inf = tl.abs(r) == float("inf")
                    a = tl.where(r_nan | r_inf, 0.0, tl.abs(r))
                    e = (a.to(tl.int64, bitcast=True) >> _F64_MBITS) - _F64_BIAS
                    e = tl.minimum(tl.maximum(e, EMIN), EMAX + 1)
                    q = a * _pow2(MBITS - e)  # exact: a power-of-two scaling
                    low = tl.floor(q)
                    frac = q - low  # exact while q < 2^53 (beyond, it overflows anyway)
                    odd = low - 2.0 * tl.floor(low * 0.5) == 1.0
                    steps = low + tl.where((frac > 0.5) | ((frac == 0.5) & odd), 1.0, 0.0)
                    st = steps.to(tl.int64)
                    over = (e > EMAX) | ((e == EMAX) & (st > MAX_SIG))
                    r_ord = (e - EMIN) * (1 << MBITS) + st
                    r_ord = tl.where(r < 0, -r_ord, r_ord)
                    if HAS_INF:
                        rc = tl.where(r_nan, 1, tl.where(over | r_inf, tl.where(r > 0, 2, 3), 0))
                    else:
                        rc = tl.where(r_nan | over | r_inf, 1, 0)
                    fin = m & (oc == 0) & (rc == 0)
                    err = tl.where(fin, o - r, 0.0)
                    sig = tl.where(fin, r, 0.0)
                    ov = tl.where(fin, o, 0.0)
                    d = tl.where(fin, o_ord - r_ord, 0)
                    u = tl.abs(d)
                    b_sig += sig * sig
                    b_err += err * err
                    b_cnt += fin.to(tl.int64)
                    s_dot += ov * sig
                    s_o2 += ov * ov
                    s_err += err
                    s_abs += tl.abs(err)
                    s_absref += tl.abs(sig)
                    m_abs = tl.maximum(m_abs, tl.abs(err))
                    s_u += u.to(tl.float64)
                    s_d += d.to(tl.float64)
                    s_mag += tl.where(r > 0, d, tl.where(r < 0, -d, 0)).to(tl.float64)
                    n_cmp += fin.to(tl.int64)
                    n_nan += (m & (oc == 1)).to(tl.int64)
                    n_inf += (m & (oc >= 2)).to(tl.int64)
                    n_mis += (m & (oc != rc)).to(tl.int64)
                    m_u = tl.maximum(m_u, u)
                    n_nz += (u != 0).to(tl.int64)
                    n_lanes += 1
                    hist += tl.histogram(tl.minimum(u, TOP).to(tl.int32), NBINS)
            tl.store(blk_ptr + blk, tl.sum(b_sig, axis=0))
            tl.store(blk_ptr + nb + blk, tl.sum(b_err, axis=0))
            tl.store(blk_ptr + 2 * nb + blk, tl.sum(b_cnt, axis=0).to(tl.float64))
    fp = fpart_ptr + pid * NF
    tl.store(fp + 0, tl.sum(s_dot, axis=0))
    tl.store(fp + 1, tl.sum(s_o2, axis=0))
    tl.store(fp + 2, tl.sum(s_err, axis=0))
    tl.store(fp + 3, tl.sum(s_abs, axis=0))
    tl.store(fp + 4, tl.sum(s_absref, axis=0))
    tl.store(fp + 5, tl.max(m_abs, axis=0))
    tl.store(fp + 6, tl.sum(s_u, axis=0))
    tl.store(fp + 7, tl.sum(s_d, axis=0))
    tl.store(fp + 8, tl.sum(s_mag, axis=0))
    ip = ipart_ptr + pid * NI
    tl.store(ip + 0, tl.sum(n_cmp, axis=0))
    tl.store(ip + 1, tl.sum(n_nan, axis=0))
    tl.store(ip + 2, tl.sum(n_inf, axis=0))
    tl.store(ip + 3, tl.sum(n_mis, axis=0))
    tl.store(ip + 4, tl.max(m_u, axis=0))
    tl.store(ip + 5, tl.sum(n_nz, axis=0))
    tl.store(ip + 6, tl.sum(n_lanes, axis=0))
    bins = tl.arange(0, NBINS)
    tl.atomic_add(hist_ptr + bins, hist.to(tl.int64), mask=bins <= TOP)
