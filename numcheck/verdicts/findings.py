"""Known weaknesses by id: what ``numcheck explain ID`` prints, from the installed package.

A built-in kernel's ``known_failure`` returns one of these ids for the cases its documented
weakness covers (status ``known``, an xfail), and ``numcheck.measure.environment`` names environment
failures the same way. The record's ``known`` field holds the id; the run's summary and each
reason cite it, so a wheel user reads the explanation without the repository's docs
(docs/findings.md has the measurements in full). A user's own kernel may return any text: it is
reported as given.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    text: str  # what happens, why, which side is right, and where it was measured


_ALL = (
    Finding(
        "torch-layer-norm-backward-large-mean",
        "torch layer_norm backward cancels on large-mean rows",
        "torch's layer_norm backward forms grad_x from sums of x itself (sum(dy*gamma*x), then "
        "subtracts mean*sum(dy*gamma)) instead of sums of x - mean, which cancels about "
        "log2(mean/std) bits when mean >> std. Measured (fp32, large_mean rows: mean 64, std "
        "1/8, D = 4096, torch 2.13.0 CPU): grad_x relative L2 5.1e-6 against the FP64 autograd "
        "reference, while the naive two-pass composition gives 2.4e-7 (21x; 9.8x through "
        "adaln_modulate); 4.2x at D = 7 on an H200 (torch 2.11). The forward and the "
        "weight/bias gradients are as accurate as the baseline. The reference (float64 "
        "autograd through the two-pass definition, gradcheck-ed) is right."),
    Finding(
        "torch-cpu-layer-norm-half-param-grads",
        "torch CPU layer_norm backward: bf16/fp16 weight and bias gradients summed in bf16/fp16",
        "With bf16 (or fp16) input, torch's CPU layer_norm backward sums the weight and bias "
        "gradients over rows in the input dtype. Measured (torch 2.13.0 CPU, 2 threads): "
        "grad_bias (= sum of dy) of 32769 x 64 bf16 rows relative L2 0.146, where one "
        "sequential bf16 accumulator gives 0.218, two (one per thread) about 0.15, and an fp32 "
        "sum rounded once 1.3e-3; grad_weight of 8x16x31 outlier-channel rows with fp32 weight "
        "1.0e-2 (a row sum cancelling 33x) against 1.8e-8 with fp32 intermediates. Seen by the "
        "careful baseline (DESIGN rule 4) and the 32769-row size class (rule 14), which the "
        "naive bf16 baseline and the small grids had hidden: mixed-precision training reads "
        "these gradients at 1-15% accuracy."),
    Finding(
        "torch-cpu-flash-backward-scale",
        "CPU flash SDPA backward: logits recomputed with another scale rounding",
        "torch's CPU flash attention backward recomputes P = exp(s - lse) with logits s that do "
        "not match, bit for bit, those the forward's logsumexp came from: the backward folds "
        "the softmax scale into its GEMM, the forward scales the GEMM's rounded result. Unless "
        "the scale is a power of two (1/sqrt(D) for D = 64 is; 80, 128 are not) they differ by "
        "an fp32 ulp, and at logits ~100 grad_v and grad_q carry 8-9x the naive fp32 "
        "composition's error (AMD EPYC, torch 2.13.0+cpu; 1.3x on an Intel Xeon with AMX, "
        "where the case passes). With scale 1/8 the ratio falls to ~1.3x. Only fp32; "
        "bf16/fp16 hide it under their own rounding."),
    Finding(
        "torch-cpu-flash-backward-rounded-output",
        "CPU flash SDPA backward uses the output rounded to bf16/fp16",
        "The flash backward takes D_i = rowsum(dO_i * O_i) from the output O rounded to the "
        "input dtype (FlashAttention-2's backward), so dS = P (dP - D) carries that rounding. "
        "On a causal row whose gradient cancels (query 1 sees two keys) grad_q's relative "
        "error is 0.277 against the naive composition's 0.057; float64 emulation with only O "
        "rounded to bf16 gives 0.285: the algorithm's, not a kernel bug."),
    Finding(
        "torch-sdpa-math-prescaled-logits",
        "SDPA math backend pre-scales q and k by sqrt(scale)",
        "torch's math backend scales q and k by sqrt(scale) before Q K^T (float64 emulation "
        "matches it bit for bit): two more fp32 roundings of logits of size ~100. On fp32 "
        "large_logits cases its error sits at the 2x baseline rule's edge (2.5x the naive "
        "error on one full-grid seed, 0.6x on another): the rule's resolution, not a defect."),
    Finding(
        "torch-cpu-gelu-vectorized-erf",
        "torch CPU fp32 gelu: vectorized erf less accurate than torch.erf",
        "torch's CPU fp32 gelu (exact form) evaluates erf with a vectorized polynomial that "
        "errs by ~5 u absolute where torch.erf errs by ~1 u: 2-7x the naive composition's "
        "error under AVX512 (1.4-5.5x under AVX2/default), within the componentwise bound; "
        "matrices whose energy sits at x < -1 (sparse inputs) fail the baseline rule's k = 2."),
    Finding(
        "torch-cpu-half-log-softmax-rounded-sum",
        "torch CPU bf16/fp16 log_softmax rounds sum(exp) to the input dtype",
        "torch's CPU log_softmax for bf16/fp16 rounds sum(exp(x - m)) to the input dtype before "
        "the log, so log-probabilities above -u (2^-9 in bf16) come out 0: a confident row's "
        "loss and its target gradient p_t - 1 vanish (seen where targets are the argmax; "
        "cross_entropy fp16 grad_logits in the full grid)."),
    Finding(
        "torch-cuda-rms-norm-subnormal-grad",
        "torch CUDA rms_norm backward: subnormal intermediate in grad_weight",
        "On subnormal fp32 inputs torch's CUDA rms_norm backward forms grad_weight through a "
        "subnormal intermediate: 3e-6 relative error against the baseline's 6e-8 (H200, torch "
        "2.11)."),
    Finding(
        "inductor-strided-row-reduction",
        "inductor reduces column-major rows with one sequential sum",
        "On a transposed (column-major) x, inductor reduces each row with one sequential fp32 "
        "accumulator (12-14 u in rstd on a 128-wide row; contiguous rows get lane-wise sums, "
        "<= 1.7 u). A benign summation order, but 7x the norms baseline's cascaded torch.mean "
        "on one zero_blocks row, so the baseline rule flags it on compiled adaln_modulate."),
    Finding(
        "tf32-is-not-fp32",
        "TF32 is not fp32 (expected to fail the fp32 policy)",
        "TF32 rounds operands to 10 mantissa bits, ~2^13 x fp32's error; judged by the fp32 "
        "policy it must fail, which shows that numcheck tells TF32 from fp32 (H200: 70-91 dB "
        "SQNR against the fp32 baseline's 123-136 dB)."),
    Finding(
        "te-nvfp4-tiny-amax-decode",
        "NVFP4 decoded with amax / 2688 after the encode scale clamped (Transformer Engine)",
        "Below a tensor amax of 2688 / fp32 max (~2^-116.6) the fp32 encode scale 2688 / amax "
        "overflows and is clamped to the fp32 max; Transformer Engine (and numcheck's torch "
        "nvfp4_qdq kernel, which follows its arithmetic) still decodes with amax / 2688 "
        "(dequantize_nvfp4.cuh; the GEMM's alpha), so the result is amax * fp32 max / 2688 "
        "times too small. Measured on N(0,1) 16 x 1024 tensors (torch 2.13.0 CPU): SQNR 20.4 "
        "dB down to 2^-116, 12.0 at 2^-117, 4.1 at 2^-118, 0.9 at 2^-120, 0 on subnormal "
        "inputs; the reference decodes with 1 / S_enc there (the inverse of the encode used, "
        "NVFP4's S_dec = 1 / S_enc) and keeps 20.4 dB to 2^-130. Real activations and weights "
        "are never that small."),
    Finding(
        "inductor-cache-across-cpu-capability",
        "inductor's cache ignores ATEN_CPU_CAPABILITY",
        "Inductor generates C++ for the ISA that ATEN_CPU_CAPABILITY selects, but its FX-graph "
        "cache key does not include it, so a graph cached under one capability is served "
        "under another from the same TORCHINDUCTOR_CACHE_DIR: 'at::vec has not been declared' "
        "compile errors, or silently wrong outputs (torch 2.13.0). numcheck gives each "
        "capability its own cache folder (numcheck.kernels.compiled.isolate_inductor_cache); give "
        "your own compiles one folder per capability too."),
    Finding(
        "torch-cpu-flash-bf16-avx2-vnni",
        "CPU flash SDPA in bf16 fails under ATEN_CPU_CAPABILITY=avx2 on AMX machines",
        "torch's CPU flash SDPA in bf16 raises 'pack_vnni2 is only supported when avx512 is "
        "supported' under ATEN_CPU_CAPABILITY=avx2 on an Intel Xeon with AMX (torch 2.13.0): a "
        "torch build limitation, not a kernel error. Does not reproduce on AMD EPYC without "
        "AMX. Run it under avx512."),
    Finding(
        "triton-interp-libdevice",
        "a libdevice function Triton's CPU interpreter cannot run",
        "Triton's interpreter (TRITON_INTERPRET=1, triton 3.9.0) leaves the functions of "
        "triton.language.extra.libdevice returning None. numcheck's interpreter support "
        "(numcheck.kernels.triton_interp) implements the common float ones (rsqrt, sqrt, exp, "
        "log, tanh, erf, pow, fma, rounding, trigonometry, ...: numpy's float64 value rounded "
        "once to the argument's format) and names every other one instead of returning None. "
        "A case that needs one is the environment's limit, not the kernel's failure: run the "
        "kernel compiled on a GPU (bench/gpu_run.sh)."),
    Finding(
        "triton-interp-device-code",
        "inline PTX or an extern call inside a Triton kernel on the CPU interpreter",
        "tl.inline_asm_elementwise and extern_elementwise calls are device code; Triton's "
        "interpreter raises 'not supported in interpreter mode' (triton 3.9.0). Nothing on "
        "the CPU can run them: the kernel is verified compiled on a GPU."),
    Finding(
        "triton-no-driver",
        "a Triton launcher asked for a GPU driver where there is none",
        "Triton raised '0 active drivers': the kernel's launcher (or an autotuner) queried the "
        "device (triton.runtime.driver.active: properties, a benchmarker) on a machine without "
        "a GPU, or without TRITON_INTERPRET=1. numcheck's interpreter support picks an "
        "autotuned kernel's first config instead of benchmarking; a launcher's own device "
        "queries need a GPU. Set TRITON_INTERPRET=1 before triton is imported, or run on CUDA."),
)
FINDINGS: dict[str, Finding] = {f.id: f for f in _ALL}


def cite(known: str) -> str:
    """How a record's ``known`` reads in a reason or a summary: an id with its title and the
    command that explains it; a user kernel's own text as given."""
    f = FINDINGS.get(known)
    return f"{f.id}: {f.title} (numcheck explain {f.id})" if f else known


def explain(finding_id: str | None = None) -> str:
    """The text ``numcheck explain`` prints: one finding in full, or the list of ids."""
    if finding_id is None:
        width = max(len(i) for i in FINDINGS)
        return "\n".join(f"{f.id:<{width}}  {f.title}" for f in _ALL)
    f = FINDINGS[finding_id]
    return f"{f.id}\n{f.title}\n\n{textwrap.fill(f.text, 92)}"
