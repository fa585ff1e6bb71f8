"""The condition-aware bound never degenerates (numcheck.verdicts.conditioning, DESIGN rule 12).

Where one logit dominates (log p = -6e-15), no input perturbation moves log p (D ~ 1e-20, and
log(1 + 6e-15) in float64 kept 2% of it), while every algorithm rounds the row's sum s = 1 +
6e-15 to 1: torch's fp32 log_softmax returns 0 there, once 5e14 x a bound without that term
(9e15 x on quick's fp32-3x129-large_logits-s0-contiguous-second_last). The bound now carries
the result's own roundings (c_0 u_c |ref|) and the op's rounded intermediates (log_softmax: s
and log s); the reference is log1p-style. Torch's kernels pass on every quick case where they
compute in the compute precision, and a kernel that loses digits still fails.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from numcheck import formats, run
from numcheck.catalog import get_op, kernels, ops
from numcheck.cases import inputs
from numcheck.registry import Kernel
from numcheck.verdicts import conditioning, policy
from numcheck.verdicts.policy import BASELINE_K
from numcheck.verification import verify


def _dominant(dtype: str = "fp32", n: int = 128, rows: int = 4) -> torch.Tensor:
    """Rows whose first logit (38.3: no bf16 value, so that a rounded LSE errs) leads the
    others (N(0, 1)) by 38: log p_max = -6e-15; float64 values of ``dtype``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, n, generator=g, dtype=torch.float64)
    x[:, 0] = 38.3
    return formats.round_to(x, dtype)


def _ratio(op: str, x: torch.Tensor, out: torch.Tensor, dtype: str) -> float:
    """The bound's ratio as numcheck.run._cond_ratio composes it, for a log_softmax over the
    last dim of ``x`` (float64 values of the case's dtype)."""
    spec = get_op(op)
    u = conditioning.compute_unit(dtype)
    d = conditioning.spread(lambda t: {"out": spec.reference(t["x"], -1)}, {"x": x}, u,
                            seed=inputs.seed_for("dominant"))["out"]
    d = d + u * spec.cond_scale(x, -1)
    c = spec.policy.cond_c + x.shape[-1]  # sum_len: the reduced length
    return max(conditioning.ratio(out, spec.reference(x, -1), d, dtype, c, x.shape[-1], u),
               conditioning.ratio(out, spec.reference(x, -1), d, dtype, c, x.shape[-1], u,
                                  elementwise=True))


def test_log_softmax_reference_keeps_its_digits_near_zero():
    x = _dominant()
    want = torch.tensor([-math.log1p(sum(math.exp(v - row[0]) for v in row[1:]))
                         for row in x.tolist()], dtype=torch.float64)
    got = get_op("log_softmax").reference(x, -1)[:, 0]
    assert float(want.max()) == pytest.approx(-6e-15, rel=0.5)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_torch_log_softmax_passes_where_one_logit_dominates(dtype):
    """torch.log_softmax returns 0 for log p = -6e-15 (s rounded to 1): within the bound now
    (before: D = 0 on those elements, ratio 1e14-1e16)."""
    x = _dominant(dtype)
    dt = torch.float32 if dtype == "fp32" else torch.bfloat16
    out = torch.log_softmax(x.to(dt), -1).to(torch.float64)
    assert bool((out[:, 0] == 0).all())  # the case is what it claims: the sum rounded to 1
    assert _ratio("log_softmax", x, out, dtype) <= 1.0


def test_a_rounded_log_sum_exp_still_exceeds_it():
    """x - LSE with LSE rounded to bf16 in an fp32 kernel: u_bf16 |LSE| on log-probabilities
    of any size, 100x the bound on the same rows."""
    x = _dominant()
    xf = x.to(torch.float32)
    lse = torch.logsumexp(xf, -1, keepdim=True).to(torch.bfloat16).float()
    assert _ratio("log_softmax", x, (xf - lse).to(torch.float64), "fp32") > 100


def _lse_rounded_to_bf16(x, dim=-1):
    xf = x.float()
    return (xf - torch.logsumexp(xf, dim, keepdim=True).to(torch.bfloat16).float()).to(x.dtype)


