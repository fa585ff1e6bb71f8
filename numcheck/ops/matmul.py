"""GEMM: matmul(a, b) and linear(x, weight, bias=None).

Shapes (Case.shape):

* matmul ``(M, K, N)``: a ``(M, K)``, b ``(K, N)``; or ``(B, M, K, N)``: a ``(B, M, K)``,
  b ``(B, K, N)`` (batched).
* linear ``(rows, K, N)``: x ``(rows, K)``; or ``(B, S, K, N)``: x ``(B, S, K)``; weight ``(N, K)``,
  bias ``(N,)`` when the case has param ``bias``. Param ``weight=fp32`` stores weight and bias in
  fp32 beside bf16/fp16 activations (a master-weight model run without a cast); the eager kernel
  then casts them to the activation dtype, as autocast does, and returns the activation dtype (a
  kernel that promotes to fp32 and returns fp32 is allowed too).

Inputs. Both operands follow the case's distribution, except that ``outlier_channels`` gives the
outliers to a / x only (activation channels along K, as LLM.int8() describes them) and a normal
weight: outliers in both operands would put 10^6-sized products into fp16 sums, where an
overflow at the boundary of fp16's range decides the verdict, not the kernel. ``positive`` is a
distribution of this file: |U(-1, 1)| = U(0, 1) for every operand, from ``inputs.draw("uniform")``.
On positive inputs |A||B| = |AB|, so the componentwise ratio is the relative error itself and it
separates fp32 from bf16/fp16 accumulation (DESIGN rule 5); the grid adds such cases at
K = 64, 1024 and 4096 (``_PROBES``).

Reference (DESIGN rule 1): C[i, j] = sum_k a[i, k] b[k, j] written out in float64 as a
broadcast product summed over K, chunked along K so that at most 2^22 products exist at once
(32 MiB); no GEMM is called. Its error, ~K 2^-53 |A||B|, is 2^29 / K below fp32's unit roundoff.
Gradients come from float64 autograd through that formula (tests/test_ops_matmul.py runs
gradcheck on it and cross-checks it against float64 ``@``).

Baseline (DESIGN rule 4): the textbook GEMM loop in fp32, acc += a[:, k] b[k, :] for k = 0..K-1
(K rank-1 updates of plain torch ops; on CPU the same arithmetic compiled, bit for bit; its
gradients are the same loop on the upstream gradient), rounded once to the compute dtype. That
is the naive form of what every real GEMM does: fp32 accumulation (bf16/fp16 products
are exact in fp32; fp32 products round), a recursive sum over K. No GEMM is called, so the
baseline is never the kernel under test (a bf16 kernel's oneDNN/cuBLAS path, or fp32's sgemm).
Why not torch.sum over a broadcast product: its cascade summation is ~10x more accurate than a
GEMM's per-output accumulation (fp32 N(0,1), K = 4096: 1.7 u vs torch's M = 1 linear 20 u, a plain
recursion), so "within 2x of the baseline" would fail sound fp32 kernels for their summation
order rather than for a lost bit.

Policy (DESIGN rule 5): componentwise |out - ref| <= c u_out (|A||B| + eta), |b| added for
linear, with scale = |a| |b| in float64 and eta the underflow term (_ETA). c = bound_c +
K u_acc / u_out: one rounding of the result (1 u of |C| <= |A||B|; linear allows three, see
_LIN_POLICY) plus a quarter-unit margin, and Higham's gamma_K = K u_acc of a recursive fp32
sum (u_acc = 2^-24). ``reduction_len`` returns K u_acc / u_out, K counted in output units: K for
fp32, K / 2^16 for bf16, K / 2^13 for fp16. On positive inputs a GEMM that accumulates in bf16
errs by several u of |AB| already at K = 64 (measured 2.6-2.9 u with partial sums of 8 products
added in bf16/fp16, 7.8-8.1 u with one per product) while fp32 accumulation stays within one
rounding (measured max 0.999 u on torch's CPU kernels, K up to 4096). Plus the baseline rule
(rel_l2 and the worst output tile's SQNR within 2x the baseline's + 2 u). Blocks are output
tiles of up to 128 x 128 (``_tiles``). For fp32 compute the bound is gamma_K, loose by design;
a lost bit there (TF32, bf16 passes) is caught by the baseline rule, at the recursive fp32
baseline's level.

TF32 (``torch_tf32``, CUDA only): judged by the fp32 policy and expected to FAIL it. An fp32 GEMM
promises fp32 accuracy; TF32 rounds both operands to 10 fraction bits, up to 2 u_tf32 = 2^-10
relative per product, 2^14 fp32 units (emulated on N(0,1): rel_l2 ~3e-4 against the fp32
baseline's ~1e-7; the baseline rule's floor is 2 u = 1.2e-7). That verdict answers the
question a user of an fp32 op asks ("is this an fp32 GEMM?") and shows the suite notices TF32
switched on behind a kernel's back. Judging it as a "tf32" compute dtype instead (inputs stored
fp32, operands rounded to tf32 with round-to-nearest-away in the baseline, bound 2 u_tf32 +
(K + 1) u_fp32) is the right test of TF32 as TF32, but the framework cannot express it yet: a case
dtype needs a torch dtype (run._torch_dtype rejects "tf32"), the baseline does not see the case,
and the policy's bound has one unit. See the family's report for the change that would allow it.

CUDA note: the pinned numerics keep torch's default allow_bf16_reduced_precision_reduction=True,
which lets cuBLAS reduce split-K partials in bf16. The K = 4096 positive probes measure exactly
that; a failure there on a GPU would be a finding about that default, not a tolerance to widen.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from numcheck import formats
from numcheck.cases import inputs
from numcheck.cases.grid import Case, make_grid
from numcheck.verdicts.policy import Policy
from numcheck.registry import Kernel, OpSpec

# Products alive at once in the explicit formulas (reference, baseline, scale): 2^22 float64 =
# 32 MiB per chunk, small next to the CPU's caches' worth of work it amortizes.
_CHUNK_PRODUCTS = 1 << 22
# Output tile for block statistics (DESIGN rule 6): 128 x 128 is the common GEMM CTA tile.
_TILE = 128
# fp32 accumulation: the unit roundoff every real GEMM accumulates in (bf16/fp16 included).
_U_ACC = formats.get("fp32").unit_roundoff
# The componentwise bound's underflow term (Higham's eta): |err| <= c u (|A||B| + eta). A result
# in the subnormal range errs by up to half the smallest subnormal, which is u * min_normal for
# every IEEE format; fp16's min_normal 2^-14 is the largest among this op's outputs (sparse fp16
# inputs give single-product outputs below it). The framework's bound has no per-format absolute
# term, so scale carries fp16's for every dtype: <= 2^-23 absolute slack for bf16, 2^-38 for fp32.
_ETA = formats.get("fp16").min_normal
# PLATFORM.md: fp16 mm runs at ~1 GFLOP/s on these CPUs; 2^24 multiply-adds (~33 ms) is the most
# one fp16 case may cost, which still admits the 64 x 4096 x 64 accumulation probe.
_FP16_MAX_MACS = 1 << 24


# ---- shapes and inputs ------------------------------------------------------------------------

def _dt(case: Case) -> torch.dtype:
    return formats.get(case.dtype).torch


def _mnk(case: Case) -> tuple[tuple[int, ...], int, int, int]:
    """(leading dims, M, K, N) of a matmul case."""
    *lead, m, k, n = case.shape
    return tuple(lead), m, k, n


def _draw(case: Case, name: str, shape: tuple[int, ...], dist: str | None = None) -> torch.Tensor:
    dist = dist or case.dist
    if dist == "positive":
        # U(0, 1): |U(-1, 1)|. inputs.DISTRIBUTIONS has no positive-only law; GEMM needs one.
        return inputs.draw("uniform", shape, seed=case.seed, fmt=case.dtype,
                           stream=f"{case.id}/{name}").abs()
    return inputs.draw(dist, shape, seed=case.seed, fmt=case.dtype, stream=f"{case.id}/{name}")


def _operand_dist(case: Case) -> str:
    """The second operand's (b / weight / bias) distribution: activation outliers stay in a/x."""
    return "normal" if case.dist == "outlier_channels" else case.dist


