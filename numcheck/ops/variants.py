"""Benign rewrites and planted losses of the built-in kernels.

The benign rewrites are other backward-stable formulations of the same op: reordered fp32 sums,
Welford's variance, online softmax, blocked / split-K GEMM, fp32 compute with one rounding at
the end, fused multiply-adds. Each one's error differs from the eager kernel's only by rounding
noise of the same order, so a golden-regression check must pass them. The planted losses each
lose part of a bit (one extra rounding of an intermediate to the compute dtype), so it must
catch them.

Planted quantizer faults (``planted_mx_recipe``: a lost mantissa bit, a block scale a binade
off, a NaN) do the same for the telemetry goldens (numcheck.telemetry.telemetry_rules).

They calibrate the golden slack (``bench/calibrate_golden_slack.py``) and prove it
(``tests/test_golden_benign.py``, ``tests/test_ops_*.py``). Use them the same way for your own
goldens: ``numcheck.verify(op, fn)`` with one of them in place of your kernel, against your
golden rows. Each takes the op's signature; none is registered as a kernel.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from numcheck import formats
from numcheck.ops.attention import sdpa_baseline
from numcheck.ops.rope import rotate_half
from numcheck.quant.mx import MXFormat

# ---- norms -----------------------------------------------------------------------------------


def rms_reversed_fp32_sum(x, weight, eps):
    """RMSNorm with the sum of squares added sequentially in reverse order in fp32: a reordered
    sum, one rounding."""
    xf = x.float()
    ms = (xf * xf).flip(-1).cumsum(-1)[..., -1:] / x.shape[-1]  # sequential, reversed order
    return (xf * torch.rsqrt(ms + eps) * weight.float()).to(x.dtype)


def ln_welford(x, weight, bias, eps):
    """LayerNorm by Welford's running mean / M2 in fp32, over blocks of 16 columns merged
    pairwise: a stable one-pass variance, one rounding."""
    xf = x.float()
    d = x.shape[-1]
    n = torch.zeros(xf.shape[:-1] + (1,), dtype=torch.float32, device=x.device)
    mean = torch.zeros_like(n)
    m2 = torch.zeros_like(n)
    for c0 in range(0, d, 16):
        blk = xf[..., c0:c0 + 16]
        nb = blk.shape[-1]
        mb = blk.mean(-1, keepdim=True)
        m2b = ((blk - mb) ** 2).sum(-1, keepdim=True)
        delta = mb - mean
        tot = n + nb
        mean = mean + delta * nb / tot
        m2 = m2 + m2b + delta * delta * n * nb / tot
        n = tot
    y = (xf - mean) * torch.rsqrt(m2 / d + eps) * weight.float() + bias.float()
    return y.to(x.dtype)


def adaln_unfused_fp32(x, shift, scale, eps):
    """adaLN modulate as mean, two-pass variance, divide, scale and shift, all in fp32: the
    textbook composition, one rounding."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = ((xf - mean) ** 2).mean(-1, keepdim=True)
    return (((xf - mean) / torch.sqrt(var + eps)) * (1 + scale.float()) + shift.float()).to(x.dtype)


