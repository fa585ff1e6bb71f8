"""The quant suite's measurements: round-trip records per quantization path x distribution, GEMM
records per recipe x distribution (judged and tabulated by numcheck.quant.quant_rules).

Round trip (op ``roundtrip``, kernel = the path name): x is drawn in fp32 (the master copy a
training step quantizes; a bf16 x would make the BF16 yardstick exact), ``qdq(x)`` in fp32 is
compared with x (float64) with the path's own quantization block as the stats block; the
baseline is x rounded once to bf16 (the BF16 yardstick). Metrics:

* ``clip_frac``: fraction of elements the quantizer saturated: |x| at its block's scale beyond
  the largest representable value by more than half the top step (max_elem + ulp(max_elem)/2;
  int: qmax + 1/2), i.e. values that would round above the maximum without saturation. Elements
  between max_elem and that threshold round down to max_elem as ordinary RNE and do not count
  (an FP8 row's amax itself lands there when the fp32 scale 448/amax rounds up). For FP8 the
  scaled value is the fp32 product |x * scale|; flushed NVFP4 blocks (scale 0) count as
  underflow, not clipping.
* ``underflow_frac``: nonzero elements of x that come back as exactly 0.
* ``nonfinite``: NaN/inf in qdq(x) (x is finite in every distribution here).

GEMM (op ``gemm``, kernel = the recipe name): ``scaled_matmul(a, b, recipe)`` (fp32) against the
FP64 product of the un-quantized operands; the baseline is the BF16 GEMM (operands rounded to
bf16, fp32 product). Metric ``sqnr_gap_db`` = baseline SQNR - recipe SQNR.

Verdicts, floors and the report table are the quant family's rules (numcheck/quant/quant_rules.py);
this module only measures. Its paths are numcheck.quant.recipe.SUITE_FIELDS'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from numcheck import formats
from numcheck.measure import environment
from numcheck.cases import inputs
from numcheck.cases.inputs import input_digest
from numcheck.records import Record
from numcheck.measure.elements import ulp_histogram
from numcheck.measure.stats import error_stats
from numcheck.quant.base import QuantFormat
from numcheck.quant.recipe import RECIPES, SUITE_FIELDS, Quantizer, get_recipe, scaled_matmul
from numcheck.quant.quant_rules import QUANT_RULES

ROUNDTRIP_SHAPE = (64, 256)  # 64 rows x 8 MX blocks / 16 NVFP4 blocks / 2 FP8 1x128 tiles per row
GEMM_SHAPE = (64, 512, 64)  # (M, K, N): K a multiple of 128 (fp8 block tiles) and of the RHT
GEMM_TILE = (16, 16)  # output tiles for the worst-block SQNR of a GEMM
DTYPE = "fp32"


@dataclass(frozen=True)
class QuantPath:
    """One quantization path: its Quantizer and the stats block (the quantization block)."""

    name: str
    q: Quantizer
    blocks: object  # int k along the last dim, (rows, cols) tiles, or "row"

    @property
    def format(self) -> QuantFormat:
        return self.q.format


def _paths() -> dict[str, QuantPath]:
    qs = [Quantizer(kind, **fields) for kind, each in SUITE_FIELDS.items() for fields in each]
    # Stats blocks follow the scaling block; one scale per row or per tensor: rows.
    return {q.format.name: QuantPath(q.format.name, q,
                                     "row" if q.format.block is None else q.format.block)
            for q in qs}


PATHS: dict[str, QuantPath] = _paths()


def _stat_blocks(blocks, shape):
    return shape[-1] if blocks == "row" else blocks


def _record(op, kernel, case_id, dist, seed, params, shape, digest, ks, bs, u,
            metrics) -> Record:
    """A measured, not yet judged record of the quant family (numcheck.verdicts.judge judges it)."""
    return Record(
        family="quant", op=op, kernel=kernel, case_id=case_id, dtype=DTYPE,
        shape="x".join(map(str, shape)), dist=dist, seed=seed, params=params, device="cpu",
        device_class=environment.device_class("cpu"), input_digest=digest, u=u,
        bound_ratio=math.nan, baseline_bound_ratio=math.nan,
        kernel_stats=ks, baseline_stats=bs, metrics=metrics)


def _with_histogram(rec: Record, out: torch.Tensor, ref: torch.Tensor) -> Record:
    """A record that fails its rules carries its error histogram, as a failing op case does
    (numcheck.run); measured only then (about 0.5 us an element) and while out is at hand. The
    rules are asked on a copy: judging the record stays numcheck.verdicts.judge's."""
    if QUANT_RULES.absolute(rec.replace()):
        rec.ulp_hist = ulp_histogram(out, ref, rec.kernel_stats.fmt)
    return rec


