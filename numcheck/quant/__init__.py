"""numcheck.quant: reference quantizers (FP8, MX, NVFP4, INT8/INT4), transforms (SR, RHT),
QuantRecipe and the reference scaled GEMM. Everything here is float64 inside and written from
the specs (DESIGN rule 10); fake-quant functions return the input's dtype.

Each family implements ``QuantFormat`` (numcheck/quant/base.py) once: ``FP8Format``,
``MXFormat``, ``NVFP4Format``, ``IntFormat``; a ``Quantizer`` asks its ``format``. This package
is pure math and registers nothing: the ops fp8_qdq, mx_qdq, nvfp4_qdq, int8_qdq, int4_qdq and
scaled_matmul (with their third-party torch kernels) are declared in numcheck/ops/quant.py and
registered by numcheck.catalog, so ``nc.verify("fp8_qdq", my_fn)`` works.
"""
from numcheck.quant.base import QuantFormat  # noqa: F401
from numcheck.quant.fp8 import (DelayedScaling, FP8Format, FP8Quantized, fp8_dequantize, fp8_qdq,  # noqa: F401
                  fp8_quantize)
from numcheck.quant.intq import (IntFormat, IntQuantized, int4_dequantize, int4_qdq,  # noqa: F401
                   int4_quantize, int8_dequantize, int8_qdq, int8_quantize)
from numcheck.quant.mx import MXFormat, MXQuantized, mx_dequantize, mx_qdq, mx_quantize  # noqa: F401
from numcheck.quant.nvfp4 import (NVFP4Format, NVFP4Quantized, nvfp4_dequantize, nvfp4_qdq,  # noqa: F401
                    nvfp4_quantize)
from numcheck.quant.recipe import (RECIPES, QuantRecipe, Quantizer, get_recipe, scaled_matmul,  # noqa: F401
                     scaled_matmul_reference)
from numcheck.quant.transforms import hadamard, inverse_hadamard, sr_qdq  # noqa: F401

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
