"""Activations: gelu(x, approximate="none"|"tanh"), silu(x), swiglu(a, b) = silu(a) * b.

Shapes: any; the grid uses ``(rows..., D)`` with ragged last dims (vectorized kernels have
remainder loops). ``approximate`` is a case param of gelu, passed as a keyword.

References (float64, from primitives, written so that no step cancels; checked against mpmath):

* gelu "none": x * Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2. The textbook
  0.5 x (1 + erf(x / sqrt 2)) cancels for x < 0 even in float64: 1 + erf(-7.07) is 0 there while gelu(-10) = -7.6e-23 is a
  normal fp32/bf16 number.
* gelu "tanh": 0.5 x (1 + tanh(y)), y = sqrt(2/pi) (x + 0.044715 x^3), written as the identical
  x sigmoid(2y) (0.5 (1 + tanh y) = sigmoid(2y) exactly), which does not cancel either.
* silu: x sigmoid(x); swiglu: silu(a) * b. sigmoid from exp(-|z|), which never overflows, so
  values and autograd gradients stay finite for every finite input (near_overflow included).

Baselines: the textbook formulas with plain torch primitives in the compute dtype (each step
rounded): 0.5 x (1 + erf(x/sqrt 2)), 0.5 x (1 + tanh(...)), x * sigmoid(x), x * sigmoid(x) * b.

Policy (DESIGN rule 5): ULP gates only where an elementwise op is away from its zeros. silu and
gelu have an asymptotic zero at x -> -inf, and torch's kernels leave the ULP scale there
(tests/test_ops_activations.py pins these numbers as findings), so both are judged by
componentwise bounds plus the baseline rule:

* torch's CPU gelu computes 0.5 x (1 + erf(x/sqrt 2)) in fp32 for every dtype: the fp32 result is
  within 5 ULP for x > -1, but 1 875 ULP off at x = -3, 2.3e6 ULP at x = -5, and from x = -5.5
  on 1 + erf is 0 or one fp32 step (0 at x = -5.505, true -1.0e-7; bf16: 32 ULP at x = -5). Its
  absolute error stays <= 6.3 u |x|: Phi is evaluated with an absolute, not a relative, error.
  Every framework uses that formula, so gelu's bound is |err| <= c u |x| (scale = |x|), c = 8;
  the tanh form cancels the same way (1 + tanh(y), y < 0). Its vectorized erf is also 2-7x less
  accurate than torch.erf (a known weakness of the fp32 torch kernel, see its known_failure).
* torch's silu is x / (1 + exp(-x)): <= 2 ULP (fp32) and correctly rounded (bf16, fp16, computed
  in fp32) everywhere except x < -88.72, where exp(-x) overflows fp32 and the result is -0 while
  the true value (down to x = -103.9) is a normal fp32/bf16 number below 2^-121: 4.4e7 ULP. The
  bound for silu/swiglu is relative, scale = |x| (sigmoid(x) + 2^-16) (times |b|), c = 4, with
  that overflow band left out (scale = inf for x < -88.72).

Both bounds carry an absolute floor ``_FLOOR`` (see there) for fp16's subnormal range; without an
output-format-aware underflow term in the framework's bound that floor is format-blind, so outputs
below ~2^-15 are judged absolutely, to 2^-21 in bf16 and 2^-37 in fp32. Without it, the relative
bounds fail correctly rounded fp16 subnormals.

Not judged (skip_grads, with the reasons there): gelu-tanh's gradient at |x| > 1.8e19 (torch's
backward is NaN: x^2 overflows) and swiglu's grad_a where g * b overflows before silu'(a)
scales it back (near_overflow; fp16 wide_range, which saturates at 65504).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from numcheck import formats
from numcheck.cases import inputs, skips
from numcheck.cases.grid import Case, make_grid
from numcheck.kernels.compiled import compiled_kernel
from numcheck.verdicts.policy import Policy
from numcheck.registry import Kernel, OpSpec

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_TANH_K = math.sqrt(2.0 / math.pi)  # the tanh approximation's constants (Hendrycks & Gimpel)
_TANH_C = 0.044715
APPROXIMATE = ("none", "tanh")

# exp(-x) overflows fp32 (and bf16, same exponent range) for x < -log(fp32 max) = -88.7228:
# kernels computing x / (1 + exp(-x)) in fp32 return -0 there (torch's CPU silu does), where
# |silu(x)| < 89 e^-88.72 < 2^-121. Those elements are not judged by the bound (scale = inf).
SILU_OVERFLOW_X = -math.log(formats.get("fp32").max)
# fp16's subnormal spacing is 2^-24: a correctly rounded fp16 result below 2^-14 errs by up to
# 2^-25 = 2 u_fp16 2^-15, so a floor of 2^-15 in the scale costs a correct kernel a ratio <= 2.
_FLOOR = 2.0 ** -15
# The same floor as a fraction of |x| for silu: below sigmoid(x) = 2^-16 (x < -11.1) fp16 outputs
# are subnormal (x < -12.2) and the judgment turns absolute, c u 2^-16 |x|.
_SIG_FLOOR = 2.0 ** -16


def _dt(case: Case) -> torch.dtype:
    return formats.get(case.dtype).torch


def _draw(case: Case, name: str) -> torch.Tensor:
    return inputs.draw(case.dist, case.shape, seed=case.seed, fmt=case.dtype,
                       stream=f"{case.id}/{name}")


# ---- gelu -----------------------------------------------------------------------------------

def _gelu_inputs(case: Case):
    return {"x": (_draw(case, "x"), _dt(case))}, {"approximate": case.param("approximate",
                                                                           "none")}


def _sigmoid64(z: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-z)) from exp(-|z|), which never overflows: finite values and finite autograd
    gradients for every finite z (a torch.where over an overflowing branch would give NaN grads)."""
    e = torch.exp(-z.abs())
    return torch.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def gelu_reference(x, approximate="none"):
    if approximate == "tanh":
        # x^3 overflows float64 only beyond 5.6e102, far above every format's max except fp64.
        return x * _sigmoid64(2.0 * _TANH_K * (x + _TANH_C * x * x * x))
    return x * (0.5 * torch.special.erfc(-x * _SQRT1_2))


