"""The fused CPU pass of ``stats.error_stats``: one compiled loop (numba) reads out and ref once.

One call takes one 2-D chunk (``blocks.chunks``) and leaves, per block of the chunk, the signal
and noise energies and the compared count; for the chunk, the partial sums, maxima and counts,
and it adds the ULP distances into a histogram. No chunk-sized temporary exists (three
512-element scratch arrays): the torch route makes ~35 passes over chunk-sized buffers, this one
makes one, so error_stats runs at a quarter of copy bandwidth and a small call costs
microseconds of work, not milliseconds.

The statistics are the general route's (``stats._general_totals``; numcheck.measure._stats_triton is the
same pass in Triton): the reference rounded to fmt's grid to nearest, ties to even, with the
format's own overflow (inf, or NaN where fmt has none), as ``formats.round_with_ordinal`` does,
here as an ordinal: its float64 exponent gives the binade, its fraction times 2^mbits the
position inside it, rounded to an integer by adding and subtracting 2^52; out's ordinal, class
and value are decoded from its bits. It serves outputs stored in fmt itself (bf16, fp16, fp32, fp8). Sums run in
element order in float64 (no fastmath: LLVM neither reassociates nor contracts them into FMAs),
so the figures do not depend on the CPU's vector width; ULP sums are exact int64.

stats loads this module through numcheck.measure.backend (the one selector); where numba is
missing or fails to compile, or the compiled passes are off (NUMCHECK_BACKEND=torch), stats
keeps its torch route (the same statistics, tested equal in tests/test_stats_fast.py). The
format constants the loop reads are numcheck.formats' (module globals: numba freezes them).
"""
from __future__ import annotations

import numpy as np
import torch

from numcheck import formats
from numcheck.measure.backend import njit
from numcheck.measure.host_memory import host_view

# The integer view the loop reads each output dtype through: it decodes the bits itself (the
# same for every format, and no fp8 conversion to depend on).
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
         torch.float8_e4m3fn: torch.int8, torch.float8_e5m2: torch.int8}
# 2.0**k for k in [-_P, _P]: the scalings of the subnormal steps and of the scalar
# classification pass for formats up to fp32 (exponents within +-(128 + 52)); no ldexp call.
_P = 200
_POW2 = np.array([float.fromhex(f"0x1p{k}") for k in range(-_P, _P + 1)], dtype=np.float64)
NF, NI = 6, 8  # the float and integer totals _loop leaves (its doc)
# float64's layout, which the loop decodes the reference from (numba freezes these globals into
# the compiled code): fraction bits, bias, exponent field, sign position, 1.0's bits
_F64 = formats.get("fp64")
_F64_MBITS, _F64_BIAS, _F64_EXP, _F64_FRAC = _F64.mbits, _F64.bias, _F64.exp_mask, _F64.frac_mask
_F64_SIGN = _F64.bits - 1
_F64_ONE = _F64.bias << _F64.mbits


def supports(dtype: torch.dtype, f: formats.Format) -> bool:
    """Outputs stored in fmt itself, among the dtypes the loop reads."""
    return f.torch is dtype and dtype in _BITS


def constants(dtype: torch.dtype, f: formats.Format) -> tuple[int, ...]:
    """(emin, emax, mbits, max_sig, max_ord, has_inf, width) of outputs of ``dtype`` in ``f``."""
    return (f.emin, f.emax, f.mbits, f.max_significand, f.max_ordinal, int(f.has_inf),
            8 * dtype.itemsize)


