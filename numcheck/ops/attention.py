"""Attention: sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None), torch's signature.

Shapes. ``Case.shape`` is ``(B, H, Hkv, S, Skv, D)``: q is ``(B, H, S, D)``, k and v are
``(B, Hkv, Skv, D)``. ``Hkv < H`` is grouped-query attention (MQA when ``Hkv == 1``): query head
``h`` reads kv head ``h // (H // Hkv)`` (torch's ``enable_gqa=True``, which kernels are given
whenever ``Hkv != H``). ``scale`` defaults to ``1 / sqrt(D)``. The case param ``dv`` (an int;
the last part of the case id) gives v another head dim, ``(B, Hkv, Skv, dv)``, and the output
``(B, H, S, dv)``: multi-head latent attention (DeepSeek-V2/V3 MLA: D = 192 = 128 + 64 rotary,
dv = 128 in training and prefill; D = 576, dv = 512, one kv head, when decode absorbs the up
projections). The scale stays ``1 / sqrt(D)`` (torch's: q's head dim). A grid row gives it as a
seventh side of the shape, ``(B, H, Hkv, S, Skv, D, dv)``, which the grid turns into the param.

Case params: ``causal`` (``is_causal=True``: an explicit lower-triangular mask aligned to the
top-left corner, key j visible to query i iff ``j <= i``, as torch's ``is_causal``; a non-square
causal case with ``S > Skv`` has no empty row), ``mask`` (None, ``"bool"``: a random boolean
``attn_mask`` of shape ``(B, 1, S, Skv)``, True = attend, every row keeps at least one key;
``"fully_masked_rows"``: the same with ``max(1, B*S // 4)`` query rows masked entirely),
``layout`` and ``scale`` (an explicit softmax scale, ``full`` only). Masks and causal are not
combined (torch's API rejects ``attn_mask`` with ``is_causal=True``).

The boolean mask travels as a keyword argument (a CPU tensor; numcheck's input stage rounds and
moves floating-point tensors only), so kernels move it to q's device themselves.

Distributions: ``normal``, ``uniform`` (q, k, v all drawn from it); ``outlier_channels``: v with
outlier channels (100x..1000x, inputs.draw's), q and k normal: each output row is dominated by
one channel, which the row blocks must see through. (Outliers of that size in q or k would put
logits at ~1000 and turn every softmax row one-hot: large logits are large_logits' job, at a
controlled size.) ``large_logits`` (this file's own): q, k normal, then both scaled so that the
largest |QK^T * scale| of the case is LOGIT_MAX = 100, beyond exp's range in fp16 (11.1) and in
bf16/fp32 (88.7): a softmax that skips the max subtraction overflows in every dtype.

Fully masked rows (DESIGN rule 3): the op's default convention is a zero output row (as torch's
math, CPU flash and flex attention): ``softmax`` over an empty set is defined as all zeros, so
the row gets no value and its gradients are 0. The reference implements it with ``where`` before
the exp, so it stays finite and differentiable there (gradcheck'd). Model libraries that mask
with ``finfo.min`` return the mean of V there (every logit of the row lands on finfo.min: a
uniform softmax): a kernel declares ``conventions={"masked_rows": "mean_v"}`` (or
``mean_v_filled``, ``nan``; MASKED_ROWS) and is compared under it, reference and baseline alike;
one that follows another choice than it declares fails with the convention's name
(numcheck.verdicts.conventions), not with an error statistic.

Reference: float64, ``softmax(QK^T * scale + mask) V`` from primitives: matmul, max subtraction,
exp, sum, division; GQA by ``repeat_interleave`` of k/v heads; backward by float64 autograd.
Baseline: the same composition in the compute dtype (bf16/fp16/fp32 matmuls, ``torch.softmax``),
never ``F.scaled_dot_product_attention``. Policy: the baseline rule (FlashAttention's practice,
k = 2), blocks are the D-long output rows of each query (and of each key for grad_k/grad_v).
No ULP gate: the weighted sum P V cancels. grad_q/grad_k are not judged where softmax saturates
(see _unjudged_grads: their reference rows vanish and the worst-row rule would compare rounding
noise with ~0).

Measured on CPU (torch 2.13), quick and full grids: math, flash and flex pass every case in
every dtype except two fp32 large_logits corners, declared as known weaknesses (status "known",
see the known_failure functions): CPU flash's backward recomputes P = exp(s - lse) from logits
rounded differently from those the forward's logsumexp saw (the scale is folded into the GEMM
in the backward only), so at logits ~100 and a non-power-of-two scale its grad_v is 6-12x the
naive fp32 composition's error; the math backend pre-scales q and k by sqrt(scale) and lands at
2.5x the naive forward error on one full-grid seed (0.6x on another). The naive fp32
composition is nearly exact on one-hot rows, so a fixed k compares where single roundings of
~100-size logits landed; a floor of ~u_fp32 * max|logit| (one rounding of the largest logit)
would tell the math case from a bug, but the framework has no per-case floor yet.

MLA rows (``dv``; quick and full) and GQA 8:1 rows (full), measured on CPU (torch 2.13): math
and flex pass every one (math's fp32 large_logits corner as above); flash skips the ``dv`` rows
(torch's flash takes one head dim for q, k and v) and fails one GQA-8 row, bf16 causal seed 1:
grad_q of query row 1 (it sees two keys, so grad_q = scale p0 p1 (dP0 - dP1)(k0 - k1) cancels
to 1/15 of the median row) at 0.28 relative error against the naive composition's 0.057. The
reference is right (float64 autograd); float64 emulation of the flash backward with only its
output O rounded to bf16 (D = rowsum(dO * O)) gives 0.285, so this is FlashAttention's
algorithm meeting the worst-row rule on a cancelling row, like _unjudged_grads' saturated
rows: an open finding for the lead (docs/grid-audit.md), not declared here.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from numcheck import formats
from numcheck.cases import inputs, skips
from numcheck.cases.grid import Case, Row, make_grid
from numcheck.kernels.compiled import compiled_kernel
from numcheck.verdicts.policy import Policy
from numcheck.registry import Convention, Kernel, OpSpec

# Largest |logit| of a large_logits case: above ln(fp32 max) = 88.7, so exp without max
# subtraction overflows in bf16/fp32 as well as fp16; attention logit growth in large models
# reaches such values (Dehghani et al. 2023, ViT-22B; Wortsman et al. 2023).
LOGIT_MAX = 100.0
# Probability that a key is kept in a random boolean mask (1 - 1/4 masked).
_MASK_KEEP = 0.75
# One query row in four fully masked in a fully_masked_rows case (at least one).
_EMPTY_ROWS_DEN = 4

DISTS = ("normal", "outlier_channels", "uniform", "large_logits")

# (B, H, Hkv, S, Skv, D)
_SHAPES = [
    (1, 4, 2, 127, 129, 64),  # GQA, 2 query heads per kv head; ragged S around 128 tiles
    (2, 2, 2, 7, 7, 128),  # MHA, short square
    (1, 6, 2, 129, 127, 80),  # GQA 3:1, head dim 80 (not a power of two); S > Skv
    (2, 4, 1, 1, 33, 64),  # MQA decode: one query row
]
_FULL_SHAPES = [
    (1, 8, 8, 256, 256, 64),  # aligned, several key blocks
    (2, 4, 2, 65, 31, 256),  # the largest head dim flash kernels take
    (1, 2, 2, 17, 300, 32),  # long key side
]

# The grid's "attn" factor: how attention is restricted (one factor, so that pairwise coverage
# is not broken by a keep filter; mapped to the causal/mask params below).
_ATTN = {"none": (False, None), "causal": (True, None), "bool": (False, "bool"),
         "fully_masked_rows": (False, "fully_masked_rows")}


def _dt(case: Case) -> torch.dtype:
    return formats.get(case.dtype).torch


def _dims(case: Case) -> tuple[int, int, int, int, int, int]:
    b, h, hkv, s, skv, d = case.shape
    return b, h, hkv, s, skv, d


def _dv(case: Case) -> int:
    """v's head dim: the ``dv`` param, or D (q's and k's) when the case has none."""
    dv = case.param("dv")
    return case.shape[-1] if dv is None else int(dv)


