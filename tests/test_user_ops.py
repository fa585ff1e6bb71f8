"""User-defined ops (nc.op), kernel registration and constraints (@nc.kernel), rule 11."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import numcheck as nc
from numcheck.cases import inputs
from numcheck.cases.grid import make_grid
from numcheck.catalog import CATALOG, kernels
from numcheck.ops.norms import rms_norm_reference

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype")


@pytest.fixture
def registry_snapshot():
    with CATALOG.restoring():
        yield


def _norm_quant_inputs(case):
    x = inputs.draw(case.dist, case.shape, seed=case.seed, stream=f"{case.id}/x")
    w = 1 + 0.1 * inputs.draw("normal", case.shape[-1:], seed=case.seed, stream=f"{case.id}/w")
    dt = nc.formats.get(case.dtype).torch
    return {"x": (x, dt), "weight": (w, dt)}, {"eps": 1e-6}


def _norm_quant_reference(x, weight, eps):
    """Fused RMSNorm + e4m3 fake-quant: float64 norm, numcheck's own e4m3 rounding."""
    return nc.round_to(rms_norm_reference(x, weight, eps), "e4m3", saturate=True)


def _norm_quant_baseline(x, weight, eps):
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight
    return y.to(torch.float8_e4m3fn).to(x.dtype)


def _fused(x, weight, eps):
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(
        torch.float8_e4m3fn).to(x.dtype)


def _fused_truncating(x, weight, eps):
    y = F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).double()
    return nc.round_to(y, "e4m3", "rz").to(x.dtype)


def test_user_op_norm_plus_quantize(registry_snapshot):
    nc.op("rms_norm_e4m3", reference=_norm_quant_reference, inputs=_norm_quant_inputs,
          baseline=_norm_quant_baseline,
          policy=nc.Policy(truncation_ulp=0.25),  # e4m3 RNE: mean ULP bias ~0, rz gives -0.5
          grid=make_grid("rms_norm_e4m3", {"dtype": ["bf16", "fp32"],
                                           "shape": [(8, 128), (5, 129)],
                                           "dist": ["normal", "outlier_channels"]}))
    good = nc.verify("rms_norm_e4m3", _fused, device="cpu")
    assert good.passed, good.summary()
    bad = nc.verify("rms_norm_e4m3", _fused_truncating, device="cpu")
    assert not bad.passed and "truncation" in bad.failures[0].reason


def test_user_op_cannot_shadow_builtin():
    with pytest.raises(nc.UsageError, match="built-in"):
        nc.op("rms_norm", reference=_norm_quant_reference, inputs=_norm_quant_inputs,
              baseline=_norm_quant_baseline)


def test_kernel_decorator_registers_and_verify_uses_its_name(registry_snapshot):
    @nc.kernel("rms_norm", name="my_rmsnorm", dtypes=("bf16",), forward_only=True)
    def my_rmsnorm(x, weight, eps):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    assert kernels("rms_norm")["my_rmsnorm"].fn is my_rmsnorm
    v = nc.verify("rms_norm", my_rmsnorm, device="cpu")
    assert v.kernel == "my_rmsnorm" and v.passed, v.summary()
    skipped = [r for r in v.records if r.status == "skipped"]
    assert skipped and all("supports bf16" in r.reason for r in skipped)
    assert all(r.output == "out" for r in v.records)  # forward_only: no gradient records


def test_verify_takes_a_registered_kernels_name():
    """``nc.verify(op, "name")`` runs the op's registered kernel of that name (its constraints
    included); an unknown name is a UsageError naming the registered ones."""
    v = nc.verify("silu", "torch", device="cpu", case_ids=[
        c.id for c in CATALOG.get_op("silu").grid("quick")[:2]])
    assert v.kernel == "torch" and v.passed and v.executed == 2, v.summary()
    with pytest.raises(nc.UsageError, match="no kernel named 'nope'.*registered: .*torch"):
        nc.verify("silu", "nope", device="cpu")


def test_separate_backward_function_is_used(registry_snapshot):
    calls = []

    def backward(grad_out, x, weight, eps):
        calls.append(1)
        x_ = x.detach().float().requires_grad_()
        w_ = weight.detach().float().requires_grad_()
        y = F.rms_norm(x_, (x.shape[-1],), w_, eps)
        gx, gw = torch.autograd.grad(y, (x_, w_), grad_out.float())
        return gx.to(x.dtype), gw.to(weight.dtype)

    @nc.kernel("rms_norm", name="with_bwd", backward=backward, dtypes=("fp32",))
    def fwd(x, weight, eps):
        return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)

    v = nc.verify("rms_norm", fwd, device="cpu")
    assert v.passed, v.summary() and calls
    assert {r.output for r in v.records if r.status == "passed"} >= {"grad_x", "grad_weight"}


def test_everything_skipped_fails_rule_11(registry_snapshot):
    @nc.kernel("rms_norm", name="cuda_only", devices=("cuda",))
    def cuda_only(x, weight, eps):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    v = nc.verify("rms_norm", cuda_only, device="cpu")
    assert v.executed == 0 and not v.passed
    assert "nothing executed" in v.summary()


def test_unknown_constraint_is_a_usage_error():
    with pytest.raises(nc.UsageError, match="dtype"):
        nc.kernel("rms_norm", dtype=("bf16",))


def test_numerics_state_is_pinned_and_restored(registry_snapshot):
    """A caller's bf16-for-fp32 matmul setting must not leak into the case, and comes back."""
    from numcheck.measure import numerics
    seen = {}

    @nc.kernel("rms_norm", name="spy", dtypes=("fp32",))
    def spy(x, weight, eps):
        seen["state"] = numerics.current()
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    caller = numerics.current()
    relaxed = dataclasses.replace(
        caller, num_threads=1,
        fp32_precision=tuple((k, "bf16" if k.startswith("mkldnn") else v)
                             for k, v in caller.fp32_precision))
    numerics.apply(relaxed)
    try:
        v = nc.verify("rms_norm", spy, device="cpu")
        assert seen["state"] == numerics.PINNED
        assert numerics.current() == relaxed
        assert "threads=2" in v.records[0].numerics
    finally:
        numerics.apply(caller)


def _softcap_reference(x, cap=30.0):
    """Logit soft-capping (Gemma 2): cap * tanh(x / cap), written once in torch primitives."""
    return cap * torch.tanh(x / cap)


def test_an_op_from_a_reference_alone(registry_snapshot):
    """issue 31: nc.op needs only the reference: inputs drawn per parameter, the careful
    baseline (the reference in fp32 on the stored inputs, rounded once), a default grid with
    every float dtype and both layouts. A fused fp32-inside kernel passes; one that evaluates
    in bf16 fails (fp32 and fp16 cases at least: its bf16 roundings exceed their baselines)."""
    nc.op("softcap", reference=_softcap_reference, grad_args=("x",))
    cases = CATALOG.get_op("softcap").grid("quick")
    assert {c.dtype for c in cases} == {"fp32", "bf16", "fp16"}
    assert {c.param("layout") for c in cases} == {"contiguous", "transposed"}
    fused = nc.verify("softcap", lambda x: (30.0 * torch.tanh(x.float() / 30.0)).to(x.dtype),
                      device="cpu")
    assert fused.passed and fused.executed == len(cases), fused.summary()
    lossy = nc.verify("softcap", lambda x: (30.0 * torch.tanh(x.bfloat16() / 30.0)).to(x.dtype),
                      device="cpu")
    assert not lossy.passed
    assert {"fp32", "fp16"} <= {r.dtype for r in lossy.failures}, lossy.summary()
