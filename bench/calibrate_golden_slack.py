"""Calibrate the golden-regression slack (DESIGN rule 7) from benign rewrites and planted losses.

The rule under design, for rel_l2 (and the same for the worst block, rel = 10^(-dB/20), n the
block size n_compared / n_blocks):

    regression iff  c.rel > g.rel + max(S_E * E, Z * g.rel / sqrt(2 n), F * u)

g: the golden row (the eager kernel), c: the current row, E = max(g.kernel_rel, g.baseline_rel),
u: unit roundoff of the output format. The script runs every op's quick grid on the CPU:

1. benign rewrites (numcheck.ops.variants, plus a few of the bench's own) against the eager kernel:
   the excess d = c.rel - g.rel in units of E, of g.rel / sqrt(2 n) and of u, per op and dtype;
2. the eager kernel under 1 thread instead of the pinned 2, and under ATEN_CPU_CAPABILITY=avx2
   (another machine's vector code) in a subprocess;
3. planted losses: (a) noise with RMS sqrt(f^2 - 1) x each element's error vs FP64 added to the
   eager output (and to its grads) in float64, rounded to the output format, f = 1.19 (a quarter
   bit) and 1.41 (half a bit); (b) one extra rounding of an intermediate to the output dtype;
   (c) truncation (round toward zero) of an fp32 result instead of round-to-nearest;
   and the fraction of them that candidate (S_E, Z, F) triples catch, split by n and by E / g.rel;
4. max_ulp and mag_bias_ulp excess of the benign rewrites and of the planted losses.

    /work/venv/bin/python bench/calibrate_golden_slack.py [--ops rms_norm,matmul] [--no-isa]

Prints the tables of docs/golden-slack-calibration.md (about 4 minutes on 2 CPU cores).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import warnings
from collections import defaultdict

import torch
import torch.nn.functional as F

import numcheck as nc
from numcheck import formats
from numcheck.measure import numerics
from numcheck.catalog import get_op, kernels
from numcheck.registry import Kernel
from numcheck.ops.rope import rotate_half

from numcheck.ops.variants import (
    adaln_unfused_fp32, cross_entropy_unfused, gelu_erfc_fp32, linear_row_tiles, linear_unfused,
    ln_welford, log_softmax_two_pass_fp32, matmul_blocked_fp32, matmul_fp32_accumulate,
    matmul_split_k_reversed, rms_reversed_fp32_sum, rope_complex_fp32, rope_fma,
    rope_fp32_round_once, sdpa_math_fp32, sdpa_online, sdpa_reversed_keys, silu_sigmoid_fp32,
    silu_sigmoid_fp32_backward, softmax_blocked_sum, softmax_cascaded_sum, softmax_fp32_upcast,
    softmax_online, swiglu_fused_fp32)

QUARTER, HALF = 2 ** 0.25, 2 ** 0.5
# Candidates (S_E for bf16/fp16 outputs, S_E for fp32 outputs, Z, F) whose false alarms and
# catch rates are tabulated; the first is the recommendation. The last is a fixed 5% slack.
CANDIDATES = [(0.10, 1.25, 6.0, 0.05), (0.10, 0.10, 6.0, 0.05), (0.05, 1.25, 6.0, 0.05),
              (0.10, 1.25, 4.0, 0.05), (0.25, 1.25, 6.0, 0.25), (0.10, 0.50, 6.0, 0.05),
              (0.05, 0.05, 0.0, 0.0)]
N_BINS = [(0, 64), (64, 256), (256, 1024), (1024, 16384), (16384, 1 << 40)]
RATIO_BINS = [(1.0, 1.5), (1.5, 4.0), (4.0, math.inf)]  # E / g.rel: baseline vs kernel error

# ---- the bench's own benign rewrites (the shared ones are in numcheck.ops.variants) -------------


def rms_fp32_upcast(x, weight, eps):  # bench: F.rms_norm on fp32 copies, one rounding
    out = F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps)
    return out.to(torch.promote_types(x.dtype, weight.dtype))


def rms_blocked_sum(x, weight, eps):  # bench: sum of squares in blocks of 64, fp32
    xf = x.float()
    sq = xf * xf
    s = sum(sq[..., c0:c0 + 64].sum(-1, keepdim=True) for c0 in range(0, x.shape[-1], 64))
    return (xf * torch.rsqrt(s / x.shape[-1] + eps) * weight.float()).to(x.dtype)


def ln_two_pass_fp32(x, weight, bias, eps):  # bench: mean, then variance by definition
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = ((xf - mean) ** 2).mean(-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps) * weight.float() + bias.float()
    return y.to(x.dtype)


def adaln_fused_fp32(x, shift, scale, eps):  # bench: one fused fp32 pass, one rounding
    xf = x.float()
    y = F.layer_norm(xf, (x.shape[-1],), None, None, eps)
    return torch.addcmul(shift.float(), y, 1 + scale.float()).to(x.dtype)


def log_softmax_logsumexp_fp32(x, dim=-1):  # bench: torch.logsumexp in fp32
    xf = x.float()
    return (xf - torch.logsumexp(xf, dim, keepdim=True)).to(x.dtype)


def cross_entropy_fp32_then_round(logits, target):  # bench: fp32 loss rounded once
    return F.cross_entropy(logits.float(), target.to(logits.device)).to(logits.dtype)


def gelu_fp32_upcast(x, approximate="none"):  # bench
    return F.gelu(x.float(), approximate=approximate).to(x.dtype)


def silu_fp32_upcast(x):  # bench
    return F.silu(x.float()).to(x.dtype)


# ---- one extra rounding: an intermediate rounded to the output dtype (bench) -----------------

def _od(*ts):
    dt = ts[0].dtype
    for t in ts[1:]:
        dt = torch.promote_types(dt, t.dtype)
    return dt


def xr_rms_norm(x, weight, eps):
    xf = x.float()
    t = (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (t.float() * weight.float()).to(_od(x, weight))


def xr_layer_norm(x, weight, bias, eps):
    xf = x.float()
    t = F.layer_norm(xf, (x.shape[-1],), None, None, eps).to(x.dtype)
    return (t.float() * weight.float() + bias.float()).to(_od(x, weight))


def xr_adaln(x, shift, scale, eps):
    t = F.layer_norm(x.float(), (x.shape[-1],), None, None, eps).to(x.dtype)
    return (t.float() * (1 + scale.float()) + shift.float()).to(x.dtype)


def xr_matmul(a, b):  # split-K partials stored in the output dtype
    h = a.shape[-1] // 2
    if h == 0:
        return (a.float() @ b.float()).to(a.dtype).float().to(a.dtype)
    p1 = (a[..., :h].float() @ b[..., :h, :].float()).to(a.dtype)
    p2 = (a[..., h:].float() @ b[..., h:, :].float()).to(a.dtype)
    return (p1.float() + p2.float()).to(a.dtype)


def xr_linear(x, weight, bias=None):
    out = xr_matmul(x, weight.to(x.dtype).mT)
    return out if bias is None else (out.float() + bias.to(x.dtype).float()).to(x.dtype)


def xr_softmax(x, dim=-1):  # the final scale 1/sum rounded to the output dtype
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim, keepdim=True).detach())
    inv = (1 / e.sum(dim, keepdim=True)).to(x.dtype).float()
    return (e * inv).to(x.dtype)


def xr_log_softmax(x, dim=-1):  # logsumexp rounded to the output dtype
    xf = x.float()
    lse = torch.logsumexp(xf, dim, keepdim=True).to(x.dtype).float()
    return (xf - lse).to(x.dtype)


def xr_cross_entropy(logits, target):
    lsm = xr_log_softmax(logits, -1).float()
    return -lsm.gather(-1, target.to(logits.device).view(-1, 1)).mean().to(logits.dtype)


def xr_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):  # 1/l in the output dtype
    dt = q.dtype
    g = q.shape[-3] // k.shape[-3]
    q, k, v = q.float(), k.float().repeat_interleave(g, -3), v.float().repeat_interleave(g, -3)
    s, skv = q.shape[-2], k.shape[-2]
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    allowed = torch.ones(s, skv, dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed.tril()
    if attn_mask is not None:
        allowed = allowed & attn_mask.to(q.device)
    logits = ((q @ k.mT) * sc).masked_fill(~allowed, -math.inf)
    m = logits.amax(-1, keepdim=True).detach()
    m = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(logits - m)
    lsum = p.sum(-1, keepdim=True)
    inv = torch.where(lsum == 0, 0.0, 1 / torch.where(lsum == 0, 1.0, lsum)).to(dt).float()
    return ((p @ v) * inv).to(dt)


def xr_rope(x, cos, sin):
    xf = x.float()
    t = (xf * cos.float()).to(x.dtype).float()
    return (t + rotate_half(xf) * sin.float()).to(x.dtype)


def xr_gelu(x, approximate="none"):
    xf = x.float()
    if approximate == "tanh":
        y = math.sqrt(2 / math.pi) * (xf + 0.044715 * xf * xf * xf)
        phi = torch.sigmoid(2 * y)
    else:
        phi = 0.5 * torch.special.erfc(-xf * (1 / math.sqrt(2)))
    return (xf * phi.to(x.dtype).float()).to(x.dtype)


def xr_silu(x):
    xf = x.float()
    return (xf * torch.sigmoid(xf).to(x.dtype).float()).to(x.dtype)


def xr_swiglu(a, b):
    af = a.float()
    return ((af * torch.sigmoid(af).to(a.dtype).float()).to(a.dtype).float() * b.float()).to(
        a.dtype)


# ---- the op table: (eager golden kernel, benign rewrites, extra-rounding variant) -------------

def _silu_kernel():
    return Kernel("silu", "sigmoid_fp32", silu_sigmoid_fp32, backward=silu_sigmoid_fp32_backward)


OPS = {
    "rms_norm": ("torch", [rms_reversed_fp32_sum, rms_fp32_upcast, rms_blocked_sum],
                 xr_rms_norm),
    "layer_norm": ("torch", [ln_welford, ln_two_pass_fp32], xr_layer_norm),
    "adaln_modulate": ("torch", [adaln_unfused_fp32, adaln_fused_fp32], xr_adaln),
    "matmul": ("torch", [matmul_blocked_fp32, matmul_split_k_reversed, matmul_fp32_accumulate],
               xr_matmul),
    "linear": ("torch", [linear_unfused, linear_row_tiles], xr_linear),
    "softmax": ("torch", [Kernel("softmax", "online", softmax_online, forward_only=True),
                          softmax_fp32_upcast, softmax_cascaded_sum, softmax_blocked_sum],
                xr_softmax),
    "log_softmax": ("torch", [log_softmax_two_pass_fp32, log_softmax_logsumexp_fp32],
                    xr_log_softmax),
    "cross_entropy": ("torch", [cross_entropy_unfused, cross_entropy_fp32_then_round],
                      xr_cross_entropy),
    "sdpa": ("sdpa_math", [sdpa_online, sdpa_math_fp32, sdpa_reversed_keys, "sdpa_flash"],
             xr_sdpa),
    "rope": ("torch", [rope_complex_fp32, rope_fp32_round_once, rope_fma], xr_rope),
    "gelu": ("torch", [gelu_erfc_fp32, gelu_fp32_upcast], xr_gelu),
    "silu": ("torch", [_silu_kernel, silu_fp32_upcast], xr_silu),
    "swiglu": ("torch", [swiglu_fused_fp32], xr_swiglu),
}


# ---- planted noise: the eager output (and grads) with f x its error vs FP64 ------------------

def _noisy_value(out: torch.Tensor, ref: torch.Tensor, f: float, gen: torch.Generator):
    o = out.detach().double()
    err = o - ref.detach().double()
    fin = torch.isfinite(o) & torch.isfinite(err)
    noise = torch.randn(o.shape, dtype=torch.float64, generator=gen) * math.sqrt(f * f - 1)
    y = torch.where(fin, o + noise * err.abs().nan_to_num(0.0), o)
    return nc.round_to(y, formats.get(out.dtype).name).to(out.dtype)


def noisy_kernel(op: str, eager: Kernel, f: float) -> Kernel:
    spec = get_op(op)

    class Noisy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, meta, *ts):
            names, kw, gen = meta
            ctx.meta, ctx.names = meta, names
            ctx.save_for_backward(*ts)
            ins = dict(zip(names, ts))
            out = eager.fn(**ins, **kw)
            ref = spec.reference(**{n: t.double() for n, t in ins.items()}, **kw)
            return _noisy_value(out, ref, f, gen)

        @staticmethod
        def backward(ctx, g):
            names, kw, gen = ctx.meta
            ts = ctx.saved_tensors
            need = [i for i, t in enumerate(ts) if ctx.needs_input_grad[i + 1]]
            with torch.enable_grad():
                lv = [t.detach().requires_grad_(i in need) for i, t in enumerate(ts)]
                eg = torch.autograd.grad(eager.fn(**dict(zip(names, lv)), **kw),
                                         [lv[i] for i in need], g, allow_unused=True)
                lr = [t.detach().double().requires_grad_(i in need) for i, t in enumerate(ts)]
                rg = torch.autograd.grad(spec.reference(**dict(zip(names, lr)), **kw),
                                         [lr[i] for i in need], g.double(), allow_unused=True)
            grads: list = [None] * (len(ts) + 1)
            for j, i in enumerate(need):
                if eg[j] is not None and rg[j] is not None:
                    grads[i + 1] = _noisy_value(eg[j], rg[j], f, gen)
                else:
                    grads[i + 1] = eg[j]
            return tuple(grads)

    def fn(**kw):
        names = [k for k, v in kw.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
        rest = {k: v for k, v in kw.items() if k not in names}
        gen = torch.Generator().manual_seed(hash((op, tuple(kw[n].shape for n in names))) % 2**31)
        return Noisy.apply((names, rest, gen), *[kw[n] for n in names])

    return Kernel(op, f"noise_x{f:.2f}", fn)


def truncating_kernel(op: str, eager: Kernel) -> Kernel:
    """The eager output of fp32-upcast inputs rounded toward zero to the output dtype (forward
    only): half a ULP of downward magnitude bias, the truncation gate's target."""
    def fn(**kw):
        up = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
              for k, v in kw.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hi = eager.fn(**up)
        like = eager.fn(**kw)
        return nc.round_to(hi, formats.get(like.dtype).name, "rz").to(like.dtype)
    return Kernel(op, "truncate", fn, forward_only=True)