def _scale_of(case: Case) -> float:
    sc = case.param("scale")
    return float(sc) if sc is not None else 1.0 / math.sqrt(case.shape[-1])


# ---- inputs ---------------------------------------------------------------------------------

def _mask(case: Case) -> torch.Tensor | None:
    kind = case.param("mask")
    if kind is None:
        return None
    b, _, _, s, skv, _ = _dims(case)
    u = inputs.draw("uniform", (b, 1, s, skv), seed=case.seed, stream=f"{case.id}/mask")
    keep = u < 2 * _MASK_KEEP - 1  # U(-1, 1) < 0.5: probability 0.75
    # Every row keeps at least one key: its own random one.
    pick = inputs.draw("uniform", (b, 1, s, 1), seed=case.seed, stream=f"{case.id}/mask_key")
    col = ((pick + 1) / 2 * skv).floor().clamp(max=skv - 1).long()
    keep.scatter_(-1, col, True)
    if kind == "fully_masked_rows":
        rows = b * s
        n = max(1, rows // _EMPTY_ROWS_DEN)
        if rows > 1:
            n = min(n, rows - 1)  # never the whole output
        order = inputs.draw("uniform", (rows,), seed=case.seed,
                            stream=f"{case.id}/empty_rows").argsort()
        keep.view(rows, skv)[order[:n]] = False
    return keep


def _qkv(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, h, hkv, s, skv, d = _dims(case)
    qs, ks, vs = (b, h, s, d), (b, hkv, skv, d), (b, hkv, skv, _dv(case))

    def draw(dist, shape, name):
        return inputs.draw(dist, shape, seed=case.seed, fmt=case.dtype, stream=f"{case.id}/{name}")

    if case.dist == "large_logits":
        q, k, v = draw("normal", qs, "q"), draw("normal", ks, "k"), draw("normal", vs, "v")
        logits = (q @ _expand_kv(k, h).transpose(-2, -1)) * _scale_of(case)
        a = math.sqrt(LOGIT_MAX / float(logits.abs().max()))
        return q * a, k * a, v
    if case.dist == "outlier_channels":
        return draw("normal", qs, "q"), draw("normal", ks, "k"), draw(case.dist, vs, "v")
    return draw(case.dist, qs, "q"), draw(case.dist, ks, "k"), draw(case.dist, vs, "v")


def _sdpa_inputs(case: Case):
    q, k, v = _qkv(case)
    dt = _dt(case)
    return ({"q": (q, dt), "k": (k, dt), "v": (v, dt)},
            {"attn_mask": _mask(case), "is_causal": bool(case.param("causal", False)),
             "scale": case.param("scale")})


# ---- reference and baseline -----------------------------------------------------------------

def _expand_kv(t: torch.Tensor, h: int) -> torch.Tensor:
    """kv heads repeated for GQA: query head i reads kv head i // (H // Hkv)."""
    hkv = t.shape[-3]
    if h % hkv:
        raise ValueError(f"sdpa: {h} query heads are not a multiple of {hkv} kv heads")
    return t if hkv == h else t.repeat_interleave(h // hkv, dim=-3)


def _allowed(attn_mask, is_causal: bool, s: int, skv: int, device) -> torch.Tensor | None:
    """Boolean 'may attend' mask (broadcastable to the logits), or None when all keys are."""
    allowed = None
    if is_causal:
        allowed = torch.ones(s, skv, dtype=torch.bool, device=device).tril()  # top-left aligned
    if attn_mask is not None:
        m = attn_mask.to(device)
        m = m if m.dtype == torch.bool else m != -math.inf  # additive mask: -inf masks
        allowed = m if allowed is None else allowed & m
    return allowed


def _additive(attn_mask, like: torch.Tensor):
    """A float attn_mask is added to the logits (torch's convention); a bool one adds nothing."""
    if attn_mask is None or attn_mask.dtype == torch.bool:
        return None
    return attn_mask.to(like.device, like.dtype)


def _scaled_logits(q, k, v, attn_mask, scale):
    """QK^T * scale with kv heads expanded for GQA, in the inputs' dtype; shared by reference
    and baseline. Returns (logits, v expanded, additive float mask or None)."""
    h, d = q.shape[-3], q.shape[-1]
    k, v = _expand_kv(k, h), _expand_kv(v, h)
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    logits = (q @ k.transpose(-2, -1)) * sc
    return logits, v, _additive(attn_mask, logits)


def _equal_logits(logits: torch.Tensor, masked_rows: str) -> torch.Tensor:
    """The logits of a fully masked row under the mean_v conventions: all equal (0), so the
    softmax is uniform; "mean_v" keeps their gradients (adding finfo.min to a logit moves
    nothing in its derivative), "mean_v_filled" has none (masked_fill cuts them)."""
    return logits - logits.detach() if masked_rows == "mean_v" else torch.zeros_like(logits)


def sdpa_reference(q, k, v, attn_mask=None, is_causal=False, scale=None, masked_rows="zero"):
    """float64 softmax(QK^T * scale + mask) V from primitives; fully masked rows as the
    masked_rows convention says (MASKED_ROWS)."""
    logits, v, add = _scaled_logits(q, k, v, attn_mask, scale)
    s, skv = logits.shape[-2], logits.shape[-1]
    if add is not None:
        logits = logits + torch.where(add == -math.inf, 0.0, add)  # -inf: masked below
    allowed = _allowed(attn_mask, is_causal, s, skv, q.device)
    if allowed is None:
        allowed = torch.ones((), dtype=torch.bool, device=q.device)
    allowed = allowed.expand(logits.shape)
    live = allowed.any(-1, keepdim=True)
    if masked_rows.startswith("mean_v"):  # an empty row attends to every key, equally
        logits = torch.where(live, logits, _equal_logits(logits, masked_rows))
        allowed, live = allowed | ~live, torch.ones_like(live)
    # Max subtraction (exact in float64 and mathematically a no-op, hence detached); fully
    # masked rows take m = 0, and masked logits become -inf *before* the exp, so neither the
    # value nor the gradient sees an inf or NaN there.
    m = torch.where(allowed, logits, -math.inf).amax(-1, keepdim=True)
    m = torch.where(live, m, 0.0).detach()
    e = torch.exp(torch.where(allowed, logits - m, -math.inf))
    denom = e.sum(-1, keepdim=True)
    # an empty row: 0 / 1 = 0, or 0 / 0 = NaN (the nan convention: softmax over all -inf)
    p = e / (denom if masked_rows == "nan" else torch.where(live, denom, 1.0))
    return p @ v


def sdpa_baseline(q, k, v, attn_mask=None, is_causal=False, scale=None, masked_rows="zero"):
    """The naive composition in the compute dtype: matmul, torch.softmax, matmul. Kept naive
    on purpose (DESIGN rule 4): it is what torch's math backend runs, and flash kernels round P
    to the compute dtype before P @ V as it does; its bf16 logits are rounded where a flash
    kernel keeps fp32 (a flash kernel rounding its logits is not exposed by this baseline;
    issue 31, open)."""
    logits, v, add = _scaled_logits(q, k, v, attn_mask, scale)
    s, skv = logits.shape[-2], logits.shape[-1]
    if add is not None:
        logits = logits + add
    allowed = _allowed(attn_mask, is_causal, s, skv, q.device)
    if allowed is None:
        return torch.softmax(logits, dim=-1) @ v
    masked = logits.masked_fill(~allowed, -math.inf)
    live = allowed.expand(logits.shape).any(-1, keepdim=True)
    # Empty rows: softmax of all -inf is NaN (and NaN gradients): they get equal logits and
    # then the convention's row (the uniform softmax itself for mean_v).
    p = torch.softmax(torch.where(live, masked, _equal_logits(logits, masked_rows)), dim=-1)
    if masked_rows == "zero":
        p = torch.where(live, p, 0.0)
    elif masked_rows == "nan":
        p = torch.where(live, p, math.nan)
    return p @ v


# ---- kernels --------------------------------------------------------------------------------

_BACKENDS = {
    "sdpa_math": SDPBackend.MATH,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
}


def _sdpa_under(backend: SDPBackend):
    def fn(q, k, v, attn_mask=None, is_causal=False, scale=None):
        if attn_mask is not None:
            attn_mask = attn_mask.to(q.device)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                enable_gqa=k.shape[-3] != q.shape[-3])
    fn.__name__ = f"sdpa_{backend.name.lower()}"
    fn.__qualname__ = fn.__name__
    return fn


def _flex_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """flex_attention in eager mode: causal / boolean masks as a mask_mod, float masks as a
    score_mod."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    b, h, s, _ = q.shape
    skv = k.shape[-2]
    mask_mod = score_mod = None
    if attn_mask is not None:
        m = attn_mask.to(q.device).expand(b, h, s, skv)
        if m.dtype == torch.bool:
            def mask_mod(bi, hi, qi, ki):
                return m[bi, hi, qi, ki]
        else:
            def score_mod(score, bi, hi, qi, ki):
                return score + m[bi, hi, qi, ki]
    elif is_causal:
        def mask_mod(bi, hi, qi, ki):
            return qi >= ki
    block_mask = (create_block_mask(mask_mod, b, h, s, skv, device=q.device)
                  if mask_mod is not None else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              enable_gqa=k.shape[-3] != h)


def _cuda_common(case: Case, device: str, name: str) -> str | None:
    if torch.version.hip is not None:
        return f"{name}: ROCm's attention backends have other limits, not modeled here"
    if not torch.cuda.is_available():
        return f"{name}: no CUDA device"
    # other layouts: torch raises "No available kernel" (sdp_utils.cpp's stride checks)
    return skips.contiguous(name)(case, device)


def _capability(device: str) -> tuple[int, int]:
    return torch.cuda.get_device_capability(torch.device(device))


def _torch_predicate(backend: SDPBackend, case: Case, device: str) -> str | None:
    """torch's own dispatch predicate (torch.backends.cuda.can_use_*) on empty tensors of the
    case's shapes, dtype, layout and mask, inputs requiring grad: the exact filter list
    sdpa_kernel([backend]) applies, for whatever torch/cuDNN version is installed."""
    from torch.backends import cuda as bc
    fn = {SDPBackend.FLASH_ATTENTION: bc.can_use_flash_attention,
          SDPBackend.EFFICIENT_ATTENTION: bc.can_use_efficient_attention,
          SDPBackend.CUDNN_ATTENTION: bc.can_use_cudnn_attention}[backend]
    b, h, hkv, s, skv, d = _dims(case)
    dt, layout = _dt(case), case.param("layout", "contiguous")

    def empty(shape):
        t = torch.empty(shape, dtype=dt, device=device)
        return inputs.with_layout(t, layout).requires_grad_()
    try:
        q, k, v = empty((b, h, s, d)), empty((b, hkv, skv, d)), empty((b, hkv, skv, _dv(case)))
        mask = (torch.ones((b, 1, s, skv), dtype=torch.bool, device=device)
                if case.param("mask") else None)
        with sdpa_kernel([backend]), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            params = bc.SDPAParams(q, k, v, mask, 0.0, bool(case.param("causal", False)),
                                   hkv != h)
            ok = fn(params, True)
    except Exception as e:  # an older torch without this API: skip rather than guess
        return f"could not evaluate torch's {backend.name} predicate: {type(e).__name__}: {e}"
    if ok:
        return None
    why = "; ".join(str(w.message) for w in caught)[:300]
    return f"torch.backends.cuda.can_use_{backend.name.lower()} rejects the case: {why}"


def _flash_supports(case: Case, device: str) -> str | None:
    if _dv(case) != case.shape[-1]:
        # sdp_utils_cpp.cpp / sdp_utils.cpp check_head_dim_size_flash (torch 2.13, CPU and CUDA).
        return (f"sdpa_flash needs v's head dim equal to q's and k's (torch: 'Flash attention "
                f"requires q,k,v to have the same last dimension'); got {case.shape[-1]} and "
                f"{_dv(case)}")
    if torch.device(device).type != "cuda":
        # CPU flash (_scaled_dot_product_flash_attention_for_cpu): fp16/bf16/fp32/fp64, masks,
        # causal, GQA; only the last-dim stride must be 1 (measured; sdp_utils_cpp.cpp).
        return skips.contiguous("sdpa_flash")(case, device)
    b, h, hkv, s, skv, d = _dims(case)
    reason = _cuda_common(case, device, "sdpa_flash")
    if reason:
        return reason
    if case.dtype not in ("fp16", "bf16"):
        return f"CUDA flash attention runs fp16/bf16, not {case.dtype}"
    if case.param("mask"):
        return "CUDA flash attention takes no attn_mask"
    if d > 256:
        return f"CUDA flash attention: head dim {d} > 256"
    major, minor = _capability(device)
    if not (8, 0) <= (major, minor) <= (12, 1):
        return f"CUDA flash attention needs sm80..sm121, not sm{major}{minor}"
    if ((8, 6) <= (major, minor) <= (8, 9) or major == 12) and 192 < d <= 224:
        return f"CUDA flash attention has no backward for head dim {d} on sm{major}{minor}"
    if case.param("causal") and s != skv:
        return ("CUDA flash attention (FA2) aligns causal masks bottom-right; torch refuses "
                "is_causal with S != Skv")
    if not torch.backends.cuda.is_flash_attention_available():
        return "torch was built without flash attention"
    return _torch_predicate(SDPBackend.FLASH_ATTENTION, case, device)


def _efficient_supports(case: Case, device: str) -> str | None:
    b, h, hkv, s, skv, d = _dims(case)
    reason = _cuda_common(case, device, "sdpa_efficient")
    if reason:
        return reason
    major, minor = _capability(device)
    if not (5, 0) <= (major, minor) <= (12, 1):
        return f"memory-efficient attention needs sm50..sm121, not sm{major}{minor}"
    if case.dtype == "bf16" and major < 8:
        return "memory-efficient attention runs bf16 on sm80 and newer only"
    align = 4 if case.dtype == "fp32" else 8  # CUTLASS GEMM alignment (sdp_utils.cpp)
    if d % align or _dv(case) % align:
        return (f"memory-efficient attention needs head dims % {align} == 0, got {d} "
                f"(v: {_dv(case)})")
    return _torch_predicate(SDPBackend.EFFICIENT_ATTENTION, case, device)


def _cudnn_supports(case: Case, device: str) -> str | None:
    b, h, hkv, s, skv, d = _dims(case)
    reason = _cuda_common(case, device, "sdpa_cudnn")
    if reason:
        return reason
    if case.dtype not in ("fp16", "bf16"):
        return f"cuDNN attention runs fp16/bf16, not {case.dtype}"
    if d % 8 or d > 128 or _dv(case) % 8 or _dv(case) > 128:
        # 256 is allowed on sm90/sm100 with recent cuDNN only; 128 holds everywhere (MLA's
        # D = 192 runs on recent cuDNN/sm90+ only, which torch's predicate would have to vouch
        # for: not run).
        return (f"cuDNN attention: head dims must be multiples of 8 and <= 128, got {d} "
                f"(v: {_dv(case)})")
    if skv == 1:
        return "cuDNN attention does not take a key/value sequence of length 1"
    if case.param("mask"):
        # attn_mask support (and its broadcast shapes) depends on the cuDNN/torch version.
        return "cuDNN attention: attn_mask support varies by cuDNN version; not run"
    if case.param("causal") and s != skv:
        return "cuDNN attention: causal alignment with S != Skv varies by version; not run"
    major, minor = _capability(device)
    if not (8, 0) <= (major, minor) <= (12, 1):
        return f"cuDNN attention needs sm80..sm121, not sm{major}{minor}"
    ver = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if ver is None or ver < 90000:
        return f"cuDNN attention needs cuDNN >= 9.0, found {ver}"
    return _torch_predicate(SDPBackend.CUDNN_ATTENTION, case, device)


# ---- registration ---------------------------------------------------------------------------

_FACTORS = {"dtype": ["fp32", "bf16", "fp16"], "shape": _SHAPES, "dist": list(DISTS),
            "attn": list(_ATTN), "layout": ["contiguous"], "scale": [None]}
# full: wider shapes, strided inputs (a slice of a fused QKV projection; column-major S x D),
# an explicit softmax scale (4x the default logits for D=64).
_FULL = {"shape": _FULL_SHAPES, "layout": ["sliced", "transposed"], "scale": [0.5]}

def _attn_params(c: Case) -> Case:
    """The attn factor turned into the causal and mask params; a seventh side of the shape
    (v's head dim, rows below) into the ``dv`` param, last."""
    p = dict(c.params)
    causal, mask = _ATTN[p.pop("attn")]
    params = (("causal", causal), ("mask", mask), ("layout", p["layout"]), ("scale", p["scale"]))
    if len(c.shape) == 7:
        return dataclasses.replace(c, shape=c.shape[:6], params=params + (("dv", c.shape[6]),))
    return dataclasses.replace(c, params=params)


def _row(dtype, shape, dist, attn, layout="contiguous", scale=None) -> Row:
    return {"dtype": dtype, "shape": shape, "dist": dist, "attn": attn, "layout": layout,
            "scale": scale}


# Shape classes the pairwise design above lacks, added as fixed rows after it (the design is
# untouched, so no existing case id or input moves; docs/grid-audit.md). (B, H, Hkv, S, Skv, D
# [, dv]). Both sets: MLA with small S (the quick set's time budget is tight).
_MLA_ROWS = [
    _row("fp32", (1, 4, 4, 33, 33, 192, 128), "normal", "causal"),  # MLA prefill, causal
    _row("bf16", (2, 4, 4, 17, 31, 192, 128), "outlier_channels", "fully_masked_rows"),
    _row("fp16", (1, 4, 2, 9, 65, 192, 128), "large_logits", "bool"),  # dv != D under GQA
    _row("bf16", (1, 8, 1, 1, 65, 576, 512), "uniform", "none"),  # absorbed MLA decode (MQA)
]
# full only: MLA at 16 heads and S = 129 (two key blocks of 64 and a tail), absorbed decode with
# a few query rows, MLA with strided inputs and an explicit scale; GQA 8 (Llama-3 70B's 64/8,
# Qwen2.5's 40/8) with head dim 128, prefill and decode.
_FULL_ROWS = [
    _row("fp32", (1, 16, 16, 129, 129, 192, 128), "large_logits", "none"),
    _row("bf16", (1, 16, 16, 129, 129, 192, 128), "uniform", "causal"),
    _row("fp16", (2, 16, 1, 3, 257, 576, 512), "outlier_channels", "bool"),
    _row("bf16", (1, 4, 4, 33, 33, 192, 128), "normal", "none", layout="sliced"),
    _row("fp32", (1, 4, 4, 33, 33, 192, 128), "uniform", "bool", layout="transposed",
         scale=0.5),
    _row("bf16", (1, 16, 2, 65, 129, 128), "normal", "causal"),
    _row("fp16", (2, 32, 4, 1, 300, 128), "outlier_channels", "fully_masked_rows"),
    _row("fp32", (1, 16, 2, 65, 129, 128), "large_logits", "fully_masked_rows"),
]


# Size class (DESIGN rule 14; docs/grid-audit.md): decode against 8193 keys, past the 8192 where
# split-KV kernels partition the key sequence across programs and combine partial outputs by
# their log-sum-exps (vLLM's paged attention takes its partitioned V2 kernel past max_seq_len
# 8192; torch's CPU flash kernel walks 512-key blocks: 16 and a one-key tail). GQA 4:1.
_SIZE_ROWS = [_row("bf16", (1, 8, 2, 1, 8193, 64), "normal", "none")]

sdpa_grid = make_grid("sdpa", _FACTORS, extra_full=_FULL, probes=_MLA_ROWS + _SIZE_ROWS,
                      transform=_attn_params, full_probes=_FULL_ROWS)


def _rows(case: Case, shape: torch.Size):
    return shape[-1] if len(shape) else None


# Softmax saturates (near one-hot rows) under these distributions: see _unjudged_grads.
_PEAKED = ("large_logits",)


def _unjudged_grads(case: Case) -> tuple[str, ...]:
    """grad_q and grad_k where their reference rows vanish (no relative rule applies).

    * Causal with S == 1: the one query sees one key, softmax is constant 1 and the reference
      grad_q and grad_k are exactly 0.
    * Saturated softmax (large_logits): grad_q_i = scale sum_j dS_ij k_j with
      dS = P (dP - rowsum(dO * O)) is ~e^-(logit gap) of its natural scale |dO||O||k| in most
      rows. FlashAttention's backward (every flash kernel: D = rowsum(dO * O) from the stored,
      rounded O; P recomputed from an fp32 logsumexp) leaves an error of u |dO||O||k| in every
      row, so the worst-row rule compares rounding noise with a near-zero row (measured on
      CPU flash: emulating only the rounded O in float64 reproduces its grad_q error), while
      the naive baseline's one-hot softmax cancels exactly. grad_v = P^T dO stays judged.
    """
    if case.param("causal") and case.shape[3] == 1:
        return ("q", "k")
    return ("q", "k") if case.dist in _PEAKED else ()


def _pow2(x: float) -> bool:
    return math.frexp(x)[0] == 0.5


def _cpu_flash_lse_backward(case: Case, device: str, output: str) -> str | None:
    """Finding: torch's CPU flash backward recomputes P = exp(s - lse) with logits s that do
    not match, bit for bit, those the forward's logsumexp came from: the backward folds the
    softmax scale into its GEMM (alpha = scale), the forward multiplies the GEMM's rounded
    result by the scale. Unless the scale is a power of two (1/sqrt(D) for D = 64 is; 80, 128
    are not), the two differ by an fp32 ulp of the logit, and at logits ~100 the lse is off the
    recomputed logits by up to ~4e-5: P, hence grad_v and grad_q, carry ~1e-5 relative error,
    8-9x the naive fp32 composition's. Measured: P = exp(fp32 GEMM with alpha=scale - the
    kernel's own lse) reproduces its grad_v to 5e-7 of its 1.2e-5 error; with scale = 1/8 on
    the same inputs the error drops to ~1.3x the naive one. The forward is as accurate as the
    naive composition; bf16/fp16 hide the mismatch under their own rounding."""
    sc = case.param("scale")
    sc = float(sc) if sc is not None else 1.0 / math.sqrt(case.shape[-1])
    if (torch.device(device).type == "cpu" and case.dtype == "fp32" and not _pow2(sc)
            and case.dist == "large_logits" and output.startswith("grad_")):
        return "torch-cpu-flash-backward-scale"
    # Finding (issue 12, full set: bf16-1x16x2x65x129x128-normal-s1-causal grad_q, worst row
    # 0.277 relative vs the naive composition's 0.057): the flash backward takes
    # D_i = rowsum(dO_i * O_i) from the output O rounded to bf16/fp16 (FlashAttention-2's
    # backward), so dS = P (dP - D) carries that rounding; on a causal row whose gradient
    # cancels (query 1 sees two keys: 1/15 of a typical row's size) grad_q's relative error is
    # the rounding of O over a small result. Float64 emulation with only O rounded to bf16
    # gives 0.285 on that row: the algorithm's, not a kernel bug.
    if (torch.device(device).type == "cpu" and case.dtype in ("bf16", "fp16")
            and case.param("causal") and output == "grad_q"):
        return "torch-cpu-flash-backward-rounded-output"
    return None


def _math_prescaled_logits(case: Case, device: str, output: str) -> str | None:
    """Finding: torch's math backend scales q and k by sqrt(scale) before Q K^T (float64
    emulation matches it bit for bit), two more fp32 roundings of logits of size ~100; on
    large_logits fp32 cases its error sits at the 2x rule's edge (2.5x the naive error on one
    full-grid seed, 0.6x on another)."""
    if case.dtype == "fp32" and case.dist == "large_logits" and output == "out":
        return "torch-sdpa-math-prescaled-logits"
    return None


# Eager flex_attention has no backward on CPU (NotImplementedError) and on CUDA its eager path
# is a debugging reference: forward only.


def _compiled_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """softmax(QK^T * scale + mask) V written out (GQA by repeat_interleave), the pattern
    inductor's fuse_attention pass rewrites into scaled_dot_product_attention."""
    h, hkv = q.shape[-3], k.shape[-3]
    if hkv != h:
        k = k.repeat_interleave(h // hkv, dim=-3)
        v = v.repeat_interleave(h // hkv, dim=-3)
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * sc
    if is_causal:
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask.to(s.device), float("-inf"))
    return torch.matmul(s.softmax(dim=-1), v)


def _compiled_sdpa_known(case: Case, device: str, output: str) -> str | None:
    """Unmasked, non-causal attention compiles to the CPU flash kernel (forward and backward:
    checked with the profiler in tests/test_ops_compiled.py), so the flash kernel's declared
    weakness applies; causal cases run inductor's own bmm + softmax."""
    return None if case.param("causal") else _cpu_flash_lse_backward(case, device, output)


# ---- declared ops and kernels (registered by numcheck.catalog) -------------------------

# What a fully masked query row returns (DESIGN rule 3); a kernel declares its choice with
# nc.kernel("sdpa", conventions={"masked_rows": ...}).
MASKED_ROWS = Convention(
    "masked_rows",
    (("zero", "a zero row, zero gradients: softmax over no key is all zeros, as torch's math, "
              "CPU flash and flex attention"),
     ("mean_v", "the mean of V over all keys: every logit of the row plus finfo.min, equal "
                "after rounding, so a uniform softmax whose gradients reach q and k"),
     ("mean_v_filled", "the mean of V, the row's logits filled with finfo.min (masked_fill): "
                       "no gradient reaches q or k from the row"),
     ("nan", "NaN: softmax over all -inf; NaN reaches grad_v")),
    applies=lambda case: case.param("mask") == "fully_masked_rows")

OPS = (
    OpSpec(
        "sdpa", _sdpa_inputs, sdpa_reference, sdpa_baseline, sdpa_grid,
        # The defaults: baseline rule k = 2 (FlashAttention's tests), floor 2u (one rounding more
        # than the baseline), gradients k = 4 / floor 4u (a backward chains more roundings).
        Policy(notes="baseline rule only: P V cancels, no ULP or componentwise gate"),
        grad_args=("q", "k", "v"), blocks=_rows, skip_grads=_unjudged_grads,
        # QK^T sums D terms, P V sums Skv (gamma_L of the condition-aware bound)
        sum_len=lambda case: case.shape[4] + case.shape[5],
        conventions=(MASKED_ROWS,),
        doc="sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None); Case.shape = "
            "(B, H, Hkv, S, Skv, D), q (B, H, S, D), k/v (B, Hkv, Skv, D); fully masked rows "
            "-> 0 (conventions: masked_rows zero | mean_v | mean_v_filled | nan)"),
)
KERNELS = (
    Kernel("sdpa", "sdpa_math", _sdpa_under(SDPBackend.MATH),
        known_failure=_math_prescaled_logits),
    Kernel("sdpa", "sdpa_flash", _sdpa_under(SDPBackend.FLASH_ATTENTION),
        supports=_flash_supports, known_failure=_cpu_flash_lse_backward,
        reaches=("aten::_scaled_dot_product_flash_attention_for_cpu_backward",)),
    Kernel("sdpa", "sdpa_efficient", _sdpa_under(SDPBackend.EFFICIENT_ATTENTION),
        devices=("cuda",), supports=_efficient_supports),
    Kernel("sdpa", "sdpa_cudnn", _sdpa_under(SDPBackend.CUDNN_ATTENTION),
        devices=("cuda",), dtypes=("fp16", "bf16"), supports=_cudnn_supports),
    Kernel("sdpa", "flex_attention", _flex_attention, forward_only=True),
    # No attn_mask: each mask kind is another graph, and a fully masked row would give NaN here
    # (softmax over -inf), not the convention's 0. Causal and unmasked cases run.
    compiled_kernel("sdpa", _compiled_attention, known_failure=_compiled_sdpa_known,
                    mask=(None,)),
)
