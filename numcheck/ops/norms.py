"""Norms: rms_norm(x, weight, eps), layer_norm(x, weight, bias, eps) over the last dim, and
adaln_modulate(x, shift, scale, eps) = layernorm(x, no affine) * (1 + scale) + shift.

Shapes: ``(rows..., D)``; adaln's shift/scale are ``(B, 1, D)`` (one conditioning vector per
sample, as in DiT). Weights may be fp32 beside bf16/fp16 activations (param ``weight=fp32``).

References: mean and variance by definition (two passes) in float64. Baselines: the same formula
in the compute dtype with plain torch primitives. Policy: blocks are rows. RMSNorm's output is a
product (well-conditioned) but its reduction makes a fixed ULP count meaningless across dtypes,
so the baseline rule gates it; LayerNorm/adaLN subtract the mean (cancellation is inherent,
DESIGN rule 5), so they get the componentwise bound |err| <= c u (|x - mean| + |mean|)/sigma |w|.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from numcheck import formats
from numcheck.kernels import triton_interp as _triton_interp
from numcheck.cases import inputs
from numcheck.cases.grid import Case, make_grid
from numcheck.kernels.compiled import compiled_kernel
from numcheck.verdicts.policy import Policy
from numcheck.registry import Kernel, OpSpec

EPS = 1e-6  # a typical training eps; small enough that dropping it only shows on zero rows

# No D = 1 rows: layer norm of one element is exactly its bias (x - mean = 0) and RMSNorm's is
# sign(x) * w, whose gradient is pure cancellation; both say nothing about a kernel.
_SHAPES = [(4, 128), (3, 129), (2, 7, 1025), (16, 33), (1, 7)]
_DISTS = ["normal", "outlier_channels", "zero_blocks", "constant_rows", "large_mean",
          "student_t", "subnormal", "near_overflow", "wide_range"]


def _dt(case: Case) -> torch.dtype:
    return formats.get(case.dtype).torch


def _weight_dtype(case: Case) -> torch.dtype:
    return torch.float32 if case.param("weight") == "fp32" else _dt(case)


def _out_dtypes(case: Case) -> tuple[torch.dtype, ...]:
    # Mixed bf16 activations / fp32 weights: torch returns the activation dtype; a kernel that
    # promotes to fp32 is allowed too.
    return (_dt(case), torch.float32) if case.param("weight") == "fp32" else (_dt(case),)


def _affine(case: Case, name: str, d: int, center: float) -> torch.Tensor:
    return center + 0.1 * inputs.draw("normal", (d,), seed=case.seed, stream=f"{case.id}/{name}")


def _x(case: Case) -> torch.Tensor:
    return inputs.draw(case.dist, case.shape, seed=case.seed, fmt=case.dtype,
                       stream=f"{case.id}/x")


# ---- rms_norm -------------------------------------------------------------------------------

def _rms_inputs(case: Case):
    d = case.shape[-1]
    return ({"x": (_x(case), _dt(case)), "weight": (_affine(case, "weight", d, 1.0),
                                                    _weight_dtype(case))}, {"eps": EPS})


def rms_norm_reference(x, weight, eps):
    ms = (x * x).sum(-1, keepdim=True) / x.shape[-1]
    return x / torch.sqrt(ms + eps) * weight


# DESIGN rule 4: the norms' baselines compute in fp32 from the stored inputs and round once at
# the output (autograd rounds each gradient once at its leaf), as fused norm kernels and torch's
# own do; statistics rounded to bf16 are the bug class a baseline must not share (issue 31).
def rms_norm_baseline(x, weight, eps):
    xf = formats.widen(x)
    ms = (xf * xf).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(ms + eps) * weight.to(xf.dtype)).to(x.dtype)


def _eager_rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


# ---- layer_norm -----------------------------------------------------------------------------

def _ln_inputs(case: Case):
    d = case.shape[-1]
    return ({"x": (_x(case), _dt(case)),
             "weight": (_affine(case, "weight", d, 1.0), _weight_dtype(case)),
             "bias": (_affine(case, "bias", d, 0.0), _weight_dtype(case))}, {"eps": EPS})


def _normalize64(x, eps):
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / x.shape[-1]
    return (x - mean) / torch.sqrt(var + eps)


def layer_norm_reference(x, weight, bias, eps):
    return _normalize64(x, eps) * weight + bias


def _normalize_naive(x, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + eps)


def layer_norm_baseline(x, weight, bias, eps):
    xf = formats.widen(x)
    return (_normalize_naive(xf, eps) * weight.to(xf.dtype) + bias.to(xf.dtype)).to(x.dtype)


def _ln_scale(x, weight, bias, eps):
    """|x - mean| + |mean| over sigma, times |w|, plus |b|: what the result's rounding scales with."""
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    sigma = torch.sqrt(((x - mean) ** 2).sum(-1, keepdim=True) / x.shape[-1] + eps)
    return ((x - mean).abs() + mean.abs()) / sigma * weight.abs() + bias.abs()


