"""numcheck.quant: reference quantizers (FP8, MX, NVFP4, INT8/INT4), transforms (SR, RHT),
QuantRecipe and the reference scaled GEMM. Everything here is float64 inside and written from
the specs (DESIGN rule 10); fake-quant functions return the input's dtype.

Each family implements ``QuantFormat`` (numcheck/quant/base.py) once: ``FP8Format``,
``MXFormat``, ``NVFP4Format``, ``IntFormat``; a ``Quantizer`` asks its ``format``. This package
is pure math and registers nothing: the ops fp8_qdq, mx_qdq, nvfp4_qdq, int8_qdq, int4_qdq and
scaled_matmul (with their third-party torch kernels) are declared in numcheck/ops/qdq.py and
registered by numcheck.catalog, so ``nc.verify("fp8_qdq", my_fn)`` works. The package is also
the quant family of records (``quant_rules``: floors, report sections; ``paths``: the suite's
measurements; ``quant_html``: its HTML section).

Names load on first use (PEP 562): the family's rules (``quant_rules``) are read by ``numcheck
compare`` / ``report`` without importing torch.
"""
from __future__ import annotations

from typing import Any

__all__ = [
    "QuantFormat", "FP8Format", "MXFormat", "NVFP4Format", "IntFormat",
    "fp8_qdq", "fp8_quantize", "fp8_dequantize", "FP8Quantized", "DelayedScaling",
    "mx_qdq", "mx_quantize", "mx_dequantize", "MXQuantized",
    "nvfp4_qdq", "nvfp4_quantize", "nvfp4_dequantize", "NVFP4Quantized",
    "int8_qdq", "int8_quantize", "int8_dequantize", "int4_qdq", "int4_quantize",
    "int4_dequantize", "IntQuantized",
    "scaled_matmul", "scaled_matmul_reference", "QuantRecipe", "Quantizer", "RECIPES",
    "get_recipe", "hadamard", "inverse_hadamard", "sr_qdq",
]


def __getattr__(name: str) -> Any:
    # Explicit imports, not a name -> module table: the import-graph test sees every edge.
    if name in ("QuantFormat",):
        from numcheck.quant import base as home
    elif name in ("DelayedScaling", "FP8Format", "FP8Quantized", "fp8_dequantize", "fp8_qdq",
                  "fp8_quantize"):
        from numcheck.quant import fp8 as home
    elif name in ("IntFormat", "IntQuantized", "int4_dequantize", "int4_qdq", "int4_quantize",
                  "int8_dequantize", "int8_qdq", "int8_quantize"):
        from numcheck.quant import intq as home
    elif name in ("MXFormat", "MXQuantized", "mx_dequantize", "mx_qdq", "mx_quantize"):
        from numcheck.quant import mx as home
    elif name in ("NVFP4Format", "NVFP4Quantized", "nvfp4_dequantize", "nvfp4_qdq",
                  "nvfp4_quantize"):
        from numcheck.quant import nvfp4 as home
    elif name in ("RECIPES", "QuantRecipe", "Quantizer", "get_recipe", "scaled_matmul",
                  "scaled_matmul_reference"):
        from numcheck.quant import recipe as home
    elif name in ("hadamard", "inverse_hadamard", "sr_qdq"):
        from numcheck.quant import transforms as home
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(home, name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
