"""The device pass of the telemetry's statistics: Triton kernels, one or two launches per
tensor, no host synchronization.

``fields.tensor_stats`` (the torch route) takes ~18 kernel launches per tensor, and the
reference quantizers behind ``fields.quant_stats`` ~150 to ~230 per tensor and recipe: on a
GPU a tiny model's step is bounded by its launches, so that route cost ~12 launches per
launch of the step itself with statistics alone (counted as aten ops: tiny_lm's training step
412, what its watched step added 5736). Here:

* ``plain_rows``: a tensor's eight plain fields (``fields.PLAIN``) in one launch. Each program
  reads a run of ``per`` elements through the integer view of their bits (the magnitude of an
  IEEE float orders like the integer it is: NaN ``mag > inf``, Inf ``mag == inf``, zero
  ``mag == 0``; amax and the smallest non-zero magnitude are integer max / min over the finite
  ones, decoded once from their bits: bitwise the torch route's); sum_sq: x^2 in float64 over
  the finite elements, a partial sum per lane, then Triton's tree over the lanes (a fixed
  order for a given launch; the torch route sums in another, within a relative 2 n 2^-53).
* ``mx_rows`` (one launch) and ``nvfp4_rows`` (two: the tensor's amax first): the quantization
  fields of an MX or NVFP4 format, each element through numcheck/telemetry/_quant_numba.py's
  arithmetic, which is the reference quantizer's step for step (counts and scales bitwise;
  float sums differ by their order).

Every function writes one row of fields per program (a tensor up to ``_PER`` elements, or
``_PER_BLOCKS`` blocks, takes one program: every tensor of the tiny models): rows that merge
by fields.FIELDS' rules into the tensor's row, which ``Telemetry._flush`` does on the host
after the step's one read-back. Launches go to the tensor's own device and its current stream.

Telemetry loads this module only for a CUDA tensor, through numcheck.measure.backend (and the
tests, on CPU tensors, under Triton's interpreter); where Triton is missing or a kernel fails,
the torch route runs (warned once), as numcheck.measure._stats_triton does for error_stats. The
format constants the kernels read are numcheck.formats' and quant/mx.py's (tl.constexpr).
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from numcheck import formats
from numcheck.quant.mx import E8M0_EMAX, E8M0_EMIN, NAN_EXP
from numcheck.telemetry import fields

_F64, _F32 = formats.get("fp64"), formats.get("fp32")
_BF16, _FP16 = formats.get("bf16"), formats.get("fp16")
_BITS = fields.BIT_VIEWS  # dtype -> (integer view, +inf's bits, magnitude mask)
# The formats' exact constants the kernels read (globals a Triton kernel reads must be
# constexpr): float64's layout (exponents from its bits, powers of two built there); bf16 is
# float32's top half; fp16's fraction bits and mask, its implicit bit, and the exponent that
# scales a code's significand (bias + mbits: its smallest subnormal is 2^-24); fp32's max (the
# NVFP4 and MX rceil scales clamp there); E8M0's exponent range and NaN code (quant/mx.py).
_F64_MBITS = tl.constexpr(_F64.mbits)
_F64_BIAS = tl.constexpr(_F64.bias)
_F64_FRAC = tl.constexpr(_F64.frac_mask)
_BF16_SHIFT = tl.constexpr(_F32.bits - _BF16.bits)
_FP16_MBITS = tl.constexpr(_FP16.mbits)
_FP16_FRAC = tl.constexpr(_FP16.frac_mask)
_FP16_ONE = tl.constexpr(float(1 << _FP16.mbits))
_FP16_SCALE = tl.constexpr(_FP16.bias + _FP16.mbits)
_FP32_MAX = tl.constexpr(_F32.max)
_E8M0_EMIN = tl.constexpr(E8M0_EMIN)
_E8M0_EMAX = tl.constexpr(E8M0_EMAX)
_E8M0_NAN = tl.constexpr(NAN_EXP)
_PER = 1 << 16     # elements per program at least: tensors up to it take one program
_PROGRAMS = 128    # at most, beyond that a program takes more (an H200 has 132 SMs)
_LANES = 1024      # elements a program reads at once (4 warps, 8 per thread)
NF = 8             # fields per row: fields.PLAIN


def handles(t: torch.Tensor) -> bool:
    """A dense tensor of a dtype the kernel reads, not a subclass, not negative (the integer
    view would read the stored bits, not the values). On CUDA, or any device under Triton's
    interpreter (the tests' CPU tensors): passes.py asks numcheck.measure.backend for this
    module by device (kind telemetry-cuda; telemetry-cuda-on-cpu, which a test substitutes)."""
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
    per, programs = _split(n, _PER, _LANES)
    out = torch.empty(programs, NF, dtype=torch.float64, device=x.device)
    with _on(x):
        _plain[(programs,)](x.view(ibits).reshape(-1), out, n, per, **constants(x.dtype),
                            enable_fp_fusion=False)  # v * v rounded before summed, as on CPU
    return out


def _split(n: int, least: int, unit: int) -> tuple[int, int]:
    """(items per program, programs) for n items: at least ``least`` a program, a multiple of
    ``unit``, at most _PROGRAMS programs."""
    per = max(least, triton.cdiv(triton.cdiv(n, _PROGRAMS), unit) * unit)
    return per, triton.cdiv(n, per)


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
        v = (mag << _BF16_SHIFT).to(tl.float32, bitcast=True).to(tl.float64)
    else:  # fp16: binade and fraction; subnormals fraction x 2^-24
        e = mag >> _FP16_MBITS
        f = (mag & _FP16_FRAC).to(tl.float64)
        v = tl.where(e == 0, f, f + _FP16_ONE) * \
            ((tl.maximum(e, 1) - _FP16_SCALE + _F64_BIAS).to(tl.int64)
             << _F64_MBITS).to(tl.float64, bitcast=True)
    return v


@triton.jit
def _mag(raw, MASK: tl.constexpr, WIDTH: tl.constexpr):
    """Magnitude bits of raw bits: int64 lanes for float64, int32 for the others (16-bit lanes
    widened; the mask clears the sign)."""
    if WIDTH == 64:
        m = raw & MASK
    else:
        m = raw.to(tl.int32) & MASK
    return m


@triton.jit
def _abs_value(mag, INF: tl.constexpr, WIDTH: tl.constexpr, BF16: tl.constexpr):
    """float64 |x| of magnitude bits, Inf and NaN included."""
    a = _value(tl.where(mag < INF, mag, 0), INF, WIDTH, BF16)
    return tl.where(mag == INF, float("inf"), tl.where(mag > INF, float("nan"), a))


@triton.jit
def _span(per, n):
    """The [start, end) of the items this program takes (int64: past 2^31 elements)."""
    start = tl.program_id(0).to(tl.int64) * per
    return start, tl.minimum(start + per, n)


@triton.jit
def _mag_zeros(LANES: tl.constexpr, WIDTH: tl.constexpr):
    if WIDTH == 64:
        z = tl.zeros([LANES], dtype=tl.int64)
    else:
        z = tl.zeros([LANES], dtype=tl.int32)
    return z


@triton.jit
def _plain(bits_ptr, out_ptr, n, per, INF: tl.constexpr, MASK: tl.constexpr,
           WIDTH: tl.constexpr, BF16: tl.constexpr, LANES: tl.constexpr):
    pid = tl.program_id(0)
    lane = tl.arange(0, LANES)
    start, end = _span(per, n)
    zi = _mag_zeros(LANES, WIDTH)
    n_nan = tl.zeros([LANES], dtype=tl.int32)
    n_inf = tl.zeros([LANES], dtype=tl.int32)
    n_zero = tl.zeros([LANES], dtype=tl.int32)
    mx = zi
    mn = zi + INF
    ss = tl.zeros([LANES], dtype=tl.float64)
    for j in range(start, end, LANES):
        idx = j + lane
        live = idx < end
        mag = _mag(tl.load(bits_ptr + idx, mask=live, other=0), MASK, WIDTH)
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


# ---- MX and NVFP4 quantization statistics ---------------------------------------------------
# fields.quant_stats for an MXFormat (numcheck/quant/mx.py) or an NVFP4Format (quant/nvfp4.py):
# the fields a row holds, in this order (q_n, the element count, is the caller's: rows x cols)
QUANT_FIELDS = ("q_underflow", "q_saturated", "q_sig_sq", "q_err_sq", "blk_n", "blk_scaled_n",
                "blk_log2_min", "blk_log2_max", "blk_log2_sum", "blk_log2_sumsq", "blk_clip",
                "blk_scale_sat", "blk_sqnr_min_db", "blk_nan")
QUANT_INDEX = tuple(fields.INDEX[k] for k in QUANT_FIELDS)
_TILE_LANES = 1024    # elements of whole blocks a program reads at once
_PER_BLOCKS = 2048    # blocks per program at least (64K elements of 32-blocks)


def quant_rows(t: torch.Tensor, fmt):
    """(rows, fix) for an MX or NVFP4 format (these exact classes: a subclass may change any
    rule; None for any other format): the rows of mx_rows / nvfp4_rows, and what to apply to
    them once read back (numpy, before fields.host_rows merges them), or None."""
    from numcheck.quant.mx import MXFormat
    from numcheck.quant.nvfp4 import NVFP4Format
    if type(fmt) is MXFormat:
        return mx_rows(t, fmt), None
    if type(fmt) is NVFP4Format:
        return nvfp4_rows(t, fmt), log2_extremes
    return None


def log2_extremes(rows):
    """nvfp4_rows' rows with their smallest and largest decode scale (blk_log2_min/max's
    columns) made torch.log2 of them, as fields.quant_stats takes them: Triton's log2 (libm's
    or libdevice's) differs from torch's in the last bit on ~2e-5 of NVFP4 scales, and the
    extremes are compared bitwise (the log2 sums keep Triton's: one ulp a term is within
    their bound). Columns with no scaled block keep +-inf."""
    out = rows.copy()
    ext = torch.from_numpy(out[:, 6:8].copy())
    out[:, 6:8] = torch.where(ext > 0, torch.log2(ext), ext).numpy()
    return out


def mx_rows(t: torch.Tensor, fmt) -> torch.Tensor:
    """(programs, len(QUANT_FIELDS)) float64 rows on t's device that merge by fields.FIELDS'
    rules into ``fields.quant_stats(t, Quantizer(fmt))`` less q_n, for ``type(fmt) is
    MXFormat`` and ``handles(t)`` with t.dim() >= 1; one launch. _quant_cpu._mx's arithmetic,
    step for step: the E8M0 exponent from the float64 bits of the block's finite amax (floor),
    or the fp32 quotient amax / max rounded up to a power of two (rceil), clamped to
    [-127, 127]; a block holding NaN or Inf gets the NaN code and decodes to NaN."""
    f = formats.get(fmt.elem)
    return _block_rows(t, 1, int(fmt.block), f, NV=False, RCEIL=fmt.scale_mode == "rceil")


def nvfp4_rows(t: torch.Tensor, fmt) -> torch.Tensor:
    """As mx_rows, for ``type(fmt) is NVFP4Format``: tiles of 1 x 16 (16 x 16 with
    ``two_d``); two launches: each program's largest magnitude bits (NaN's lie above Inf's,
    so a NaN anywhere makes the tensor's amax NaN, as nvfp4_quantize has it), whose maximum
    the block kernel takes, then the tiles through _quant_cpu._nvfp4's arithmetic (fp32 tensor scales
    2688 / amax and amax / 2688, the e4m3 block scale rounded and saturated from
    (tile amax x enc) / 6, e2m1 elements of x / (block scale x dec), a zero scale flushing the
    tile). blk_log2_min/max's columns hold the smallest and largest decode scale (log2_extremes
    makes them torch's log2 after the read-back); the log2 sums take Triton's log2."""
    from numcheck.quant.nvfp4 import NVFP4_BLOCK
    tr = NVFP4_BLOCK if fmt.two_d else 1
    return _block_rows(t, tr, NVFP4_BLOCK, formats.get("e2m1"), NV=True, RCEIL=False)


def _block_rows(t: torch.Tensor, tr: int, tc: int, f, NV: bool, RCEIL: bool) -> torch.Tensor:
    """t as (rows, last dim) in tiles of tr x tc, zero-padded as quant_stats pads (lanes past
    the last row or column read as zeros: elements of their block, which a NaN block decodes
    to NaN like the others), each element of format f."""
    from numcheck.quant.nvfp4 import E2M1_MAX, TENSOR_RANGE
    x = t.detach()
    if not x.is_contiguous():
        x = x.contiguous()
    cols = x.shape[-1]
    rows = x.numel() // cols
    nbr = triton.cdiv(cols, tc)
    ntiles = triton.cdiv(rows, tr) * nbr
    tcp = triton.next_power_of_2(tc)
    tiles = max(1, _TILE_LANES // (tr * tcp))   # tiles a program reads at once
    per, programs = _split(ntiles, _PER_BLOCKS, tiles)
    bits = x.view(_BITS[x.dtype][0]).reshape(-1)
    out = torch.empty(programs, len(QUANT_FIELDS), dtype=torch.float64, device=x.device)
    e4 = formats.get("e4m3")
    c = constants(x.dtype)
    with _on(x):
        cells, ncells = out, 0   # MX reads no tensor amax
        if NV:   # each program's largest magnitude bits; _blocks takes their max
            per_a, ncells = _split(bits.numel(), _PER, _LANES)
            cells = torch.empty(ncells, dtype=torch.int64, device=x.device)
            _amax_bits[(ncells,)](bits, cells, bits.numel(), per_a, **c)
        _blocks[(programs,)](bits, cells, ncells, out, rows, cols, nbr, ntiles, per, **c,
                             TR=tr, TC=tc,
                             TCP=tcp, TILES=tiles, NV=NV, RCEIL=RCEIL, EMIN=f.emin,
                             EMAX=f.emax, MBITS=f.mbits, FMAX=f.max, THR=f.overflow_threshold,
                             E4_EMIN=e4.emin, E4_EMAX=e4.emax, E4_MBITS=e4.mbits,
                             E4_MAX=e4.max, RANGE=TENSOR_RANGE, ELEM_MAX=E2M1_MAX,
                             CELLS=_PROGRAMS, enable_fp_fusion=False)
    return out


@triton.jit
def _signed(raw, mag, INF: tl.constexpr, WIDTH: tl.constexpr, BF16: tl.constexpr):
    """float64 value of raw bits (NaN and Inf included; ``mag`` their _mag)."""
    if WIDTH == 64:
        v = raw.to(tl.float64, bitcast=True)
    elif WIDTH == 32:
        v = raw.to(tl.float32, bitcast=True).to(tl.float64)
    elif BF16:
        v = (raw.to(tl.int32) << _BF16_SHIFT).to(tl.float32, bitcast=True).to(tl.float64)
    else:
        a = _abs_value(mag, INF, WIDTH, BF16)
        v = tl.where(raw < 0, -a, a)
    return v


@triton.jit
def _pow2(k):
    """2.0**k, exact, from the bits (k in [-1022, 1023])."""
    return ((k + _F64_BIAS).to(tl.int64) << _F64_MBITS).to(tl.float64, bitcast=True)


@triton.jit
def _rne_sat(y, EMIN: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
             FMAX: tl.constexpr):
    """formats.round_to(y, f, "rne", saturate=True) as _quant_cpu._rne_sat: |y| + c - c with
    c = 2^(exponent - MBITS), the exponent clamped to [EMIN, EMAX + 1]; then at most FMAX (NaN
    stays NaN), the sign put back."""
    a = tl.abs(y)
    b = a.to(tl.int64, bitcast=True) >> _F64_MBITS
    b = tl.minimum(tl.maximum(b, EMIN + _F64_BIAS), EMAX + 1 + _F64_BIAS)
    c = ((b + _F64_MBITS - MBITS) << _F64_MBITS).to(tl.float64, bitcast=True)
    m = (a + c) - c
    m = tl.where(m > FMAX, FMAX, m)
    return tl.where(y < 0, -m, m)


@triton.jit
def _amax_bits(bits_ptr, cell_ptr, n, per, INF: tl.constexpr, MASK: tl.constexpr,
               WIDTH: tl.constexpr, BF16: tl.constexpr, LANES: tl.constexpr):
    lane = tl.arange(0, LANES)
    start, end = _span(per, n)
    mx = _mag_zeros(LANES, WIDTH)
    for j in range(start, end, LANES):
        idx = j + lane
        mx = tl.maximum(mx, _mag(tl.load(bits_ptr + idx, mask=idx < end, other=0), MASK, WIDTH))
    tl.store(cell_ptr + tl.program_id(0), tl.max(mx, axis=0).to(tl.int64))


@triton.jit
def _blocks(bits_ptr, cell_ptr, ncells, out_ptr, rows, cols, nbr, ntiles, per,
            INF: tl.constexpr,
            MASK: tl.constexpr, WIDTH: tl.constexpr, BF16: tl.constexpr, LANES: tl.constexpr,
            TR: tl.constexpr, TC: tl.constexpr, TCP: tl.constexpr, TILES: tl.constexpr,
            NV: tl.constexpr, RCEIL: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
            MBITS: tl.constexpr, FMAX: tl.constexpr, THR: tl.constexpr,
            E4_EMIN: tl.constexpr, E4_EMAX: tl.constexpr, E4_MBITS: tl.constexpr,
            E4_MAX: tl.constexpr, RANGE: tl.constexpr, ELEM_MAX: tl.constexpr,
            CELLS: tl.constexpr):
    pid = tl.program_id(0)
    if NV:   # the tensor scales from its amax (nvfp4_quantize): 1 and 1 for amax 0
        k = tl.arange(0, CELLS)
        top_bits = tl.max(tl.load(cell_ptr + k, mask=k < ncells, other=0), axis=0)
        if WIDTH != 64:
            top_bits = top_bits.to(tl.int32)
        tamax = _abs_value(top_bits, INF, WIDTH, BF16)
        enc = (RANGE / tamax).to(tl.float32).to(tl.float64)
        clamped = enc > _FP32_MAX
        enc = tl.where(clamped, _FP32_MAX, enc)
        # past the clamp the decode inverts the clamped encode (nvfp4.tensor_scales)
        dec = tl.where(clamped, (1.0 / enc).to(tl.float32).to(tl.float64),
                       (tamax / RANGE).to(tl.float32).to(tl.float64))
        enc = tl.where(tamax == 0, 1.0, enc)
        dec = tl.where(tamax == 0, 1.0, dec)
        nan_q = tl.where(dec != dec, float("nan"), 1.0)
    ln = tl.arange(0, TR * TCP)
    bi = tl.arange(0, TILES)
    start, end = _span(per, ntiles)
    zf = tl.zeros([TILES], dtype=tl.float64)
    zi = tl.zeros([TILES], dtype=tl.int64)
    und, nsat, blk, nscaled, clip, ssat, bnan, rnan = zi, zi, zi, zi, zi, zi, zi, zi
    sig, err, lsum, lsq = zf, zf, zf, zf
    lmin = zf + float("inf")
    lmax = zf - float("inf")
    rmin = zf + float("inf")
    for b0 in range(start, end, TILES):
        b = b0 + bi
        bl = b < end
        row = (b // nbr)[:, None] * TR + (ln // TCP)[None, :]
        col = (b % nbr)[:, None] * TC + (ln % TCP)[None, :]
        m = bl[:, None] & ((ln % TCP) < TC)[None, :]   # the tile's lanes, padding included
        raw = tl.load(bits_ptr + row * cols + col, mask=m & (row < rows) & (col < cols),
                      other=0)
        mag = _mag(raw, MASK, WIDTH)
        fin = mag < INF
        v = _signed(raw, mag, INF, WIDTH, BF16)
        tb = tl.max(mag, axis=1)   # NaN's bits lie above Inf's
        bad = tb >= INF            # a NaN or an Inf in the block: no scale to speak of
        amax = _value(tl.max(tl.where(fin, mag, 0), axis=1), INF, WIDTH, BF16)   # finite
        if NV:
            bs = _rne_sat(_abs_value(tb, INF, WIDTH, BF16) * enc / ELEM_MAX, E4_EMIN, E4_EMAX,
                          E4_MBITS, E4_MAX)   # the e4m3 block scale, saturating
            s = bs * dec
            cq = _rne_sat(v / tl.where(s == 0, 1.0, s)[:, None], EMIN, EMAX, MBITS, FMAX)
            q = cq * nan_q * s[:, None]   # s 0: the block flushes to +-0
            sat = m & (s[:, None] > 0) & (tl.abs(v) > (THR * s)[:, None])
            live = bl & (amax > 0) & (bad == 0)
            scaled = live & (s > 0) & (s < float("inf"))
            l2 = tl.log2(tl.where(scaled, s, 1.0))
            ext = s   # the extremes: the scales themselves (log2_extremes takes torch's log2)
            at_end = s == 0
        else:
            if RCEIL:
                qq = (amax / FMAX).to(tl.float32)
                qq = tl.where(qq == float("inf"), _FP32_MAX, qq.to(tl.float64))
                qb = qq.to(tl.int64, bitcast=True)
                e = (qb >> _F64_MBITS) - _F64_BIAS + ((qb & _F64_FRAC) != 0).to(tl.int64)
            else:
                e = (amax.to(tl.int64, bitcast=True) >> _F64_MBITS) - _F64_BIAS - EMAX
            e = tl.minimum(tl.maximum(e, _E8M0_EMIN), _E8M0_EMAX)
            e = tl.where(bad, _E8M0_NAN, e)   # the NaN code
            s = _pow2(e)
            q = _rne_sat(v * _pow2(-e)[:, None], EMIN, EMAX, MBITS, FMAX) * s[:, None]
            q = tl.where(bad[:, None], float("nan"), q)
            sat = m & (tl.abs(v) > THR * s[:, None])
            live = bl & (amax > 0) & (bad == 0)
            scaled = live   # a live MX block's scale is a finite power of two
            l2 = e.to(tl.float64)
            ext = l2
            at_end = (e >= _E8M0_EMAX) | (e <= _E8M0_EMIN)
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
        blk += live.to(tl.int64)
        nscaled += scaled.to(tl.int64)
        lmin = tl.minimum(lmin, tl.where(scaled, ext, float("inf")))
        lmax = tl.maximum(lmax, tl.where(scaled, ext, -float("inf")))
        lsum += tl.where(scaled, l2, 0.0)
        lsq += tl.where(scaled, l2 * l2, 0.0)
        clip += (live & (bsat > 0)).to(tl.int64)
        ssat += (live & at_end).to(tl.int64)
        ratio = bsig / berr   # berr 0 -> +inf, as the reference
        rnan += (live & (ratio != ratio)).to(tl.int64)
        rmin = tl.minimum(rmin, tl.where(live & (ratio == ratio), ratio, float("inf")))
        bnan += (bl & bad).to(tl.int64)
    o = out_ptr + pid * 14
    tl.store(o + 0, tl.sum(und, axis=0).to(tl.float64))
    tl.store(o + 1, tl.sum(nsat, axis=0).to(tl.float64))
    tl.store(o + 2, tl.sum(sig, axis=0))
    tl.store(o + 3, tl.sum(err, axis=0))
    tl.store(o + 4, tl.sum(blk, axis=0).to(tl.float64))
    tl.store(o + 5, tl.sum(nscaled, axis=0).to(tl.float64))
    tl.store(o + 6, tl.min(lmin, axis=0))
    tl.store(o + 7, tl.max(lmax, axis=0))
    tl.store(o + 8, tl.sum(lsum, axis=0))
    tl.store(o + 9, tl.sum(lsq, axis=0))
    tl.store(o + 10, tl.sum(clip, axis=0).to(tl.float64))
    tl.store(o + 11, tl.sum(ssat, axis=0).to(tl.float64))
    # 10 log10 of the smallest ratio (monotone: the worst block's dB); NaN as soon as one is
    db = tl.log2(tl.min(rmin, axis=0)) * 3.0102999566398120
    tl.store(o + 12, tl.where(tl.sum(rnan, axis=0) > 0, float("nan"), db))
    tl.store(o + 13, tl.sum(bnan, axis=0).to(tl.float64))


# ---- shadow SQNR sums ---------------------------------------------------------------------------

def sqnr_rows(out: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    """(programs, 2) float64 rows [sum r^2, sum (o - r)^2] over the finite elements r of the
    float64 reference (fields.sqnr_pair's two sums; a non-finite ``out`` there makes the error
    infinite or NaN, as it should), summing by the fields' rule into the pair's; one launch.
    ``handles(out)``, ``ref64`` float64 of out's shape and device."""
    o = out.detach()
    o = o if o.is_contiguous() else o.contiguous()
    r = ref64.detach()
    r = r if r.is_contiguous() else r.contiguous()
    n = o.numel()
    per, programs = _split(n, _PER, _LANES)
    rows = torch.empty(programs, 2, dtype=torch.float64, device=o.device)
    with _on(o):
        _sqnr[(programs,)](o.view(_BITS[o.dtype][0]).reshape(-1), r.reshape(-1), rows, n, per,
                           **constants(o.dtype), enable_fp_fusion=False)
    return rows


@triton.jit
def _sqnr(bits_ptr, ref_ptr, out_ptr, n, per, INF: tl.constexpr, MASK: tl.constexpr,
          WIDTH: tl.constexpr, BF16: tl.constexpr, LANES: tl.constexpr):
    pid = tl.program_id(0)
    lane = tl.arange(0, LANES)
    start, end = _span(per, n)
    sig = tl.zeros([LANES], dtype=tl.float64)
    err = tl.zeros([LANES], dtype=tl.float64)
    for j in range(start, end, LANES):
        idx = j + lane
        live = idx < end
        raw = tl.load(bits_ptr + idx, mask=live, other=0)
        r = tl.load(ref_ptr + idx, mask=live, other=0.0)
        o = _signed(raw, _mag(raw, MASK, WIDTH), INF, WIDTH, BF16)
        fin = live & (tl.abs(r) < float("inf"))   # NaN compares false
        d = tl.where(fin, o - r, 0.0)
        sig += tl.where(fin, r * r, 0.0)
        err += d * d
    row = out_ptr + pid * 2
    tl.store(row + 0, tl.sum(sig, axis=0))
    tl.store(row + 1, tl.sum(err, axis=0))
