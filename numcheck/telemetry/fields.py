"""Telemetry statistics: mergeable raw fields per (step, module, op, role, recipe), computed on
the tensor's own device without a host synchronization, and the columns derived from them.

Every raw field merges by one rule (``FIELDS``: "sum", "max" or "min"), so the same rule
accumulates a module called twice in a step, and merges per-rank frames (``merge``);
percentages and SQNRs are derived afterwards (``derive``), never averaged.

Rows accumulate on the host (``host_*``: a list of Python floats per row), fed by the CPU
passes (numcheck/telemetry/_fields_numba.py, _quant_cpu.py), by fields given as floats or 0-d
CPU tensors, and by the rows a device computed, read back once per step (``host_rows``: the
device pass numcheck/telemetry/_fields_triton.py, and the torch route's fields stacked).
``tensor_stats`` and ``quant_stats`` are that torch route: the reference of the compiled
passes, and the route where they do not apply.

Quantization statistics (``quant_stats``) run numcheck's own reference quantizer
(``Quantizer.format``: encode, decode, saturation) on the observed tensor in float64, as a 2-D
(rows, cols) view quantized along its last dim (the GEMM's reduction dim for a linear layer's
input and weight, the dgrad GEMM's for grad_output), zero-padded like
``convergence.linear`` to whole blocks (zeros change no block's amax and no tensor amax).
"""
from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import torch

from numcheck.quant.fp8 import FP8Quantized
from numcheck.quant.mx import E8M0_EMAX, E8M0_EMIN, MXQuantized
from numcheck.quant.nvfp4 import NVFP4Quantized
from numcheck.quant.recipe import RECIPES
from numcheck import formats

# The compiled passes' bit-level reads of a float tensor (numcheck/telemetry/_fields_numba.py,
# _fields_triton.py): dtype -> (the integer view, +inf's bits, the magnitude mask), from the
# formats' exact constants.
BIT_VIEWS = {dtype: (view, formats.get(name).inf_bits, formats.get(name).abs_mask)
             for dtype, view, name in ((torch.float64, torch.int64, "fp64"),
                                       (torch.float32, torch.int32, "fp32"),
                                       (torch.bfloat16, torch.int16, "bf16"),
                                       (torch.float16, torch.int16, "fp16"))}

KEY = ("step", "rank", "module", "op", "role", "pass", "recipe", "what_if")

# (raw field, how it merges). Identity of each rule: sum 0, max -inf, min +inf.
FIELDS: tuple[tuple[str, str], ...] = (
    ("calls", "sum"),           # tensors observed (a module called twice adds twice)
    ("n", "sum"),               # elements
    ("n_nan", "sum"), ("n_inf", "sum"), ("n_zero", "sum"),
    ("amax", "max"),            # max |x| over finite elements
    ("min_nonzero", "min"),     # min |x| over finite non-zero elements
    ("sum_sq", "sum"),          # sum x^2 over finite elements
    ("q_n", "sum"),             # elements quantized by the row's recipe
    ("q_underflow", "sum"),     # x != 0 and q(x) == 0
    ("q_saturated", "sum"),     # QuantFormat.saturation: clipped beyond the top step
    ("q_sig_sq", "sum"), ("q_err_sq", "sum"),   # sum x^2, sum (q(x) - x)^2 over finite x
    ("blk_n", "sum"),           # live blocks (block amax > 0) of a block format
    ("blk_scaled_n", "sum"),    # live blocks with a positive finite scale (the log2 stats)
    ("blk_log2_min", "min"), ("blk_log2_max", "max"),
    ("blk_log2_sum", "sum"), ("blk_log2_sumsq", "sum"),  # log2 of the decode scale
    ("blk_clip", "sum"),        # live blocks with a saturated element (amax clips)
    ("blk_scale_sat", "sum"),   # live blocks whose scale sits at its format's range end
    ("blk_sqnr_min_db", "min"),  # the worst live block's SQNR
    ("blk_nan", "sum"),         # blocks holding a NaN or Inf: no scale to speak of, so not
                                # live and in no other block statistic; counted here
    ("blk_cut", "sum"),         # blocks of this rank's shard that are not blocks of the whole
                                # tensor: a shard boundary cut them (cut_blocks); NaN: unknown
    ("sh_n", "sum"), ("sh_sig_sq", "sum"), ("sh_err_sq", "sum"),     # layer's own (shadow)
    ("e2e_n", "sum"), ("e2e_sig_sq", "sum"), ("e2e_err_sq", "sum"),  # vs an fp64 model copy
    # 48 bits of the tensors' bit patterns (numcheck/telemetry/digest.py), summed over the
    # row's calls; NaN in a watch without digests=True
    ("digest", "sum"),
)
NAMES = tuple(f for f, _ in FIELDS)
INDEX = {f: i for i, f in enumerate(NAMES)}
_IDENTITY = {"sum": 0.0, "max": -math.inf, "min": math.inf}
IDENTITY = tuple(_IDENTITY[how] for _, how in FIELDS)
DERIVED = ("nonfinite", "dynamic_range_binades", "underflow_pct", "saturation_pct", "sqnr_db",
           "scale_min_binades", "scale_max_binades", "scale_std_binades", "block_clip_pct",
           "scale_sat_pct", "worst_block_sqnr_db", "blocks_cut", "shadow_sqnr_db",
           "e2e_sqnr_db")