# DESIGN rule 4: the activations' baselines compute in fp32 from the stored inputs and round
# once at the output, as torch's own half-precision activation kernels and fused kernels do.
def gelu_baseline(x, approximate="none"):
    xf = formats.widen(x)
    if approximate == "tanh":
        return (0.5 * xf * (1 + torch.tanh(_TANH_K * (xf + _TANH_C * xf * xf * xf)))).to(x.dtype)
    return (0.5 * xf * (1 + torch.erf(xf * _SQRT1_2))).to(x.dtype)


def _gelu_scale(x, approximate="none"):
    return x.abs() + _FLOOR


def _eager_gelu(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


# ---- silu / swiglu --------------------------------------------------------------------------

def _silu_inputs(case: Case):
    return {"x": (_draw(case, "x"), _dt(case))}, {}


def silu_reference(x):
    return x * _sigmoid64(x)


def silu_baseline(x):
    xf = formats.widen(x)
    return (xf * torch.sigmoid(xf)).to(x.dtype)


def _silu_mag(x: torch.Tensor) -> torch.Tensor:
    """|x| (sigmoid(x) + 2^-16), inf in the fp32 exp-overflow band (see the module doc)."""
    mag = x.abs() * (_sigmoid64(x) + _SIG_FLOOR)
    return torch.where(x < SILU_OVERFLOW_X, math.inf, mag)


def _silu_scale(x):
    return _silu_mag(x) + _FLOOR


def _swiglu_inputs(case: Case):
    return {"a": (_draw(case, "a"), _dt(case)), "b": (_draw(case, "b"), _dt(case))}, {}


def swiglu_reference(a, b):
    return a * _sigmoid64(a) * b


def swiglu_baseline(a, b):
    af = formats.widen(a)  # the fused form: silu(a) * b in fp32, one rounding
    return (af * torch.sigmoid(af) * b.to(af.dtype)).to(a.dtype)


def _swiglu_scale(a, b):
    # silu(a) is rounded (relative u, plus the floor) before the product in an unfused kernel;
    # inf * 0 (the overflow band times b = 0) would be NaN: such an element is exactly 0 anyway.
    return torch.nan_to_num((_silu_mag(a) + _FLOOR) * b.abs(), nan=0.0) + _FLOOR


def _eager_silu(x):
    return F.silu(x)


def _eager_swiglu(a, b):
    return F.silu(a) * b


# ---- registration ---------------------------------------------------------------------------

_SHAPES = [(4, 128), (3, 129), (2, 7, 33), (1, 1025)]
# wide_range reaches both silu's fp32 exp-overflow band and gelu's cancelling tail; student_t is
# the heavy-tailed activation; near_overflow checks that x * Phi(x) / x * sigmoid(x) keep huge x.
_DISTS = ["normal", "student_t", "wide_range", "outlier_channels", "near_overflow", "sparse"]
_FACTORS = {"dtype": ["fp32", "bf16", "fp16"], "shape": _SHAPES, "dist": _DISTS,
            "layout": ["contiguous", "transposed"]}
_FULL = {"shape": [(64, 4096), (5, 3, 31)], "dist": ["uniform", "lognormal", "subnormal",
                                                     "zero_blocks"],
         "layout": ["sliced"]}


# tanh form, |x| > 1.8e19 (near_overflow in fp32/bf16): x^2 overflows fp32, and the
# derivative (1 - tanh^2(y)) sqrt(2/pi) (1 + 3 c x^2) becomes 0 * inf = NaN in torch's
# backward, where the true derivative is 1 (x > 0) or 0 (x < 0). Pinned as a finding in the
# tests; the forward is still judged.
_gelu_skip_grads = skips.grads_where(
    lambda case: case.param("approximate") == "tanh" and case.dist == "near_overflow"
    and case.dtype != "fp16", "x")
# grad_a = g b silu'(a): an unfused backward forms g * b first, which overflows the format when
# |b| is within a few binades of its max (near_overflow; fp16's wide_range, which saturates
# 10% of its values at 65504) although silu'(a) (0 for a << 0) brings the exact result back
# in range: inf/NaN from torch's and the baseline's backward alike. Pinned as a finding;
# forward and grad_b are still judged.
_swiglu_skip_grads = skips.grads_where(
    lambda case: case.dist == "near_overflow" or (case.dist == "wide_range"
                                                   and case.dtype == "fp16"), "a")


def _blocks(case: Case, shape: torch.Size):
    """Elementwise: no rows to follow (DESIGN rule 6). Every element is judged by the bound; the
    baseline rule compares energies over whole (rows x D) matrices.

    Smaller blocks turn the block rule into an element-by-element lottery wherever kernel and
    baseline evaluate a cancelling formula differently: torch's gelu tail (1 + erf in fp32) vs
    the baseline's torch.erf, in a sparse row's one nonzero or the 1-element tail block of a
    1025-element tensor cut into 1024s (measured: 1e6x relative error in gelu's gradient at
    x = -8, where either side's is 6e-8 absolute).
    """
    return (shape[-2], shape[-1]) if len(shape) >= 2 else None


# silu/swiglu, c = 4 (relative, in units of u): torch's fp32 silu measured 2.37 on a dense sweep
# of [-12, 12] (2 ULP), bf16/fp16 <= 1 (rounded once from fp32); 4 admits one more rounding than
# torch, and a lost bit (8 u) fails.
_ACT_POLICY = Policy(bound_c=4.0, notes="componentwise, relative: x sigmoid(x) (b) + floor")
# gelu, c = 8 (absolute, in units of u |x|): torch's fp32 gelu measured 6.3 on a dense sweep of
# [-12, 12] (its vectorized erf errs by ~5 u absolute: 5 ULP at x = 2.9), the naive fp32
# baseline 1.5; bf16/fp16 <= 1.6.
_GELU_POLICY = Policy(bound_c=8.0, notes="componentwise, u |x|: 1 + erf cancels for x < 0")


def _torch_gelu_vectorized_erf(case: Case, device: str, output: str) -> str | None:
    """Finding (tests/test_ops_activations.py): torch's CPU fp32 gelu (exact form) evaluates erf
    with a vectorized polynomial that errs by ~5 u absolute, where the naive composition's
    torch.erf errs by ~1 u: its output error is 2x the baseline's over U(-6, 6), 7x over
    U(-3, -1), 5 ULP at x = 2.9 (within the componentwise bound, c = 8 in u |x|). Matrices whose
    energy sits at x < -1 (sparse inputs) fail the baseline rule's k = 2."""
    if (torch.device(device).type == "cpu" and case.dtype == "fp32" and output == "out"
            and case.param("approximate", "none") == "none"):
        return "torch-cpu-gelu-vectorized-erf"
    return None


# ---- declared ops and kernels (registered by numcheck.catalog) -------------------------

OPS = (
    OpSpec(
        "gelu", _gelu_inputs, gelu_reference, gelu_baseline,
        make_grid("gelu", {**_FACTORS, "approximate": list(APPROXIMATE)}, extra_full=_FULL),
        _GELU_POLICY, grad_args=("x",), blocks=_blocks, scale=_gelu_scale,
        skip_grads=_gelu_skip_grads,
        doc="gelu(x, approximate='none'|'tanh'): x Phi(x), or its tanh approximation"),
    OpSpec(
        "silu", _silu_inputs, silu_reference, silu_baseline,
        make_grid("silu", _FACTORS, extra_full=_FULL),
        _ACT_POLICY, grad_args=("x",), blocks=_blocks, scale=_silu_scale,
        doc="silu(x) = x sigmoid(x)"),
    OpSpec(
        "swiglu", _swiglu_inputs, swiglu_reference, swiglu_baseline,
        make_grid("swiglu", _FACTORS, extra_full=_FULL),
        _ACT_POLICY, grad_args=("a", "b"), blocks=_blocks, scale=_swiglu_scale,
        skip_grads=_swiglu_skip_grads,
        doc="swiglu(a, b) = silu(a) * b (gate a, up-projection b, same shape)"),
)
KERNELS = (
    Kernel("gelu", "torch", _eager_gelu, known_failure=_torch_gelu_vectorized_erf,
           reaches=("aten::gelu:fp32",)),
    Kernel("silu", "torch", _eager_silu),
    Kernel("swiglu", "torch", _eager_swiglu),
    compiled_kernel("swiglu", _eager_swiglu),
)