def case_seed(*parts) -> int:
    """A short stable seed (ids stay readable): the same inputs for every path of one dist."""
    return inputs.seed_for("quant", *parts) % 100_000


def roundtrip_record(path: str | QuantPath, dist: str, shape=ROUNDTRIP_SHAPE,
                     seed: int | None = None) -> Record:
    """One round-trip record (module doc), measured; ``numcheck.verdicts.judge.judge`` applies the
    floors (numcheck.quant.quant_rules)."""
    p = PATHS[path] if isinstance(path, str) else path
    seed = case_seed("roundtrip", dist) if seed is None else seed
    case_id = f"{DTYPE}-{'x'.join(map(str, shape))}-{dist}-s{seed}"
    x32, x64 = inputs.cast(inputs.draw(dist, shape, seed=seed, fmt=DTYPE, stream="x"),
                           torch.float32)
    out = p.q.qdq(x32, -1)
    blocks = _stat_blocks(p.blocks, shape)
    ks = error_stats(out, x64, blocks=blocks)
    base = formats.round_to(x64, "bf16", saturate=False).to(torch.float32)
    bs = error_stats(base, x64, blocks=blocks)
    finite = torch.isfinite(x64)
    metrics = {
        "clip_frac": float(p.format.saturation(x64, -1).double().mean()),
        "underflow_frac": float(((x64 != 0) & (out == 0)).double().mean()),
        "nonfinite": int((~torch.isfinite(out) & finite).sum()),
    }
    rec = _record("roundtrip", p.name, case_id, dist, seed, f"path={p.name}", shape,
                  input_digest({"x": x64}, {}), ks, bs, p.format.unit_roundoff, metrics)
    return _with_histogram(rec, out, x64)


def gemm_inputs(dist: str, shape=GEMM_SHAPE, seed: int | None = None):
    """(a, b) fp32 and their exact float64 values; outliers (outlier_channels) in a only, as
    in LLM activations against normal weights (the scaled_matmul op's cases do the same)."""
    m, k, n = shape
    seed = case_seed("gemm", dist) if seed is None else seed
    a32, a64 = inputs.cast(inputs.draw(dist, (m, k), seed=seed, fmt=DTYPE, stream="a"),
                           torch.float32)
    bdist = "normal" if dist == "outlier_channels" else dist
    b32, b64 = inputs.cast(inputs.draw(bdist, (k, n), seed=seed, fmt=DTYPE, stream="b"),
                           torch.float32)
    return seed, a32, a64, b32, b64


def gemm_record(recipe: str, dist: str, shape=GEMM_SHAPE) -> Record:
    """One quantized-GEMM record (module doc), measured, not judged."""
    from numcheck.ops.matmul import matmul_reference
    r = get_recipe(recipe)
    seed, a32, a64, b32, b64 = gemm_inputs(dist, shape)
    case_id = f"{DTYPE}-{'x'.join(map(str, shape))}-{dist}-s{seed}"
    gen = torch.Generator().manual_seed(seed)  # RHT signs (and SR, where a recipe has it)
    out = scaled_matmul(a32, b32, r, generator=gen)
    ref = matmul_reference(a64, b64)
    base = torch.matmul(a32.bfloat16().float(), b32.bfloat16().float())
    ks = error_stats(out, ref, blocks=GEMM_TILE)
    bs = error_stats(base, ref, blocks=GEMM_TILE)
    gap = bs.sqnr_db - ks.sqnr_db
    metrics = {"sqnr_gap_db": gap,
               "nonfinite": int((~torch.isfinite(out)).sum())}
    rec = _record("gemm", r.name, case_id, dist, seed, f"recipe={r.name}", shape,
                  input_digest({"a": a64, "b": b64}, {"recipe": r.name}), ks, bs,
                  r.x.format.unit_roundoff, metrics)
    return _with_histogram(rec, out, ref)


RECIPE_NAMES = tuple(RECIPES)
