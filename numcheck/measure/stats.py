"""Error statistics of a kernel's output against its FP64 reference: ``error_stats`` -> ErrorStats.

One pass over the pair, in chunks of whole blocks, keeps peak extra memory bounded (a few
chunk-sized buffers plus one small record per block), on CPU and CUDA alike.

Definitions (each also in ErrorStats' field docs):

* The reference is rounded to ``fmt`` (round-to-nearest-even, the format's own overflow) only to
  classify non-finite values (DESIGN rule 3) and to measure ULPs; every other statistic compares
  ``out`` with the exact float64 ``ref``.
* Elements where ``out`` or the rounded reference is non-finite are left out of every finite
  statistic; ``nonfinite_mismatch`` counts those whose class differs (NaN by class, inf by sign).
* ``p99_ulp`` is the nearest-rank 99th percentile (the smallest u with at least 99% of compared
  elements at or below u), exact, from integer counts, never a sort.
* A zero reference gives defined values, never NaN: sqnr_db = +inf and rel_l2 = 0 when the
  error is zero too, else -inf and +inf; cosine = 1 when both vectors are zero, 0 when only one
  is; bias = 0 when there is no error, else +-inf.

How. On CPU, outputs stored in fmt itself (bf16, fp16, fp32, fp8) go through one compiled loop
(numcheck.measure._stats_numba, numba) that reads each chunk once; on CUDA through one Triton kernel
(numcheck.measure._stats_triton). Everything else, and those where numba or Triton is missing, takes the
torch route, as do all where numcheck.measure.backend, the one selector, has the compiled passes
off (NUMCHECK_BACKEND=torch; its doc): each chunk takes one of two routes; all give the
statistics defined above.

* Fast, where out's dtype is fmt itself and its values are exact in fp32 (bf16, fp16, fp32,
  fp8), and the chunk turns out all finite with its reference below fmt's overflow threshold
  (read from the chunk's own sums and range, never assumed). The float statistics are fp64 dot
  products and reductions of ``out - ref``. The ULP distance is integer arithmetic on fp32 bit
  patterns: with s = 2^(-126 - emin), fmt's values times s are the fp32 values whose low
  ``23 - mbits`` bits are zero, subnormals included, so fmt's ordinal is the fp32 ordinal shifted
  right by that much; ref * s is rounded once to fp32, and for out and ref of one sign the
  distance is (bits(out * s) - bits(ref * s) + half) >> shift, which rounds ref to nearest in the
  same step. Two cases it cannot do are set aside and measured by the general route's rounding:
  out and ref of opposite signs, and an fp32 value exactly halfway between two fmt values (the
  float64 ref may lie on either side of it: rounding twice could go the wrong way).
* General: everything else (non-finite values, overflow, fp64, e8m0, another grid than out's
  dtype, a CPU that flushes subnormals): numcheck's own rounding (formats.round_with_ordinal) in
  float64, masked.

p99 comes from counts: a chunk whose largest distance is at most 2 ULP has its histogram fixed by
its count, its nonzero count and its sum; other chunks add a bincount. Only a p99 in the
histogram's clamped last bin (2^16 - 1 ULP; 511 on CUDA: a broken kernel) takes more passes
(radix select). On CPU the chunks run on worker threads, one intra-op thread each (_map says
why), the compiled loop's too (it releases the GIL).
"""
from __future__ import annotations

import importlib
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy
import torch

from numcheck import formats
from numcheck.errors import UsageError
from numcheck.measure import backend
from numcheck.measure.blocks import (chunks, grid, n_blocks, tile_sizes, tile_sums,
                                     tile_sumsq)
from numcheck.measure.errorstats import ErrorStats

BLOCK_ENERGY_EPS = 1e-4  # low-energy floor: blocks 40 dB below the median block are judged at that level
_DIGIT = 16  # radix-select digit width for the exact p99
_ROW = 64  # the fast route sets rare elements aside with their rows of (at most) this many
_SMALL = 2  # a chunk whose ULP distances are all <= 2 has its histogram from three counts
_INT32_MIN = -(1 << 31)
# Output dtypes whose every value is exact in fp32 (the fast route's out * s).
_FP32_EXACT = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn,
               torch.float8_e5m2)


