"""Number formats: the format table, numcheck's own rounding, and ULP distances.

Every rounding here is numcheck's own arithmetic on float64 bit patterns, exact by construction:
the input's exponent comes from its bits, the value is scaled by an exact power of two so that
one quantum of the target is 1.0, and the integer/fraction split of that scaled value (exact
below 2^53) decides the rounding. There is no intermediate cast, so there is no double rounding
(torch and ml_dtypes cast fp64 -> fp32 -> target and get values within 2^-30 of a midpoint wrong;
see docs/formats.md). Library casts appear only as oracles in tests.

Conventions (written down once, tested in tests/test_formats_*.py):

* ``saturate=True`` clamps every non-NaN input into [-max, max], infinities included (OCP FP8
  saturating conversion; what torch's e4m3fn cast does).
* ``saturate=False`` is the format's own overflow: inf for fp64/fp32/tf32/bf16/fp16/e5m2, NaN for
  e4m3 (no inf encoding) and e8m0. e2m3, e3m2, e2m1 have neither and always saturate.
  Round-toward-zero never overflows a finite input to inf (IEEE 754-2019 section 7.4): it gives max.
* NaN stays NaN. e2m3/e3m2/e2m1 have no NaN encoding (in MX the NaN lives in the block scale):
  round_to still returns NaN, being float64; ml_dtypes writes a zero with the NaN's sign bit
  flipped there (+NaN -> -0; a documented finding).
* Signed zero is kept: a negative value that rounds to zero gives -0.0.
* e8m0 holds only 2^-127 .. 2^127 (no sign, no zero, code 0xFF = NaN). Positive values round to
  the nearest power of two (linear midpoint 1.5 * 2^k; ties go up, as torch and ml_dtypes do) and
  clamp at 2^-127 from below; negative values and NaN give NaN. Zero has no encoding: 2^-127 with
  saturate=True (torch's code 0x00), NaN with saturate=False (ml_dtypes).
* tf32 is fp32's exponent range with a 10-bit mantissa, subnormals included (min 2^-136).
* Stochastic rounding rounds up with probability frac(|x| / quantum), drawn as a 53-bit uniform:
  exact for every fraction with at most 53 bits (all inputs at or above the target's normal range).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from numcheck.errors import UsageError

ROUNDINGS = ("rne", "rz", "rna", "sr")


@dataclass(frozen=True)
class Format:
    """One number format. Constants are exact (hex floats); tests re-derive them from the bits."""

    name: str
    ebits: int
    mbits: int  # explicit fraction bits
    bias: int
    emin: int  # unbiased exponent of the smallest normal
    emax: int  # unbiased exponent of the largest finite value
    max: float
    min_normal: float
    min_subnormal: float | None  # None: the format has no subnormals
    has_inf: bool
    has_nan: bool
    signed: bool
    inf_encoding: str
    nan_encoding: str
    torch_dtype: str | None  # attribute name in torch, where torch has the dtype
    ml_dtypes_dtype: str | None  # attribute name in ml_dtypes (numpy's own for fp64/fp32/fp16)

    @property
    def bits(self) -> int:
        return int(self.signed) + self.ebits + self.mbits

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value: 2^-mbits."""
        return 2.0 ** -self.mbits

    @property
    def unit_roundoff(self) -> float:
        """Largest relative error of round-to-nearest in the normal range: 2^-(mbits+1)."""
        return 2.0 ** -(self.mbits + 1)

    @property
    def overflow_threshold(self) -> float:
        """max plus half the step below it (the top binade's ulp): RNE without saturation rounds
        values above this beyond max (e4m3: 464, e5m2: 61440, e2m1: 7)."""
        return self.max + 0.5 * 2.0 ** (self.emax - self.mbits)

    @property
    def always_saturates(self) -> bool:
        return not self.has_inf and not self.has_nan

    # Bit-layout constants, for the compiled passes that decode encodings from their bits
    # (numcheck/measure/_stats_*, numcheck/telemetry/_fields_*, _quant_numba). Exact ints from
    # the field widths above; layout: sign, exponent, fraction (IEEE 754-2019 section 3.4).
    @property
    def frac_mask(self) -> int:
        """The fraction field's bits, 2^mbits - 1 (fp64: 0xFFFFFFFFFFFFF, fp16: 0x3FF)."""
        return (1 << self.mbits) - 1

    @property
    def exp_mask(self) -> int:
        """The exponent field's bits, unshifted: 2^ebits - 1, the code of inf and NaN in IEEE
        formats (fp64: 0x7FF, fp16: 0x1F)."""
        return (1 << self.ebits) - 1

    @property
    def abs_mask(self) -> int:
        """The encoding's bits without the sign: its magnitude, which orders like the integer
        it is (fp32: 0x7FFFFFFF, bf16 and fp16: 0x7FFF)."""
        return (1 << (self.ebits + self.mbits)) - 1

    @property
    def inf_bits(self) -> int | None:
        """+inf's encoding, the exponent field all ones over a zero fraction (fp32: 0x7F800000,
        bf16: 0x7F80, fp16: 0x7C00); None where the format has no inf."""
        return self.exp_mask << self.mbits if self.has_inf else None

    @property
    def max_significand(self) -> int:
        """max as an integer significand times 2^(emax - mbits) (e4m3: 14, e2m1: 3)."""
        return int(self.max * 2.0 ** (self.mbits - self.emax))

    @property
    def max_ordinal(self) -> int:
        """max's position in the ordered encoding (``ordinal``): for an IEEE-like format, the
        magnitude bits of its code (bf16: 0x7F7F, e4m3: 0x7E)."""
        return (self.emax - self.emin) * 2**self.mbits + self.max_significand

    @property
    def torch(self) -> torch.dtype | None:
        return getattr(torch, self.torch_dtype) if self.torch_dtype else None


