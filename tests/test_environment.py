"""numcheck.measure.environment.known_failure: error messages of documented environment failures
(docs/findings.md) map to their finding ids; everything else to None."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from numcheck.measure import environment as env


@pytest.mark.parametrize("message,finding", [
    # as torch 2.13.0 raised it on an Intel Xeon with AMX under ATEN_CPU_CAPABILITY=avx2 (issue 12)
    ("RuntimeError: pack_vnni2 is only supported when avx512 is supported",
     "torch-cpu-flash-bf16-avx2-vnni"),
    ("pack_vnni2 is only supported when avx512 is supported\nException raised from ...",
     "torch-cpu-flash-bf16-avx2-vnni"),
    # inductor's C++ for avx2 served under ATEN_CPU_CAPABILITY=default (measured here, torch 2.13)
    ("CppCompileError: C++ compile error\n/tmp/c/uv/cuv7t.main.cpp:15:37: error: \u2018at::vec\u2019"
     " has not been declared", "inductor-cache-across-cpu-capability"),
    ("error: 'at::vec' has not been declared", "inductor-cache-across-cpu-capability"),
    # as Triton 3.9.0's interpreter and numcheck's support raise them (tests/test_triton_limits.py)
    ("InterpreterError: NotImplementedError('inline_asm not supported in interpreter mode')",
     "triton-interp-device-code"),
    ("NotImplementedError: extern_elementwise not supported in interpreter mode",
     "triton-interp-device-code"),
    ("InterpreterError: NotImplementedError(\"triton.language.extra.libdevice.j0 is not "
     "implemented under Triton's CPU interpreter (...): an environment limit "
     "[triton-interp-libdevice], not a kernel failure\")", "triton-interp-libdevice"),
    ("RuntimeError: 0 active drivers ([]). There should only be one.", "triton-no-driver"),
])
def test_known_failure_matches_documented_messages(message, finding):
    assert env.known_failure(message) == finding


@pytest.mark.parametrize("message", [
    "", "RuntimeError: expected scalar type BFloat16 but found Float",
    "pack_vnni2",  # a fragment is not the failure
    "No available kernel. Aborting execution.",
    "AssertionError: kernel output differs",
    "InterpreterError: ValueError('Cannot broadcast, rank mismatch')",  # a kernel's own bug
])
def test_known_failure_is_none_for_other_errors(message):
    assert env.known_failure(message) is None


def test_table_entries_are_well_formed():
    from numcheck.verdicts.findings import FINDINGS

    ids = [fid for _, fid in env.ENVIRONMENT_FAILURES]
    assert len(ids) == len(set(ids))
    for pattern, fid in env.ENVIRONMENT_FAILURES:
        assert isinstance(pattern, re.Pattern) and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", fid)
        assert fid in FINDINGS  # numcheck explain knows it
    assert "known_failure" in env.__all__


def test_flash_bf16_runs_where_the_cpu_has_no_amx():
    """The VNNI failure needs AMX (torch packs for it whenever the CPU has AMX): elsewhere the
    CPU flash kernel runs bf16 under any capability (measured: AMD EPYC AVX2, capabilities avx2
    and default, forward and backward)."""
    if env.cpu_isa()["amx_tile"]:
        pytest.skip("AMX CPU: under ATEN_CPU_CAPABILITY=avx2 this is the documented failure")
    q, k, v = (torch.randn(1, 2, 127, 64, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()
