"""``fields.quant_stats`` for CPU tensors in one compiled pass (numba): ``quant_fields``, and
``quant_fields_many`` for the recipes that quantize one tensor (read and widened once).

``fields.quant_stats`` runs numcheck's float64 reference quantizer (encode, decode, saturation)
and then ~40 more torch ops on the result; on the small tensors of a training step that is all
dispatch. Here one loop per format family reads the tensor's blocks and reproduces, element by
element, the reference's arithmetic: the same float64 operations in the same association, the
same fp32 roundings (a float64 -> float32 conversion is the hardware's RNE, which is what
``formats.round_to(v, "fp32", saturate=False)`` computes, overflow to inf and subnormals
included), and element rounding onto the format's grid the way ``formats._rne`` does it (|y|
plus and minus 2^(e - mbits + 52): float64 addition itself rounds to nearest even; no
fastmath, so LLVM neither reassociates nor contracts it). Hence the scales, codes, dequantized
values and every count are the reference's bit for bit; only the float sums differ, by their
order (the reference sums with torch's vectorized reductions, this loop block by block in four
fixed interleaved partial sums): q_sig_sq, q_err_sq and the block sums are within (n - 1) 2^-53
relative of the reference (recursive summation of n non-negative terms, both ways), the log2
sums also by libm's log2 against torch's (one ulp a term), blk_sqnr_min_db within 1e-10 dB
(tests/test_telemetry_quant_cpu.py checks exactly these bounds).

Semantics (DESIGN rule 10; the quantizers' docstrings in numcheck/quant/ say why each rule is
what it is), per family:

* MX (``MXFormat``): E8M0 exponent floor(log2 amax) - emax_elem (floor) or the fp32 quotient
  amax / max_elem rounded up to a power of two (rceil), amax over the block's finite elements,
  clamped to [-127, 127]; a NaN or Inf in a block makes it the NaN scale (exponent 128 in the
  statistics, as ``block_scales`` sees it) and dequantizes the block to NaN.
* NVFP4 (``NVFP4Format``, 1x16 or 16x16): tensor scales fp32(2688 / amax) (clamped to the fp32
  max) and fp32(amax / 2688), 1 and 1 for amax 0; block scale e4m3_rne_sat(block_amax * enc / 6);
  a block scale x tensor scale of 0 flushes the block to zeros; NaN anywhere -> NaN everywhere.
* FP8 current scaling (``FP8Format``: tensor, row, block128, block128x128): scale fp32(max /
  fp32(amax)) clamped to the fp32 max, 1 for amax 0, NaN for a non-finite amax, rounded down to a
  power of two with ``pow2_scale``; codes e4m3/e5m2(fp32(x * scale)); decoded fp32(code / scale).
* INT (``IntFormat``, per channel or per group): scale fp32(amax / qmax) (saturating), the
  smallest fp32 subnormal where that underflows, 1 for amax 0, NaN for a non-finite amax; codes
  clamp(rint(fp32(x / scale)), -qmax, qmax); decoded fp32(code * scale).

The log2 of a non-power-of-two decode scale (NVFP4, FP8 blocks) is what ``torch.log2`` gives,
which is not libm's log2 (it differs in the last bit on ~1e-4 of arguments): the loop finds the
smallest and largest scale exactly and ``torch.log2`` of those two gives ``blk_log2_min`` /
``blk_log2_max`` bit for bit (log2 is monotone); the sums of log2 use libm's.

Anything else (another QuantFormat, a dtype other than fp32/bf16/fp16/fp64, a tensor not on
the CPU) returns None: the caller runs ``fields.quant_stats``. Where numba is missing or fails to
compile, ``quant_fields`` (``quant_fields_many``) warns once and returns None from then on; with
the compiled passes switched off (numcheck.measure.backend: NUMCHECK_BACKEND=torch, or
``backend.force("torch")``) it returns None, silently.

The format constants the loops read are numcheck.formats' (module globals: numba freezes them).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from numcheck import formats
from numcheck.measure import backend
from numcheck.measure.host_memory import host_view
from numcheck.quant.fp8 import FP8Format
from numcheck.quant.intq import IntFormat
from numcheck.quant.mx import E8M0_EMAX, E8M0_EMIN, NAN_EXP, MXFormat
from numcheck.quant.nvfp4 import E2M1_MAX, NVFP4_BLOCK, TENSOR_RANGE, NVFP4Format

try:
    import numba
except ImportError as _exc:  # numba is a core dependency; a broken install still runs
    numba = None
    _MISSING = f"{type(_exc).__name__}: {_exc}"

    def _jit(f):
        return f
else:
    _MISSING = ""
    # error_model="numpy": a division by zero gives inf/NaN as in torch, never an exception
    _jit = backend.njit(error_model="numpy")

# Constants the loops read (numba freezes module globals into the compiled code).
_FP32_MAX = formats.get("fp32").max  # scales clamp here (DESIGN rule 10)
_FP32_TINY = formats.get("fp32").min_subnormal  # INT scale floor (numcheck/quant/intq.py)
_E4 = formats.get("e4m3")  # NVFP4 block scales
_E4_EMIN, _E4_EMAX, _E4_MBITS, _E4_MAX = _E4.emin, _E4.emax, _E4.mbits, _E4.max
_E2 = formats.get("e2m1")  # NVFP4 elements
_E2_EMIN, _E2_EMAX, _E2_MBITS, _E2_MAX = _E2.emin, _E2.emax, _E2.mbits, _E2.max
_E2_TOP = _E2.overflow_threshold  # 7: beyond it an element saturates
# float64's layout (the loops take exponents from its bits and build powers of two there)
_F64 = formats.get("fp64")
_F64_MBITS, _F64_BIAS = _F64.mbits, _F64.bias
_FRAC = _F64.frac_mask
_INF = math.inf
# 16-bit inputs, decoded from their bits (_widen): bf16 is float32's top half; fp16's fields
# (its smallest subnormal is 2^(emin - mbits) = 2^-24; a normal value is (2^mbits + fraction)
# x 2^(exponent - bias - mbits))
_BF16, _FP16 = formats.get("bf16"), formats.get("fp16")
_CODE16 = (1 << _BF16.bits) - 1  # a 16-bit code's bits (the int16 view sign-extends)
_BF16_SHIFT = formats.get("fp32").bits - _BF16.bits
_FP16_MBITS, _FP16_EXP, _FP16_FRAC = _FP16.mbits, _FP16.exp_mask, _FP16.frac_mask
_FP16_ONE = 1 << _FP16.mbits  # the implicit bit
_FP16_SUB = _FP16.emin - _FP16.mbits  # -24: the exponent of a subnormal's fraction
_FP16_NORM = _FP16.bias + _FP16.mbits  # 25: a normal's exponent field minus this scales it
_FP16_SIGN = _FP16.bits - 1
# NVFP4's table of log2(decode scale): keyed by the e4m3 block scale's float64 exponent and top
# e4m3-mbits fraction bits, from one below the smallest e4m3 subnormal's exponent (2^-9)
_E4_KEY_SHIFT = _F64_MBITS - _E4_MBITS
_E4_KEY0 = (_F64_BIAS + _E4_EMIN - _E4_MBITS - 1) << _E4_MBITS
_E4_CODES = 1 << _E4.bits  # at most one slot per e4m3 code

# The loops' result vector (float64; counts are integers far below 2^53, exact).
(R_UND, R_SAT, R_SIG, R_ERR, R_BLK, R_SCALED, R_SMIN, R_SMAX, R_LSUM, R_LSQ, R_CLIP, R_SSAT,
 R_SQNR, R_NAN) = range(14)
_NR = 14

_STATE: dict = {"broken": None}  # why the compiled route is off (str), or None


# ---- scalar helpers (LLVM inlines them) --------------------------------------------------------

@_jit
def _pow2(k):
    """2.0**k from the bits, k in [-1022, 1023] (formats.pow2)."""
    return np.int64((k + _F64_BIAS) << _F64_MBITS).view(np.float64)


@_jit
def _fp32(v):
    """v rounded once to fp32 (RNE, overflow to inf, subnormals kept), as float64."""
    return np.float64(np.float32(v))


@_jit
def _rne_sat(y, emin, emax, mbits, fmax):
    """formats.round_to(y, f, "rne", saturate=True) for a signed format with subnormals,
    formats._rne's arithmetic: |y| + c - c with c = 2^(e - mbits + 52), e the exponent clamped
    to [emin, emax + 1]; then clamped to max (inf too; NaN stays NaN) and the sign put back."""
    a = abs(y)
    b = np.float64(a).view(np.int64) >> _F64_MBITS
    b = min(max(b, emin + _F64_BIAS), emax + 1 + _F64_BIAS)
    c = np.int64((b + _F64_MBITS - mbits) << _F64_MBITS).view(np.float64)
    m = (a + c) - c
    if m > fmax:
        m = fmax
    return np.copysign(m, y)


@_jit
def _widen(src, kind, rp, cp):
    """The float64 (rp, cp) zero-padded copy of 2-D src: kind 0 a float array, 1 bf16 bits,
    2 fp16 bits (int16 views; decoded exactly)."""
    rows, cols = src.shape
    out = np.zeros((rp, cp))
    for i in range(rows):
        for j in range(cols):
            if kind == 0:
                out[i, j] = np.float64(src[i, j])
            elif kind == 1:
                u = np.int32((np.int32(src[i, j]) & _CODE16) << _BF16_SHIFT)
                out[i, j] = np.float64(u.view(np.float32))
            else:
                w = np.int64(src[i, j]) & _CODE16
                e = (w >> _FP16_MBITS) & _FP16_EXP
                m = w & _FP16_FRAC
                if e == _FP16_EXP:
                    v = np.inf if m == 0 else np.nan
                elif e == 0:
                    v = np.float64(m) * _pow2(_FP16_SUB)
                else:
                    v = np.float64(m + _FP16_ONE) * _pow2(e - _FP16_NORM)
                out[i, j] = -v if w >> _FP16_SIGN else v
    return out


@_jit
def _block_done(res, live, bad, scaled, s, log2s, at_end, clip, bsig, berr):
    """Fold one block into res as fields.quant_stats does: live blocks (amax > 0, no NaN or
    Inf) count,
    scaled ones (positive finite decode scale s, log2s its log2) give the log2 statistics and
    the extreme scales (exact comparisons on s: the caller takes torch.log2 of the two). The
    worst block's SQNR: the smallest ratio bsig / berr (10 log10 is monotone; _finish takes it
    once), NaN as soon as one is NaN (torch.amin propagates NaN)."""
    if bad:
        res[R_NAN] += 1.0
    if not live:
        return
    res[R_BLK] += 1.0
    if scaled:
        res[R_SCALED] += 1.0
        if s < res[R_SMIN]:
            res[R_SMIN] = s
        if s > res[R_SMAX]:
            res[R_SMAX] = s
        res[R_LSUM] += log2s
        res[R_LSQ] += log2s * log2s
    if clip:
        res[R_CLIP] += 1.0
    if at_end:
        res[R_SSAT] += 1.0
    r = bsig / berr  # berr 0 -> +inf, as the reference
    if r != r or res[R_SQNR] != res[R_SQNR]:
        res[R_SQNR] = np.nan
    elif r < res[R_SQNR]:
        res[R_SQNR] = r


@_jit
def _init():
    res = np.zeros(_NR)
    res[R_SMIN] = np.inf
    res[R_SMAX] = -np.inf
    res[R_SQNR] = np.inf
    return res


@_jit
def _finish(res, sig, err, und, nsat):
    res[R_SIG] = sig
    res[R_ERR] = err
    res[R_UND] = und
    res[R_SAT] = nsat
    res[R_SQNR] = 10.0 * np.log10(res[R_SQNR])  # the smallest ratio's dB (inf: none live)
    return res


_ABS = _F64.abs_mask  # the bits of |x|: ordered like the values for x >= 0
_INF_BITS = _F64.inf_bits  # +inf; every NaN's |x| bits lie above


@_jit
def _amax(xi, i0, i1, j0, j1):
    """max |x| over rows i0:i1, cols j0:j1 of xi (x's int64 view), NaN-propagating as
    torch.amax: an integer max of the magnitude bits (vectorizes; a NaN's lie above inf's)."""
    m = 0
    for i in range(i0, i1):
        seg = xi[i, j0:j1]  # a 1-D view: indices known non-negative, the loop vectorizes
        for j in range(j1 - j0):
            m = max(m, seg[j] & _ABS)
    return np.nan if m > _INF_BITS else np.int64(m).view(np.float64)


@_jit
def _element(v, q):
    """One element's share of the element statistics (fields.quant_stats), branch-free:
    (underflow: x != 0 and q == 0; x^2 and (q - x)^2 over finite x, else 0)."""
    fin = v - v == 0
    d = q - v
    return np.int64((v != 0) & (q == 0)), v * v if fin else 0.0, d * d if fin else 0.0


@_jit
def _sums(sq, eq, n):
    """(sum sq[:n], sum eq[:n]) in four interleaved partial sums (lane j mod 4, then
    (l0 + l1) + (l2 + l3)): a fixed order whatever the vector width, and four independent
    add chains instead of one (the loops before fill sq and eq branch-free: they vectorize)."""
    s0 = s1 = s2 = s3 = 0.0
    e0 = e1 = e2 = e3 = 0.0
    n4 = n - n % 4
    for j in range(0, n4, 4):
        s0 += sq[j]
        s1 += sq[j + 1]
        s2 += sq[j + 2]
        s3 += sq[j + 3]
        e0 += eq[j]
        e1 += eq[j + 1]
        e2 += eq[j + 2]
        e3 += eq[j + 3]
    for j in range(n4, n):
        s0 += sq[j]
        e0 += eq[j]
    return (s0 + s1) + (s2 + s3), (e0 + e1) + (e2 + e3)


# ---- MX -----------------------------------------------------------------------------------------

@_jit
def _mx(x, k, emin, emax, mbits, fmax, thr, rceil):
    """MX blocks of k along the rows of padded x (numcheck/quant/mx.py)."""
    res = _init()
    xi = x.view(np.int64)
    rows, cols = x.shape
    sq = np.empty(k)
    eq = np.empty(k)
    sig = err = 0.0
    und = nsat = 0
    for i in range(rows):
        for j0 in range(0, cols, k):
            fin_max = all_max = 0  # amax over the finite elements (mx_quantize)
            bits = xi[i, j0:j0 + k]
            for j in range(k):
                b = bits[j] & _ABS
                all_max = max(all_max, b)
                fin_max = max(fin_max, b if b < _INF_BITS else 0)
            amax = np.int64(fin_max).view(np.float64)
            bad = all_max >= _INF_BITS  # a NaN or an Inf: the NaN scale code, no scale
            if rceil:
                qq = _fp32(amax / fmax)
                if qq == np.inf:
                    qq = _FP32_MAX  # an overflowing quotient: fp32's max (mx._shared_exp)
                qb = np.float64(qq).view(np.int64)
                e = (qb >> _F64_MBITS) - _F64_BIAS + np.int64((qb & _FRAC) != 0)
            else:
                e = (fin_max >> _F64_MBITS) - _F64_BIAS - emax
            e = min(max(e, E8M0_EMIN), E8M0_EMAX)
            if bad:
                e = NAN_EXP
            inv = _pow2(-e)
            s = _pow2(e)
            top = thr * s  # saturation: beyond the top step at the block's scale
            nan_q = np.nan if bad else 1.0  # a NaN scale makes the block NaN
            bsat = 0
            seg = x[i, j0:j0 + k]  # a 1-D view: indices known non-negative, the loop vectorizes
            for t in range(k):
                v = seg[t]
                q = _rne_sat(v * inv, emin, emax, mbits, fmax) * s * nan_q
                bsat += abs(v) > top
                u, sq[t], eq[t] = _element(v, q)
                und += u
            bsig, berr = _sums(sq, eq, k)
            nsat += bsat
            sig += bsig
            err += berr
            live = amax > 0 and not bad
            _block_done(res, live, bad, True, s, np.float64(e),
                        e >= E8M0_EMAX or e <= E8M0_EMIN, bsat > 0, bsig, berr)
    return _finish(res, sig, err, und, nsat)


# ---- NVFP4 --------------------------------------------------------------------------------------

@_jit
def _nvfp4(x, tr, tc):
    """NVFP4 tiles of (tr, tc) (1 x 16 or 16 x 16) of padded x (numcheck/quant/nvfp4.py)."""
    res = _init()
    xi = x.view(np.int64)
    rows, cols = x.shape
    amax = _amax(xi, 0, rows, 0, cols)  # NaN anywhere makes it NaN (nvfp4_quantize)
    if amax == 0:
        enc = dec = 1.0
    else:
        enc = _fp32(TENSOR_RANGE / amax)
        if enc > _FP32_MAX:  # clamped to the fp32 max (NaN stays); the decode inverts it
            enc = _FP32_MAX
            dec = _fp32(1.0 / enc)
        else:
            dec = _fp32(amax / TENSOR_RANGE)
    nan_q = np.nan if dec != dec else 1.0  # NaN amax: everything NaN
    # log2(bs * dec) per e4m3 block scale bs (at most 2^7 positive values): a table filled as
    # they come, keyed by bs's float64 exponent and top 3 fraction bits (e4m3's 2^-9 .. 448
    # have float64 exponents 1014 .. 1031; _E4_KEY0 is 1013's first key)
    lg = np.full(_E4_CODES, np.nan)
    sq = np.empty(tc)
    eq = np.empty(tc)
    sig = err = 0.0
    und = nsat = 0
    for i0 in range(0, rows, tr):
        for j0 in range(0, cols, tc):
            bamax = _amax(xi, i0, i0 + tr, j0, j0 + tc)
            bad = not bamax < _INF  # a NaN or an Inf: no block scale to speak of
            # the e4m3 block scale, saturating, from (bamax * enc) / 6 as nvfp4_quantize has it
            bs = _rne_sat(bamax * enc / E2M1_MAX, _E4_EMIN, _E4_EMAX, _E4_MBITS, _E4_MAX)
            denom = bs * dec
            flushed = denom == 0
            div = 1.0 if flushed else denom
            top = _E2_TOP * denom  # e2m1's overflow threshold x the scale
            bsig = berr = 0.0
            bsat = 0
            for i in range(i0, i0 + tr):
                seg = x[i, j0:j0 + tc]
                for t in range(tc):
                    v = seg[t]
                    c = _rne_sat(v / div, _E2_EMIN, _E2_EMAX, _E2_MBITS, _E2_MAX)  # e2m1, sat.
                    # flushed (denom 0): c is finite, so q = +-0, as the reference's +-0 codes
                    # give (a NaN x stays NaN)
                    q = c * nan_q * denom
                    bsat += (denom > 0) & (abs(v) > top)
                    u, sq[t], eq[t] = _element(v, q)
                    und += u
                a2, d2 = _sums(sq, eq, tc)
                bsig += a2
                berr += d2
            nsat += bsat
            sig += bsig
            err += berr
            live = bamax > 0 and not bad
            scaled = live and denom > 0 and denom < np.inf
            l2 = 0.0
            if scaled:
                key = (np.float64(bs).view(np.int64) >> _E4_KEY_SHIFT) - _E4_KEY0
                l2 = lg[key]
                if l2 != l2:
                    l2 = lg[key] = np.log2(denom)
            _block_done(res, live, bad, scaled, denom, l2, denom == 0, bsat > 0, bsig, berr)
    return _finish(res, sig, err, und, nsat)


# ---- FP8 current scaling ------------------------------------------------------------------------

@_jit
def _fp8(x, tr, tc, emin, emax, mbits, fmax, thr, pow2, blocky):
    """FP8 groups of (tr, tc) tiles of x (the tensor, a row, 1 x 128, 128 x 128; the block
    ones padded) (numcheck/quant/fp8.py); block statistics where ``blocky``."""
    res = _init()
    xi = x.view(np.int64)
    rows, cols = x.shape
    sq = np.empty(tc)
    eq = np.empty(tc)
    sig = err = 0.0
    und = nsat = 0
    for i0 in range(0, rows, tr):
        for j0 in range(0, cols, tc):
            amax = _amax(xi, i0, i0 + tr, j0, j0 + tc)
            a32 = _fp32(amax)
            if a32 == 0:
                s = 1.0
            elif a32 - a32 != 0:  # inf or NaN
                s = np.nan
            else:
                s = _fp32(fmax / a32)
                if s > _FP32_MAX:  # saturate=True: clamped to the fp32 max
                    s = _FP32_MAX
                if pow2:
                    s = _pow2((np.float64(s).view(np.int64) >> _F64_MBITS) - _F64_BIAS)
            bsig = berr = 0.0
            bsat = 0
            for i in range(i0, i0 + tr):
                seg = x[i, j0:j0 + tc]
                for t in range(tc):
                    v = seg[t]
                    c = _rne_sat(_fp32(v * s), emin, emax, mbits, fmax)
                    q = _fp32(c / s)
                    bsat += _fp32(abs(v) * s) > thr
                    u, sq[t], eq[t] = _element(v, q)
                    und += u
                a2, d2 = _sums(sq, eq, tc)
                bsig += a2
                berr += d2
            nsat += bsat
            sig += bsig
            err += berr
            if blocky:
                bad = not amax < _INF  # a NaN or an Inf: the scale is NaN
                live = amax > 0 and not bad
                scaled = live and s == s
                _block_done(res, live, bad, scaled, s,
                            -np.log2(s) if scaled else 0.0, s >= _FP32_MAX,
                            bsat > 0, bsig, berr)
    return _finish(res, sig, err, und, nsat)


# ---- INT8 / INT4 --------------------------------------------------------------------------------

@_jit
def _intq(x, g, qmax):
    """Symmetric integer groups of g along the rows of x (numcheck/quant/intq.py)."""
    res = _init()
    xi = x.view(np.int64)
    rows, cols = x.shape
    sq = np.empty(g)
    eq = np.empty(g)
    sig = err = 0.0
    und = nsat = 0
    for i in range(rows):
        for j0 in range(0, cols, g):
            amax = _amax(xi, i, i + 1, j0, j0 + g)
            s = _fp32(amax / qmax)
            if s > _FP32_MAX:  # round_to's default saturate=True
                s = _FP32_MAX
            if amax > 0 and s == 0:
                s = _FP32_TINY  # the smallest fp32 subnormal: never x / 0
            if amax == 0:
                s = 1.0
            if amax - amax != 0:
                s = np.nan
            top = (qmax + 0.5) * s
            seg = x[i, j0:j0 + g]
            for t in range(g):
                v = seg[t]
                c = np.rint(_fp32(v / s))  # half to even, as torch.round
                c = min(max(c, -qmax), qmax) if c == c else 0.0  # NaN codes are stored as 0
                q = _fp32(c * s)
                nsat += abs(v) > top
                u, sq[t], eq[t] = _element(v, q)
                und += u
            a2, d2 = _sums(sq, eq, g)
            sig += a2
            err += d2
    return _finish(res, sig, err, und, nsat)


# ---- the entry point ----------------------------------------------------------------------------

_KIND = {torch.float32: 0, torch.float64: 0, torch.bfloat16: 1, torch.float16: 2}


def _plan(fmt):
    """(block as quant_stats pads it, the loop, (rows, cols) -> its arguments after x, whether
    it has block statistics) for a format this module handles; None otherwise. Only these
    exact classes: a subclass may change any rule, and then the reference decides."""
    kind = type(fmt)
    if kind is MXFormat:
        f = formats.get(fmt.elem)
        k = int(fmt.block)
        a = (k, f.emin, f.emax, f.mbits, f.max, f.overflow_threshold,
             int(fmt.scale_mode == "rceil"))
        return (1, k), _mx, lambda rows, cols: a, True
    if kind is NVFP4Format:
        t = (NVFP4_BLOCK, NVFP4_BLOCK) if fmt.two_d else (1, NVFP4_BLOCK)
        return t, _nvfp4, lambda rows, cols: t, True
    if kind is FP8Format:
        f = formats.get(fmt.elem)
        c = (f.emin, f.emax, f.mbits, f.max, f.overflow_threshold, int(bool(fmt.pow2_scale)))
        tile = {"tensor": None, "row": None, "block128": (1, 128),
                "block128x128": (128, 128)}.get(fmt.granularity, 0)
        if tile == 0:
            return None
        if tile is not None:
            return tile, _fp8, lambda rows, cols: tile + c + (1,), True
        if fmt.granularity == "tensor":  # one group: the whole (rows, cols)
            return (1, 1), _fp8, lambda rows, cols: (rows, cols) + c + (0,), False
        return (1, 1), _fp8, lambda rows, cols: (1, cols) + c + (0,), False
    if kind is IntFormat:
        q = fmt.qmax
        if fmt.group is None:  # per channel: a row's whole slice
            return (1, 1), _intq, lambda rows, cols: (cols, q), False
        g = int(fmt.group)
        return ((1, g), _intq, lambda rows, cols: (g, q), False) if g >= 1 else None
    return None


_PLANS: dict = {}  # format -> _plan(format) (formats are frozen dataclasses)


def quant_fields(t: torch.Tensor, fmt) -> dict[str, float] | None:
    """``fields.quant_stats(t, quantizer)`` for ``fmt = quantizer.format``, as Python floats, for
    a CPU tensor of fp32/bf16/fp16/fp64 (any shape; quantized along its last dim); {} where
    quant_stats gives {} (empty or 0-d t); None where this module does not handle fmt or t, or
    numba is unavailable (the caller then runs quant_stats)."""
    return _fields(t, (fmt,))[0]


def quant_fields_many(t: torch.Tensor, fmts) -> list[dict[str, float] | None]:
    """``[quant_fields(t, fmt) for fmt in fmts]`` (a sequence of formats: the recipes that
    quantize one tensor), the same values, with the tensor read and widened to float64 once per
    padded shape instead of once per format: formats whose blocks pad t to the same shape (MX
    1x32, NVFP4 1x16 and per-tensor FP8 on a last dim that is a multiple of 32, say) run their
    loops on one copy. Never a copy padded further than a format's own blocks: the loops walk
    the whole array they get, and extra zero blocks would change results (per-tensor FP8 would
    read a second group; an all-NaN tensor's NVFP4 q_err_sq would be NaN, not 0)."""
    return _fields(t, fmts)


def _fields(t: torch.Tensor, fmts) -> list[dict[str, float] | None]:
    """quant_fields_many (quant_fields: one format)."""
    n = len(fmts)
    if _STATE["broken"] is not None or backend.mode() == "torch":  # off: NUMCHECK_BACKEND=torch
        return [None] * n
    if numba is None:
        _off(f"numba is missing ({_MISSING})")
        return [None] * n
    # detach only where it changes something: a plain tensor that needs no grad is its own
    # detached view (numpy() refuses a tensor that requires grad; a Parameter detaches to a
    # plain tensor)
    x = t if type(t) is torch.Tensor and not t.requires_grad else t.detach()
    if x.numel() == 0 or x.dim() == 0:
        return [{} for _ in range(n)]
    kind = _KIND.get(x.dtype)
    if kind is None or not x.is_cpu or type(x) is not torch.Tensor or \
            x.is_neg():  # a negative-bit view: numpy cannot take its memory
        return [None] * n
    cols = x.shape[-1]
    if not x.is_contiguous():
        x = x.contiguous()
    # numpy's reshape of a contiguous array is a view (torch's costs a dispatch)
    src = host_view(x.view(torch.int16) if kind else x).reshape(-1, cols)
    rows = src.shape[0]
    wide: dict = {}  # (padded rows, padded cols) -> the float64 copy
    out: list = []
    for fmt in fmts:
        try:
            plan = _PLANS[fmt]
        except KeyError:
            plan = _PLANS[fmt] = _plan(fmt)
        except TypeError:  # an unhashable format is none of ours
            plan = None
        if plan is None:
            out.append(None)
            continue
        (br, bc), loop, args_of, blocky = plan
        shape = (-(-rows // br) * br, -(-cols // bc) * bc)
        try:
            xp = wide.get(shape)
            if xp is None:
                xp = wide[shape] = _widen(src, kind, *shape)
            res = loop(xp, *args_of(rows, cols))
        except Exception as exc:  # noqa: BLE001 - numba that cannot compile here: the torch route
            _off(f"the compiled loop failed ({type(exc).__name__}: {exc})")
            return out + [None] * (n - len(out))  # as quant_fields from here on
        out.append(_fields_of(res, rows * cols, loop, blocky))
    return out


def _fields_of(res: np.ndarray, n: int, loop, blocky: bool) -> dict[str, float]:
    """The fields from a loop's result vector (``res`` is spent: its scale extremes become
    their log2 in place)."""
    r = res.tolist()
    if not blocky:
        return {"q_n": float(n), "q_underflow": r[R_UND], "q_saturated": r[R_SAT],
                "q_sig_sq": r[R_SIG], "q_err_sq": r[R_ERR]}
    if r[R_SCALED] == 0:
        lo, hi = _INF, -_INF
    elif loop is _mx:
        lo, hi = math.log2(r[R_SMIN]), math.log2(r[R_SMAX])  # exact: 2^e
    else:
        # NVFP4's log2 of the decode scale and FP8's -log2 of the encode scale as block_scales
        # takes them: torch.log2, not libm's (see above), on the two extremes in place (one
        # contiguous 2-element tensor: the same kernel as a fresh one, without building it)
        lo, hi = torch.from_numpy(res[R_SMIN:R_SMAX + 1]).log2_().tolist()
        if loop is _fp8:  # encode scales: the largest is the smallest decode scale
            lo, hi = -hi, -lo
    return {"q_n": float(n), "q_underflow": r[R_UND], "q_saturated": r[R_SAT],
            "q_sig_sq": r[R_SIG], "q_err_sq": r[R_ERR], "blk_n": r[R_BLK],
            "blk_scaled_n": r[R_SCALED], "blk_log2_min": lo, "blk_log2_max": hi,
            "blk_log2_sum": r[R_LSUM], "blk_log2_sumsq": r[R_LSQ], "blk_clip": r[R_CLIP],
            "blk_scale_sat": r[R_SSAT], "blk_sqnr_min_db": r[R_SQNR], "blk_nan": r[R_NAN]}


def _off(why: str) -> None:
    _STATE["broken"] = why
    # stacklevel: _off, _fields, quant_fields(_many), then its caller
    warnings.warn(f"numcheck.telemetry: {why}; quantization statistics take the slower torch "
                  "route", RuntimeWarning, stacklevel=4)


def available() -> bool:
    """Whether the compiled route is on (numba present and not failed in this process, and
    numcheck.measure.backend not switched to the torch routes)."""
    return numba is not None and _STATE["broken"] is None and backend.mode() != "torch"