def _f(h: str) -> float:
    return float.fromhex(h)


FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("fp64", 11, 52, 1023, -1022, 1023, _f("0x1.fffffffffffffp1023"), _f("0x1p-1022"),
           _f("0x1p-1074"), True, True, True, "S.11111111111.0{52}", "S.11111111111.(nonzero)",
           "float64", "float64"),
    Format("fp32", 8, 23, 127, -126, 127, _f("0x1.fffffep127"), _f("0x1p-126"), _f("0x1p-149"),
           True, True, True, "S.11111111.0{23}", "S.11111111.(nonzero)", "float32", "float32"),
    Format("tf32", 8, 10, 127, -126, 127, _f("0x1.ffcp127"), _f("0x1p-126"), _f("0x1p-136"),
           True, True, True, "as fp32", "as fp32", None, None),
    Format("bf16", 8, 7, 127, -126, 127, _f("0x1.fep127"), _f("0x1p-126"), _f("0x1p-133"),
           True, True, True, "S.11111111.0000000", "S.11111111.(nonzero)", "bfloat16", "bfloat16"),
    Format("fp16", 5, 10, 15, -14, 15, _f("0x1.ffcp15"), _f("0x1p-14"), _f("0x1p-24"),
           True, True, True, "S.11111.0{10}", "S.11111.(nonzero)", "float16", "float16"),
    Format("e4m3", 4, 3, 7, -6, 8, _f("0x1.cp8"), _f("0x1p-6"), _f("0x1p-9"),
           False, True, True, "none", "S.1111.111", "float8_e4m3fn", "float8_e4m3fn"),
    Format("e5m2", 5, 2, 15, -14, 15, _f("0x1.cp15"), _f("0x1p-14"), _f("0x1p-16"),
           True, True, True, "S.11111.00", "S.11111.{01,10,11}", "float8_e5m2", "float8_e5m2"),
    Format("e2m3", 2, 3, 1, 0, 2, _f("0x1.ep2"), _f("0x1p0"), _f("0x1p-3"),
           False, False, True, "none", "none", None, "float6_e2m3fn"),
    Format("e3m2", 3, 2, 3, -2, 4, _f("0x1.cp4"), _f("0x1p-2"), _f("0x1p-4"),
           False, False, True, "none", "none", None, "float6_e3m2fn"),
    Format("e2m1", 2, 1, 1, 0, 2, _f("0x1.8p2"), _f("0x1p0"), _f("0x1p-1"),
           False, False, True, "none", "none", "float4_e2m1fn_x2", "float4_e2m1fn"),
    Format("e8m0", 8, 0, 127, -127, 127, _f("0x1p127"), _f("0x1p-127"), None,
           False, True, False, "none", "11111111", "float8_e8m0fnu", "float8_e8m0fnu"),
]}

