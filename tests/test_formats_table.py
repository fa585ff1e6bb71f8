"""The format table: every constant in formats.FORMATS re-derived from (ebits, mbits, bias) and the
inf/NaN rules, cross-checked with ml_dtypes.finfo and torch.finfo, and formats.get's lookups.

The derivation (independent of formats.py's own arithmetic, exact with Fraction):
* exponent field E in [0, 2^ebits - 1]; value = 2^(E - bias) * (1 + m / 2^mbits) for E >= 1.
* E = 0 is the subnormal binade (same exponent as E = 1, no implicit bit), except for formats
  without subnormals (e8m0: E = 0 is the normal value 2^-bias).
* IEEE-like formats with inf reserve E = all ones for inf/NaN; "fn" formats with NaN only (e4m3)
  reserve the single pattern S.1111.111; formats with neither (e2m3, e3m2, e2m1) use all patterns;
  e8m0 reserves 0xFF for NaN.
"""
from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import numcheck as nc
from numcheck import formats

ALL = list(formats.FORMATS)
DOC = Path(__file__).resolve().parents[1] / "docs" / "formats.md"

# Expected reservation rule per format: how the top of the encoding space is used.
#   "ieee": exponent all-ones = inf/NaN;  "fn": only all-ones exponent+mantissa is NaN;
#   "none": every pattern is a finite value;  "e8m0": 0xFF is NaN, no sign, no zero.
RULE = {"fp64": "ieee", "fp32": "ieee", "tf32": "ieee", "bf16": "ieee", "fp16": "ieee",
        "e5m2": "ieee", "e4m3": "fn", "e2m3": "none", "e3m2": "none", "e2m1": "none",
        "e8m0": "e8m0"}
# Widths from the formats' specs (IEEE 754, OCP FP8 / MX v1.0, NVIDIA TF32), not from formats.py.
SPEC = {"fp64": (11, 52, 1023), "fp32": (8, 23, 127), "tf32": (8, 10, 127), "bf16": (8, 7, 127),
        "fp16": (5, 10, 15), "e4m3": (4, 3, 7), "e5m2": (5, 2, 15), "e2m3": (2, 3, 1),
        "e3m2": (3, 2, 3), "e2m1": (2, 1, 1), "e8m0": (8, 0, 127)}
MAX_DECIMAL = {"e4m3": 448, "e5m2": 57344, "e2m3": 7.5, "e3m2": 28, "e2m1": 6, "fp16": 65504,
               "e8m0": 2.0**127}  # published maxima (OCP specs, IEEE binary16)


def derive(f: formats.Format) -> dict:
    """Constants of f from its bit layout alone (exact Fractions)."""
    rule = RULE[f.name]
    top = 2**f.ebits - 1  # all-ones exponent field
    if rule == "e8m0":
        emin = 0 - f.bias  # E = 0 is a normal value
        emax = top - 1 - f.bias  # 0xFF is NaN
        max_sig = Fraction(1)
        min_sub = None
    else:
        emin = 1 - f.bias
        min_sub = Fraction(2) ** (emin - f.mbits)
        if rule == "ieee":
            emax = top - 1 - f.bias
            max_sig = 2 - Fraction(1, 2**f.mbits)
        elif rule == "fn":
            emax = top - f.bias
            max_sig = 2 - Fraction(2, 2**f.mbits)  # mantissa all-ones is NaN
        else:
            emax = top - f.bias
            max_sig = 2 - Fraction(1, 2**f.mbits)
    return {"emin": emin, "emax": emax, "max": max_sig * Fraction(2) ** emax,
            "min_normal": Fraction(2) ** emin, "min_subnormal": min_sub,
            "has_inf": rule == "ieee", "has_nan": rule != "none", "signed": rule != "e8m0"}


def md_dtype(f: formats.Format):
    if f.ml_dtypes_dtype is None:
        return None
    return getattr(ml_dtypes, f.ml_dtypes_dtype, None) or np.dtype(f.ml_dtypes_dtype).type


@pytest.mark.parametrize("name", ALL)
def test_layout_matches_spec(name):
    f = formats.FORMATS[name]
    assert f.name == name
    assert (f.ebits, f.mbits, f.bias) == SPEC[name]


