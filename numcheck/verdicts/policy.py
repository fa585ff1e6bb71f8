"""Verdicts: DESIGN rules 3-6 applied to a kernel's ErrorStats and its baseline's.

Every rule stands on its own (a bug present when goldens are refreshed is still caught):

* non-finite (rule 3): no NaN/inf the rounded reference does not have, and none missing;
* baseline (rule 4): kernel rel_l2 <= k * baseline rel_l2 + floor, the same for the worst block,
  and for the r-th worst block against the baseline's r-th worst over the worse half
  (numcheck.measure.paired: a baseline's own bad block must not hide the kernel's others);
* ULP (rule 5): max ULP in the output format, only for well-conditioned ops;
* componentwise bound (rule 5): max |out - ref| / (u * scale) <= c, where cancellation is
  inherent (scale = |A||B| for GEMM, |x cos| + |y sin| for RoPE, ...);
* truncation (rule 6): the mean ULP toward larger magnitude stays near 0 (truncation gives -0.5).
* condition-aware bound (rule 5, ``numcheck.verdicts.conditioning``): the error a backward-stable kernel
  may make, measured by perturbing the case's inputs by the compute precision. A kernel within
  it is not failed by the baseline or componentwise rules (a stable formulation other than the
  baseline's); those rules' excess is then a note, reported separately. It never excuses a
  non-finite mismatch, a ULP or truncation gate.

Thresholds come with their source; ``Policy`` holds them per op. ``OP_RULES`` is the ops
family's side of the one verdict path (``numcheck.verdicts.judge``): these rules applied to a record.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Callable

from numcheck.measure.errorstats import ErrorStats
from numcheck.records import Record
from numcheck.verdicts.family import Family

# FlashAttention's own tests: error vs the fp32 reference <= 2x that of the same-precision
# PyTorch composition (tests/test_flash_attn.py, "out - out_ref ... <= 2 * (out_pt - out_ref)").
BASELINE_K = 2.0
# Rounding one exact value to the output format costs rel_l2 ~ u/sqrt(3); 2u allows one more
# rounding step than the baseline without letting a lost bit (4u and up) through.
FLOOR_U = 2.0
# Truncation toward zero gives a mean of -0.5 ULP toward smaller magnitude, RNE gives ~0.
TRUNCATION_ULP = 0.25
# Condition-aware bound, C = COND_C + OpSpec.sum_len: a backward-stable kernel's error is that of
# inputs perturbed by a few u_c (Higham, "Accuracy and Stability", ch. 3: elementwise ops and
# products 1-3 roundings per result; sums of n terms gamma_n = n u, the sum_len term).
# 4: up to four roundings per element beyond the perturbation itself.
COND_C = 4.0


@dataclass(frozen=True)
class Policy:
    baseline_k: float = BASELINE_K
    floor_u: float = FLOOR_U
    max_ulp: int | None = None  # ULP gate (well-conditioned ops only)
    bound_c: float | None = None  # componentwise bound in units of the output's unit roundoff
    # ... plus this many units per element of the op's reduction (Higham's gamma_n: a recursive
    # sum of n terms errs by up to n u; pairwise or blocked kernels stay far below).
    bound_per_len: float = 0.0
    # |mag_bias_ulp| gate on every forward output (an op that knows its result is one rounding,
    # e.g. a fused quantizer); None: the automatic gate below
    truncation_ulp: float | None = None
    # the truncation gate at TRUNCATION_ULP wherever an output is rounded once (rounded_once);
    # False for lossy results that are no rounding of an exact value (quantizers)
    auto_truncation: bool = True
    # Fused backward kernels recompute from saved statistics (mean, rstd) instead of the
    # forward's intermediates; on ill-conditioned rows (large_mean, mean/std = 512) torch's CPU
    # layer_norm backward measured 4.1x the naive autograd's error while within 0.3 u * cond.
    grad_baseline_k: float = 2 * BASELINE_K
    grad_floor_u: float = 4.0  # backward chains two or three roundings more than forward
    # The condition-aware bound's constant (None: the op has no such bound, e.g. an exact op
    # gated by ULP 0); the reduction length is added to it.
    cond_c: float | None = COND_C
    notes: str = ""


@dataclass(frozen=True)
class RecordPolicy(Policy):
    """An op's Policy for one record, with the record's condition-aware bound on demand:
    ``cond_bound()`` measures it (numcheck.run: DRAWS more FP64 references, numcheck.verdicts.
    conditioning), and ``judge`` asks for it only where the record fails without it. The
    record is judged once."""

    cond_bound: Callable[[], float | None] | None = field(default=None, compare=False,
                                                          repr=False)
    # (k, floor) -> numcheck.measure.paired.WorstRank: the baseline rule rank by rank
    block_ranks: Callable | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, policy: Policy, cond_bound: Callable[[], float | None],
           block_ranks: Callable | None = None) -> RecordPolicy:
        return cls(**{f.name: getattr(policy, f.name) for f in fields(Policy)},
                   cond_bound=cond_bound, block_ranks=block_ranks)


@dataclass
class Verdict:
    passed: bool = True
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # rules excused by the condition bound
    cond_ratio: float | None = None  # the condition-aware bound's ratio the rules used
    block_ratio: float | None = None  # the baseline rule rank by rank (None: not measured)

    def fail(self, message: str) -> None:
        self.passed = False
        self.failures.append(message)


def _rank_rule(v: Verdict, relative: Callable[[str], None], block_ranks, what: str, kk: float,
               floor: float) -> None:
    """The baseline rule at each rank of the worse half of the sorted block errors: the
    kernel's r-th worst block against the baseline's r-th worst (numcheck.measure.paired)."""
    if callable(block_ranks):
        w = block_ranks(kk, floor)
        v.block_ratio = w.ratio
        if not w.ratio <= 1.0:
            relative(f"{what}: worst block no. {w.rank} (#{w.block}) rel {w.kernel_rel:.3e} > "
                     f"{kk:g} x the baseline's no. {w.rank} {w.baseline_rel:.3e} + {floor:.1e}")
        return
    v.block_ratio = block_ranks
    if not block_ranks <= 1.0:
        relative(f"{what}: a block error is {block_ranks:.3g} x what the baseline rule allows "
                 f"at its rank ({kk:g} x the baseline's of that rank + {floor:.1e})")


def _block_rel(s: ErrorStats) -> float:
    """The worst block's relative error, from its SQNR (inf SQNR -> 0)."""
    return 10.0 ** (-s.min_block_sqnr_db / 20.0) if s.min_block_sqnr_db != math.inf else 0.0


