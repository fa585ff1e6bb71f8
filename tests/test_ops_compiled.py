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

from numcheck.cases import Case
from numcheck.catalog import get_op, kernels
from numcheck import compiled as C
from numcheck.ops.activations import _eager_swiglu
from numcheck.run import verify

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
    assert "shapes" in k.skip_reason(other, "cpu")
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
