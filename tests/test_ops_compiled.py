"""torch.compile (inductor) kernels: they pass their ops' quick cases, skip outside their fixed
shape/dtype set with the reason, run what we think they run (CPU flash attention), and never fall
back to eager silently.

Compiling is slow (about 60 s for the four ops' quick cases on 2 cores with a fresh inductor
cache): those tests are marked slow (run with --numcheck-slow) and share one xdist group, so that
under ``-n 2 --dist loadgroup`` one worker compiles while the other runs the rest.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from numcheck.cases.grid import Case
from numcheck.catalog import get_op, kernels
from numcheck.kernels import compiled as C
from numcheck.ops.activations import _eager_swiglu
from numcheck.verification import verify

pytestmark = [pytest.mark.xdist_group("compiled"), pytest.mark.filterwarnings("ignore")]

OPS = ["rms_norm", "adaln_modulate", "swiglu", "sdpa"]


def _verify(op, fn, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return verify(op, fn, device="cpu", **kw)


# ---- cheap: registration and constraints (no compiling) -------------------------------------

@pytest.mark.parametrize("op", OPS)
def test_registered_with_constraints(op):
    k = kernels(op)["compiled"]
    assert k.compiled and k.dtypes == ("fp32", "bf16")
    assert isinstance(k.fn, C.Compiled)
    spec = get_op(op)
    ran = [c for c in spec.grid("quick") if k.skip_reason(c, "cpu") is None]
    # two shapes (a small graph count keeps compile time bounded), both dtypes, never empty
    assert ran and {c.shape for c in ran} <= set(C.SHAPES[op])
    assert {c.dtype for c in ran} <= {"fp32", "bf16"}
    # one dynamo graph per shape, dtype, strides/params and set of inputs needing grad: below
    # the recompile limit, past which the kernel would raise
    graphs = {(c.shape, c.dtype, c.params,
               tuple(a for a in spec.grad_args if a not in (spec.skip_grads(c) if spec.skip_grads
                                                            else ()))) for c in ran}
    assert len(graphs) <= C.RECOMPILE_LIMIT, graphs


def test_skip_reasons_name_the_constraint():
    k = kernels("swiglu")["compiled"]
    fp16 = Case("swiglu", "fp16", (4, 128), "normal", 0)
    assert "fp32, bf16" in k.skip_reason(fp16, "cpu")
    other = Case("swiglu", "fp32", (2, 7, 33), "normal", 0)
    assert "shape in (4, 128)" in k.skip_reason(other, "cpu")
    masked = Case("sdpa", "fp32", (2, 2, 2, 7, 7, 128), "normal", 0,
                  (("causal", False), ("mask", "bool")))
    assert "mask" in kernels("sdpa")["compiled"].skip_reason(masked, "cpu")
    w32 = Case("rms_norm", "bf16", (4, 128), "normal", 0, (("weight", "fp32"),))
    assert "weight" in kernels("rms_norm")["compiled"].skip_reason(w32, "cpu")


def test_importing_numcheck_compiles_nothing():
    fresh = C.Compiled(_eager_swiglu)
    assert fresh._compiled is None and fresh.__name__ == "compiled__eager_swiglu"


# ---- slow: compiling ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
def test_compiled_kernels_pass_quick(op):
    v = _verify(op, kernels(op)["compiled"])
    assert v.passed, v.summary()
    assert v.executed >= 2


@pytest.mark.slow
def test_compiled_attention_runs_cpu_flash():
    """Inductor rewrites the hand-written softmax(QK^T) V into the CPU flash kernel, forward and
    backward, GQA included; the causal form (masked_fill) stays bmm + softmax."""
    from torch.profiler import ProfilerActivity, profile
    f = kernels("sdpa")["compiled"].fn

    def ops_run(causal):
        q = torch.randn(1, 4, 127, 64, requires_grad=True)
        k = torch.randn(1, 2, 129, 64, requires_grad=True)
        v = torch.randn(1, 2, 129, 64, requires_grad=True)
        f(q, k, v, is_causal=causal)  # compile outside the profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            f(q, k, v, is_causal=causal).sum().backward()
        return {e.key for e in prof.key_averages()}
    plain = ops_run(False)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in plain
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in plain
    causal = ops_run(True)
    assert not any("flash_attention" in n for n in causal) and "aten::bmm" in causal


@pytest.mark.slow
def test_recompile_limit_raises_instead_of_running_eager(monkeypatch):
    monkeypatch.setattr(C, "RECOMPILE_LIMIT", 1)

    def double(x):
        return x * 2
    f = C.Compiled(double)
    f(torch.ones(3))
    with pytest.raises(Exception, match="(?i)recompile|cache.*limit"):
        f(torch.ones(5))


# ---- inductor's cache per CPU capability (docs/findings.md) --------------------------------

def test_inductor_cache_dir_per_capability():
    assert C.inductor_cache_dir("AVX2", "/c") == "/c/numcheck-avx2"
    assert C.inductor_cache_dir("DEFAULT", "/c/") == "/c/numcheck-default"
    assert C.inductor_cache_dir("AVX512", "/c/numcheck-avx512") == "/c/numcheck-avx512"  # kept
    # a folder numcheck chose for another capability (a parent process's): its sibling
    assert C.inductor_cache_dir("DEFAULT", "/c/numcheck-avx2") == "/c/numcheck-default"
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    assert C.inductor_cache_dir("AVX2", None) == default_cache_dir() + "/numcheck-avx2"


_GUARD = """
import json, torch
from numcheck.kernels.compiled import isolate_inductor_cache
from torch._inductor.runtime.cache_dir_utils import cache_dir
path = isolate_inductor_cache()
print(json.dumps({"cap": str(torch.backends.cpu.get_cpu_capability()), "path": path,
                  "inductor": cache_dir()}))