def judge(policy: Policy, k: ErrorStats, b: ErrorStats | None, *, what: str = "out",
          compute: str | None = None, bound_ratio: float | None = None,
          baseline_bound_ratio: float | None = None, reduction_len: float = 0,
          cond: float = 1.0, grad: bool = False,
          cond_ratio: float | None | Callable[[], float | None] = None,
          gate_bias: bool | None = None, block_ranks: float | Callable | None = None,
          verdict: Verdict | None = None) -> Verdict:
    """Apply the policy to kernel stats ``k`` (and baseline stats ``b``); messages name ``what``.

    compute: the case's compute format; the floor allows one rounding in the coarser of it and
    the output's format (an fp32 gradient of fp16 work carries fp16 roundings).
    cond: ||scale|| / ||ref|| for ops with a componentwise scale (>= 1): the floor is one
    rounding of the scale, not of the result, where cancellation makes the result small (a
    7-element large-mean row: cond 512; two correct kernels then differ by 2.5x at random).
    cond_ratio: the kernel's error over its condition-aware bound (numcheck.verdicts.conditioning),
    None where not measured: <= 1 turns the baseline and componentwise rules into notes. A
    callable measures it (an FP64 reference per draw): asked once, after the other rules, and
    only where one of them fails, the policy has a bound (cond_c) and no element is non-finite
    against the reference (which the bound never excuses); the value used is the verdict's
    ``cond_ratio`` (None where not asked).
    gate_bias: whether the truncation rule binds (``rounded_once``); None: the policy says.
    block_ranks: the baseline rule rank by rank over the worse half of the blocks, for records whose
    worst blocks pass it: a callable ``(k, floor) -> numcheck.measure.paired.WorstRank`` (asked
    only where the kernel's worst block exceeds the floor), or the ratio it gave (a record
    judged again); None: not applied (the baseline's worst block may then hide the kernel's
    errors elsewhere).
    """
    # formats and conditioning import torch: imported here, so that OP_RULES loads without it
    # (numcheck.verdicts.judge hands it to the readers of goldens, numcheck compare and report)
    from numcheck import formats
    from numcheck.verdicts.conditioning import compute_unit

    v = verdict or Verdict()
    # (message, whether a stable formulation may exceed the rule), in the rules' order: the
    # condition-aware bound, when it is a callable, is measured once all of them have spoken
    found: list[tuple[str, bool]] = []

    def absolute(message: str) -> None:
        found.append((message, False))

    def relative(message: str) -> None:  # the rules a stable formulation may exceed
        found.append((message, True))

    u = max(formats.get(k.fmt).unit_roundoff,
            formats.get(compute).unit_roundoff if compute else 0.0)
    if k.nonfinite_mismatch:
        absolute(f"{what}: {k.nonfinite_mismatch} element(s) non-finite where the rounded "
                 f"reference is not, or the reverse (the output holds {k.n_nan} NaN and "
                 f"{k.n_inf} inf in all)")
    kk = policy.grad_baseline_k if grad else policy.baseline_k
    floor = (policy.grad_floor_u if grad else policy.floor_u) * u * max(1.0, cond)
    if b is not None and b.nonfinite_mismatch:  # its statistics cover the finite part only
        v.notes.append(f"{what}: the baseline is non-finite where the rounded reference is not "
                       f"({b.nonfinite_mismatch} element(s)): baseline rule not applied")
    elif b is not None:
        if not k.rel_l2 <= kk * b.rel_l2 + floor:  # `not <=` so that NaN fails
            relative(f"{what}: rel_l2 {k.rel_l2:.3e} > {kk:g} x baseline {b.rel_l2:.3e} + "
                     f"floor {floor:.1e} (SQNR {k.sqnr_db:.1f} dB vs baseline {b.sqnr_db:.1f} dB)")
        kb, bb = _block_rel(k), _block_rel(b)
        if not kb <= kk * bb + floor:
            relative(f"{what}: worst block (#{k.worst_block}) SQNR {k.min_block_sqnr_db:.1f} "
                     f"dB, baseline's worst {b.min_block_sqnr_db:.1f} dB: rel {kb:.3e} > "
                     f"{kk:g} x {bb:.3e} + {floor:.1e}")
        elif block_ranks is not None and kb > floor:
            _rank_rule(v, relative, block_ranks, what, kk, floor)
    if policy.max_ulp is not None and not grad and not k.max_ulp <= policy.max_ulp:
        absolute(f"{what}: max ULP {k.max_ulp} > {policy.max_ulp} ({k.fmt}; p99 {k.p99_ulp})")
    if gate_bias is None:
        gate_bias = rounded_once(policy, k, compute_unit(compute or k.fmt), grad)
    if gate_bias:
        limit = truncation_limit(policy, k, b)
        if not abs(k.mag_bias_ulp) <= limit:
            absolute(f"{what}: mean ULP toward larger magnitude {k.mag_bias_ulp:+.3f} "
                     f"(truncation gives -0.5; gate +-{limit:.3f}, baseline "
                     f"{b.mag_bias_ulp if b is not None else 0.0:+.3f})")
    if policy.bound_c is not None and bound_ratio is not None and not grad:
        # A kernel as good as the naive baseline passes (accumulation over long rows makes any
        # fixed c either loose for short rows or tight for long ones).
        c = policy.bound_c + policy.bound_per_len * reduction_len
        limit = max(c, policy.baseline_k * (baseline_bound_ratio or 0.0))
        if not bound_ratio <= limit:
            relative(f"{what}: componentwise error {bound_ratio:.2f} x u*scale > {limit:.2f} "
                     f"(c={c:g}, baseline {baseline_bound_ratio or 0:.2f})")
    if callable(cond_ratio):
        wanted = found and policy.cond_c is not None and not k.nonfinite_mismatch
        cond_ratio = cond_ratio() if wanted else None
    v.cond_ratio = cond_ratio
    stable = cond_ratio is not None and cond_ratio <= 1.0  # NaN is not stable
    for message, excusable in found:
        if not excusable:
            v.fail(message)
        elif stable:
            v.notes.append(f"{message}; within the condition-aware bound ({cond_ratio:.2f} "
                           f"of it)")
        elif cond_ratio is not None:
            v.fail(f"{message}; condition-aware bound exceeded too ({cond_ratio:.3g} x)")
        else:
            v.fail(message)
    return v


