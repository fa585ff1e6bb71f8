"""A kernel receives only the parameters it accepts (DESIGN, "Public contract"): extras at the
op's default are not passed; a case that needs another value skips with the reason."""
from __future__ import annotations

import torch

from numcheck.quant import fp8, nvfp4
from numcheck.records import Status

from _support import quiet_verify


def published_fp8_qdq(x, fmt="e4m3", granularity="tensor", dim=-1):
    """fp8_qdq with the signature of shared/DESIGN.md only (no pow2_scale)."""
    return fp8.fp8_qdq(x, fmt, granularity, dim)


def published_nvfp4_qdq(x, dim=-1):
    """nvfp4_qdq(x, dim) as published (no two_d)."""
    return nvfp4.nvfp4_qdq(x, dim)


def test_a_kernel_with_the_published_fp8_signature_runs_every_case_it_can():
    v = quiet_verify("fp8_qdq", published_fp8_qdq)
    ran = [r for r in v.records if r.status != Status.SKIPPED]
    skipped = [r for r in v.records if r.status == Status.SKIPPED]
    assert ran and all(r.status == Status.PASSED for r in ran), v.summary()
    assert {r.params.split("pow2_scale=")[1] for r in ran} == {"False"}
    assert skipped and all("does not take pow2_scale=True" in r.reason for r in skipped)
    assert v.passed


def test_a_kernel_with_the_published_nvfp4_signature_runs_every_case_it_can():
    v = quiet_verify("nvfp4_qdq", published_nvfp4_qdq)
    assert v.passed, v.summary()
    skipped = [r for r in v.records if r.status == Status.SKIPPED]
    assert all("two_d=True" in r.reason for r in skipped)
    assert all("two_d=False" in r.params for r in v.records if r.status != Status.SKIPPED)


def test_a_kernel_taking_kwargs_gets_every_parameter():
    seen = set()

    def anything(x, **kw):
        seen.update(kw)
        return fp8.fp8_qdq(x, **kw)
    v = quiet_verify("fp8_qdq", anything)
    assert v.passed and seen == {"fmt", "granularity", "dim", "pow2_scale"}


def test_a_missing_tensor_argument_is_an_error_not_a_skip():
    """Only parameters at the op's default may be left out: a kernel whose signature lacks the
    rms_norm weight (a tensor of the op) errors on every case, by name; it is never skipped."""
    def no_weight(x, eps):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    v = quiet_verify("rms_norm", no_weight)
    assert not v.passed and v.records
    assert all(r.status == Status.ERROR and "weight" in r.reason for r in v.records), v.summary()