# A linear layer's roles a recipe quantizes, and the recipe's quantizer of each
QUANT_ROLE = {"input": "x", "weight": "w", "grad_output": "grad"}
# How a row's tensor lies across the ranks of a process group (docs/telemetry.md,
# "Distributed"): "" one process; "replicated" the same tensor on every rank (DDP's weights; a
# Replicate DTensor), merged by taking one rank's row; "sharded" this rank's shard of a DTensor
# (FSDP2, tensor parallelism); "split" this rank's rows of a batch-split tensor (activations
# and their gradients); "partial" this rank's summand of a tensor a collective sums (DDP's
# weight gradients before the all-reduce): sharded, split and partial rows merge by
# FIELDS' rules (partial rows then describe the ranks' parts, not the reduced tensor)
SHARDING = ("", "replicated", "sharded", "split", "partial")
COLUMNS = KEY + ("sharding",) + NAMES + DERIVED


# ---- host accumulation (Python floats, no torch op per observation) --------------------------
# A host vector is a list of len(NAMES) floats, combined field by field with the rules above;
# max and min propagate NaN (as torch.maximum / torch.minimum would), sums overflow to inf.

_RULE = {f: ("sum", "max", "min").index(how) for f, how in FIELDS}
_RULES = tuple(_RULE[f] for f in NAMES)
PLAIN = NAMES[:8]   # tensor_stats' fields, the first eight of FIELDS
assert PLAIN == ("calls", "n", "n_nan", "n_inf", "n_zero", "amax", "min_nonzero", "sum_sq")
PLAIN_IDENTITY = IDENTITY[:8]
PLAIN_INDEX = tuple(range(8))


def _merge(rule: int, a: float, b: float) -> float:
    """One field's rule (_RULES: 0 sum, 1 max, 2 min); max and min: NaN in either -> NaN (as
    torch.maximum / torch.minimum)."""
    if rule == 0:
        return a + b
    if a != a:
        return a
    return (a if a > b else b) if rule == 1 else (a if a < b else b)


def host_identity() -> list[float]:
    return list(IDENTITY)


def host_update(acc: list[float], values: dict) -> None:
    """Combine ``values`` (field -> Python float or 0-d CPU tensor) into ``acc`` in place."""
    for k, x in values.items():
        i = INDEX[k]
        acc[i] = _merge(_RULES[i], acc[i], float(x))


def host_plain(acc: list[float], p: list[float]) -> None:
    """Combine a tensor's plain fields (PLAIN order, as _stats_cpu.raw gives them) into the
    first len(PLAIN) entries of ``acc``; amax and min_nonzero are never NaN (finite elements
    only), so the builtin max/min are the rule."""
    acc[0] += p[0]
    acc[1] += p[1]
    acc[2] += p[2]
    acc[3] += p[3]
    acc[4] += p[4]
    acc[5] = max(acc[5], p[5])
    acc[6] = min(acc[6], p[6])
    acc[7] += p[7]


def host_rows(acc: list[float], idx: tuple[int, ...], rows) -> None:
    """Merge into ``acc``, in place, rows of fields read back from a device: ``rows`` a 2-D
    numpy array whose column j holds field ``idx[j]`` (FIELDS order); its rows merge by the
    same rules (a sum, or max / min with NaN propagating, as torch.maximum / minimum)."""
    if rows.shape[0] == 1:
        vals = rows[0].tolist()
    else:
        with np.errstate(over="ignore", invalid="ignore"):   # inf and NaN as on the device
            vals = [float(getattr(rows[:, j], ("sum", "max", "min")[_RULES[i]])())
                    for j, i in enumerate(idx)]
    for i, x in zip(idx, vals, strict=True):
        acc[i] = _merge(_RULES[i], acc[i], x)