@pytest.mark.parametrize("name", ALL)
def test_constants_rederived_from_bits(name):
    f = formats.FORMATS[name]
    d = derive(f)
    assert f.emin == d["emin"]
    assert f.emax == d["emax"]
    assert Fraction(f.max) == d["max"]
    assert Fraction(f.min_normal) == d["min_normal"]
    if d["min_subnormal"] is None:
        assert f.min_subnormal is None
    else:
        assert Fraction(f.min_subnormal) == d["min_subnormal"]
    assert (f.has_inf, f.has_nan, f.signed) == (d["has_inf"], d["has_nan"], d["signed"])
    assert f.always_saturates == (not d["has_inf"] and not d["has_nan"])
    if name in MAX_DECIMAL:
        assert f.max == MAX_DECIMAL[name]


@pytest.mark.parametrize("name", ALL)
def test_bits_eps_unit_roundoff(name):
    f = formats.FORMATS[name]
    widths = {"fp64": 64, "fp32": 32, "tf32": 19, "bf16": 16, "fp16": 16, "e4m3": 8, "e5m2": 8,
              "e2m3": 6, "e3m2": 6, "e2m1": 4, "e8m0": 8}
    assert f.bits == widths[name]
    # eps: distance from 1.0 to the next value of the format, counted from the grid.
    assert Fraction(f.eps) == Fraction(1, 2**f.mbits)
    assert f.unit_roundoff == f.eps / 2
    if name not in ("e8m0",):  # 1 + eps is a value of f, 1 + eps/2 is not
        x = torch.tensor([1.0 + f.eps, 1.0 + f.eps / 2], dtype=torch.float64)
        assert nc.round_to(x, f, "rz").tolist() == [1.0 + f.eps, 1.0]


@pytest.mark.parametrize("name", [n for n in ALL if formats.FORMATS[n].ml_dtypes_dtype])
def test_against_ml_dtypes_finfo(name):
    f = formats.FORMATS[name]
    fi = ml_dtypes.finfo(md_dtype(f))
    assert float(fi.max) == f.max
    assert float(fi.smallest_normal) == f.min_normal
    # finfo reports smallest_subnormal == smallest_normal for a format without subnormals
    assert float(fi.smallest_subnormal) == (f.min_subnormal or f.min_normal)
    assert float(fi.eps) == f.eps
    assert (fi.minexp, fi.maxexp) == (f.emin, f.emax + 1)
    assert (fi.nmant, fi.nexp) == (f.mbits, f.ebits)
    assert fi.bits == f.bits


@pytest.mark.parametrize("name", [n for n in ALL if formats.FORMATS[n].torch_dtype
                                  and n != "e2m1"])  # float4_e2m1fn_x2: torch.finfo not implemented
def test_against_torch_finfo(name):
    f = formats.FORMATS[name]
    fi = torch.finfo(f.torch)
    assert fi.max == f.max
    assert fi.smallest_normal == f.min_normal
    assert fi.eps == f.eps
    assert fi.bits == f.bits


def test_torch_dtypes_exist_where_named():
    for f in formats.FORMATS.values():
        if f.torch_dtype:
            assert isinstance(f.torch, torch.dtype), f.name
            assert formats.get(f.torch) is f
        else:
            assert f.torch is None
    assert formats.FORMATS["tf32"].torch_dtype is None
    assert formats.FORMATS["tf32"].ml_dtypes_dtype is None


@pytest.mark.parametrize("name", [n for n, f in formats.FORMATS.items()
                                  if f.ml_dtypes_dtype and f.bits <= 16])
def test_encoding_counts_match_ml_dtypes(name):
    """NaN/inf encodings, max, smallest positive value and sign, enumerated from all encodings of
    the ml_dtypes type, agree with the rule used in derive()."""
    f = formats.FORMATS[name]
    dt = md_dtype(f)
    n = 2**f.bits
    codes = np.arange(n, dtype=np.uint8 if np.dtype(dt).itemsize == 1 else np.uint16)
    with np.errstate(invalid="ignore"):
        vals = codes.view(dt).astype(np.float64)
    assert np.isnan(vals).any() == f.has_nan
    assert np.isinf(vals).any() == f.has_inf
    finite = vals[np.isfinite(vals)]
    assert finite.max() == f.max
    assert finite[finite > 0].min() == (f.min_subnormal or f.min_normal)
    assert (finite < 0).any() == f.signed


