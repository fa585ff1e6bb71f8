"""The quant suite's measurements: round-trip records per quantization path x distribution, GEMM
records per recipe x distribution, and the markdown SQNR table (``sqnr_table``).

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

Verdicts and floors live with the suite (suites/test_quant.py); this module only measures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import environment, formats, inputs
from ..run import _stat_columns, input_digest
from ..stats import error_stats
from . import fp8 as _fp8
from . import intq as _intq
from . import mx as _mx
from . import nvfp4 as _nv
from .recipe import RECIPES, Quantizer, get_recipe, scaled_matmul

ROUNDTRIP_SHAPE = (64, 256)  # 64 rows x 8 MX blocks / 16 NVFP4 blocks / 2 FP8 1x128 tiles per row
GEMM_SHAPE = (64, 512, 64)  # (M, K, N): K a multiple of 128 (fp8 block tiles) and of the RHT
GEMM_TILE = (16, 16)  # output tiles for the worst-block SQNR of a GEMM
DTYPE = "fp32"


@dataclass(frozen=True)
class Path:
    """One quantization path: its Quantizer, the stats block (the quantization block) and the
    element format (its unit roundoff goes into the record's ``u``)."""

    name: str
    q: Quantizer
    blocks: object  # int k along the last dim, (rows, cols) tiles, or "row"
    elem: str


def _paths() -> dict[str, Path]:
    out = []
    for fmt in ("e4m3", "e5m2"):
        for gran, blk in (("tensor", "row"), ("row", "row"), ("block128", 128),
                          ("block128x128", (128, 128))):
            out.append(Path(f"fp8_{fmt}_{gran}", Quantizer("fp8", fmt=fmt, granularity=gran),
                            blk, fmt))
    for elem in _mx.ELEMS:
        for mode in _mx.SCALE_MODES:
            out.append(Path(f"mx_{elem}_{mode}", Quantizer("mx", fmt=elem, block=32,
                                                           scale_mode=mode), 32, elem))
    out.append(Path("nvfp4", Quantizer("nvfp4"), 16, "e2m1"))
    out.append(Path("nvfp4_2d", Quantizer("nvfp4", two_d=True), (16, 16), "e2m1"))
    out.append(Path("int8", Quantizer("int8"), "row", "int8"))
    out.append(Path("int4", Quantizer("int4", block=128), 128, "int4"))
    return {p.name: p for p in out}


PATHS: dict[str, Path] = _paths()
# Unit roundoff of the integer grids relative to their largest code (half a step of qmax).
_INT_U = {"int8": 0.5 / _intq.INT8_QMAX, "int4": 0.5 / _intq.INT4_QMAX}


def unit_roundoff(elem: str) -> float:
    return _INT_U[elem] if elem in _INT_U else formats.get(elem).unit_roundoff


def _stat_blocks(blocks, shape):
    return shape[-1] if blocks == "row" else blocks


def saturation(path: Path, x64: torch.Tensor) -> torch.Tensor:
    """Boolean mask (x's shape): |x| beyond the largest value representable at the element's
    scale (module doc), for quantization along the last dim."""
    q, a = path.q, x64.abs()
    if q.kind == "fp8":
        r = _fp8.fp8_quantize(x64, q.fmt, q.granularity, -1, q.pow2_scale)
        s = _fp8.expand(r.scale, x64.shape, q.granularity, x64.dim() - 1)
        return formats.round_to(a * s, "fp32", saturate=False) > overflow_threshold(q.fmt)
    if q.kind == "mx":
        r = _mx.mx_quantize(x64, q.fmt, q.block, q.scale_mode, -1)
        e = r.scale_exp.to(torch.int64).clamp(-1022, 1023).repeat_interleave(q.block, dim=-1)
        return a > overflow_threshold(q.fmt) * _mx._pow2(e)
    if q.kind == "nvfp4":
        r = _nv.nvfp4_quantize(x64, -1, q.two_d)
        _, _, expand = _nv._tiles(x64, x64.dim() - 1, q.two_d)
        s = expand(r.block_scale * r.tensor_scale)
        return (s > 0) & (a > overflow_threshold("e2m1") * s)
    r = _intq.int8_quantize(x64) if q.kind == "int8" else _intq.int4_quantize(x64, q.block)
    g = x64.shape[-1] if q.kind == "int8" else q.block
    s = r.scale.double().repeat_interleave(g, dim=-1)
    return a > (r.qmax + 0.5) * s


def overflow_threshold(fmt: str) -> float:
    """max + half the step below it (ulp at the top binade): RNE without saturation rounds
    values above this beyond max (e4m3: 464, e5m2: 61440, e2m1: 7)."""
    f = formats.get(fmt)
    return f.max + 0.5 * 2.0 ** (f.emax - f.mbits)


def _record(op, kernel, case_id, dist, seed, params, shape, digest, ks, bs, u, metrics):
    return {
        "op": op, "kernel": kernel, "case_id": case_id, "output": "out",
        "dtype": DTYPE, "shape": "x".join(map(str, shape)), "dist": dist, "seed": seed,
        "params": params, "device": "cpu", "device_class": environment.device_class("cpu"),
        "status": "passed", "reason": "", "input_digest": digest, "u": u,
        "gate_ulp": False, "gate_bias": False, "bound_ratio": math.nan,
        "baseline_bound_ratio": math.nan,
        **_stat_columns("kernel", ks), **_stat_columns("baseline", bs), "metrics": metrics,
    }


def case_seed(*parts) -> int:
    """A short stable seed (ids stay readable): the same inputs for every path of one dist."""
    return inputs.seed_for("quant", *parts) % 100_000


def roundtrip_record(path: str | Path, dist: str, shape=ROUNDTRIP_SHAPE,
                     seed: int | None = None) -> dict:
    """One round-trip record (module doc); status "passed" (the suite applies the floors)."""
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
        "clip_frac": float(saturation(p, x64).double().mean()),
        "underflow_frac": float(((x64 != 0) & (out == 0)).double().mean()),
        "nonfinite": int((~torch.isfinite(out) & finite).sum()),
    }
    return _record("roundtrip", p.name, case_id, dist, seed, f"path={p.name}", shape,
                   input_digest({"x": x64}, {}), ks, bs, unit_roundoff(p.elem), metrics)


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