_ALIASES = {
    "float64": "fp64", "double": "fp64", "float32": "fp32", "float": "fp32",
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float6_e2m3fn": "e2m3",
    "float6_e3m2fn": "e3m2", "float4_e2m1fn": "e2m1", "float4_e2m1fn_x2": "e2m1",
    "float8_e8m0fnu": "e8m0",
}


def get(fmt: str | Format | torch.dtype) -> Format:
    """Look a format up by name (``"bf16"``, ``"e4m3"``, ``"bfloat16"``), Format or torch dtype."""
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, torch.dtype):
        name = str(fmt).removeprefix("torch.")
    elif isinstance(fmt, str):
        name = fmt
    else:
        raise UsageError(f"fmt={fmt!r}: expected a format name, a Format or a torch dtype")
    name = _ALIASES.get(name, name)
    if name not in FORMATS:
        raise UsageError(f"fmt={fmt!r} is not a numcheck format; use one of {', '.join(FORMATS)}")
    return FORMATS[name]


def widen(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the precision fused kernels compute half-precision inputs in: bf16/fp16 as fp32,
    other dtypes as they are (the careful baselines, DESIGN rule 4)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0**k as float64, exact, built from the bits; k (int64) must lie in [-1022, 1023]."""
    return ((k + 1023) << 52).view(torch.float64)


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) (int64) for finite float64 a >= 0, from the exponent bits: exact for every
    normal float64 (fp32/bf16/fp16 subnormals are normal there); zero and fp64 subnormals give
    -1023."""
    return (a.view(torch.int64) >> 52) - 1023


def _round_magnitude(a: torch.Tensor, f: Format, rounding: str,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Round finite a >= 0 (float64) to f's grid with an unbounded exponent range above.

    Returns (magnitude, ordinal): the rounded value before any overflow rule, and its position in
    f's ordered encoding (the same integer as ordinal gives, computed in the same pass).
    """
    # Exponent clamped to [emin, emax + 1]: below emin the quantum is the subnormal step; above
    # emax + 1 everything overflows anyway, and the clamp keeps every power of two in range.
    e = floor_log2(a).clamp(f.emin, f.emax + 1)
    qexp = e - f.mbits
    m = a * pow2(-qexp)  # exact: scaling by a power of two, result far from under/overflow
    low = torch.floor(m)
    frac = m - low  # exact while m < 2^53 (always, except beyond-overflow values)
    if rounding == "rne":
        up = (frac > 0.5) | ((frac == 0.5) & (torch.remainder(low, 2.0) == 1.0))
    elif rounding == "rna":
        up = frac >= 0.5
    elif rounding == "rz":
        up = torch.zeros_like(frac, dtype=torch.bool)
    else:
        draws = torch.randint(0, 2**53, m.shape, generator=generator, device=m.device,
                              dtype=torch.int64)
        up = draws.to(torch.float64) * 2.0**-53 < frac
    steps = low + up
    return steps * pow2(qexp), (e - f.emin) * 2**f.mbits + steps.to(torch.int64)


def round_to(x, fmt, rounding: str = "rne", saturate: bool = True,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Round ``x`` to the values of ``fmt``; returns float64 on x's device.

    rounding: ``rne`` (nearest, ties to even), ``rz`` (toward zero), ``rna`` (nearest, ties away:
    what tf32 conversion does on NVIDIA GPUs) or ``sr`` (stochastic; needs ``generator``, a
    torch.Generator on x's device). ``saturate`` as the module docstring says.
    """
    f = get(fmt)
    if rounding not in ROUNDINGS:
        raise UsageError(f"rounding={rounding!r}: use one of {', '.join(ROUNDINGS)}")
    x64 = as_float64(x, "round_to")
    if rounding == "sr" and generator is None:
        raise UsageError("rounding='sr' needs generator=torch.Generator(device=x.device)"
                         ".manual_seed(...): stochastic rounding must be reproducible")
    if f.name == "fp64":
        return x64.clamp(-f.max, f.max) if saturate else x64.clone()
    if _has_fast_rne(f, rounding):
        return _rne(x64, f, saturate)
    return round_with_ordinal(x64, f, rounding, saturate, generator)[0]


def as_float64(x, who: str, device=None) -> torch.Tensor:
    """x as float64, exactly: Python numbers go straight to float64 (never through fp32)."""
    if not isinstance(x, torch.Tensor):
        return torch.as_tensor(x, dtype=torch.float64, device=device)
    if not (x.is_floating_point() or x.dtype in (torch.int8, torch.int16, torch.int32)):
        raise UsageError(f"{who}: x has dtype {x.dtype}; pass a floating-point tensor "
                         "(int64 does not convert to float64 exactly)")
    return x.to(device=device or x.device, dtype=torch.float64)


def round_with_ordinal(x64: torch.Tensor, f: Format, rounding: str = "rne", saturate: bool = True,
                       generator: torch.Generator | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """round_to's body for float64 x and f other than fp64: (values, signed ordinals), the
    ordinals (``ordinal``'s) computed in the same pass.

    The ordinal of an element whose result is not finite is meaningless; callers mask it.
    """
    if _has_fast_rne(f, rounding):
        out = _rne(x64, f, saturate)
        return out, _ordinal_on_grid(out, f)
    return _round_general(x64, f, rounding, saturate, generator)


def _has_fast_rne(f: Format, rounding: str) -> bool:
    return rounding == "rne" and f.min_subnormal is not None and f.signed


def _rne(x64: torch.Tensor, f: Format, saturate: bool) -> torch.Tensor:
    """Round to nearest even in ~8 elementwise passes (the general path takes ~35; qdq in
    training runs is dominated by them): float64 addition itself rounds to nearest even.

    With e the input's exponent clamped to [emin, emax + 1] and c = 2^(e - mbits + 52), |x| + c
    lies in [c, 2c) (|x| < 2^(e+1) <= c, as mbits <= 51), where float64's spacing is exactly the
    quantum 2^(e - mbits) of f: the sum is |x| rounded to f's grid (IEEE 754 addition, ties to
    even), plus c, and subtracting c is exact. Beyond 2^(emax+2) the sum may round coarser, but
    stays above f.max and overflows as it must. inf and NaN pass through the sum unchanged.
    tests/test_formats_rounding.py checks it against the general path on every format.
    """
    a = x64.abs()
    biased = (a.view(torch.int64) >> 52).clamp_(f.emin + 1023, f.emax + 1024)
    c = ((biased + (52 - f.mbits)) << 52).view(torch.float64)
    mag = (a + c).sub_(c)
    if saturate or f.always_saturates:
        mag = mag.clamp_(max=f.max)  # +-inf clamps too; NaN stays NaN (torch.clamp propagates it)
    else:
        mag = torch.where(mag > f.max, float("inf") if f.has_inf else float("nan"), mag)
    return torch.copysign(mag, x64)


def _ordinal_on_grid(v: torch.Tensor, f: Format) -> torch.Tensor:
    """Signed ordinal of finite values known to lie on f's grid, from their float64 bits: a
    normal value's exponent and top mbits fraction bits are its position above the subnormals."""
    a = v.abs()
    normal = (a.view(torch.int64) >> (52 - f.mbits)) - ((f.emin + 1022) << f.mbits)
    ordn = torch.where(a < f.min_normal, (a * 2.0 ** (f.mbits - f.emin)).to(torch.int64), normal)
    return torch.where(v < 0, -ordn, ordn)


def _round_general(x64: torch.Tensor, f: Format, rounding: str, saturate: bool,
                   generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.where(torch.isfinite(x64), x64.abs(), 0.0)
    mag, ordn = _round_magnitude(a, f, rounding, generator)

    if saturate or f.always_saturates:
        over_value = inf_value = f.max
    else:
        over_value = inf_value = float("inf") if f.has_inf else float("nan")
        if rounding == "rz":  # IEEE 754-2019 7.4: toward zero, a finite overflow gives max
            over_value = f.max
    over = mag > f.max
    mag = torch.where(over, over_value, mag)
    ordn = torch.where(over, _max_ordinal(f), ordn)
    mag = torch.where(torch.isinf(x64), inf_value, mag)
    if f.min_subnormal is None:  # e8m0: nothing below min_normal, and no zero
        under = mag < f.min_normal
        ordn = torch.where(under, 2**f.mbits, ordn)
        mag = torch.where(x64 == 0, f.min_normal if saturate else float("nan"),
                          torch.where(under, f.min_normal, mag))
    out = torch.copysign(mag, x64)
    if not f.signed:
        out = torch.where(x64 < 0, float("nan"), out.abs())
    out = torch.where(torch.isnan(x64), float("nan"), out)
    return out, torch.where(x64 < 0, -ordn, ordn)


def _max_ordinal(f: Format) -> int:
    return (f.emax - f.emin) * 2**f.mbits + int(f.max * 2.0 ** (f.mbits - f.emax))


def ordinal(v: torch.Tensor, f: Format) -> torch.Tensor:
    """Signed position of each value in f's ordered encoding (+0 and -0 both 0); int64.

    Raises UsageError for a value that is not in f (off the grid, beyond max, inf where f has
    none). NaN entries get 0; callers mask them.
    """
    nan = torch.isnan(v)
    a = torch.where(nan, 0.0, v.abs())
    inf = torch.isinf(a)
    if f.name == "fp64":
        return torch.where(v < 0, -1, 1) * (a.view(torch.int64) & 0x7FFFFFFFFFFFFFFF)
    fin = torch.where(inf, 0.0, a)
    e = floor_log2(fin).clamp(min=f.emin)
    s = fin * pow2(f.mbits - e)  # integer significand for values on f's grid
    bad = (s != torch.floor(s)) | (fin > f.max)
    if f.min_subnormal is None:
        bad |= fin < f.min_normal
    if not f.signed:
        bad |= v < 0
    if not f.has_inf:
        bad |= inf
    bad &= ~nan
    if bool(bad.any()):
        idx = int(torch.nonzero(bad.flatten())[0])
        raise UsageError(
            f"ulp_distance: {v.flatten()[idx].item()!r} (flat index {idx}) is not a value of "
            f"{f.name}; round it first with nc.round_to(x, {f.name!r}) or pass the format "
            "the values were produced in")
    top = _max_ordinal(f) + 1
    # In the lowest binade (and below it, subnormals) s is the ordinal itself; each binade above
    # adds 2^mbits. This is the magnitude of the bit encoding for every IEEE-like format.
    ordn = torch.where(inf, top, (e - f.emin) * 2**f.mbits + s.to(torch.int64))
    return torch.where(v < 0, -ordn, ordn)


def ulp_distance(a, b, fmt) -> torch.Tensor:
    """Number of steps between a and b in fmt's ordered values; int64, broadcast shape.

    0 means the same value (+0 and -0 are 0 apart). inf sits one step beyond max (IEEE order).
    NaN is compared by class: 0 when both are NaN, INT64_MAX when only one is. Values that are
    not in fmt raise UsageError (round them first with nc.round_to).
    """
    f = get(fmt)
    a64 = as_float64(a, "ulp_distance")
    b64 = as_float64(b, "ulp_distance", device=a64.device)
    a64, b64 = torch.broadcast_tensors(a64, b64)
    oa, ob = ordinal(a64, f), ordinal(b64, f)
    diff = oa - ob
    # fp64 ordinals reach 2^62.9: a difference across zero can wrap; it saturates instead.
    wrapped = ((oa >= 0) & (ob < 0) & (diff < 0)) | ((oa < 0) & (ob >= 0) & (diff >= 0))
    d = torch.where(wrapped, torch.iinfo(torch.int64).max, diff.abs())
    na, nb = torch.isnan(a64), torch.isnan(b64)
    d = torch.where(na & nb, 0, d)
    return torch.where(na ^ nb, torch.iinfo(torch.int64).max, d)