GOOD_LOOKUPS = [
    ("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16"), ("half", "fp16"),
    ("float16", "fp16"), ("fp32", "fp32"), ("float", "fp32"), ("float32", "fp32"),
    ("double", "fp64"), ("float64", "fp64"), ("tf32", "tf32"), ("e4m3", "e4m3"),
    ("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2"), ("float6_e2m3fn", "e2m3"),
    ("float6_e3m2fn", "e3m2"), ("float4_e2m1fn", "e2m1"), ("float4_e2m1fn_x2", "e2m1"),
    ("float8_e8m0fnu", "e8m0"),
    (torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.half, "fp16"),
    (torch.float32, "fp32"), (torch.float64, "fp64"), (torch.float8_e4m3fn, "e4m3"),
    (torch.float8_e5m2, "e5m2"), (torch.float8_e8m0fnu, "e8m0"),
    (torch.float4_e2m1fn_x2, "e2m1"),
]


@pytest.mark.parametrize("key,name", GOOD_LOOKUPS, ids=[str(k) for k, _ in GOOD_LOOKUPS])
def test_get_accepts_names_aliases_dtypes(key, name):
    assert formats.get(key) is formats.FORMATS[name]


@pytest.mark.parametrize("name", ALL)
def test_get_accepts_format_and_own_name(name):
    f = formats.FORMATS[name]
    assert formats.get(f) is f
    assert formats.get(name) is f


BAD_LOOKUPS = [("bf17", "bf17"), ("BF16", "BF16"), ("", "''"), ("e4m3fnuz", "e4m3fnuz"),
               (torch.int32, "torch.int32"), (torch.float8_e4m3fnuz, "float8_e4m3fnuz"),
               (torch.complex64, "complex64"), (3, "3"), (None, "None"), (np.float32, "float32")]


@pytest.mark.parametrize("bad,shown", BAD_LOOKUPS, ids=[repr(b) for b, _ in BAD_LOOKUPS])
def test_get_rejects_with_usage_error_naming_value(bad, shown):
    with pytest.raises(nc.UsageError) as ei:
        formats.get(bad)
    assert shown in str(ei.value)
    assert isinstance(ei.value, ValueError)  # UsageError is a ValueError too


def test_round_to_and_ulp_reject_unknown_format():
    x = torch.tensor([1.0], dtype=torch.float64)
    with pytest.raises(nc.UsageError, match="fp9"):
        nc.round_to(x, "fp9")
    with pytest.raises(nc.UsageError, match="fp9"):
        nc.ulp_distance(x, x, "fp9")
    with pytest.raises(nc.UsageError, match="rnd"):
        nc.round_to(x, "bf16", rounding="rnd")


# --- docs/formats.md: its table must agree with FORMATS -----------------------------------------

def _doc_table() -> dict[str, dict[str, str]]:
    text = DOC.read_text()
    m = re.search(r"<!-- format-table:start -->\n(.*?)<!-- format-table:end -->", text, re.S)
    assert m, "docs/formats.md lacks the <!-- format-table:start/end --> block"
    lines = [ln.strip() for ln in m.group(1).strip().splitlines() if ln.strip().startswith("|")]
    header = [c.strip().strip("`") for c in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[2:]:  # skip the |---| line
        cells = [c.strip().strip("`") for c in ln.strip("|").split("|")]
        assert len(cells) == len(header), ln
        row = dict(zip(header, cells))
        rows[row["name"]] = row
    return rows


def test_doc_table_matches_formats():
    rows = _doc_table()
    assert set(rows) == set(formats.FORMATS), "docs/formats.md table lists other formats"
    yes = {"yes": True, "no": False}
    for name, f in formats.FORMATS.items():
        r = rows[name]
        assert int(r["bits"]) == f.bits, name
        assert (int(r["ebits"]), int(r["mbits"]), int(r["bias"])) == \
            (f.ebits, f.mbits, f.bias), name
        assert (int(r["emin"]), int(r["emax"])) == (f.emin, f.emax), name
        assert float.fromhex(r["max"]) == f.max, name
        assert float.fromhex(r["min_normal"]) == f.min_normal, name
        if f.min_subnormal is None:
            assert r["min_subnormal"] == "none", name
        else:
            assert float.fromhex(r["min_subnormal"]) == f.min_subnormal, name
        assert float.fromhex(r["eps"]) == f.eps, name
        assert (yes[r["inf"]], yes[r["NaN"]]) == (f.has_inf, f.has_nan), name
        assert float(r["max (decimal)"]) == pytest.approx(f.max, rel=1e-4), name