def test_a_rounded_log_sum_exp_fails_every_fp32_case():
    ids = [c.id for c in get_op("log_softmax").grid("quick") if c.dtype == "fp32"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = verify("log_softmax", Kernel("log_softmax", "lse_bf16", _lse_rounded_to_bf16,
                                         forward_only=True), device="cpu", case_ids=ids)
    assert {r.case_id for r in v.failures} == set(ids)
    assert all("condition-aware bound exceeded too" in r.reason for r in v.failures)


# --- torch's kernels, every quick case, the bound forced on every record ----------------------

def _forced(monkeypatch, op: str, kern: Kernel) -> list[tuple[str, str, float, float]]:
    """(case id, output, kernel's ratio, the op's careful baseline's ratio) for every record
    whose reference gives the output, the bound measured whether or not a rule asks for it
    (numcheck.run measures it only where a record fails without it)."""
    rows = []
    measure = run._cond_ratio

    def both(spec, case, o, p, fmt, blocks):
        k = measure(spec, case, o, p, fmt, blocks)
        if k is not None:
            b = measure(spec, case, dataclasses.replace(o, kernel=o.baseline), p, fmt, blocks)
            rows.append((case.id, o.name, k, b))
        return k

    make = policy.RecordPolicy.of.__func__

    def eager(cls, pol, bound, *rest):
        value = bound() if pol.cond_c is not None else None
        return make(cls, pol, lambda: value, *rest)

    monkeypatch.setattr(run, "_cond_ratio", both)
    monkeypatch.setattr(policy.RecordPolicy, "of", classmethod(eager))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verify(op, kern, device="cpu", cases="quick")
    return rows


# Gaps of the bound, measured (the careful baseline, DESIGN rule 4, exceeds it as much): the
# softmax and log_softmax backward reads the forward's output rounded to bf16/fp16 (the op's
# interface; up to 344 x) and, in fp32, sums g y where near-one-hot rows cancel (softmax fp32
# outlier_channels: 86 x). The bound perturbs inputs at u_c and adds cond_scale to the result
# only: these intermediates have no term yet. There torch's kernel stays within BASELINE_K x the
# baseline's ratio.
GAPS = {("softmax", "grad_x"), ("log_softmax", "grad_x")}
# Torch's half-precision kernels that round an intermediate to bf16/fp16 (not stable at u_c =
# fp32: the bound refuses them, the baseline rule judges them; the baseline passes each case):
# log_softmax and cross_entropy round s = sum exp(x - m) (docs/findings.md, bf16/fp16
# log_softmax rounds sum(exp); up to 502 x), cross_entropy its log-probabilities too (15 x);
# softmax over a non-last dim (second_last) errs by ~0.9 ULP of bf16 where one rounding gives
# 0.5 (16 x).
HALF_FINDINGS = {"log_softmax": "", "cross_entropy": "", "softmax": "-second_last"}


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "cross_entropy"])
def test_torch_softmax_family_within_the_bound(monkeypatch, op):
    rows = _forced(monkeypatch, op, kernels(op)["torch"])
    assert len(rows) > 30  # every record measured, forward and gradients
    for cid, out, k, b in rows:
        gap = (op, out) in GAPS
        half = not cid.startswith("fp32")
        assert b <= 1 or gap, (cid, out, "baseline", b)  # a gap only where one is listed
        if half and op in HALF_FINDINGS and cid.endswith(HALF_FINDINGS[op]) and \
                (out == "out" or op == "cross_entropy"):
            continue
        assert k <= 1 or (gap and k <= BASELINE_K * b), (cid, out, k, b)
    # what it covers in full: every fp32 forward record, every bf16/fp16 softmax over the last dim
    assert all(k <= 1 for cid, out, k, _ in rows if out == "out" and cid.startswith("fp32"))


# Ops whose torch kernel exceeds the bound today (forced, quick grid, after this change), each
# outside this file's scope: the causes measured with the careful baseline's own ratio.
OPEN = {
    "gelu": "a gap of the bound: the erf form's 1 + erf(x / sqrt 2) cancels for x << 0 (u_c |x| "
            "absolute); fp32 65900 x, the baseline 70500 x: no cond_scale term in the op yet",
    "silu": "a gap: exp(-x) overflows below -88.7, silu = -0 for -2e-37 (fp32 wide_range "
            "23600 x, the baseline alike)",
    "swiglu": "silu's gap (fp32 22300 x, the baseline alike); torch rounds silu(a) to bf16/fp16 "
              "before * b (up to 2860 x; the baseline within)",
    "rope": "torch rounds x cos and rotate(x) sin to bf16/fp16 before the sum (12600 x; the "
            "baseline within)",
    "adaln_modulate": "torch's bf16/fp16 composite rounds layer_norm's output, the product and "
                      "the sum (2090 x; the baseline within)",
    "layer_norm": "torch's bf16/fp16 grad_weight/grad_bias with fp32 weights (133 x; the "
                  "baseline 0.03 x; finding torch-cpu-layer-norm-half-param-grads), and a gap: "
                  "fp32 1x7 subnormal grad_weight, 24 x, the baseline alike",
    "linear": "a gap: the careful baseline exceeds as much on every such record (bf16 with "
              "fp32 bias: 261 x)",
}


@pytest.mark.slow
@pytest.mark.parametrize("op", [
    pytest.param(s.name, marks=[pytest.mark.xfail(reason=OPEN[s.name], strict=True)]
                 if s.name in OPEN else [])
    for s in ops("ops") if s.policy.cond_c is not None
    and s.name not in ("softmax", "log_softmax", "cross_entropy")])
def test_torch_kernels_within_the_bound(monkeypatch, op):
    """The other ops: matmul, rms_norm and sdpa (sdpa_math) pass every record today."""
    kern = kernels(op).get("torch") or kernels(op)["sdpa_math"]
    rows = _forced(monkeypatch, op, kern)
    assert rows
    bad = [r for r in rows if not r[2] <= 1]
    assert not bad, bad[:8]
