"""``numcheck doctor``: what numcheck sees on this machine (versions and provenance, the CPU's
ISA, each device's dtype and SDPA support, optional libraries, the number-format table), as one
JSON-able dict (``report``) and as text (``render``)."""
from __future__ import annotations

import math


def exact_hex(x: float) -> str:
    """Exact, shortest normalized hex of a finite float: ``0x1.cp+8``, ``0x1p-1074``.

    float.hex pads to 13 hex digits and writes fp64 subnormals as ``0x0.0000000000001p-1022``;
    normalizing (m * 2^e with 1 <= m < 2, scaling by powers of two is exact) reads better.
    """
    if x == 0 or not math.isfinite(x):
        return float(x).hex()
    m, e = math.frexp(abs(x))  # abs(x) = m * 2**e, 0.5 <= m < 1
    digits = (2 * m).hex()[len("0x1."):].split("p")[0].rstrip("0")
    sign = "-" if x < 0 else ""
    return f"{sign}0x1{'.' + digits if digits else ''}p{e - 1:+d}"


def _num(x: float | None) -> str:
    """A format constant as decimal and exact hex: ``448 (0x1.cp+8)``; ``none`` for None."""
    if x is None:
        return "none"
    return f"{x:.6g} ({exact_hex(x)})"


def _format_rows() -> list[dict]:
    """The number-format table (numcheck.formats.FORMATS) as plain rows, for text and JSON."""
    from numcheck.formats import FORMATS

    rows = []
    for f in FORMATS.values():
        rows.append({
            "name": f.name, "bits": f.bits, "ebits": f.ebits, "mbits": f.mbits, "bias": f.bias,
            "emin": f.emin, "emax": f.emax,
            "max": f.max, "max_hex": exact_hex(f.max),
            "min_normal": f.min_normal, "min_normal_hex": exact_hex(f.min_normal),
            "min_subnormal": f.min_subnormal,
            "min_subnormal_hex": None if f.min_subnormal is None else exact_hex(f.min_subnormal),
            "has_inf": f.has_inf, "has_nan": f.has_nan, "signed": f.signed,
            "inf_encoding": f.inf_encoding, "nan_encoding": f.nan_encoding,
            "torch_dtype": f.torch_dtype, "ml_dtypes_dtype": f.ml_dtypes_dtype,
        })
    return rows


def report() -> dict:
    """Everything doctor shows, as one JSON-able dict (the text output renders this)."""
    from numcheck.measure import environment as env
    from numcheck.version import __version__

    devices = []
    for dev in env.available_devices():
        prov = env.provenance(dev)
        devices.append({
            "device": str(dev),
            "device_class": prov["device_class"],
            "name": prov["device_name"],
            "compute_capability": prov["compute_capability"],
            "dtype_support": env.dtype_support(dev),
            "sdpa_backends": env.sdpa_backends(dev),
        })
    return {
        "numcheck": __version__,
        "provenance": env.provenance(),
        "cpu_isa": env.cpu_isa(),
        "devices": devices,
        "optional_libraries": env.optional_libraries(),
        "formats": _format_rows(),
    }


def _table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = indent + "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*(str(c) for c in row)).rstrip() for row in rows]
    return lines


def _pairs(d: dict, indent: str = "  ") -> list[str]:
    width = max((len(k) for k in d), default=0)
    return [f"{indent}{k:<{width}}  {v}" for k, v in d.items()]


def render(report: dict) -> str:
    lines = [f"numcheck {report['numcheck']} doctor", "", "Versions and provenance (default device)"]
    lines += _pairs(report["provenance"])
    isa = report["cpu_isa"]
    lines += ["", "CPU ISA"]
    lines += _pairs({k: v for k, v in isa.items()})
    for dev in report["devices"]:
        lines += ["", f"Device {dev['device']}: {dev['name']} "
                      f"(device_class {dev['device_class']}, compute capability "
                      f"{dev['compute_capability']})", "  dtype support"]
        lines += _pairs(dev["dtype_support"], indent="    ")
        lines += ["  SDPA backends"]
        lines += _pairs(dev["sdpa_backends"], indent="    ")
    lines += ["", "Optional libraries"]
    lines += _pairs({name: (info["version"] or "installed") if info["importable"] else
                     "not installed" for name, info in report["optional_libraries"].items()})
    rows = report["formats"]
    lines += ["", "Number formats (numcheck.formats.FORMATS)"]
    lines += _table(
        ["name", "bits", "ebits", "mbits", "bias", "emin", "emax", "inf", "NaN", "torch dtype",
         "ml_dtypes dtype"],
        [[r["name"], r["bits"], r["ebits"], r["mbits"], r["bias"], r["emin"], r["emax"],
          r["inf_encoding"], r["nan_encoding"], r["torch_dtype"] or "-",
          r["ml_dtypes_dtype"] or "-"] for r in rows])
    lines += [""]
    lines += _table(["name", "max", "min normal", "min subnormal"],
                    [[r["name"], _num(r["max"]), _num(r["min_normal"]), _num(r["min_subnormal"])]
                     for r in rows])
    return "\n".join(lines)