def rms_extra_rounding(x, weight, eps):
    """Planted loss: the normalized activations stored in x's dtype before the weight multiply
    (one extra rounding)."""
    xf = x.float()
    y = (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (y.float() * weight.float()).to(x.dtype)


# ---- matmul, linear --------------------------------------------------------------------------


def matmul_blocked_fp32(a, b, block=128):
    """GEMM with K in blocks of 128, fp32 products per block, fp32 running sum: a reordered
    fp32 sum, one rounding."""
    acc = None
    for k0 in range(0, a.shape[-1], block):
        p = a[..., k0:k0 + block].float() @ b[..., k0:k0 + block, :].float()
        acc = p if acc is None else acc + p
    return acc.to(a.dtype)


def matmul_split_k_reversed(a, b, splits=4):
    """Split-K GEMM with fp32 partials reduced from the last split to the first: a reordered
    fp32 sum, one rounding."""
    k = a.shape[-1]
    step = -(-k // splits)
    parts = [a[..., k0:k0 + step].float() @ b[..., k0:k0 + step, :].float()
             for k0 in range(0, k, step)]
    acc = parts[-1]
    for p in reversed(parts[:-1]):
        acc = acc + p
    return acc.to(a.dtype)


def matmul_fp32_accumulate(a, b):
    """A bf16/fp16 GEMM done as an fp32 GEMM and one rounding (fp32 accumulation, as tensor
    cores do)."""
    return (a.float() @ b.float()).to(a.dtype)


def matmul_partials_in_dtype(a, b, block=256):
    """Planted loss: fp32 partial products per 256-wide K block, each rounded to the input
    dtype before they are summed."""
    acc = None
    for k0 in range(0, a.shape[-1], block):
        p = (a[..., k0:k0 + block].float() @ b[..., k0:k0 + block, :].float()).to(a.dtype).float()
        acc = p if acc is None else acc + p
    return acc.to(a.dtype)


def linear_unfused(x, weight, bias=None):
    """x W^T rounded to the compute dtype, then the bias added in the compute dtype: the
    common unfused epilogue (one rounding more than a fused one)."""
    dt = x.dtype
    out = x @ weight.to(dt).mT
    return out if bias is None else out + bias.to(dt)


def linear_row_tiles(x, weight, bias=None):
    """Linear in tiles of 64 rows, fp32 GEMM and bias epilogue per tile, one rounding: the
    same sums, only split by rows. The weight and bias are widened once, so that their
    gradients sum over the tiles in fp32 (widened per tile, autograd rounds each tile's share to
    bf16 and sums those in bf16: 30 dB at 32769 rows, the size class of the linear op)."""
    dt = x.dtype
    x2 = x.reshape(-1, x.shape[-1])
    w = weight.to(dt).float()
    b = None if bias is None else bias.to(dt).float()
    outs = []
    for r0 in range(0, x2.shape[0], 64):
        o = x2[r0:r0 + 64].float() @ w.mT
        outs.append(o if b is None else o + b)
    return torch.cat(outs).to(dt).reshape(*x.shape[:-1], weight.shape[0])


# ---- softmax, log_softmax, cross_entropy -----------------------------------------------------
# The softmax rewrites detach the max, as fused kernels do (it is a constant shift): autograd
# through amax adds -sum(grad_z), zero up to rounding, to the argmax element, which measured 11x
# the textbook backward's error (fp32, D = 1025, uniform logits).


def softmax_online(x, dim=-1):
    """Online softmax (Milakov & Gimelshein): blocks of 32, running max and rescaled running
    sum in fp32, then exp(x - m) / l, as flash-attention-style kernels do; one rounding.
    Forward only: autograd through its rescaling loop is no kernel's backward."""
    xf = x.float().movedim(dim, -1)
    m = torch.full(xf.shape[:-1] + (1,), -math.inf, device=x.device)
    s = torch.zeros_like(m)
    for c0 in range(0, xf.shape[-1], 32):
        blk = xf[..., c0:c0 + 32]
        m_new = torch.maximum(m, blk.amax(-1, keepdim=True))
        s = s * torch.exp(m - m_new) + torch.exp(blk - m_new).sum(-1, keepdim=True)
        m = m_new
    return (torch.exp(xf - m) / s).movedim(-1, dim).to(x.dtype)


def softmax_fp32_upcast(x, dim=-1):
    """torch.softmax on an fp32 copy, rounded once to x's dtype."""
    return torch.softmax(x.float(), dim).to(x.dtype)


def softmax_cascaded_sum(x, dim=-1):
    """Softmax with the normalizer by torch.sum in fp32 (cascaded, more accurate than the
    baseline's loop), one rounding."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim, keepdim=True).detach())
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def softmax_blocked_sum(x, dim=-1):
    """Softmax with the normalizer as fp32 partial sums over blocks of 32, added in reverse
    block order: a reordered sum, one rounding."""
    xf = x.float().movedim(dim, -1)
    e = torch.exp(xf - xf.amax(-1, keepdim=True).detach())
    parts = [e[..., c0:c0 + 32].sum(-1, keepdim=True) for c0 in range(0, e.shape[-1], 32)]
    s = torch.zeros_like(parts[0])
    for p in reversed(parts):
        s = s + p
    return (e / s).movedim(-1, dim).to(x.dtype)


def softmax_recip_in_dtype(x, dim=-1):
    """Planted loss: 1 / sum rounded to x's dtype, then multiplied in (one extra rounding per
    row)."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim, keepdim=True))
    return (e * (1.0 / e.sum(dim, keepdim=True)).to(x.dtype).float()).to(x.dtype)


def log_softmax_two_pass_fp32(x, dim=-1):
    """log_softmax as z - log(sum(exp(z))), z = x - max, in fp32: the two-pass textbook form,
    one rounding."""
    xf = x.float()
    z = xf - xf.amax(dim, keepdim=True).detach()
    return (z - torch.log(torch.exp(z).sum(dim, keepdim=True))).to(x.dtype)


def cross_entropy_unfused(logits, target):
    """Mean cross-entropy as fp32 log_softmax, gather and mean, rounded once to the logits'
    dtype."""
    lsm = torch.log_softmax(logits.float(), -1)
    return -lsm.gather(-1, target.to(logits.device).view(-1, 1)).mean().to(logits.dtype)


# ---- sdpa --------------------------------------------------------------------------------------


def sdpa_online(q, k, v, attn_mask=None, is_causal=False, scale=None, *, block=32,
                rescale=True):
    """Flash-style attention: keys in blocks of 32, running max and sum, fp32 accumulation, one
    rounding. ``rescale=False`` is a planted bug, not a rewrite: the accumulator is not rescaled
    when the running max grows."""
    dt = q.dtype
    h, s, d = q.shape[-3], q.shape[-2], q.shape[-1]
    g = h // k.shape[-3]
    q, k, v = q.float(), k.float().repeat_interleave(g, -3), v.float().repeat_interleave(g, -3)
    skv = k.shape[-2]
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    allowed = torch.ones(s, skv, dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed.tril()
    if attn_mask is not None:
        allowed = allowed & attn_mask.to(q.device)
    allowed = allowed.expand(*q.shape[:-1], skv)
    m = torch.full((*q.shape[:-1], 1), -math.inf, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((*q.shape[:-1], v.shape[-1]), device=q.device)  # MLA: v's head dim
    for j in range(0, skv, block):
        logits = (q @ k[..., j:j + block, :].transpose(-2, -1)) * sc
        logits = logits.masked_fill(~allowed[..., j:j + block], -math.inf)
        m_new = torch.maximum(m, logits.amax(-1, keepdim=True).detach())
        m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
        p = torch.exp(logits - m_safe)
        alpha = torch.exp(m - m_safe)  # 0 while the row has seen no key
        l = l * alpha + p.sum(-1, keepdim=True)
        acc = (acc * alpha if rescale else acc) + p @ v[..., j:j + block, :]
        m = m_new
    return (acc / torch.where(l == 0, 1.0, l)).to(dt)


def sdpa_math_fp32(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """torch's math backend on fp32 copies, the result cast back (what autocast-free fp32
    attention does): one rounding."""
    dt = q.dtype
    with sdpa_kernel([SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=is_causal, scale=scale,
            attn_mask=None if attn_mask is None else attn_mask.to(q.device),
            enable_gqa=k.shape[-3] != q.shape[-3])
    return out.to(dt)


def sdpa_reversed_keys(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """The naive composition (numcheck's sdpa baseline) over keys in reverse order: a
    reordered summation."""
    s, skv = q.shape[-2], k.shape[-2]
    allowed = torch.ones(s, skv, dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed.tril()
    if attn_mask is not None:
        allowed = allowed & attn_mask.to(q.device)
    return sdpa_baseline(q, k.flip(-2), v.flip(-2), attn_mask=allowed.flip(-1), scale=scale)


# ---- rope --------------------------------------------------------------------------------------


def rope_complex_fp32(x, cos, sin):
    """Permute halves to interleaved pairs, view as complex, multiply by cos + i sin in fp32,
    view back and undo the permutation (the Meta Llama implementation on a HF layout); one
    rounding."""
    d = x.shape[-1]
    half = d // 2
    xi = torch.stack([x[..., :half], x[..., half:]], -1).float().contiguous()  # (..., D/2, 2)
    rot = torch.complex(cos[..., :half].float(), sin[..., :half].float())
    z = torch.view_as_complex(xi) * rot
    r = torch.view_as_real(z)  # (..., D/2, 2)
    return torch.cat([r[..., 0], r[..., 1]], -1).to(x.dtype)


def rope_fp32_round_once(x, cos, sin):
    """x cos + rotate_half(x) sin in fp32, rounded once to x's dtype."""
    xf = x.float()
    return (xf * cos.float() + rotate_half(xf) * sin.float()).to(x.dtype)


def rope_fma(x, cos, sin):
    """addcmul: x cos + rotate_half(x) sin with one rounding fewer per element in the compute
    dtype."""
    return torch.addcmul(x * cos, rotate_half(x), sin)


# ---- activations -------------------------------------------------------------------------------


def gelu_erfc_fp32(x, approximate="none"):
    """x Phi(x) via erfc in fp32 (no 1 + erf cancellation: more accurate than torch in the
    tail); the tanh form as x sigmoid(2y), its exact rewrite; one rounding."""
    xf = x.float()
    if approximate == "tanh":
        y = math.sqrt(2 / math.pi) * (xf + 0.044715 * xf * xf * xf)
        return (xf * torch.sigmoid(2 * y)).to(x.dtype)
    return (xf * 0.5 * torch.special.erfc(-xf * (1 / math.sqrt(2)))).to(x.dtype)


def silu_sigmoid_fp32(x):
    """SiLU as x sigmoid(x) in fp32, one rounding. Pair it with ``silu_sigmoid_fp32_backward``
    (``Kernel(..., backward=...)``): autograd through this graph is not a fused backward."""
    xf = x.float()
    return (xf * torch.sigmoid(xf)).to(x.dtype)


def silu_sigmoid_fp32_backward(grad_out, x):
    """The fused SiLU backward g s (1 + x (1 - s)), s = sigmoid(x), in fp32. (Autograd through
    x * sigmoid(x) forms g * x first, which overflows for |x| ~ 1e38 and gives inf * 0 = NaN at
    x << 0: a property of that graph, not of the forward under test.)"""
    xf, gf = x.float(), grad_out.float()
    s = torch.sigmoid(xf)
    return ((gf * s * (1 + xf * (1 - s))).to(x.dtype),)


def swiglu_fused_fp32(a, b):
    """SwiGLU a sigmoid(a) b in one fp32 expression, one rounding (no rounding of silu(a))."""
    af = a.float()
    return (af * torch.sigmoid(af) * b.float()).to(a.dtype)


# ---- planted quantizer faults (telemetry goldens) ------------------------------------------
# An MX recipe whose quantizers carry a fault, measured by numcheck.telemetry.watcher in place of
# the real one (same name, so its records meet the real recipe's goldens): they calibrate the
# telemetry slacks (bench/calibrate_telemetry_slack.py) and prove them
# (tests/test_telemetry_golden.py).

@dataclass(frozen=True)
class FaultyMX(MXFormat):
    """An MX format with a planted fault: ``lost_bit`` (elements keep one mantissa bit less,
    RNE), ``scale_up`` / ``scale_down`` (block scales one binade too high / low: elements
    rounded, saturating, on the shifted grid), ``nan`` (a NaN out of finite values)."""

    fault: str = "lost_bit"

    def encode(self, x, dim=-1):
        q = super().encode(x, dim)
        if self.fault not in ("scale_up", "scale_down"):
            return q
        e = (q.scale_exp + (1 if self.fault == "scale_up" else -1)).clamp(-127, 127)  # E8M0
        s = 2.0 ** e.to(torch.float64).repeat_interleave(self.block, q.dim)
        codes = formats.round_to(torch.as_tensor(x, dtype=torch.float64) / s, self.elem)
        return dataclasses.replace(q, codes=codes, scale_exp=e,
                                   scale_code=(e + 127).to(q.scale_code.dtype))

    def decode(self, q):
        x = super().decode(q)
        if self.fault == "lost_bit":
            e = torch.floor(torch.log2(x.abs().clamp_min(1e-300)))
            step = 2.0 ** (e - (formats.get(self.elem).mbits - 1))
            return torch.where(x == 0, x, torch.round(x / step) * step)
        if self.fault == "nan":
            x = x.clone()
            x.view(-1)[0] = math.nan
        return x


@dataclass(frozen=True)
class _PlantedQuantizer:
    format: FaultyMX


@dataclass(frozen=True)
class PlantedRecipe:
    """A QuantRecipe-like (``name``, ``x``, ``w``, ``grad``) for numcheck.telemetry.watcher."""

    name: str
    x: _PlantedQuantizer
    w: _PlantedQuantizer
    grad: _PlantedQuantizer
    hadamard: None = None


def planted_mx_recipe(fault: str, base: str = "mxfp8") -> PlantedRecipe:
    """``base`` (an MX recipe of numcheck.quant.recipe.RECIPES) with ``fault`` (FaultyMX) in
    each role's quantizer, under ``base``'s name."""
    from numcheck.quant.recipe import get_recipe
    r = get_recipe(base)
    return PlantedRecipe(base, *(_PlantedQuantizer(FaultyMX(q.fmt, q.block, q.scale_mode, fault))
                                 for q in (r.x, r.w, r.grad)))