# Truncation gate's margins: a kernel as biased as the baseline passes (+0.1 ULP: what benign
# rewrites moved the bias by, docs/golden-slack-calibration.md), plus 3 standard errors of the
# mean of n ULP distances of +-1 or 0 (variance <= mean |ULP|), taken from the less noisy of
# kernel and baseline so that truncation's own spread does not widen its gate.
BIAS_MARGIN = 0.1
BIAS_Z = 3.0
# Where the gate binds (rounded_once): 3 standard errors of a mean of n values in {-1, 0, 1}
# (<= 1.5 / sqrt(n)) stay under the 0.25 gate's distance to truncation's 0.5 from n = 36; 64
# leaves a margin for the baseline term. A kernel within 2 ULPs everywhere: one rounding plus
# one (torch's fp16 log_softmax: p99 2 ULPs, max 1644 near log p = 0, mean -3.7: not a rounding).
TRUNCATION_MIN_N = 64
TRUNCATION_MAX_ULP = 2


def truncation_limit(policy: Policy, k: ErrorStats, b: ErrorStats | None) -> float:
    """The largest |mean ULP toward larger magnitude| the truncation gate lets through."""
    base = policy.truncation_ulp if policy.truncation_ulp is not None else TRUNCATION_ULP
    if b is None:
        return base + BIAS_Z * math.sqrt(max(k.mean_ulp, 0.0) / max(k.n_compared, 1))
    spread = min(k.mean_ulp, b.mean_ulp)
    return max(base, abs(b.mag_bias_ulp) + BIAS_MARGIN) + \
        BIAS_Z * math.sqrt(max(spread, 0.0) / max(k.n_compared, 1))