def host_combine(a: list[float], b: list[float]) -> list[float]:
    """Two host vectors (or a host vector and a device row read back) combined, field by field."""
    return [_merge(r, x, y) for x, y, r in zip(a, b, _RULES, strict=True)]


def _full(v: float, like: torch.Tensor) -> torch.Tensor:
    return torch.full((), float(v), dtype=torch.float64, device=like.device)


def tensor_stats(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Plain statistics of one tensor (as observed, no quantization); {} for an empty tensor."""
    x = t.detach()
    if x.numel() == 0:
        return {}
    a = x.abs().to(torch.float64)
    fin = torch.isfinite(a)
    af = torch.where(fin, a, 0.0)
    return {"calls": _full(1, a), "n": _full(x.numel(), a), "n_nan": torch.isnan(a).sum(),
            "n_inf": torch.isinf(a).sum(), "n_zero": (a == 0).sum(), "amax": af.amax(),
            "min_nonzero": torch.where(af > 0, af, math.inf).amin(),
            "sum_sq": (af * af).sum()}


def as_2d(t: torch.Tensor) -> torch.Tensor:
    """The float64 (rows, cols) view a linear layer's GEMM quantizes along cols."""
    x = t.detach().to(torch.float64)
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def pad_to_blocks(x2: torch.Tensor, block) -> torch.Tensor:
    """Zero-pad (rows, cols) to whole blocks: k along cols, or (r, c) tiles."""
    r, c = block if isinstance(block, tuple) else (1, block or 1)
    pr, pc = (-x2.shape[0]) % r, (-x2.shape[1]) % c
    return torch.nn.functional.pad(x2, (0, pc, 0, pr)) if pr or pc else x2


def blocks(v: torch.Tensor, block) -> torch.Tensor:
    """(n_blocks, elements) of a padded (rows, cols) tensor, in the order the quantizers lay
    their scales out (row-major over the block grid)."""
    if isinstance(block, tuple):
        r, c = block
        rows, cols = v.shape
        return v.reshape(rows // r, r, cols // c, c).transpose(1, 2).reshape(-1, r * c)
    return v.reshape(-1, block)


def block_scales(enc) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(log2 of each block's decode scale, whether it sits at its format's range end), flat in
    block order; None for a format without block scales (FP8 tensor/row, INT8).

    MX: the E8M0 exponent; at the end of E8M0's range: 127 (or the NaN code) above, -127 below.
    NVFP4: e4m3 block scale x fp32 tensor scale; at the end: a flushed block (scale 0; the top,
    448, is where the tensor's own amax block lands by design, so it does not count).
    FP8 block128 / block128x128: the fp32 decode scale 1/scale; at the end: an encode scale
    clamped to the fp32 max (a block amax below 448 / fp32 max)."""
    if isinstance(enc, MXQuantized):
        e = enc.scale_exp.to(torch.float64).flatten()
        return e, (e >= E8M0_EMAX) | (e <= E8M0_EMIN)
    if isinstance(enc, NVFP4Quantized):
        s = (enc.block_scale * enc.tensor_scale).flatten()
        return torch.log2(s), s == 0
    if isinstance(enc, FP8Quantized) and enc.granularity in ("block128", "block128x128"):
        s = enc.scale.to(torch.float64).flatten()
        return -torch.log2(s), s >= torch.finfo(torch.float32).max
    return None


def quant_stats(t: torch.Tensor, quantizer) -> dict[str, torch.Tensor]:
    """What ``quantizer`` (a Quantizer: its ``format``) does to t, from numcheck's reference
    quantizer run in float64 (RNE: stochastic rounding keeps these scales and only adds
    unbiased element noise). Element statistics and, for block formats, per-block ones."""
    if t.numel() == 0 or t.dim() == 0:
        return {}
    fmt = quantizer.format
    x2 = as_2d(t)
    xp = pad_to_blocks(x2, fmt.block)
    enc = fmt.encode(xp, -1)
    q = fmt.decode(enc)
    sat = fmt.saturation(xp, -1)
    fin = torch.isfinite(xp)
    err = torch.where(fin, (q - xp) ** 2, 0.0)
    sig = torch.where(fin, xp * xp, 0.0)
    out = {"q_n": _full(x2.numel(), xp), "q_underflow": ((xp != 0) & (q == 0)).sum(),
           "q_saturated": sat.sum(), "q_sig_sq": sig.sum(), "q_err_sq": err.sum()}
    scales = block_scales(enc)
    if scales is None:
        return out
    log2s, at_end = scales
    xb = blocks(xp, fmt.block)
    bad = (~torch.isfinite(xb)).any(-1)
    # all-zero (and padding-only) blocks have no scale to speak of, nor have blocks with a NaN
    # or an Inf (numcheck's quantizers give them a NaN scale, the MX NaN code, or a zero one
    # for FP8 blocks: the block decodes to NaN, not to a clipped value); counted in blk_nan
    live = (xb.abs().amax(-1) > 0) & ~bad
    scaled = live & torch.isfinite(log2s)
    ls = torch.where(scaled, log2s, 0.0)
    bsig, berr = blocks(sig, fmt.block).sum(-1), blocks(err, fmt.block).sum(-1)
    bsqnr = 10.0 * torch.log10(bsig / berr)   # err 0 -> +inf
    out.update({
        "blk_n": live.sum(), "blk_scaled_n": scaled.sum(),
        "blk_log2_min": torch.where(scaled, log2s, math.inf).amin(),
        "blk_log2_max": torch.where(scaled, log2s, -math.inf).amax(),
        "blk_log2_sum": ls.sum(), "blk_log2_sumsq": (ls * ls).sum(),
        "blk_clip": (blocks(sat, fmt.block).any(-1) & live).sum(),
        "blk_scale_sat": (at_end & live).sum(),
        "blk_sqnr_min_db": torch.where(live, bsqnr, math.inf).amin(),
        "blk_nan": bad.sum()})
    return out


@functools.lru_cache(maxsize=256)   # asked at every call of a row; one answer per shard
def cut_blocks(extent: tuple, block) -> float:
    """blk_cut of a shard: of the blocks ``quant_stats`` lays over this rank's shard (``block``:
    k along the last dim, or (r, c) tiles of the (rows, cols) view), how many are not blocks of
    the whole tensor, whose quantizer would lay its blocks over the whole tensor's view: a shard
    boundary cut them (or, past a cut, the shard's blocks straddle the whole tensor's).
    ``extent``: per dim of the whole tensor, (offset, length, size) of the shard's range of it;
    offset None where the shard's indices along that dim are not one range (NaN then, if that
    dim lies on an axis with blocks of more than one element)."""
    r, c = block if isinstance(block, tuple) else (1, block)
    rows, cols = _axis_blocks(extent[:-1], r), _axis_blocks(extent[-1:], c)
    if rows is None or cols is None:
        return math.nan
    # a tile is whole where its row block and its column block both are
    return float(rows[0] * cols[0] - rows[1] * cols[1])


def _axis_blocks(dims: tuple, block: int) -> tuple[int, int] | None:
    """(blocks, whole blocks) of a shard along one axis of quant_stats' (rows, cols) view: the
    tensor dims ``dims`` ((offset, length, size) each) flattened row-major, as ``as_2d`` does;
    None where an offset is unknown."""
    if block == 1:   # blocks of one element: none is cut
        n = math.prod(length for _, length, _ in dims)
        return n, n
    if any(offset is None for offset, _, _ in dims):
        return None
    index = np.zeros(1, dtype=np.int64)   # the shard's positions along the whole axis
    for offset, length, size in dims:
        index = (index[:, None] * size + np.arange(offset, offset + length)).reshape(-1)
    return _whole_blocks(index, math.prod(size for _, _, size in dims), block)


def _whole_blocks(index: np.ndarray, size: int, block: int) -> tuple[int, int]:
    """(blocks, whole blocks) along one axis: the shard's blocks are runs of ``block``
    consecutive local elements (the last one short: pad_to_blocks pads it); ``index``: each
    local element's position along the whole axis (increasing), ``size`` the axis' length. A
    block is one of the whole axis' where its positions are consecutive from a multiple of
    ``block``, and it is full or ends where the axis ends (the whole tensor's last block is
    padded alike)."""
    n = len(index)
    count = np.minimum(block, n - np.arange(0, n, block))   # elements in each block
    first = index[::block]
    pos = np.full(len(first) * block, -1, dtype=np.int64)
    pos[:n] = index
    inside = np.arange(block) < count[:, None]
    steps = pos.reshape(-1, block) == first[:, None] + np.arange(block)
    whole = (steps | ~inside).all(1) & (first % block == 0) & \
        ((count == block) | (first + count == size))
    return len(first), int(whole.sum())


def sqnr_pair(out: torch.Tensor, ref64: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    """{prefix_n, prefix_sig_sq, prefix_err_sq}: out against a float64 reference (finite
    reference elements; a non-finite ``out`` there makes the error infinite, as it should)."""
    o = out.detach().to(torch.float64)
    r = ref64.detach().to(torch.float64)
    fin = torch.isfinite(r)
    d = torch.where(fin, o - r, 0.0)
    return {f"{prefix}_n": _full(1, r), f"{prefix}_sig_sq": torch.where(fin, r * r, 0.0).sum(),
            f"{prefix}_err_sq": (d * d).sum()}


# ---- derived columns and merging (pandas, on the host) ---------------------------------------

def _db(sig, err):
    import numpy as np
    with np.errstate(divide="ignore", invalid="ignore"):
        return 10.0 * np.log10(sig / err)


def derive(df):
    """Add the derived columns (DERIVED) to a frame of raw fields, in place; returns it."""
    import numpy as np
    with np.errstate(divide="ignore", invalid="ignore"):
        df["nonfinite"] = df["n_nan"] + df["n_inf"]
        ok = np.isfinite(df["min_nonzero"]) & (df["min_nonzero"] > 0)
        df["dynamic_range_binades"] = np.where(ok, np.log2(df["amax"] / df["min_nonzero"]),
                                               np.nan)
        q = df["q_n"] > 0
        # of the finite non-zero elements (NaN and Inf never quantize to zero)
        nz = df["n"] - df["n_zero"] - df["n_nan"] - df["n_inf"]
        df["underflow_pct"] = np.where(q, 100.0 * df["q_underflow"] / nz, np.nan)
        df["saturation_pct"] = np.where(q, 100.0 * df["q_saturated"] / df["q_n"], np.nan)
        df["sqnr_db"] = np.where(q, _db(df["q_sig_sq"], df["q_err_sq"]), np.nan)
        k = df["blk_scaled_n"]
        s = k > 0
        mean = df["blk_log2_sum"] / k
        var = np.maximum(df["blk_log2_sumsq"] / k - mean * mean, 0.0)
        df["scale_min_binades"] = np.where(s, df["blk_log2_min"], np.nan)
        df["scale_max_binades"] = np.where(s, df["blk_log2_max"], np.nan)
        df["scale_std_binades"] = np.where(s, np.sqrt(var), np.nan)
        b = df["blk_n"] > 0
        df["block_clip_pct"] = np.where(b, 100.0 * df["blk_clip"] / df["blk_n"], np.nan)
        df["scale_sat_pct"] = np.where(b, 100.0 * df["blk_scale_sat"] / df["blk_n"], np.nan)
        df["worst_block_sqnr_db"] = np.where(b, df["blk_sqnr_min_db"], np.nan)
        # of a quantized row: 0 where every block lies inside a shard (and in one process)
        df["blocks_cut"] = np.where(q, df["blk_cut"], np.nan)
        df["shadow_sqnr_db"] = np.where(df["sh_n"] > 0, _db(df["sh_sig_sq"], df["sh_err_sq"]),
                                        np.nan)
        df["e2e_sqnr_db"] = np.where(df["e2e_n"] > 0, _db(df["e2e_sig_sq"], df["e2e_err_sq"]),
                                     np.nan)
    return df


def frame(rows: list[dict]):
    """A records() frame (KEY, raw fields, derived columns) from raw rows."""
    import pandas as pd
    df = pd.DataFrame(rows, columns=list(KEY + ("sharding",) + NAMES))
    df[list(NAMES)] = df[list(NAMES)].astype("float64")
    df["what_if"] = df["what_if"].astype(bool)
    # rows without a sharding (one process; layer_sensitivity's) leave the column float NaN:
    # pandas 3 warns on a str fill of a float column, and pandas 4 will refuse it
    shard = df["sharding"]
    df["sharding"] = shard.astype(object).where(shard.notna(), "").astype(str)
    return derive(df)[list(COLUMNS)]


def merge(frames):
    """Merge per-rank records() frames (or parquet paths): sums add, maxima and minima take the
    max and min, then the derived columns are recomputed. Rows are matched on (step, module,
    op, role, pass, recipe, what_if); the merged rows have rank -1. Rows whose ``sharding`` is
    "replicated" (the same tensor on every rank) are taken from one rank (the lowest); rows
    without a sharding (files from one process, or older files) are merged by the rules, so
    a replicated tensor there counts once per rank: its sums grow, its percentages and SQNRs
    do not change. "split" and "partial" rows (plain tensors: a rank cannot tell a batch
    split from a tensor-parallel replica) whose fields are bitwise the same on every rank are
    taken as one tensor every rank holds (``_held_alike``). Files written before blk_cut
    existed count no cut blocks. Warns where a shard boundary cut quantization blocks
    (``blocks_cut``)."""
    import pandas as pd
    frames = [pd.read_parquet(f) if not isinstance(f, pd.DataFrame) else f for f in frames]
    if not frames:
        return frame([])
    df = pd.concat(frames, ignore_index=True)
    if "sharding" not in df.columns:
        df["sharding"] = ""
    if "blk_cut" not in df.columns:
        df["blk_cut"] = 0.0
    df["sharding"] = df["sharding"].fillna("").astype(str)
    keys = [k for k in KEY if k != "rank"]
    df.loc[_held_alike(df, keys), "sharding"] = "replicated"
    rep = df["sharding"] == "replicated"
    if rep.any():   # one rank's copy: the lowest rank's
        low = df[rep].groupby(keys, dropna=False)["rank"].transform("min")
        df = df[~rep | (df["rank"] == low.reindex(df.index))]
    how = {**dict(FIELDS), "sharding": "first"}
    groups = df.groupby(keys, sort=True, dropna=False)
    out = groups.agg(how).reset_index()
    # an unknown count (NaN: cut_blocks) stays unknown; pandas' sum would make it 0
    out["blk_cut"] = groups["blk_cut"].sum(min_count=1).to_numpy()
    out["rank"] = -1
    out = derive(out)[list(COLUMNS)]
    _warn_cut(out)
    return out


def _held_alike(df, keys):
    """The "split" and "partial" rows of a match that has a row from every rank of the files
    and the same bits in every field on each. Under tensor parallelism a plain tensor outside
    the parallel regions (the input of a column-parallel linear, a row-parallel linear's
    all-reduced output, the gradients of a layer every rank computes alike) is one tensor
    that every rank holds: summing its ranks' rows would count it once per rank. Ranks that
    hold different rows of a batch never give the same sums of squares and digests; a
    data-parallel run that feeds every rank the same rows does, and counts them once too."""
    import pandas as pd
    loose = df["sharding"].isin(("split", "partial"))
    if not loose.any() or df["rank"].nunique() < 2:
        return loose & False
    sub = df[loose]
    bits = sub[list(NAMES)].to_numpy(np.float64).copy()
    bits[np.isnan(bits)] = np.nan   # one NaN bit pattern
    sig = pd.Series([r.tobytes() for r in bits], index=sub.index)
    g = sig.groupby([sub[k] for k in keys], dropna=False)
    alike = (g.transform("nunique") == 1) & (g.transform("size") == df["rank"].nunique())
    return loose & alike.reindex(df.index, fill_value=False)


def _warn_cut(df) -> None:
    """merge's one warning naming the rows whose shards cut quantization blocks."""
    cut = df[df["blk_cut"] > 0]
    if cut.empty:
        return
    where = sorted({f"{m} {role} ({recipe}: {_block_of(recipe, role)})"
                    for m, role, recipe in zip(cut["module"], cut["role"], cut["recipe"])})
    warnings.warn(
        f"numcheck.telemetry.merge: a shard boundary cuts quantization blocks of "
        f"{', '.join(where)}: their per-block statistics (scale_*_binades, block_clip_pct, "
        "scale_sat_pct, worst_block_sqnr_db) and quantization statistics (sqnr_db, "
        "saturation_pct, underflow_pct) are of each shard's own blocks, not of the whole "
        "tensor's quantization blocks; blocks_cut counts them (docs/telemetry.md, "
        "\"Distributed\")", UserWarning, stacklevel=3)


def _block_of(recipe: str, role: str) -> str:
    """The blocks a RECIPES recipe quantizes a role in ("blocks of 32", "128x128 tiles");
    "its blocks" for another recipe (a file does not hold its quantizers)."""
    r = RECIPES.get(recipe)
    q = getattr(r, QUANT_ROLE[role]) if r is not None and role in QUANT_ROLE else None
    block = None if q is None else q.format.block
    if block is None:
        return "its blocks"
    return f"{block[0]}x{block[1]} tiles" if isinstance(block, tuple) else f"blocks of {block}"