def _out_ordinal(o: torch.Tensor, o64: torch.Tensor, f: formats.Format) -> torch.Tensor:
    """Signed ordinal of out's values; straight from the bits when out is stored in fmt itself."""
    if f.torch is o.dtype and o.dtype in _INT_VIEW:
        raw = o.view(_INT_VIEW[o.dtype]).to(torch.int64)
        return _apply_sign(raw & ((1 << (f.bits - 1)) - 1), raw)
    return formats.ordinal(torch.where(torch.isfinite(o64), o64, 0.0), f)


_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
             torch.float8_e4m3fn: torch.int8, torch.float8_e5m2: torch.int8}


def _apply_sign(mag: torch.Tensor, signed_bits: torch.Tensor) -> torch.Tensor:
    """mag negated where signed_bits is negative, branch-free (two's complement: (m ^ s) - s)."""
    s = signed_bits >> 63  # int64: -1 where negative, 0 elsewhere
    return (mag ^ s) - s


def _classes(v: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +inf, 3 -inf."""
    cls = torch.isnan(v).to(torch.int8)
    cls = torch.where(v == math.inf, 2, cls)
    return torch.where(v == -math.inf, 3, cls)


class _Part(NamedTuple):
    """One chunk's statistics: exact integers and float64 sums, on the host."""

    n_compared: int
    n_nan: int
    n_inf: int
    mismatch: int
    floats: tuple  # sum out*ref, sum out^2, sum err, sum |err|, sum |ref|, max |err|
    ulps: tuple  # sum u, sum d, sum d toward larger magnitude, max u (u = |d|)
    set_aside: tuple | None = None  # (out, ref): the fast route's elements for the general route


class _Hist:
    """The exact histogram of the ULP distances u = |d|, its last bin clamped (u >= 2^16 - 1).

    A chunk whose u are all <= 2 adds three counts, fixed by its count, nonzero count and sum;
    another adds a bincount into its thread's own copy. Integer sums: the order does not matter.
    """

    def __init__(self, device: torch.device, bins: int = 1 << _DIGIT):
        self.device, self.nbins = device, bins
        self.small = [0] * (_SMALL + 1)
        self.bins: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()

    def add(self, n: int, nonzero: int, sum_u: int, max_u: int, u: torch.Tensor,
            padding: int = 0) -> None:
        """n distances: their nonzero count, sum and max; ``u`` (scratch, clamped in place) holds
        them and ``padding`` zeros more (elements not compared), read only where max_u > 2."""
        if max_u <= _SMALL:  # sum_u = n1 + 2 n2, nonzero = n1 + n2
            twos = sum_u - nonzero
            with self.lock:
                self.small[0] += n - nonzero
                self.small[1] += nonzero - twos
                self.small[2] += twos
            return
        bins = self.bins.get(threading.get_ident())
        if bins is None:
            bins = self.bins[threading.get_ident()] = torch.zeros(
                self.nbins, dtype=torch.int64, device=self.device)
        # u is the caller's scratch: clamped in place; a bincount only as long as max_u needs
        counts = torch.bincount(u.flatten().clamp_(max=bins.numel() - 1))
        bins[:counts.numel()] += counts
        bins[0] -= padding

    def total(self) -> numpy.ndarray:
        """The histogram on the host (numpy: a small call's few ops cost microseconds there)."""
        hist = numpy.zeros(self.nbins, dtype=numpy.int64)
        for bins in self.bins.values():
            hist += bins.cpu().numpy()
        hist[:_SMALL + 1] += self.small
        return hist


class _Route(NamedTuple):
    """The fast route's constants for one (out dtype, fmt) pair; see the module doc."""

    s: float  # 2^(-126 - emin): fmt's subnormals onto fp32's
    shift: int  # 23 - mbits: fp32 ULPs in one of fmt's
    limit: float  # fmt's overflow threshold: a chunk whose |ref| reaches it goes general
    half: torch.Tensor  # 2^(shift - 1), and the shifts, as 0-d tensors: a Python int operand
    right: torch.Tensor  # costs ~4 us of dispatch an op
    left: torch.Tensor
    sign: torch.Tensor


def _fast_route(dtype: torch.dtype, f: formats.Format, device: torch.device) -> _Route | None:
    if f.torch is not dtype or dtype not in _FP32_EXACT or _flushes_subnormals(device):
        return None
    shift = 23 - f.mbits
    half, right, left, sign = (torch.tensor(v, dtype=torch.int32, device=device) for v in (
        (1 << shift) >> 1, shift, 32 - shift, 31))
    return _Route(2.0 ** (-126 - f.emin), shift, f.overflow_threshold, half, right, left, sign)


def _flushes_subnormals(device: torch.device) -> bool:
    """True where an fp32 result below 2^-126 becomes zero (torch.set_flush_denormal(True) on a
    CPU): the fast route needs fp32 subnormals exact (fmt's own, and ref * s near zero)."""
    tiny = torch.tensor(2.0 ** -149, dtype=torch.float64, device=device).to(torch.float32)
    return bool(tiny == 0)


class _Buffers:
    """The fast route's chunk-sized work space, one per thread and call."""

    def __init__(self, n: int, device: torch.device):
        self.e = torch.empty(n, dtype=torch.float64, device=device)
        self.y = torch.empty(n, dtype=torch.float32, device=device)
        self.o = torch.empty(n, dtype=torch.float32, device=device)
        self.t = torch.empty(n, dtype=torch.int32, device=device)


def _fast_chunk(o, r, route: _Route, tr, tc, parts, buf: _Buffers, hist: _Hist) -> _Part | None:
    """The fast route on one chunk (see the module doc); None where the chunk needs the
    general route. Each torch call costs a few microseconds of dispatch: the chunk's ~35 are
    a third of its time, hence scalars read with .item() and the buffers used whole."""
    n = o.numel()
    o1, r1 = o.reshape(-1), r.reshape(-1)
    e, y, ob, t = (buf.e, buf.y, buf.o, buf.t) if n == buf.e.numel() else \
        (buf.e[:n], buf.y[:n], buf.o[:n], buf.t[:n])
    e.copy_(o1)
    dot, o2 = torch.dot(e, r1), torch.dot(e, e)
    e.sub_(r1)  # out - ref
    tile_sumsq(r, tr, tc, parts[0])
    tile_sumsq(e.view(o.shape), tr, tc, parts[1])
    s_err = e.sum()
    s_abs = e.abs_().sum().item()
    max_abs = e.max()
    s_absref = torch.abs(r1, out=e).sum()
    min_absref, max_absref = torch.aminmax(e)
    if not (math.isfinite(s_abs) and max_absref.item() < route.limit):
        return None  # a non-finite value, or a reference at fmt's overflow (NaN fails too)
    # ULPs: fp32 bit patterns of out * s (exact) and of ref * s (rounded once)
    y.copy_(r1 if route.s == 1 else torch.mul(r1, route.s, out=e))
    ob.copy_(o1)
    if route.s != 1:
        ob.mul_(route.s)
    yb, d = y.view(torch.int32), ob.view(torch.int32)
    # Set aside rows holding an element the arithmetic below cannot do: out and ref of opposite
    # signs; ref * s halfway between two values of fmt (low `shift` bits 100...0: the minimum of
    # the bits shifted left).
    row = math.gcd(n, _ROW)
    rows = _rows_below(torch.bitwise_xor(d, yb, out=t), 0, row)
    if route.shift:
        ties = _rows_below(torch.bitwise_left_shift(yb, route.left, out=t), _INT32_MIN + 1, row)
        rows = ties if rows is None else rows if ties is None else torch.cat([rows, ties]).unique()
    d.sub_(yb)  # one sign: the magnitudes' difference in fp32 ULPs
    if route.shift:
        d.add_(route.half).bitwise_right_shift_(route.right)  # ref rounded to nearest (no ties)
    if rows is not None:
        d.view(-1, row).index_fill_(0, rows, 0)  # 0 here; _measure_set_aside replaces them
    dmin, dmax = torch.aminmax(d)
    max_u = max(-dmin.item(), dmax.item())
    # Sums in int32 where they cannot overflow: a sum into int64 first copies the chunk to int64.
    acc = torch.int32 if n * max_u < 1 << 31 else torch.int64
    s_d = d.sum(dtype=acc).item()
    s_neg = torch.bitwise_right_shift(yb, route.sign, out=t).bitwise_and_(d).sum(dtype=acc).item()
    # d is out's distance toward larger magnitude: a zero ref has no direction
    s_zero = torch.eq(r1, 0, out=t).mul_(d).sum(dtype=acc).item() if min_absref.item() == 0 else 0
    s_u = d.abs_().sum(dtype=acc).item()
    # the nonzero count matters only where max_u is 2 (<= 1: it is the sum; > 2: a bincount)
    hist.add(n, torch.count_nonzero(d).item() if max_u == 2 else s_u, s_u, max_u, d)
    return _Part(n, 0, 0, 0, (dot.item(), o2.item(), s_err.item(), s_abs, s_absref.item(),
                              max_abs.item()), (s_u, s_d - 2 * s_neg, s_d - s_zero, max_u),
                 None if rows is None else (o1.view(-1, row)[rows], r1.view(-1, row)[rows]))


def _rows_below(t: torch.Tensor, below: int, row: int) -> torch.Tensor | None:
    """Indices of the rows (``row`` elements each) of ``t`` (int32, flat) that hold an element
    below ``below``, or None. Rare: one minimum answers the common case, and whole rows are set
    aside (a bool mask and nonzero over a chunk cost ~8 ns an element, a minimum 0.2)."""
    if t.amin().item() >= below:
        return None
    return (t.view(-1, row).amin(dim=1) < below).nonzero().squeeze(1)


def _general_d(o, o64, r64, f) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out's classes, the rounded reference's classes, the signed ULP distance d, 0 where either
    is not finite)."""
    if f.name == "fp64":
        rr, r_ord = r64, formats.ordinal(torch.where(torch.isfinite(r64), r64, 0.0), f)
    else:
        rr, r_ord = formats.round_with_ordinal(r64, f, "rne", False)
    oc, rc = _classes(o64), _classes(rr)
    fin = (oc == 0) & (rc == 0)
    return oc, rc, torch.where(fin, _out_ordinal(o, o64, f) - r_ord, 0)


def _general_totals(o, r, f: formats.Format, tr: int, tc: int, top: int = (1 << _DIGIT) - 1):
    """The general route on one 2-D chunk, in tensors (the fused CUDA kernel computes the same
    per element: numcheck.measure._stats_triton): (block sums [signal, noise, count] (3, k),
    float64 [sum out*ref, sum out^2, sum err, sum |err|, sum |ref|, max |err|, sum u, sum d,
    sum d toward larger magnitude], int64 [compared, NaN, inf, mismatch, max u, nonzero u], u
    clamped to ``top``, the histogram's last bin (0 where not compared))."""
    o64, r64 = o.to(torch.float64), r.to(torch.float64)
    oc, rc, d = _general_d(o, o64, r64, f)
    fin = (oc == 0) & (rc == 0)
    err = torch.where(fin, o64 - r64, 0.0)
    sig = torch.where(fin, r64, 0.0)
    ov = torch.where(fin, o64, 0.0)
    blocks = torch.stack([tile_sums(sig * sig, tr, tc), tile_sums(err * err, tr, tc),
                          tile_sums(fin.to(torch.float64), tr, tc)])
    u = d.abs()
    # float64 sums of the ULP distances: fp64's reach 2^63, an int64 sum could wrap
    floats = torch.stack([(ov * sig).sum(), (ov * ov).sum(), err.sum(), err.abs().sum(),
                          sig.abs().sum(), err.abs().amax(), u.to(torch.float64).sum(),
                          d.to(torch.float64).sum(),
                          (d * torch.sign(r64).to(torch.int64)).to(torch.float64).sum()])
    ints = torch.stack([fin.sum(), (oc == 1).sum(), (oc >= 2).sum(), (oc != rc).sum(), u.amax(),
                        torch.count_nonzero(u)])
    return blocks, floats, ints, u.clamp(max=top).to(torch.int32)


def _part(floats: list, ints: list) -> _Part:
    n, n_nan, n_inf, mismatch, max_u, _ = ints
    return _Part(n, n_nan, n_inf, mismatch, tuple(floats[:6]), (*floats[6:], max_u))


def _general_chunk(o, r64, f, tr, tc, parts, hist: _Hist) -> _Part:
    """Any values: non-finite classes, overflow, subnormals, zeros, off-format outputs."""
    blocks, floats, ints, u = _general_totals(o, r64, f, tr, tc)
    parts.copy_(blocks)
    part = _part(floats.tolist(), ints.tolist())
    if part.n_compared:
        hist.add(part.n_compared, ints[5].item(), int(part.ulps[0]), part.ulps[3], u,
                 padding=o.numel() - part.n_compared)
    return part


def _measure_set_aside(parts: list[_Part], f: formats.Format, hist: _Hist) -> _Part:
    """The fast route's set-aside elements (finite, below overflow), by the general route's
    rounding: the distances that replace the zeros they were counted as."""
    o = torch.cat([p.set_aside[0].flatten() for p in parts])
    r64 = torch.cat([p.set_aside[1].flatten() for p in parts])
    d = _general_d(o, o.to(torch.float64), r64, f)[2]
    u = d.abs()
    s_u, s_d, s_mag, max_u, nonzero = torch.stack([
        u.sum(), d.sum(), (d * torch.sign(r64).to(torch.int64)).sum(), u.max(),
        torch.count_nonzero(u)]).tolist()
    hist.small[0] -= u.numel()
    hist.add(u.numel(), nonzero, s_u, max_u, u)
    return _Part(0, 0, 0, 0, (0.0,) * 6, (s_u, s_d, s_mag, max_u))


def _chunked(out: torch.Tensor, ref: torch.Tensor, f: formats.Format, blocks):
    """The chunked pass: (per-chunk parts, histogram, per-block [signal, noise, count] sums)."""
    hist = _Hist(out.device)
    blk = torch.zeros(3, n_blocks(out.shape, blocks), dtype=torch.float64, device=out.device)
    blk[2] = tile_sizes(out.shape, blocks)  # the fast route's counts; the general route's own
    route = _fast_route(out.dtype, f, out.device) if out.numel() else None
    jobs, at = [], 0
    for o, r, (tr, tc) in chunks(out, ref, blocks):
        k = -(-o.shape[0] // tr) * -(-o.shape[1] // tc)
        jobs.append((o, r, tr, tc, blk[:, at:at + k]))
        at += k
    size = jobs[0][0].numel() if jobs else 0  # the first chunk is the largest
    buffers: dict[int, _Buffers] = {}

    def one(job) -> _Part:
        o, r, tr, tc, parts = job
        r64 = r if r.dtype == torch.float64 else r.to(torch.float64)
        part = None
        if route:
            buf = buffers.get(threading.get_ident())
            if buf is None:
                buf = buffers[threading.get_ident()] = _Buffers(size, out.device)
            part = _fast_chunk(o, r64, route, tr, tc, parts, buf, hist)
        return part or _general_chunk(o, r64, f, tr, tc, parts, hist)

    parts = list(_map(one, jobs, out.device))
    aside = [p for p in parts if p.set_aside is not None]
    if aside:
        parts.append(_measure_set_aside(aside, f, hist))
    return parts, hist, blk


def _compiled_cpu(out: torch.Tensor, ref: torch.Tensor, f: formats.Format, blocks):
    """CPU: one compiled loop per chunk (numcheck.measure._stats_numba) on the worker threads, as
    _chunked returns; None where it does not apply or numba is missing (then _chunked)."""
    loop = _cpu_loop()
    if loop is None or not loop.supports(out.dtype, f) or out.numel() == 0 or \
            type(out) is not torch.Tensor or type(ref) is not torch.Tensor:  # noqa: E721
        return None  # (a tensor subclass may not hand its memory to numpy: the torch route)
    k = loop.constants(out.dtype, f)
    blk = torch.zeros(3, n_blocks(out.shape, blocks), dtype=torch.float64)
    hist = _Hist(out.device, _CPU_BINS)
    jobs, at = [], 0
    for o, r, (tr, tc) in chunks(out.detach(), ref.detach(), blocks, _LOOP_CHUNK):
        nb = -(-o.shape[0] // tr) * -(-o.shape[1] // tc)
        jobs.append((o, r, tr, tc, blk[:, at:at + nb]))
        at += nb

    def one(job) -> _Part:
        o, r, tr, tc, parts = job
        r64 = r if r.dtype == torch.float64 else r.to(torch.float64)
        bins = hist.bins.get(threading.get_ident())
        if bins is None:  # one histogram a thread: integer counts, the order does not matter
            bins = hist.bins[threading.get_ident()] = torch.zeros(_CPU_BINS, dtype=torch.int64)
        sums = numpy.zeros((3, parts.shape[1]))
        fl, it = loop.chunk(o.contiguous(), r64.contiguous(), tr, tc, k, sums, bins.numpy())
        parts.copy_(torch.from_numpy(sums))
        n, n_nan, n_inf, mismatch, max_u, s_u, s_d, s_mag = it.tolist()
        return _Part(n, n_nan, n_inf, mismatch, tuple(fl.tolist()), (s_u, s_d, s_mag, max_u))

    try:
        return list(_map(one, jobs, out.device)), hist, blk
    except Exception as exc:  # noqa: BLE001 - numba that cannot compile here: the torch route
        # off for the rest of the process: a compile failure does not heal
        backend.broken(CPU_PASS, f"numcheck.error_stats: the compiled CPU loop failed "
                       f"({type(exc).__name__}: {exc}); using the torch route", stacklevel=3)
        return None


# The compiled loop's histogram: u < 4095 counted exactly (fp32 outputs of a TF32 or reordered
# GEMM reach a few hundred ULP); a p99 beyond takes the radix passes.
_CPU_BINS = 4096
# Elements per job of the compiled loop: enough jobs for every thread, few enough that the
# ~30 us of Python around each stays below 1% of its ~3 ms.
_LOOP_CHUNK = 1 << 19
# The compiled passes' kinds for numcheck.measure.backend, the one selector (its doc: the switch
# that turns them off, NUMCHECK_BACKEND=torch, and the substitutes tests plant).
CPU_PASS = "stats-cpu"  # numcheck.measure._stats_numba
CUDA_PASS = "stats-cuda"  # numcheck.measure._stats_triton


def _cpu_loop():
    """numcheck.measure._stats_numba, or None (numba missing: warned once; off; broken)."""
    return backend.load(CPU_PASS, lambda: importlib.import_module("numcheck.measure._stats_numba"),
                        "numcheck.error_stats: no numba ({}); CPU tensors take the slower torch "
                        "route", stacklevel=3)


def _map(fn, jobs: list, device: torch.device):
    """fn over jobs, results in order. On a CPU with several intra-op threads, jobs run on as
    many worker threads, each doing its ops on one: torch's own split runs every op across
    the threads, each op ending at a barrier, and a chunk is ~30 ops; on a 2-core machine
    shared with another process a barrier waits for a descheduled thread (measured: 5-10x slower
    than one thread). Each job's ops then run on one thread wherever they run, so the results do
    not depend on the thread count (torch's own split changes float sums)."""
    k = torch.get_num_threads() if device.type == "cpu" and _PER_THREAD_COUNT else 1
    if k == 1 or len(jobs) == 1:
        return map(fn, jobs)
    return _workers(k).map(fn, jobs)


# Only OpenMP keeps the intra-op thread count per thread (torch's native pool has one count).
_PER_THREAD_COUNT = "parallel backend: OpenMP" in torch.__config__.parallel_info()
_pool: tuple = (None, None)  # ((pid, k), its ThreadPoolExecutor)
_pool_lock = threading.Lock()


def _workers(k: int) -> ThreadPoolExecutor:
    """This process's k worker threads, each with one intra-op thread."""
    global _pool
    key = (os.getpid(), k)  # a forked child inherits the executor but not its threads
    with _pool_lock:
        if _pool[0] != key:
            if _pool[1] is not None and _pool[0][0] == key[0]:
                _pool[1].shutdown(wait=False)
            pool = ThreadPoolExecutor(k, thread_name_prefix="numcheck-stats")
            ready = threading.Barrier(k + 1)  # k tasks that wait for each other: k threads
            for _ in range(k):
                pool.submit(_one_thread, ready)
            ready.wait()
            torch.set_num_threads(k)  # the workers' calls also set the process default: restore
            _pool = (key, pool)
    return _pool[1]


def _one_thread(ready: threading.Barrier) -> None:
    torch.get_num_threads()  # a thread takes the process default at its first use, so first...
    torch.set_num_threads(1)  # ...then its own count (OpenMP keeps one per thread)
    ready.wait()


def _fused(out: torch.Tensor, ref: torch.Tensor, f: formats.Format, blocks):
    """CUDA: one Triton kernel over the whole tensor (numcheck.measure._stats_triton), as _chunked
    returns; None where it does not apply or cannot run (then _chunked: the fallback)."""
    kernel = _cuda_kernel()
    if kernel is None or not kernel.supports(out.dtype, f) or ref.dtype != torch.float64 or \
            out.numel() == 0 or not (out.is_contiguous() and ref.is_contiguous()):
        return None
    try:
        blk, floats, ints, bins = kernel.totals(out, ref, f, grid(out.shape, blocks),
                                                _FUSED_BINS - 1)
    except Exception as exc:  # noqa: BLE001 - a GPU or Triton the kernel does not build on
        backend.broken(CUDA_PASS, f"numcheck.error_stats: the fused CUDA kernel failed "
                       f"({type(exc).__name__}: {exc}); using the chunked path", stacklevel=3)
        return None
    hist = _Hist(out.device, _FUSED_BINS)
    hist.bins[0] = bins
    return [_part(floats.tolist(), ints.tolist())], hist, blk


# The fused kernel's histogram: u < 511 exactly, a p99 beyond (a broken kernel) takes the radix
# passes. Its bins are per-program registers, added into global memory at the end.
_FUSED_BINS = 512


def _cuda_kernel():
    """numcheck.measure._stats_triton, or None (Triton missing: warned once; off; broken)."""
    return backend.load(CUDA_PASS,
                        lambda: importlib.import_module("numcheck.measure._stats_triton"),
                        "numcheck.error_stats: no Triton ({}); CUDA tensors take the chunked "
                        "path", stacklevel=3)


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
    n_blocks(out.shape, blocks)  # a bad blocks= is a UsageError before any work
    fused = _fused(out, ref, f, blocks) if out.is_cuda else _compiled_cpu(out, ref, f, blocks)
    parts, hist, blk = fused if fused is not None else _chunked(out, ref, f, blocks)
    return _finish(out, ref, f, blocks, parts, hist, blk)


def _finish(out, ref, f, blocks, parts: list[_Part], hist: _Hist, blk) -> ErrorStats:
    n, n_nan, n_inf, mismatch = (sum(p[i] for p in parts) for i in range(4))
    dot, o2, err, abs_err, abs_ref = (math.fsum(p.floats[i] for p in parts) for i in range(5))
    sum_u, sum_d, sum_mag = (sum(p.ulps[i] for p in parts) for i in range(3))
    max_abs = max((p.floats[5] for p in parts), default=0.0)
    max_u = max((p.ulps[3] for p in parts), default=0)
    blk = blk.cpu().numpy()
    s, e2 = float(blk[0].sum()), float(blk[1].sum())
    mbs, worst, nblocks = _min_block_sqnr(blk)

    def mean(total) -> float:
        return total / n if n else 0.0

    return ErrorStats(
        fmt=f.name, n=out.numel(), n_compared=n, n_nan=n_nan, n_inf=n_inf,
        nonfinite_mismatch=mismatch, max_abs=max_abs, mean_abs=mean(abs_err),
        rel_l2=_ratio(math.sqrt(e2), math.sqrt(s)), sqnr_db=_sqnr_db(s, e2),
        cosine=_cosine(dot, o2, s), bias=_ratio(err, abs_ref, signed=True),
        max_ulp=int(max_u), mean_ulp=mean(sum_u),
        p99_ulp=_p99(out, ref, f, blocks, n, int(max_u), hist.total()),
        bias_ulp=mean(sum_d), mag_bias_ulp=mean(sum_mag), min_block_sqnr_db=mbs,
        worst_block=worst, n_blocks=nblocks)


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


def _min_block_sqnr(blk: numpy.ndarray) -> tuple[float, int, int]:
    """Worst per-element-normalized block SQNR, its flat block index, and the block count, from
    the (3, blocks) [signal, noise, count] sums (numpy: microseconds where torch's small ops
    cost a millisecond; the dB value by math.log10, the same on every CPU)."""
    s, e, cnt = blk
    nblocks = int(s.size)
    live = cnt > 0
    if not live.any():
        return math.inf, -1, nblocks
    c = numpy.where(live, cnt, 1.0)
    per_s = numpy.where(live, s / c, 0.0)
    per_e = numpy.where(live, e / c, 0.0)
    # The floor follows the median block, not the mean: one block 1e6x louder would lift the
    # mean by 120 dB and hide every other block's error (the NVFP4 scale-flush case). The lower
    # median of an even count, as torch.median.
    live_s = per_s[live]
    mid = (live_s.size - 1) // 2
    floor = BLOCK_ENERGY_EPS * float(numpy.partition(live_s, mid)[mid])
    signal = numpy.maximum(per_s, floor)
    with numpy.errstate(divide="ignore", invalid="ignore"):
        # noise over signal, the worst block the largest (NaN first, as an argmin of dB would)
        ratio = numpy.where(live & (per_e > 0), per_e / signal, 0.0)
    nan = numpy.isnan(ratio)
    worst = int(numpy.argmax(nan)) if nan.any() else int(numpy.argmax(ratio))
    if not ratio[worst] != 0:  # NaN, or no live block with an error
        return (math.nan, worst, nblocks) if nan.any() else (math.inf, worst, nblocks)
    q = float(signal[worst]) / float(per_e[worst])
    return (10.0 * math.log10(q) if q > 0 else -math.inf), worst, nblocks


def _histogram_rank(hist, rank: int) -> int:
    """Smallest bin index whose cumulative count reaches rank (1-based); hist: numpy or torch."""
    if isinstance(hist, torch.Tensor):
        hist = hist.cpu().numpy()
    return int(numpy.searchsorted(numpy.cumsum(hist), rank))


def _p99(out, ref, f, blocks, n: int, max_u: int, hist: numpy.ndarray) -> int:
    """Exact nearest-rank p99 of the ULP distances: the pass's histogram, then, only where p99
    lies in its last (clamped) bin, radix select over that tail, 16 bits a pass."""
    if n == 0:
        return 0
    rank = (99 * n + 99) // 100  # ceil(0.99 n), exactly
    below_tail = int(hist[:-1].sum())
    if rank <= below_tail:
        return _histogram_rank(hist, rank)
    rank -= below_tail
    tail = hist.size - 1
    mask = (1 << _DIGIT) - 1
    prefix, shift = 0, max(_DIGIT, (max_u.bit_length() - 1) // _DIGIT * _DIGIT)
    while True:
        digits = torch.zeros(1 << _DIGIT, dtype=torch.int64, device=out.device)
        for u in _abs_ulps(out, ref, f, blocks):
            u = u[u >= tail]
            if shift + _DIGIT < 63:
                u = u[(u >> (shift + _DIGIT)) == prefix]
            digits += torch.bincount((u >> shift) & mask, minlength=1 << _DIGIT)
        digit = _histogram_rank(digits, rank)
        rank -= int(digits[:digit].sum())
        prefix = (prefix << _DIGIT) | digit
        if shift == 0:
            return prefix
        shift -= _DIGIT


def _abs_ulps(out, ref, f, blocks):
    """|ULP| of the compared elements, chunk by chunk, by the general route (for the rare extra
    passes)."""
    for o, r, _ in chunks(out, ref, blocks):
        oc, rc, d = _general_d(o, o.to(torch.float64), r.to(torch.float64), f)
        yield d[(oc == 0) & (rc == 0)].abs()