def rounded_once(policy: Policy, k: ErrorStats, compute_u: float, grad: bool) -> bool:
    """Does the truncation gate bind? (DESIGN rule 6) Where the output is rounded once to its
    format: a forward output coarser than the precision a stable kernel computes in (bf16 or
    fp16 results of fp32 work), every element of the kernel's within TRUNCATION_MAX_ULP ULPs
    (one rounding of an accurate value, perhaps one more; a kernel many ULPs off somewhere is
    judged by the error rules, and a few elements thousands of ULPs off, as where log-probs
    near 0 cancel, would swamp the mean), over at least TRUNCATION_MIN_N elements (a
    mean of fewer cannot tell truncation's -0.5 from RNE's noise at 3 standard errors). An op
    whose policy sets truncation_ulp is gated on every forward output; auto_truncation=False
    exempts lossy quantizers (their result is no rounding of an exact value)."""
    from numcheck import formats  # imports torch (see judge)

    if grad:
        return False
    if policy.truncation_ulp is not None:  # the op asks for it on every forward output
        return True
    if not policy.auto_truncation or not formats.get(k.fmt).unit_roundoff > compute_u:
        return False
    return k.max_ulp <= TRUNCATION_MAX_ULP and k.n_compared >= TRUNCATION_MIN_N


class OpRules(Family):
    """The ops family's rules (built-in and users' ops), for ``numcheck.verdicts.judge``."""

    name = family = "ops"

    def absolute(self, record: Record, policy: Policy | None = None) -> list[str]:
        if record.kernel_stats is None:
            return ["no statistics measured"]
        grad = record.output != "out"
        # the record's measured bound, else (a record judged as it is measured) the bound on
        # demand
        cond_ratio = record.cond_ratio
        block_ranks = _number(record.block_ratio)   # NaN: a results file without it
        if cond_ratio is None and isinstance(policy, RecordPolicy):
            cond_ratio = policy.cond_bound
        if block_ranks is None and isinstance(policy, RecordPolicy):
            block_ranks = policy.block_ranks
        v = judge(policy or Policy(), record.kernel_stats, record.baseline_stats,
                  what=record.output, compute=record.dtype,
                  bound_ratio=_number(record.bound_ratio),
                  baseline_bound_ratio=_number(record.baseline_bound_ratio),
                  reduction_len=record.reduction_len, cond=record.cond, grad=grad,
                  cond_ratio=cond_ratio, gate_bias=record.gate_bias, block_ranks=block_ranks)
        record.notes, record.cond_ratio = " | ".join(v.notes), v.cond_ratio
        record.block_ratio = v.block_ratio
        return v.failures

    golden = None  # the common statistics rules (numcheck.goldens.regression) are the ops' rules

    def section(self, records: list[Record], plot_path=None) -> str:
        return ""  # the report's worst-cases table covers every family with error statistics


def _number(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


OP_RULES = OpRules()