def _matmul_inputs(case: Case):
    lead, m, k, n = _mnk(case)
    dt = _dt(case)
    return ({"a": (_draw(case, "a", (*lead, m, k)), dt),
             "b": (_draw(case, "b", (*lead, k, n), _operand_dist(case)), dt)}, {})


def _weight_dtype(case: Case) -> torch.dtype:
    return torch.float32 if case.param("weight") == "fp32" else _dt(case)


def _linear_inputs(case: Case):
    *xshape, n = case.shape
    k = xshape[-1]
    wd = _weight_dtype(case)
    tensors = {"x": (_draw(case, "x", tuple(xshape)), _dt(case)),
               "weight": (_draw(case, "weight", (n, k), _operand_dist(case)), wd)}
    kwargs = {}
    if case.param("bias"):
        tensors["bias"] = (_draw(case, "bias", (n,), _operand_dist(case)), wd)
    else:
        kwargs["bias"] = None
    return tensors, kwargs


# ---- the explicit GEMM (reference, baseline, scale) -----------------------------------------

def _explicit_gemm(a: torch.Tensor, b: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """sum_k a[..., i, k] b[..., k, j] as a broadcast product summed over K in ``acc``.

    K is cut into chunks of at most _CHUNK_PRODUCTS products; the chunk sums are added in order.
    Leading dims broadcast (a (B, M, K) with b (K, N) or (B, K, N)). No GEMM is called.
    """
    a, b = a.to(acc), b.to(acc)
    k = a.shape[-1]
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    per_k = max(1, math.prod(lead) * a.shape[-2] * b.shape[-1])
    kc = max(1, _CHUNK_PRODUCTS // per_k)
    out = None
    for k0 in range(0, k, kc):
        part = (a[..., :, k0:k0 + kc].unsqueeze(-1) * b[..., k0:k0 + kc, :].unsqueeze(-3)).sum(-2)
        out = part if out is None else out + part
    if out is None:  # K = 0: the empty sum
        out = torch.zeros((*lead, a.shape[-2], b.shape[-1]), dtype=acc, device=a.device)
    return out


def matmul_reference(a, b):
    """FP64 C = A B from the definition (explicit products and sums, no GEMM)."""
    return _explicit_gemm(a, b, torch.float64)


def naive_gemm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The textbook GEMM loop in fp32: acc = acc + a[..., :, k] b[..., k, :] for k = 0 .. K-1.

    A recursive sum over K (Higham's gamma_K is its bound), product and sum rounded separately,
    vectorized over the output. bf16/fp16 products are exact in fp32. Measured on N(0,1),
    K = 4096: rel_l2 19 u_fp32, where torch's blocked CPU sgemm gives 4.4 u and its M = 1 path
    20 u (the same recursion). CPU tensors run it compiled (numcheck.kernels.gemm_cpu: the same bits,
    no K passes over the output); elsewhere K rank-1 updates of torch ops. Gradients: the same
    loop on the upstream gradient (grad_a = naive_gemm32(g, b^T), grad_b = naive_gemm32(a^T, g)),
    i.e. the backward GEMMs' own naive baseline, summed in order on every ISA.
    """
    a, b = a.float(), b.float()
    if _compiled_gemm(a, b) is None:
        return _gemm_rank1(a, b)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _NaiveGemm32.apply(a, b)
    return _GEMM_CPU["module"].gemm(a, b)


def _gemm_rank1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """naive_gemm32 as K rank-1 updates of torch ops (any device; autograd differentiates it)."""
    acc = None
    for ak, bk in zip(a.unbind(-1), b.unbind(-2)):
        p = ak.unsqueeze(-1) * bk.unsqueeze(-2)
        acc = p if acc is None else acc + p
    if acc is None:  # K = 0
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        acc = torch.zeros((*lead, a.shape[-2], b.shape[-1]), device=a.device)
    return acc


_GEMM_CPU: dict = {}


def _compiled_gemm(a: torch.Tensor, b: torch.Tensor):
    """numcheck.kernels.gemm_cpu for plain CPU tensors where numba imports (else None: the torch loop;
    tensor subclasses keep it too, numpy may not reach their memory)."""
    if not (type(a) is torch.Tensor and type(b) is torch.Tensor
            and a.device.type == "cpu" and b.device.type == "cpu"):
        return None
    if "module" not in _GEMM_CPU:
        try:
            from numcheck.kernels import gemm_cpu as _gemm_cpu
        except ImportError:
            _gemm_cpu = None
        _GEMM_CPU["module"] = _gemm_cpu
    return _GEMM_CPU["module"]


class _NaiveGemm32(torch.autograd.Function):
    """naive_gemm32 of fp32 CPU tensors with its backward written as two naive_gemm32 calls."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _GEMM_CPU["module"].gemm(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = naive_gemm32(g, b.mT).sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:
            gb = naive_gemm32(a.mT, g).sum_to_size(b.shape)
        return ga, gb


def matmul_baseline(a, b):
    """Naive GEMM in the compute dtype: the fp32 loop over K, one rounding to a's dtype."""
    return naive_gemm32(a, b).to(a.dtype)


def matmul_scale(a, b):
    """|A||B| plus the underflow term _ETA (the bound's absolute part)."""
    return _explicit_gemm(a.abs(), b.abs(), torch.float64) + _ETA


def linear_reference(x, weight, bias=None):
    """FP64 x W^T + b from the definition."""
    out = _explicit_gemm(x, weight.mT, torch.float64)
    return out if bias is None else out + bias


def linear_baseline(x, weight, bias=None):
    """Naive linear in the compute dtype: weight and bias cast to x's dtype (what autocast does
    with fp32 master weights), the fp32 loop over K, the bias added in fp32, one rounding."""
    dt = x.dtype
    out = naive_gemm32(x, weight.to(dt).mT)
    if bias is not None:
        out = out + bias.to(dt).float()
    return out.to(dt)


def _linear_scale(x, weight, bias=None):
    """|x||W^T| + |b| plus the underflow term _ETA."""
    s = _explicit_gemm(x.abs(), weight.abs().mT, torch.float64) + _ETA
    return s if bias is None else s + bias.abs()


# ---- kernels ----------------------------------------------------------------------------------

def _eager_matmul(a, b):
    return torch.matmul(a, b)


def _eager_linear(x, weight, bias=None):
    # Mixed dtypes (bf16 x, fp32 weight): cast the parameters to the activation dtype, as autocast
    # does for linear; F.linear itself rejects mixed dtypes.
    dt = x.dtype
    return F.linear(x, weight.to(dt), None if bias is None else bias.to(dt))


@contextlib.contextmanager
def _tf32_matmul():
    """CUDA fp32 matmuls in TF32 inside the block; the caller's setting restored after.

    torch >= 2.9 has the per-backend knob ``fp32_precision`` and refuses to read the legacy
    ``allow_tf32`` once both APIs were used (numcheck.measure.numerics pins the new one), so the new
    knob is used wherever it exists.
    """
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):
        saved = m.fp32_precision
        m.fp32_precision = "tf32"
        try:
            yield
        finally:
            m.fp32_precision = saved
    else:  # pragma: no cover - torch < 2.9
        saved = m.allow_tf32
        m.allow_tf32 = True
        try:
            yield
        finally:
            m.allow_tf32 = saved


class _TF32(torch.autograd.Function):
    """Run ``fn(*tensors)`` with TF32 on, forward and backward.

    Autograd runs the backward after the kernel returned, when the pinned (IEEE fp32) state is
    back; a plain ``with`` around the forward would leave the gradient GEMMs in fp32 and the
    kernel would not be the TF32 kernel in backward. Backward recomputes the forward under TF32
    and differentiates it there (the grads of torch's own matmul/linear, broadcasting included).
    """

    @staticmethod
    def forward(ctx, fn, *tensors):
        ctx.fn = fn
        ctx.save_for_backward(*tensors)  # None (no bias) is kept as None
        with _tf32_matmul():
            return fn(*tensors)

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        want = [t is not None and ctx.needs_input_grad[i + 1] for i, t in enumerate(saved)]
        leaves = [t.detach().requires_grad_(w) if t is not None else None
                  for t, w in zip(saved, want)]
        with torch.enable_grad(), _tf32_matmul():
            out = ctx.fn(*leaves)
            wanted = [t for t, w in zip(leaves, want) if w]
            got = iter(torch.autograd.grad(out, wanted, grad) if wanted else ())
        return (None, *[next(got) if w else None for w in want])


def _tf32_matmul_kernel(a, b):
    """torch.matmul with TF32 on (CUDA). Judged by the fp32 policy and EXPECTED TO FAIL it: TF32
    rounds the operands to 10 fraction bits (up to 2^14 fp32 units of |A||B| per product), far
    outside the fp32 baseline rule (tests/test_ops_matmul.py shows the emulated form caught).
    The suite records this as an expected failure; it demonstrates that a TF32 GEMM is not an
    fp32 GEMM, and that the suite would notice TF32 leaking into one."""
    return _TF32.apply(torch.matmul, a, b)


def _tf32_linear_kernel(x, weight, bias=None):
    """F.linear with TF32 on (CUDA); EXPECTED TO FAIL the fp32 policy, as _tf32_matmul_kernel."""
    return _TF32.apply(F.linear, x, weight, bias)


# ---- registration -----------------------------------------------------------------------------

def _tiles(case: Case, shape: torch.Size):
    """Output tiles of up to 128 x 128 (gradients of a/b/x/weight too); 128-long runs for bias."""
    if len(shape) >= 2:
        return (min(shape[-2], _TILE), min(shape[-1], _TILE))
    return min(shape[-1], _TILE) if len(shape) == 1 and shape[-1] else None


def _acc_len(case: Case) -> float:
    """K in units of the output's unit roundoff: gamma_K of an fp32 accumulation, K u_acc, over
    u_out (Policy.bound_per_len multiplies it). K for fp32, K / 2^16 for bf16, K / 2^13 for fp16."""
    return case.shape[-2] * _U_ACC / formats.get(case.dtype).unit_roundoff


def _k_len(case: Case) -> int:
    """K: the terms of each output's inner product (its gradients sum M or N: not longer on
    the grids here, where K is the largest dimension or close to it)."""
    return case.shape[-2]


def _repair(row: dict) -> dict:
    """Make a pairwise row meaningful by changing the one value that makes it not (instead of
    dropping the row, which would lose every other pair it covers)."""
    row = dict(row)
    # fp16's 30 binades cannot hold wide_range's 2^+-20 inputs (they saturate or go subnormal)
    # nor their 2^+-40 products (outputs overflow to inf): such a case says nothing about a GEMM.
    # Too-large fp16 GEMMs are slow on the CPU (_FP16_MAX_MACS). Both run in bf16 instead.
    if row["dtype"] == "fp16" and (row["dist"] == "wide_range"
                                   or math.prod(row["shape"]) > _FP16_MAX_MACS):
        row["dtype"] = "bf16"
    # weight=fp32 beside fp32 activations is the same case as weight=same.
    if row.get("weight") == "fp32" and row["dtype"] == "fp32":
        row["weight"] = "same"
    return row


# wide_range first: in this order the pairwise rows that _repair moves from fp16 to bf16 lose no
# other pair for matmul and one (normal with fp32 weights) for linear.
_DISTS = ["wide_range", "normal", "outlier_channels", "positive", "student_t", "sparse"]
_FULL_DISTS = ["uniform", "lognormal", "zero_blocks"]

# Aligned, ragged (one past a tile in K, prime M/N), GEMV-like (M = 1, N = 1) and batched.
_MM_SHAPES = [(64, 64, 64), (127, 1025, 33), (1, 4096, 7), (33, 255, 1), (2, 33, 129, 17)]
# full adds a multi-tile output (2 x 2 tiles of 128, K = 2.5 tiles), a batched long-K case,
# K = 1 and ragged everything. Sizes stay near the largest quick case (2^24 multiply-adds):
# the baseline's K-step loop and the explicit FP64 reference with autograd cost ~0.3 s per 2^24
# on these CPUs, and full runs pairwise x 3 seeds.
_MM_FULL_SHAPES = [(256, 320, 256), (3, 128, 1024, 64), (5, 1, 3), (129, 127, 257)]
# Accumulation probes (DESIGN rule 5): positive inputs at K = 64, 1024, 4096 in every dtype.
_MM_PROBES = [{"dtype": dt, "shape": (64, k, 64), "dist": "positive", "layout": "contiguous"}
              for k in (64, 1024, 4096) for dt in ("bf16", "fp16", "fp32")]

_LIN_SHAPES = [(64, 64, 64), (129, 1025, 33), (1, 4096, 7), (2, 33, 129, 17)]
_LIN_FULL_SHAPES = [(256, 320, 256), (4, 128, 1024, 64), (5, 1, 3)]
_LIN_PROBES = [
    {"dtype": "bf16", "shape": (64, 1024, 64), "dist": "positive", "layout": "contiguous",
     "weight": "fp32", "bias": True},
    {"dtype": "fp16", "shape": (64, 4096, 64), "dist": "positive", "layout": "transposed",
     "weight": "same", "bias": True},
    {"dtype": "fp32", "shape": (64, 4096, 64), "dist": "positive", "layout": "transposed",
     "weight": "same", "bias": False},
]
# Size class (DESIGN rule 14; docs/grid-audit.md): dW = dY^T x and the bias gradient sum over
# the rows: 32769 tokens (> 32768, where split-M kernels add partial dW across programs; odd,
# so no power-of-two split is exact), K = N = 16 to keep the FP64 reference small.
_LIN_SIZES = [{"dtype": "bf16", "shape": (32769, 16, 16), "dist": "normal",
               "layout": "contiguous", "weight": "same", "bias": True}]

# A quarter unit above the roundings a correct kernel makes: one correct rounding reaches 1 u
# (measured max 0.999 u on the positive probes), while any further rounding in the output format
# (truncation, bf16 partial sums, a reduced-precision split-K reduction) approaches 2 u and over.
_MARGIN = 0.25
# matmul: one rounding of the fp32 accumulator to the output, 1 u of |C| <= |A||B| (+ gamma_K
# through reduction_len); bf16 accumulation measured 2.6 u and more at K = 64 and fails it.
_MM_POLICY = Policy(bound_c=1.0 + _MARGIN, bound_per_len=1.0,
                    notes="componentwise |A||B| bound; gamma_K of fp32 accumulation")
# linear: the product's rounding, the bias added after it (a second rounding, unfused epilogue),
# and fp32 weight/bias cast to the compute dtype (1 u of |x||W| + |b|, autocast's practice).
_LIN_POLICY = Policy(bound_c=3.0 + _MARGIN, bound_per_len=1.0,
                     notes="componentwise |x||W^T| + |b| bound; gamma_K of fp32 accumulation")


def _lin_out_dtypes(case: Case) -> tuple[torch.dtype, ...]:
    return (_dt(case), torch.float32) if case.param("weight") == "fp32" else (_dt(case),)


def _no_bias(case: Case) -> tuple[str, ...]:
    return () if case.param("bias") else ("bias",)


def _tf32_is_not_fp32(case: Case, device: str, output: str) -> str | None:
    """By design: TF32 rounds operands to 10 mantissa bits, ~2^13 x fp32's error; judged by the
    fp32 policy it must fail, which shows numcheck tells TF32 from fp32 (H200: 70-91 dB SQNR
    against the fp32 baseline's 123-136 dB, docs/device/)."""
    return "tf32-is-not-fp32"


# ---- declared ops and kernels (registered by numcheck.catalog) -------------------------

OPS = (
    OpSpec(
        "matmul", _matmul_inputs, matmul_reference, matmul_baseline,
        make_grid("matmul", {"dtype": ["fp32", "bf16", "fp16"], "shape": _MM_SHAPES, "dist": _DISTS,
                             "layout": ["contiguous", "transposed"]},
                  extra_full={"shape": _MM_FULL_SHAPES, "dist": _FULL_DISTS, "layout": ["sliced"]},
                  repair=_repair, probes=_MM_PROBES),
        _MM_POLICY, grad_args=("a", "b"), blocks=_tiles, scale=matmul_scale,
        reduction_len=_acc_len, sum_len=_k_len,
        doc="matmul(a, b): a (..., M, K) @ b (K, N) or (..., K, N); shape (M, K, N) or "
            "(B, M, K, N)"),
    OpSpec(
        "linear", _linear_inputs, linear_reference, linear_baseline,
        make_grid("linear", {"dtype": ["fp32", "bf16", "fp16"], "shape": _LIN_SHAPES, "dist": _DISTS,
                             "layout": ["contiguous", "transposed"], "weight": ["same", "fp32"],
                             "bias": [True, False]},
                  extra_full={"shape": _LIN_FULL_SHAPES, "dist": _FULL_DISTS, "layout": ["sliced"]},
                  repair=_repair, probes=_LIN_PROBES + _LIN_SIZES),
        _LIN_POLICY, grad_args=("x", "weight", "bias"), blocks=_tiles, scale=_linear_scale,
        reduction_len=_acc_len, sum_len=lambda case: _k_len(case) + 1, skip_grads=_no_bias, out_dtypes=_lin_out_dtypes,
        doc="linear(x, weight, bias=None) = x W^T + b; x (..., K), weight (N, K), bias (N,); "
            "shape (rows, K, N) or (B, S, K, N)"),
)
KERNELS = (
    Kernel("matmul", "torch", _eager_matmul),
    Kernel("linear", "torch", _eager_linear),
    Kernel("matmul", "torch_tf32", _tf32_matmul_kernel, dtypes=("fp32",),
        devices=("cuda",), known_failure=_tf32_is_not_fp32),
    Kernel("linear", "torch_tf32", _tf32_linear_kernel, dtypes=("fp32",),
        devices=("cuda",), known_failure=_tf32_is_not_fp32),
)