# ---- runs ------------------------------------------------------------------------------------

def _verify(op, kern) -> list[dict]:
    """The quick grid's records in their flat form (``Record.as_row``: kernel_rel_l2, ...)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [r.as_row() for r in nc.verify(op, kern, device="cpu", cases="quick").records]


def _keyed(rows):
    return {(r["case_id"], r["output"]): r for r in rows if r.get("kernel_rel_l2") is not None}


def _block_rel(db: float | None) -> float:
    if db is None:
        return math.nan
    return 10.0 ** (-db / 20.0) if db != math.inf else 0.0


def metrics(g: dict, c: dict) -> list[dict]:
    """The two gated statistics of golden row g and current row c (None where unusable)."""
    u = formats.get(g["kernel_fmt"]).unit_roundoff
    n = max(1, int(g["kernel_n_compared"]))
    nb = max(1, int(g["kernel_n_blocks"]))
    out = []
    for m, gr, br, cr, nn in (
            ("l2", g["kernel_rel_l2"], g["baseline_rel_l2"], c["kernel_rel_l2"], n),
            ("block", _block_rel(g["kernel_min_block_sqnr_db"]),
             _block_rel(g["baseline_min_block_sqnr_db"]),
             _block_rel(c["kernel_min_block_sqnr_db"]), max(1, n // nb))):
        if not all(v is not None and math.isfinite(v) for v in (gr, br, cr)):
            continue
        e = max(gr, br)
        out.append({"metric": m, "fmt": g["kernel_fmt"], "g": gr, "c": cr, "E": e, "u": u, "n": nn, "d": cr - gr,
                    "sig": gr / math.sqrt(2 * nn)})
    return out


def flagged(x: dict, se16: float, se32: float, z: float, fu: float) -> bool:
    se = se32 if x["fmt"] == "fp32" else se16
    return x["c"] > x["g"] + max(se * x["E"], z * x["sig"], fu * x["u"])


def _cand(c) -> str:
    return f"{c[0]:g}/{c[1]:g}, {c[2]:g}, {c[3]:g}"


def _units(x: dict) -> tuple[float, float, float]:
    d = x["d"]
    return (d / x["E"] if x["E"] > 0 else (0.0 if d <= 0 else math.inf),
            d / x["sig"] if x["sig"] > 0 else (0.0 if d <= 0 else math.inf),
            d / x["u"])


def pairs(golden: dict, current: list[dict], op: str, variant: str):
    """(key, metric row) for every case/output both runs measured in the same format."""
    for key, c in _keyed(current).items():
        g = golden.get(key)
        if g is None or c["kernel_fmt"] != g["kernel_fmt"] or c["status"] == "error":
            continue
        for x in metrics(g, c):
            x.update(op=op, variant=variant, case=key[0], output=key[1], dtype=g["dtype"],
                     fwd=key[1] == "out", g_row=g, c_row=c)
            yield x


def _q(vals: list[float], p: float) -> float:
    if not vals:
        return math.nan
    s = sorted(vals)
    return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]


def _fmt(v: float) -> str:
    if isinstance(v, str):
        return v
    if math.isnan(v):
        return "-"
    if abs(v) == math.inf:
        return "inf" if v > 0 else "-inf"
    return f"{v:.3g}"


def table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[_fmt(c) if not isinstance(c, str) else c for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = "| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(header)) + " |"
    sep = "|" + "|".join("-" * (x + 2) for x in w) + "|"
    body = ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |" for r in cells[1:]]
    return "\n".join([line, sep, *body])


def excess_tables(rows: list[dict], title: str) -> None:
    print(f"\n### {title}\n")
    for metric in ("l2", "block"):
        print(f"\n{metric}: excess d = c.rel - g.rel in units of E, of g.rel/sqrt(2n), of u "
              "(max / p99 / median over cases and outputs, forward and grads)\n")
        grp = defaultdict(list)
        for x in rows:
            if x["metric"] == metric:
                grp[(x["op"], x["dtype"])].append(x)
        out = []
        for (op, dt), xs in sorted(grp.items()):
            ue = [_units(x)[0] for x in xs]
            uz = [_units(x)[1] for x in xs]
            uu = [_units(x)[2] for x in xs]
            worst = max(xs, key=lambda x: _units(x)[0])
            out.append([op, dt, str(len(xs)), _q(ue, 1), _q(ue, .99), _q(ue, .5), _q(uz, 1),
                        _q(uz, .5), _q(uu, 1),
                        f"{worst['variant']} {worst['case']} {worst['output']}"])
        print(table(["op", "dtype", "rows", "d/E max", "p99", "med", "d/sig max", "med",
                     "d/u max", "argmax d/E"], out))
        allx = [x for x in rows if x["metric"] == metric]
        if allx:
            for i, name in enumerate(("d/E", "d/sig", "d/u")):
                top = max(allx, key=lambda x, i=i: _units(x)[i])
                print(f"  overall max {name} = {_fmt(_units(top)[i])}: {top['op']} "
                      f"{top['variant']} {top['case']} {top['output']} (g {top['g']:.3g}, "
                      f"c {top['c']:.3g}, E {top['E']:.3g}, n {top['n']})")


def false_alarms(rows: list[dict], title: str) -> None:
    print(f"\n{title}: rows flagged by each candidate (of {len(rows)})")
    for cand in CANDIDATES:
        hits = [x for x in rows if flagged(x, *cand)]
        ex = "; ".join(f"{x['op']}/{x['variant']}/{x['case']}/{x['output']}/{x['metric']}"
                       for x in hits[:4])
        print(f"  S_E={cand[0]:g}/{cand[1]:g} Z={cand[2]:g} F={cand[3]:g}: {len(hits)}  {ex}")


def catch_tables(rows: list[dict], f: float, title: str, realized_only: bool) -> None:
    """Fraction caught, by n bin and by E/g.rel bin, for each candidate."""
    rows = [x for x in rows if x["g"] > 0]
    if realized_only:
        rows = [x for x in rows if x["c"] >= x["g"] * (1 + 0.75 * (f - 1))]
    print(f"\n{title} ({len(rows)} rows{', achieved c/g >= 1 + 0.75 (f - 1)' if realized_only else ''})\n")
    for metric in ("l2", "block"):
        xs = [x for x in rows if x["metric"] == metric]
        hdr = ["S_E16/S_E32, Z, F"] + [f"n {lo}-{hi if hi < 1 << 39 else 'inf'}" for lo, hi in N_BINS] + \
              [f"E/g {lo:g}-{hi:g}" for lo, hi in RATIO_BINS] + ["bf16/fp16", "fp32", "all"]
        out = []
        for cand in CANDIDATES:
            r = [_cand(cand)]
            for lo, hi in N_BINS:
                b = [x for x in xs if lo <= x["n"] < hi]
                r.append(f"{sum(flagged(x, *cand) for x in b)}/{len(b)}")
            for lo, hi in RATIO_BINS:
                b = [x for x in xs if lo <= x["E"] / x["g"] < hi]
                r.append(f"{sum(flagged(x, *cand) for x in b)}/{len(b)}")
            for lp in (True, False):
                b = [x for x in xs if (x["fmt"] != "fp32") == lp]
                r.append(f"{sum(flagged(x, *cand) for x in b)}/{len(b)}")
            r.append(f"{sum(flagged(x, *cand) for x in xs)}/{len(xs)}")
            out.append(r)
        print(f"metric {metric}:")
        print(table(hdr, out))
        ach = [x["c"] / x["g"] for x in xs]
        print(f"  achieved c/g: median {_fmt(_q(ach, .5))}, p10 {_fmt(_q(ach, .1))}, "
              f"p90 {_fmt(_q(ach, .9))}\n")


ULP_OPS = ("silu", "swiglu", "gelu", "softmax")  # elementwise / exp-like: ULP is meaningful


def ulp_tables(benign: list[dict], planted: dict[str, list[dict]]) -> None:
    print(f"\n### max_ulp and mag_bias_ulp (forward outputs of {', '.join(ULP_OPS)})\n")
    hdr = ["set", "rows", "dmax_ulp max", "dmax_ulp/g max", "|mag| max", "(|c|-|g|) max",
           "(|c|-|g|)*sqrt(n) max", "c.max_ulp > g+max(1,g/4)", "|c|>|g|+0.1"]
    out = []
    for name, rows in [("benign", benign), *planted.items()]:
        xs = [x for x in rows if x["fwd"] and x["metric"] == "l2" and x["op"] in ULP_OPS]
        if not xs:
            continue
        dm = [x["c_row"]["kernel_max_ulp"] - x["g_row"]["kernel_max_ulp"] for x in xs]
        dr = [x["c_row"]["kernel_max_ulp"] / max(1, x["g_row"]["kernel_max_ulp"]) for x in xs]
        cm = [abs(x["c_row"]["kernel_mag_bias_ulp"]) for x in xs]
        db = [abs(x["c_row"]["kernel_mag_bias_ulp"]) - abs(x["g_row"]["kernel_mag_bias_ulp"])
              for x in xs]
        dbz = [v * math.sqrt(x["n"]) for v, x in zip(db, xs)]
        ulp_hit = sum(x["c_row"]["kernel_max_ulp"] > x["g_row"]["kernel_max_ulp"] +
                      max(1, math.ceil(x["g_row"]["kernel_max_ulp"] / 4)) for x in xs)
        bias_hit = sum(v > 0.1 for v in db)
        out.append([name, str(len(xs)), max(dm), max(dr), max(cm), max(db), max(dbz),
                    f"{ulp_hit}/{len(xs)}", f"{bias_hit}/{len(xs)}"])
    print(table(hdr, out))
    for name, rows in [("benign", benign), *planted.items()]:
        xs = [x for x in rows if x["fwd"] and x["metric"] == "l2" and x["op"] in ULP_OPS]
        if xs:
            top = max(xs, key=lambda x: x["c_row"]["kernel_max_ulp"] - x["g_row"]["kernel_max_ulp"])
            print(f"  {name} (elementwise/exp-like ops): worst max_ulp {top['op']} {top['variant']} "
                  f"{top['case']} g {top['g_row']['kernel_max_ulp']} c "
                  f"{top['c_row']['kernel_max_ulp']}")


def _isa_golden(ops: list[str], isa: str) -> dict:
    """The eager kernel's records under ATEN_CPU_CAPABILITY=isa, from a subprocess."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=isa)
    cp = subprocess.run([sys.executable, __file__, "--dump-eager", ",".join(ops)], env=env,
                        capture_output=True, text=True, check=True)
    return json.loads(cp.stdout.strip().splitlines()[-1])