"""


def _in_subprocess(code: str, capability: str, cache: str) -> str:
    import os
    import subprocess
    import sys
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "TORCHINDUCTOR_CACHE_DIR": cache}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()[-1]


def test_guard_picks_a_cache_folder_per_capability(tmp_path):
    """Under ATEN_CPU_CAPABILITY=avx2 and =default (separate processes, one user cache folder)
    the guard picks different folders inside it, and inductor's own cache_dir() follows."""
    import json
    seen = {cap: json.loads(_in_subprocess(_GUARD, cap, str(tmp_path)))
            for cap in ("avx2", "default")}
    for r in seen.values():
        assert r["path"] == r["inductor"] == str(tmp_path / f"numcheck-{r['cap'].lower()}")
    caps = {r["cap"] for r in seen.values()}
    paths = {r["path"] for r in seen.values()}
    assert len(paths) == len(caps)  # two capabilities on x86 with AVX2; one folder each
    # a child inheriting the parent's per-capability folder gets the sibling of its own
    child = json.loads(_in_subprocess(_GUARD, "default", seen["avx2"]["path"]))
    assert child["path"] == seen["default"]["path"]


_COMPILE = """
import hashlib, torch, torch.nn.functional as F
from numcheck.kernels.compiled import Compiled
def swiglu(a, b):
    return F.silu(a) * b
g = torch.Generator().manual_seed(0)
a, b = torch.randn(4, 129, generator=g), torch.randn(4, 129, generator=g)
print(hashlib.sha1(Compiled(swiglu)(a, b).numpy().tobytes()).hexdigest())
"""


@pytest.mark.slow
def test_cache_shared_across_capabilities_is_not_reused(tmp_path):
    """The finding's repro through numcheck: compile under avx2, then run under default with
    the same TORCHINDUCTOR_CACHE_DIR. Without the guard, inductor served the avx2 graph under
    default here (C++ compile error: 'at::vec' has not been declared; the other way round,
    numerics of neither capability). With it, the second run equals a fresh default compile."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("needs an x86 CPU with AVX2 (two capabilities to switch between)")
    shared, fresh = tmp_path / "shared", tmp_path / "fresh"
    _in_subprocess(_COMPILE, "avx2", str(shared))
    after = _in_subprocess(_COMPILE, "default", str(shared))
    assert after == _in_subprocess(_COMPILE, "default", str(fresh))
    assert sorted(p.name for p in shared.iterdir()) == ["numcheck-avx2", "numcheck-default"]