def chunk(o: torch.Tensor, r: torch.Tensor, tr: int, tc: int, k: tuple, blk: np.ndarray,
          hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Statistics of one 2-D chunk: ``o`` (stored in the format, rows contiguous), ``r`` float64.
    Writes the chunk's block sums into ``blk`` (3, blocks) and adds min(u, len(hist) - 1) into
    ``hist``; returns (floats (NF,), ints (NI,)) as _loop fills them."""
    bits = host_view(o.view(_BITS[o.dtype])).reshape(o.shape)  # one compile a width (~2 s)
    ref = host_view(r).reshape(r.shape)
    fl = np.zeros(NF, dtype=np.float64)
    it = np.zeros(NI, dtype=np.int64)
    _loop(bits, ref, ref.view(np.int64), tr, tc, *k, _POW2, blk, fl, it, hist)
    return fl, it


_M = float(1 << _F64_MBITS)  # 2^52: adding and subtracting it rounds to an integer (ties to even)
_S = 512  # elements per step of a block's row segment: the scratch arrays stay in L1


@njit(error_model="numpy")
def _loop(bits, ref, rbits, tr, tc, emin, emax, mbits, max_sig, max_ord, has_inf, width,
          pow2, blk, fl, it, hist):
    """One chunk. fl: [sum out*ref, sum out^2, sum err, sum |err|, sum |ref|, max |err|] over
    the compared elements (both finite); it: [compared, out NaN, out inf, class mismatch,
    max u, sum u, sum d, sum d * sign(ref)] (d: out's signed ULP distance from the rounded
    reference, u = |d|). blk[:, b] += [ref^2, err^2, 1] per block b; hist[min(u, top)] += 1.

    Each row segment of a block goes in steps of _S elements through two loops: the first is
    branch-free integer and select arithmetic (LLVM vectorizes it), the second the float sums,
    in element order (no reassociation: the figures do not depend on the vector width). Values
    come from the bits: out's from its code, the reference's position on fmt's grid from its
    float64 exponent and fraction (rint: ties to even), so no table, division or branch runs
    per element. Non-finite elements (rare) are classified by a scalar pass over their step."""
    rows, cols = bits.shape
    ct = (cols + tc - 1) // tc
    top = hist.shape[0] - 1
    low_mask = (1 << (width - 1)) - 1
    one = 1 << mbits
    frac_mask = one - 1
    fone = np.float64(one)
    sub = pow2[mbits - emin + _P]  # ref * sub: its position in fmt's subnormal steps
    ov = np.empty(_S)
    rv = np.empty(_S)
    dv = np.empty(_S, dtype=np.int64)
    s_dot = s_o2 = s_err = s_abs = s_absref = m_abs = 0.0
    n_cmp = n_nan = n_inf = n_mis = m_u = s_u = s_d = s_mag = 0
    c1 = c2 = c3 = 0
    for i in range(rows):
        brow = (i // tr) * ct
        for bj in range(ct):
            b_sig = b_err = 0.0
            b_cnt = 0
            for j0 in range(bj * tc, min(bj * tc + tc, cols), _S):
                n = min(_S, min(bj * tc + tc, cols) - j0)
                fin_n = 0
                step_u = 0
                ob, rr, rbb = bits[i, j0:j0 + n], ref[i, j0:j0 + n], rbits[i, j0:j0 + n]
                for t in range(n):
                    w = np.int64(ob[t])  # sign-extended
                    so = w >> 63  # -1 where out is negative
                    mag = w & low_mask
                    k = mag >> mbits  # binade, 0 for subnormals (no implicit bit)
                    sig = (mag & frac_mask) + one * (k > 0)
                    scale = np.int64((max(k, 1) - 1 + emin - mbits + _F64_BIAS)
                                     << _F64_MBITS).view(np.float64)
                    o = np.float64((sig ^ so) - so) * scale
                    r = rr[t]
                    rb = rbb[t]
                    e = ((rb >> _F64_MBITS) & _F64_EXP) - _F64_BIAS
                    x = np.int64((rb & _F64_FRAC) | _F64_ONE).view(np.float64)  # 1.fraction
                    # y + 2^52 - 2^52 rounds 0 <= y < 2^52 to an integer, ties to even
                    pn = (e - emin + 1) * one + np.int64(((x - 1.0) * fone + _M) - _M)
                    ps = np.int64((min(abs(r) * sub, _M) + _M) - _M)
                    rmag = pn if e >= emin else ps
                    fin = (mag <= max_ord) & (r - r == 0) & (rmag <= max_ord)
                    sr = rb >> _F64_SIGN
                    d = ((mag ^ so) - so) - ((rmag ^ sr) - sr)
                    d = d if fin else 0
                    ov[t] = o if fin else 0.0
                    rv[t] = r if fin else 0.0
                    dv[t] = d
                    fin_n += fin
                    u = abs(d)
                    s_u += u
                    s_d += d
                    s_mag += d * (np.int64(r > 0) - np.int64(r < 0))
                    step_u = max(step_u, u)
                    c1 += u == 1
                    c2 += u == 2
                    c3 += u > 2
                for t in range(n):  # the float sums, in element order
                    o = ov[t]
                    r = rv[t]
                    err = o - r
                    b_sig += r * r
                    b_err += err * err
                    s_dot += o * r
                    s_o2 += o * o
                    s_err += err
                    ae = abs(err)
                    s_abs += ae
                    s_absref += abs(r)
                    m_abs = max(m_abs, ae)
                if step_u > 2:
                    for t in range(n):
                        u = abs(dv[t])
                        if u > 2:
                            hist[min(u, top)] += 1
                m_u = max(m_u, step_u)
                b_cnt += fin_n
                if fin_n < n:  # non-finite values (rare): their classes
                    for t in range(n):
                        nn, ni, nm = _classes(bits[i, j0 + t], ref[i, j0 + t], emin, emax, mbits,
                                              max_sig, max_ord, has_inf, low_mask, pow2)
                        n_nan += nn
                        n_inf += ni
                        n_mis += nm
            b = brow + bj
            blk[0, b] += b_sig
            blk[1, b] += b_err
            blk[2, b] += b_cnt
            n_cmp += b_cnt
    hist[0] += n_cmp - c1 - c2 - c3  # not compared: d = 0 there, never counted in c1..c3
    hist[1] += c1
    hist[2] += c2
    fl[0], fl[1], fl[2], fl[3], fl[4], fl[5] = s_dot, s_o2, s_err, s_abs, s_absref, m_abs
    it[0], it[1], it[2], it[3], it[4], it[5], it[6], it[7] = (n_cmp, n_nan, n_inf, n_mis, m_u,
                                                                s_u, s_d, s_mag)


@njit(inline="always")
def _classes(code, r, emin, emax, mbits, max_sig, max_ord, has_inf, low_mask, pow2):
    """(out is NaN, out is inf, the classes differ) for one element, the reference rounded to
    nearest-even with fmt's own overflow (formats.round_with_ordinal's classes)."""
    w = np.int64(code)
    mag = w & low_mask
    oc = 0  # 0 finite, 1 NaN, 2 +inf, 3 -inf: inf is the code after max's, the ones beyond NaN
    if mag > max_ord:
        oc = (3 if w < 0 else 2) if has_inf and mag == max_ord + 1 else 1
    rc = 0
    if r != r:
        rc = 1
    elif r - r != 0:
        rc = (2 if r > 0 else 3) if has_inf else 1
    else:
        a = abs(r)
        e = ((np.float64(a).view(np.int64) >> _F64_MBITS) & _F64_EXP) - _F64_BIAS
        e = min(max(e, emin), emax + 1)
        st = np.int64(np.rint(a * pow2[mbits - e + _P]))
        if e > emax or (e == emax and st > max_sig):
            rc = (2 if r > 0 else 3) if has_inf else 1
    return np.int64(oc == 1), np.int64(oc >= 2), np.int64(oc != rc)