def gemm_record(recipe: str, dist: str, shape=GEMM_SHAPE) -> dict:
    """One quantized-GEMM record (module doc)."""
    from ..ops.matmul import matmul_reference
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
    q = r.x
    elem = "e2m1" if q.kind == "nvfp4" else (q.kind if q.kind.startswith("int") else q.fmt)
    metrics = {"sqnr_gap_db": gap,
               "nonfinite": int((~torch.isfinite(out)).sum())}
    return _record("gemm", r.name, case_id, dist, seed, f"recipe={r.name}", shape,
                   input_digest({"a": a64, "b": b64}, {"recipe": r.name}), ks, bs,
                   unit_roundoff(elem), metrics)


RECIPE_NAMES = tuple(RECIPES)


# ---- the report table ---------------------------------------------------------------------------

def _db(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return "inf" if v == math.inf else "-inf" if v == -math.inf else f"{v:.1f}"


def _metric(r: dict, key: str):
    m = r.get("metrics") or {}
    if isinstance(m, str):
        import json
        m = json.loads(m)
    return m.get(key)


def _grid(title: str, corner: str, records: list[dict], order: list[str], cell, footer) -> list[str]:
    """A markdown table: one row per kernel (in ``order``), one column per distribution,
    ``cell(record)`` in each (bold FAIL when the record failed), then ``footer`` = (label,
    fn(record)) over the first record of each distribution (the BF16 yardstick)."""
    dists = [d for d in inputs.DISTRIBUTIONS if any(r["dist"] == d for r in records)]
    kernels = sorted({r["kernel"] for r in records},
                     key=lambda k: (order.index(k) if k in order else 999, k))
    by = {(r["kernel"], r["dist"]): r for r in records}
    out = [title, "", f"| {corner} | " + " | ".join(dists) + " |", "|---|" + "---|" * len(dists)]
    for k in kernels:
        row = []
        for d in dists:
            r = by.get((k, d))
            text = "" if r is None else cell(r)
            row.append(f"**{text} FAIL**" if r is not None and r.get("status") == "failed"
                       else text)
        out.append(f"| {k} | " + " | ".join(row) + " |")
    first: dict[str, dict] = {}
    for r in records:
        first.setdefault(r["dist"], r)
    label, fn = footer
    out.append(f"| {label} | " + " | ".join(fn(first[d]) for d in dists) + " |")
    return out


def _roundtrip_cell(r: dict) -> str:
    s = f"{_db(r['kernel_sqnr_db'])} / {_db(r['kernel_min_block_sqnr_db'])}"
    clip = _metric(r, "clip_frac")
    return s + (f" ({100 * clip:.2g}%)" if clip else "")


def sqnr_table(records: list[dict]) -> str:
    """Markdown: round-trip SQNR "mean / worst block" (dB) by path x distribution, the BF16
    yardstick row, and the SQNR gap of each quantized GEMM recipe to BF16 by distribution.
    Records of other ops are ignored; an empty string when there is nothing to show."""
    rt = [r for r in records if r.get("op") == "roundtrip" and r.get("kernel_sqnr_db") is not None]
    gm = [r for r in records if r.get("op") == "gemm" and r.get("kernel_sqnr_db") is not None]
    parts: list[str] = []
    if rt:
        parts += _grid("Round-trip SQNR, dB: mean / worst block (clip %), vs the fp32 input",
                       "path", rt, list(PATHS), _roundtrip_cell,
                       ("bf16 (yardstick)", lambda r: f"{_db(r['baseline_sqnr_db'])} / "
                                                      f"{_db(r['baseline_min_block_sqnr_db'])}"))
    if gm:
        if parts:
            parts.append("")
        parts += _grid("Quantized GEMM: SQNR gap to the BF16 GEMM, dB (recipe SQNR in brackets)",
                       "recipe", gm, list(RECIPES),
                       lambda r: f"{_db(_metric(r, 'sqnr_gap_db'))} ({_db(r['kernel_sqnr_db'])})",
                       ("bf16 GEMM SQNR", lambda r: _db(r["baseline_sqnr_db"])))
    return "\n".join(parts)
