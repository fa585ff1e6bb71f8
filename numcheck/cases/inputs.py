"""Inputs: seeds, distributions, dtype casts, memory layouts and the digest of a case's inputs.

This is the first stage of numcheck's data flow (docs/DESIGN.md): a case names its distribution,
shape and seed; ``draw`` makes float64 values on the CPU from them; ``cast`` rounds those values to
each argument's dtype with numcheck's own rounding and keeps an exact float64 copy, so the kernel,
the FP64 reference and the baseline all see the same numbers; ``with_layout`` gives the kernel
the same values in another memory layout (strides are where kernels break).

Golden-gated cases come from fixed, enumerated grids (rule 8; numcheck.cases.design), and a
hypothesis search runs beside them (numcheck.cases.strategies).

Reproducibility. Everything here is a pure function of its arguments: seeds come from sha256
(never Python's ``hash``, which is salted per process), values from a ``torch.Generator`` on the
CPU, grids from index arithmetic (never from iterating a set of user values). Bit-identical
values on another machine rest on torch's CPU generator and the float64 exp/log/sin of the
platform's libm; each golden row stores a digest of its inputs, so a drift there shows up as
"inputs changed", never as a numerical regression.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

import torch

from numcheck import formats
from numcheck.errors import NumcheckError, UsageError
from numcheck.formats import round_to

__all__ = ["BLOCK_SCALE_DISTRIBUTIONS", "DISTRIBUTIONS", "LAYOUTS", "cast", "check_dist", "draw",
           "input_digest", "seed_for", "with_layout"]

# ----------------------------------------------------------------------------------------------
# Seeds and distributions
# ----------------------------------------------------------------------------------------------

DISTRIBUTIONS: tuple[str, ...] = (
    "normal", "uniform", "lognormal", "student_t", "outlier_channels", "sparse", "zero_blocks",
    "constant_rows", "large_mean", "near_overflow", "subnormal", "wide_range",
)
# Grid classes of the block-scaled formats (MX, NVFP4, block FP8): draw() makes them like any
# distribution, but they stay out of DISTRIBUTIONS, the input zoo that the hypothesis strategies
# and the quant suite's round-trip paths sweep (numcheck.quant.quant_rules holds a measured floor per
# path for exactly that list). Both are the same tensor up to an exact power of two (their
# pattern and values are drawn from one stream, whichever of the two is asked for).
BLOCK_SCALE_DISTRIBUTIONS: tuple[str, ...] = ("blocks_tiny", "blocks_huge")

# Student's t with 3 degrees of freedom: the heaviest tail that still has a finite variance.
_T_DF = 3
# outlier_channels: one outlier channel per 64 (at least one), scaled by 100x..1000x, the range
# reported for LLM activation outliers (LLM.int8(), SmoothQuant).
_OUTLIER_EVERY = 64
_OUTLIER_MIN_LOG10, _OUTLIER_MAX_LOG10 = 2.0, 3.0
# sparse: probability that an element is kept (90% exact zeros, pruned/ReLU-like inputs).
_SPARSE_KEEP = 0.1
# zero_blocks: 32 = the MX block and a common tile width; 1/4 of rows and 1/4 of the remaining
# blocks are zeroed (floor of the count, so a single row or a single block is never all zero).
_ZERO_BLOCK = 32
_ZERO_FRACTION_DEN = 4
# large_mean: mean 64, std 1/8 (both exact powers of two). A bf16 step at 64 is 0.5 = 4 std, so a
# bf16 copy keeps ~2 bits of the deviation, and a one-pass E[x^2]-E[x]^2 loses ~18 of fp32's 24
# bits to cancellation (mean^2/var = 2^18): the classic LayerNorm/variance trap.
_LARGE_MEAN, _LARGE_STD = 64.0, 0.125
# near_overflow: |x| = max * 2^-U(1,4): within 1..4 binades under the storage format's max, so
# products/sums of two overflow while every stored value is finite.
_NEAR_OVERFLOW_LO, _NEAR_OVERFLOW_HI = 1.0, 4.0
# wide_range: |x| = 2^U(-20,20): 40 binades, more than fp16 holds (it has 30 normal binades).
_WIDE_LO, _WIDE_HI = -20.0, 20.0
# blocks_tiny / blocks_huge: zeroed tiles of the scaling groups' sizes, largest first (128 x 128:
# block FP8 weights; 16 x 16: NVFP4 2-D), then zeroed and constant 32-element blocks along the
# last dim (MX; two NVFP4 blocks; a quarter of a 1 x 128 FP8 block). A quarter of the tiles and
# blocks still live at each step are zeroed (floor, so a tensor of fewer than 4 is left whole),
# an eighth of the remaining fully live 32-blocks made constant.
_SCALE_TILES = (128, 16)
_CONST_FRACTION_DEN = 8
# blocks_tiny puts the tensor's amax in the binade 2^(e_min + 5) of the storage format (e_min:
# its smallest normal's exponent; fp32/bf16: [2^-121, 2^-120)): low enough that 2688 / amax
# (NVFP4's encode scale), 448 / amax (FP8's) and MX's shared exponent floor(log2 amax) - 8
# (e4m3) all leave fp32's / E8M0's range and clamp, and that the smaller elements are
# subnormal in bf16 and fp32. blocks_huge puts it in 2^(e_max - 7) (e_max: the exponent of the
# format's largest binade; fp32/bf16: [2^120, 2^121)), where x * scale and amax-derived
# products of kernels come within a few binades of overflow.
_TINY_ABOVE_MIN_NORMAL = 5
_HUGE_BELOW_MAX = 7


def seed_for(*parts: object) -> int:
    """A stable 63-bit seed from the ``str()`` of each part (sha256, the same in every process).

    Each part is length-prefixed before hashing, so ``("ab", "c")`` and ``("a", "bc")`` differ.
    63 bits: fits a signed int64 and ``torch.Generator.manual_seed``.
    """
    h = hashlib.sha256()
    for p in parts:
        s = str(p).encode("utf-8")
        h.update(len(s).to_bytes(8, "big"))
        h.update(s)
    return int.from_bytes(h.digest()[:8], "big") >> 1


def _check_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, int) or not isinstance(shape, Iterable):
        raise UsageError(f"shape={shape!r}: pass a tuple of ints, e.g. (4, 127, 64) or () for a "
                         "scalar")
    out = tuple(shape)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in out):
        raise UsageError(f"shape={shape!r}: every side must be an int >= 0")
    return out


def check_dist(dist: str) -> None:
    if dist not in DISTRIBUTIONS and dist not in BLOCK_SCALE_DISTRIBUTIONS:
        raise UsageError(f"dist={dist!r} is not a numcheck distribution; use one of "
                         f"{', '.join(DISTRIBUTIONS + BLOCK_SCALE_DISTRIBUTIONS)}")


def _normal(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _uniform(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """U[0, 1) in float64."""
    return torch.rand(shape, generator=g, dtype=torch.float64)


def _sign(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """+1 or -1 with equal probability, float64."""
    return 1.0 - 2.0 * torch.randint(0, 2, shape, generator=g, dtype=torch.int64).to(torch.float64)


def _pow2_uniform(g: torch.Generator, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
    """2^U(lo, hi): log-uniform magnitudes."""
    return torch.exp2(lo + (hi - lo) * _uniform(g, shape))


def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
    """(number of rows, row length) when the last dim is the row; a scalar is one row of one."""
    if not shape:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


def draw(dist: str, shape: tuple[int, ...], *, seed: int, fmt="fp32",
         stream: str = "") -> torch.Tensor:
    """Values of distribution ``dist`` as a float64 CPU tensor of ``shape``.

    Deterministic in (dist, shape, seed, fmt, stream): a ``torch.Generator`` seeded with
    ``seed_for(seed, stream, dist)``. ``stream`` names the argument (``"q"``, ``"k"``, ``"v"``), so
    the arguments of one case get independent values from one case seed. ``fmt`` is the format
    the values will be stored in (numcheck name or torch dtype); only near_overflow and subnormal
    depend on it. Rows are along the last dim.

    * ``normal`` N(0,1); ``uniform`` U(-1,1); ``lognormal`` random sign * exp(N(0,1)).
    * ``student_t``: t with 3 degrees of freedom, N / sqrt(chi2_3 / 3) from torch normals (no
      scipy: the same values wherever torch runs).
    * ``outlier_channels``: N(0,1) with max(1, C//64) channels of the last dim (C = its size),
      picked from the seed, each scaled by 10^U(2,3) (100x..1000x, as in LLM activations).
    * ``sparse``: N(0,1) with each element zero with probability 0.9 (+0.0 exactly).
    * ``zero_blocks``: N(0,1); floor(R/4) of the R rows zeroed whole, then floor(n/4) of the n
      aligned 32-element blocks of the other rows zeroed (the last block may be partial). Counts
      are exact functions of the shape, positions come from the seed.
    * ``constant_rows``: each row one N(0,1) value (zero variance).
    * ``large_mean``: 64 + N(0,1)/8; mean >> std (see _LARGE_MEAN for why these numbers).
    * ``near_overflow``: random sign * max(fmt) * 2^-U(1,4); positive only for unsigned formats.
    * ``subnormal``: random sign * 2^U over [min_subnormal, largest subnormal] of ``fmt`` (the
      largest subnormal, not min_normal, is the top so that RNE can never round up to a normal);
      UsageError for a format without subnormals (e8m0).
    * ``wide_range``: random sign * 2^U(-20, 20).
    * ``blocks_tiny`` / ``blocks_huge`` (BLOCK_SCALE_DISTRIBUTIONS, for block-scaled formats):
      N(0,1) over the last two dims (R x C; leading dims are separate matrices, a vector one
      row) with floor(n/4) of the live aligned 128 x 128 tiles zeroed, then floor(n/4) of the
      live 16 x 16 tiles, then floor(n/4) of the live 32-element blocks along the last dim
      (edges partial; "live": not all zero yet), and floor(n/8) of the remaining wholly nonzero
      32-blocks made constant (each its first value); then multiplied by the power of two that
      puts max |x| in the binade 2^(e_min(fmt) + 5) (tiny; fp32/bf16: [2^-121, 2^-120)) or
      2^(e_max(fmt) - 7) (huge; fp32/bf16: [2^120, 2^121)). The two are one tensor up to a power
      of two. UsageError for an unsigned format.

    Shapes may have any rank (``()`` is a scalar), sides of 1 and 0 (an empty tensor).
    """
    check_dist(dist)
    shape = _check_shape(shape)
    f = formats.get(fmt)
    if dist in BLOCK_SCALE_DISTRIBUTIONS:
        # One stream for both: blocks_tiny and blocks_huge differ by a power of two only.
        g = torch.Generator(device="cpu").manual_seed(seed_for(seed, stream, "blocks"))
        return _scaled_blocks(g, shape, f, huge=dist == "blocks_huge")
    g = torch.Generator(device="cpu").manual_seed(seed_for(seed, stream, dist))

    if dist == "normal":
        return _normal(g, shape)
    if dist == "uniform":
        return 2.0 * _uniform(g, shape) - 1.0
    if dist == "lognormal":
        return _sign(g, shape) * torch.exp(_normal(g, shape))
    if dist == "student_t":
        z = _normal(g, shape)
        chi2 = (_normal(g, (_T_DF, *shape)) ** 2).sum(0)
        return z / torch.sqrt(chi2 / _T_DF)
    if dist == "outlier_channels":
        x = _normal(g, shape)
        if x.numel() == 0:
            return x
        c = _rows(shape)[1]
        n_out = max(1, c // _OUTLIER_EVERY)
        channels = torch.randperm(c, generator=g)[:n_out]
        scale = torch.ones(c, dtype=torch.float64)
        scale[channels] = 10.0 ** (_OUTLIER_MIN_LOG10 + (_OUTLIER_MAX_LOG10 - _OUTLIER_MIN_LOG10)
                                   * _uniform(g, (n_out,)))
        return x * (scale if shape else scale[0])
    if dist == "sparse":
        x = _normal(g, shape)
        return torch.where(_uniform(g, shape) < _SPARSE_KEEP, x, 0.0)
    if dist == "zero_blocks":
        return _zero_blocks(g, shape)
    if dist == "constant_rows":
        if not shape:
            return _normal(g, shape)
        return _normal(g, (*shape[:-1], 1)).expand(shape).contiguous()
    if dist == "large_mean":
        return _LARGE_MEAN + _LARGE_STD * _normal(g, shape)
    if dist == "near_overflow":
        mag = f.max * _pow2_uniform(g, shape, -_NEAR_OVERFLOW_HI, -_NEAR_OVERFLOW_LO)
        return _sign(g, shape) * mag if f.signed else mag
    if dist == "subnormal":
        if f.min_subnormal is None:
            raise UsageError(f"dist='subnormal': format {f.name} has no subnormal values; "
                             "pick a format that has them or another distribution")
        lo, hi = f.min_subnormal, f.min_normal - f.min_subnormal
        mag = _pow2_uniform(g, shape, math.log2(lo), math.log2(hi)).clamp(lo, hi)
        return _sign(g, shape) * mag if f.signed else mag
    # wide_range (the last of DISTRIBUTIONS; check_dist rejected anything else)
    return _sign(g, shape) * _pow2_uniform(g, shape, _WIDE_LO, _WIDE_HI)


def _zero_blocks(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    x = _normal(g, shape)
    n_rows, c = _rows(shape)
    if x.numel() == 0:
        return x
    n_blocks = -(-c // _ZERO_BLOCK)
    keep = torch.ones(n_rows, n_blocks, dtype=torch.bool)
    dead_rows = torch.randperm(n_rows, generator=g)[: n_rows // _ZERO_FRACTION_DEN]
    keep[dead_rows] = False
    live = torch.nonzero(keep[:, 0]).flatten()
    cells = (live[:, None] * n_blocks + torch.arange(n_blocks)).flatten()
    dead_cells = cells[torch.randperm(cells.numel(), generator=g)[: cells.numel()
                                                                  // _ZERO_FRACTION_DEN]]
    keep.view(-1)[dead_cells] = False
    mask = keep.repeat_interleave(_ZERO_BLOCK, dim=1)[:, :c]
    return torch.where(mask.reshape(shape), x, 0.0)


def _kill_some(g: torch.Generator, dead: torch.Tensor, live: torch.Tensor) -> None:
    """Set floor(n/4) of the n True entries of ``live`` (picked from g) True in ``dead``."""
    idx = torch.nonzero(live.flatten()).flatten()
    pick = idx[torch.randperm(idx.numel(), generator=g)[: idx.numel() // _ZERO_FRACTION_DEN]]
    dead.view(-1)[pick] = True


def _scaled_blocks(g: torch.Generator, shape: tuple[int, ...], f: formats.Format,
                   huge: bool) -> torch.Tensor:
    if not f.signed:
        raise UsageError(f"dist='blocks_{'huge' if huge else 'tiny'}': format {f.name} is "
                         "unsigned; the blocks hold N(0,1) values of both signs")
    x = _normal(g, shape)
    if x.numel() == 0:
        return x
    r = shape[-2] if len(shape) >= 2 else 1
    c = shape[-1] if shape else 1
    m = x.reshape(-1, r, c)  # a view: x is contiguous
    zero = torch.zeros(m.shape, dtype=torch.bool)
    for t in _SCALE_TILES:
        nr, nc = -(-r // t), -(-c // t)
        pad = torch.nn.functional.pad(zero, (0, nc * t - c, 0, nr * t - r), value=True)
        tiles = pad.reshape(-1, nr, t, nc, t)
        dead = torch.zeros(tiles.shape[0], nr, nc, dtype=torch.bool)
        _kill_some(g, dead, ~tiles.all(dim=(2, 4)))
        grow = dead.repeat_interleave(t, 1).repeat_interleave(t, 2)[:, :r, :c]
        zero |= grow
    nb = -(-c // _ZERO_BLOCK)
    pad = torch.nn.functional.pad(zero.reshape(-1, c), (0, nb * _ZERO_BLOCK - c), value=True)
    blocks = pad.reshape(-1, nb, _ZERO_BLOCK)
    dead = torch.zeros(blocks.shape[0], nb, dtype=torch.bool)
    _kill_some(g, dead, ~blocks.all(-1))
    zero |= dead.repeat_interleave(_ZERO_BLOCK, 1)[:, :c].reshape(m.shape)
    # Constant blocks: among the wholly nonzero full 32-blocks, an eighth (floor).
    full = c // _ZERO_BLOCK
    rows = torch.where(zero, 0.0, m).reshape(-1, c)
    if full:
        body = rows[:, : full * _ZERO_BLOCK].reshape(-1, full, _ZERO_BLOCK).clone()
        whole = ~(body == 0).any(-1)
        idx = torch.nonzero(whole.flatten()).flatten()
        pick = idx[torch.randperm(idx.numel(), generator=g)[: idx.numel() // _CONST_FRACTION_DEN]]
        flat = body.reshape(-1, _ZERO_BLOCK)
        flat[pick] = flat[pick, :1].expand(-1, _ZERO_BLOCK)
        rows[:, : full * _ZERO_BLOCK] = flat.reshape(rows.shape[0], -1)
    out = rows.reshape(shape)
    amax = out.abs().amax()
    if amax == 0:
        return out
    # floor(log2 v) = frexp's exponent - 1; the scale 2^k is exact, and so is the product (for
    # every format but fp64, whose tiny binade reaches float64's own subnormals).
    if huge:
        target = math.frexp(f.max)[1] - 1 - _HUGE_BELOW_MAX
    else:
        target = math.frexp(f.min_normal)[1] - 1 + _TINY_ABOVE_MIN_NORMAL
    k = target - (math.frexp(float(amax))[1] - 1)
    return out * 2.0 ** k


# ----------------------------------------------------------------------------------------------
# Casts and layouts
# ----------------------------------------------------------------------------------------------

# torch dtypes cast() supports: the storage dtypes with a numcheck format whose torch conversion
# from on-grid float64 is exact.
_CAST_FORMATS = {
    torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2",
}


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical float64 values (signed zeros included), NaN compared by class."""
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    ba = torch.where(na, 0, a.view(torch.int64))
    bb = torch.where(nb, 0, b.view(torch.int64))
    return torch.equal(ba, bb)


def cast(x64: torch.Tensor, dtype, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Round ``x64`` to ``dtype`` with numcheck's rounding; return (on device, float64 CPU copy).

    The rounding is ``nc.round_to(x, fmt, "rne", saturate=True)`` from float64, not torch's cast,
    which goes float64 -> fp32 -> target and double-rounds (1 + 2^-8 + 2^-40 becomes 1.0 in bf16,
    not 1 + 2^-7). The rounded float64 values are on the target's grid, so converting them to
    ``dtype`` is exact; that is checked (it fails, for instance, under
    ``torch.set_flush_denormal(True)``), so the kernel's tensor and the float64 copy that the
    reference sees hold bit-identical values. Saturating: out-of-range values and infinities
    become +-max (fp8 practice); NaN stays NaN.

    ``dtype``: float64, float32, float16, bfloat16, float8_e4m3fn or float8_e5m2 (or the numcheck
    name of one). For float64 both results are copies of x64.
    """
    if not isinstance(x64, torch.Tensor) or not x64.is_floating_point():
        raise UsageError(f"cast: x64 must be a floating-point tensor, got {type(x64).__name__}"
                         + (f" of {x64.dtype}" if isinstance(x64, torch.Tensor) else ""))
    if isinstance(dtype, str):
        dtype = formats.get(dtype).torch
    if dtype not in _CAST_FORMATS:
        names = ", ".join(str(d).removeprefix("torch.") for d in _CAST_FORMATS)
        raise UsageError(f"cast: dtype={dtype!r} is not supported; use one of {names}")
    x = x64.detach().to(device="cpu", dtype=torch.float64)  # widening is exact
    if dtype == torch.float64:
        return x.to(device=device, copy=True), x.clone()
    r = round_to(x, _CAST_FORMATS[dtype], "rne", saturate=True)
    t = r.to(dtype)
    if not _same_values(t.to(torch.float64), r):
        raise NumcheckError(
            f"cast: converting on-grid float64 values to {dtype} changed them (is "
            "torch.set_flush_denormal(True) on?); the kernel and the reference would see "
            "different inputs")
    return t.to(device), r


LAYOUTS = ("contiguous", "transposed", "sliced")


def with_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values and logical shape as ``x`` in another memory layout, on x's device.

    * ``contiguous``: row-major (``x.contiguous()``).
    * ``transposed``: the last two dims column-major (``x.mT.contiguous().mT``); rank < 2 is
      returned unchanged.
    * ``sliced``: a stride-2 view along the last dim, cut from a buffer twice as wide, as a slice
      of a fused QKV projection is. The gaps hold NaN for floating dtypes (zeros otherwise), so a
      kernel that ignores strides reads NaN and fails visibly. A scalar is returned unchanged.

    The result is not ``is_contiguous()`` wherever the shape allows (transposed needs both of the
    last two sides > 1; sliced needs more than one element). Apply the layout before
    ``requires_grad_()``: the sliced/transposed result is then a leaf view that accepts it.
    """
    if layout not in LAYOUTS:
        raise UsageError(f"layout={layout!r}: use one of {', '.join(LAYOUTS)}")
    if layout == "contiguous":
        return x.contiguous()
    if layout == "transposed":
        return x.mT.contiguous().mT if x.dim() >= 2 else x
    if x.dim() == 0:
        return x
    buf = torch.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype, device=x.device)
    buf[..., 1::2] = float("nan") if x.is_floating_point() else 0
    view = buf[..., ::2]
    view.copy_(x)
    return view


def input_digest(exact: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> str:
    """16 hex digits over the case's exact inputs (names, dtypes, shapes, values) and kwargs:
    a golden row whose digest differs saw other inputs, which is not a regression."""
    h = hashlib.sha256()
    for name in sorted(exact):
        t = exact[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    for name in sorted(kwargs):
        v = kwargs[name]
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.numpy().tobytes())
        else:
            h.update(f"{name}={v!r}".encode())
    return h.hexdigest()[:16]


def combined_digest(digests: list[str]) -> str:
    """One digest over several draws' (a case whose outputs are judged pooled): in order."""
    return hashlib.sha256(",".join(digests).encode()).hexdigest()[:16]