def _eager_kernel(op: str) -> Kernel:
    return kernels(op)[OPS[op][0]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--no-isa", action="store_true", help="skip the ATEN_CPU_CAPABILITY run")
    ap.add_argument("--save", default=None, help="write every compared row to this JSON file")
    ap.add_argument("--dump-eager", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.dump_eager:
        recs = {op: _verify(op, _eager_kernel(op)) for op in a.dump_eager.split(",")}
        print(json.dumps({op: [{k: v for k, v in r.items() if k.startswith(("kernel_", "baseline_"))
                                or k in ("case_id", "output", "dtype", "status")} for r in rs]
                          for op, rs in recs.items()}))
        return
    ops = a.ops.split(",")
    t0 = time.time()
    print(f"# golden slack calibration: torch {torch.__version__}, "
          f"{torch.backends.cpu.get_cpu_capability()}, threads pinned to "
          f"{numerics.PINNED_THREADS}, ops {', '.join(ops)}")
    benign, threads, isa, planted = [], [], [], defaultdict(list)
    goldens: dict[str, dict] = {}
    other = cap = torch.backends.cpu.get_cpu_capability()
    orig_pinned = numerics.pinned
    one_thread = dataclasses.replace(numerics.PINNED, num_threads=1)
    for op in ops:
        _, variants, xr = OPS[op]
        eager = _eager_kernel(op)
        golden = goldens[op] = _keyed(_verify(op, eager))
        for v in variants:
            kern = kernels(op)[v] if isinstance(v, str) else (v() if v is _silu_kernel else v)
            name = kern.name if isinstance(kern, Kernel) else kern.__name__
            benign.extend(pairs(golden, _verify(op, kern), op, name))
        numerics.pinned = lambda state=one_thread: orig_pinned(state)
        try:
            threads.extend(pairs(golden, _verify(op, eager), op, "1 thread"))
        finally:
            numerics.pinned = orig_pinned
        for f, label in ((QUARTER, "noise x1.19"), (HALF, "noise x1.41")):
            planted[label].extend(pairs(golden, _verify(op, noisy_kernel(op, eager, f)), op,
                                        label))
        planted["extra rounding"].extend(pairs(golden, _verify(op, xr), op, xr.__name__))
        planted["truncation"].extend(pairs(golden, _verify(op, truncating_kernel(op, eager)),
                                           op, "truncate"))
        print(f"  {op}: {len(golden)} golden rows, {time.time() - t0:.0f}s", flush=True)
    if not a.no_isa:
        other = "AVX2" if cap != "AVX2" else "DEFAULT"
        for op, rs in _isa_golden(ops, other).items():
            isa.extend(pairs(goldens[op], rs, op, f"ATEN_CPU_CAPABILITY={other}"))

    if a.save:
        keep = ("metric", "fmt", "g", "c", "E", "u", "n", "d", "sig", "op", "variant", "case",
                "output", "dtype", "fwd")
        rowsets = {"benign": benign, "threads": threads, "isa": isa, **planted}
        with open(a.save, "w") as fh:
            json.dump({k: [{**{f: x[f] for f in keep},
                            **{f"{w}_{s}": x[f"{w}_row"][f"kernel_{s}"] for w in "gc"
                               for s in ("max_ulp", "mag_bias_ulp", "mean_ulp")}}
                           for x in v] for k, v in rowsets.items()}, fh)
    excess_tables(benign, "Benign rewrites vs the eager golden")
    false_alarms(benign, "Benign rewrites")
    excess_tables(threads, "Eager kernel, 1 thread vs the pinned 2")
    false_alarms(threads, "1 thread")
    if isa:
        excess_tables(isa, f"Eager kernel, ATEN_CPU_CAPABILITY={other} vs {cap}")
        false_alarms(isa, f"ATEN_CPU_CAPABILITY={other}")
    for label, rows in planted.items():
        f = QUARTER if "1.19" in label else HALF
        if label in ("extra rounding", "truncation"):
            f = QUARTER
        catch_tables([x for x in rows if x["fwd"]], f, f"Planted: {label}, forward outputs",
                     realized_only=False)
        if label.startswith("noise"):
            catch_tables(rows, f, f"Planted: {label}, forward and grads", realized_only=True)
    xr_rows = planted["extra rounding"]
    print("\nExtra rounding, forward, per dtype: achieved c/g (l2) median and fraction caught "
          f"by {CANDIDATES[0]}")
    for dt in ("bf16", "fp16", "fp32"):
        xs = [x for x in xr_rows if x["fwd"] and x["metric"] == "l2" and x["dtype"] == dt
              and x["g"] > 0]
        ach = [x["c"] / x["g"] for x in xs]
        print(f"  {dt}: {len(xs)} rows, c/g median {_fmt(_q(ach, .5))}, "
              f"caught {sum(flagged(x, *CANDIDATES[0]) for x in xs)}, of those with c/g >= 1.19: "
              f"{sum(flagged(x, *CANDIDATES[0]) for x in xs if x['c'] >= 1.19 * x['g'])}/"
              f"{sum(x['c'] >= 1.19 * x['g'] for x in xs)}")
    ulp_tables(benign + threads, {k: v for k, v in planted.items()})
    print(f"\ndone in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