def _eager_layer_norm(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


# ---- adaln_modulate -------------------------------------------------------------------------

def _adaln_inputs(case: Case):
    b, d = case.shape[0], case.shape[-1]
    cond = (b,) + (1,) * (len(case.shape) - 2) + (d,)
    return ({"x": (_x(case), _dt(case)),
             "shift": (inputs.draw("normal", cond, seed=case.seed, stream=f"{case.id}/shift"),
                       _dt(case)),
             "scale": (0.5 * inputs.draw("normal", cond, seed=case.seed,
                                         stream=f"{case.id}/scale"), _dt(case))}, {"eps": EPS})


def adaln_reference(x, shift, scale, eps):
    return _normalize64(x, eps) * (1 + scale) + shift


def adaln_baseline(x, shift, scale, eps):
    xf = formats.widen(x)
    return (_normalize_naive(xf, eps) * (1 + scale.to(xf.dtype)) + shift.to(xf.dtype)).to(x.dtype)


def _adaln_scale(x, shift, scale, eps):
    return _ln_scale(x, (1 + scale), shift, eps)


def _eager_adaln(x, shift, scale, eps):
    return F.layer_norm(x, (x.shape[-1],), None, None, eps) * (1 + scale) + shift


# ---- registration ---------------------------------------------------------------------------

def _keep(row: dict) -> bool:
    # near_overflow only where the compute dtype's square fits fp32: x^2 overflows any fp32
    # accumulator above 1.8e19, and no training kernel rescales for that (bf16/fp32 inputs).
    return row["dist"] != "near_overflow" or row["dtype"] == "fp16"


def _zero_ref_grads(case: Case) -> tuple[str, ...]:
    # constant rows: x_hat = 0, so the reference gradients of weight (LN) and scale (adaLN) are
    # exactly 0 and no relative rule applies; forward and grad_x (which eps keeps finite) are
    # still judged.
    return ("weight", "scale") if case.dist == "constant_rows" else ()


def _rows(case: Case, shape: torch.Size):
    return shape[-1] if len(shape) else None


_FACTORS = {"dtype": ["fp32", "bf16", "fp16"], "shape": _SHAPES, "dist": _DISTS,
            "layout": ["contiguous", "transposed"]}

# Size classes where real norm kernels switch algorithm (DESIGN rule 14; docs/grid-audit.md):
# 32769 rows (> 32768 = 4096 * 8, where liger-kernel's RMSNorm moves to its multi-row block
# kernels and the weight gradient of every row-parallel kernel becomes a cross-program sum; odd,
# so no power-of-two split is exact), and hidden 8192 (one row past a 4096/5120 block).
def _size_probes(**extra):
    rows = {"dtype": "bf16", "shape": (32769, 64), "dist": "normal", "layout": "contiguous"}
    hidden = {"dtype": "bf16", "shape": (4, 8192), "dist": "outlier_channels",
              "layout": "contiguous"}
    return [{**rows, **extra}], [{**hidden, **extra}]


_RMS_SIZES, _RMS_FULL_SIZES = _size_probes(weight="same")
# adaln_modulate: shift/scale are (B, 1, D), so their gradients sum over the sequence: 32769
# tokens of one sample (the same cross-program sum), and hidden 8192 over 4 tokens.
_ADALN_SIZES = [{"dtype": "bf16", "shape": (1, 32769, 64), "dist": "normal",
                 "layout": "contiguous"}]
_ADALN_FULL_SIZES = [{"dtype": "bf16", "shape": (2, 4, 8192), "dist": "outlier_channels",
                      "layout": "contiguous"}]
_FULL = {"shape": [(64, 4096), (8, 16, 31)], "dist": ["uniform", "lognormal", "sparse"],
         "layout": ["sliced"]}

# Componentwise bound for LN/adaLN: output rounding (<= 1 u of the scale), mean and rstd rounded
# once each (8 leaves room for fp16/bf16 kernels), plus gamma_D for the statistics' sums.
_LN_POLICY = Policy(bound_c=8.0, bound_per_len=1.0,
                    notes="componentwise bound: cancellation in x - mean")


def _cuda_ln_mixed_dtypes(case: Case, device: str) -> str | None:
    """Finding (H200, torch 2.11): CUDA layer_norm raises 'expected scalar type BFloat16 but
    found Float' for fp32 weight/bias with bf16/fp16 input; the CPU kernel accepts them."""
    if torch.device(device).type == "cuda" and _weight_dtype(case) != _dt(case):
        return "torch's CUDA layer_norm rejects fp32 weight/bias with a bf16/fp16 input"
    return None


def _cuda_rms_subnormal_grad(case: Case, device: str, output: str) -> str | None:
    """Finding (H200, torch 2.11): CUDA rms_norm backward forms grad_weight through a subnormal
    intermediate for subnormal fp32 inputs: 3e-6 relative vs the baseline's 6e-8."""
    if torch.device(device).type == "cuda" and case.dist == "subnormal" and \
            output == "grad_weight":
        return "torch-cuda-rms-norm-subnormal-grad"
    return None


def _torch_ln_backward_cancels(case: Case, device: str, output: str) -> str | None:
    """Findings (docs/findings.md): torch's layer_norm backward forms grad_x from sums of x
    itself (not of x - mean), which cancels when mean >> std: measured 10-21x the two-pass
    baseline's error at D=4096, fp32, large_mean rows on CPU; 4.2x at D=7 on CUDA (H200). On
    the CPU, with bf16/fp16 input, it sums the weight and bias gradients over rows in the
    input dtype (grad_bias of 32769 bf16 rows: rel 0.15, an fp32 sum 1.3e-3)."""
    if output == "grad_x" and case.dist == "large_mean":
        return "torch-layer-norm-backward-large-mean"
    if (output in ("grad_weight", "grad_bias") and case.dtype in ("bf16", "fp16")
            and torch.device(device).type == "cpu"):
        return "torch-cpu-layer-norm-half-param-grads"
    return None


def _adaln_strided_rows(case: Case, device: str, output: str) -> str | None:
    """Finding (compiled kernel): on a transposed (column-major) x, inductor reduces each row
    with one sequential fp32 accumulator (a left-to-right two-pass in fp32 reproduces its per-row
    rstd errors: -13.4 vs -14.5 u, +12.4 vs +11.7 u on a 128-wide row); contiguous rows get
    lane-wise sums (<= 1.7 u). A benign summation order (DESIGN rule 7), but 7x the norms
    baseline's cascaded torch.mean on one row of fp32-2x16x128-zero_blocks: the norms family's
    baseline rule does not yet allow for reordered sums (softmax's baselines use a sequential
    sum for this reason)."""
    if case.param("layout") == "transposed" and case.dtype == "fp32" and output in ("out",
                                                                                    "grad_x"):
        return "inductor-strided-row-reduction"
    return None


def _row_len(case: Case) -> int:
    """Terms of the row sums (mean, variance, mean of squares) behind each output."""
    return case.shape[-1]


# ---- declared ops and kernels (registered by numcheck.catalog) -------------------------

OPS = (
    OpSpec(
        "rms_norm", _rms_inputs, rms_norm_reference, rms_norm_baseline,
        make_grid("rms_norm", {**_FACTORS, "weight": ["same", "fp32"]}, extra_full=_FULL,
                  keep=_keep, probes=_RMS_SIZES, full_probes=_RMS_FULL_SIZES),
        Policy(), grad_args=("x", "weight"), blocks=_rows, out_dtypes=_out_dtypes,
        sum_len=_row_len,
        doc="rms_norm(x, weight, eps): x / sqrt(mean(x^2) + eps) * weight over the last dim"),
    OpSpec(
        "layer_norm", _ln_inputs, layer_norm_reference, layer_norm_baseline,
        make_grid("layer_norm", {**_FACTORS, "weight": ["same", "fp32"]}, extra_full=_FULL,
                  keep=_keep, probes=_RMS_SIZES, full_probes=_RMS_FULL_SIZES),
        _LN_POLICY, grad_args=("x", "weight", "bias"), blocks=_rows, scale=_ln_scale,
        reduction_len=_row_len, sum_len=_row_len,
        skip_grads=_zero_ref_grads,
        out_dtypes=_out_dtypes,
        doc="layer_norm(x, weight, bias, eps) over the last dim, biased variance"),
    OpSpec(
        "adaln_modulate", _adaln_inputs, adaln_reference, adaln_baseline,
        make_grid("adaln_modulate", {**_FACTORS, "shape": [(2, 16, 128), (3, 7, 129), (1, 5, 1025)]},
                  extra_full=_FULL, keep=_keep, probes=_ADALN_SIZES,
                  full_probes=_ADALN_FULL_SIZES),
        _LN_POLICY, grad_args=("x", "shift", "scale"), blocks=_rows, scale=_adaln_scale,
        reduction_len=_row_len, sum_len=_row_len,
        skip_grads=_zero_ref_grads,
        doc="adaln_modulate(x, shift, scale, eps) = layernorm(x) * (1 + scale) + shift; "
            "shift/scale (B, 1, D)"),
)
def _triton_rms_norm(x, weight, eps):
    return _triton_interp.kernels_module(x.device).rms_norm(x, weight, eps)


def _triton_rms_norm_backward(grad_out, x, weight, eps):
    return _triton_interp.kernels_module(x.device).rms_norm_backward(grad_out, x, weight, eps)


KERNELS = (
    Kernel("rms_norm", "torch", _eager_rms_norm,
        known_failure=_cuda_rms_subnormal_grad),
    # numcheck.kernels.triton_builtin: interpreted on the CPU (docs/triton.md), compiled on CUDA
    Kernel("rms_norm", "triton", _triton_rms_norm, backward=_triton_rms_norm_backward,
           supports=_triton_interp.supports),
    Kernel("layer_norm", "torch", _eager_layer_norm, supports=_cuda_ln_mixed_dtypes,
        known_failure=_torch_ln_backward_cancels, reaches=("aten::native_layer_norm_backward",)),
    Kernel("adaln_modulate", "torch", _eager_adaln,
        known_failure=_torch_ln_backward_cancels, reaches=("aten::native_layer_norm_backward",)),
    # weight: only the same-dtype weight (fp32 weights beside bf16 x would double the graphs).
    compiled_kernel("rms_norm", _eager_rms_norm, weight=("same",)),
    compiled_kernel("adaln_modulate", _eager_adaln, known_failure=_adaln_strided_rows),
)
