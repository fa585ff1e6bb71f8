"""nc.adapt: library entry points as kernels of an op (issue 30): an autograd Function called
positionally with library switches, a tuple or a dataclass of outputs, a kernel that writes
into a buffer it is given, and the errors a wrong mapping gets."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import numcheck as nc
from numcheck.errors import UsageError
from _support import quiet_verify


def _rms(x, w, eps):  # a careful kernel: fp32 inside, one rounding at the output
    xf = x.float()
    y = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps) * w.float()
    return y.to(x.dtype)


class RMSFunction(torch.autograd.Function):
    """Like a library's: positional apply with switches the op does not have."""

    @staticmethod
    def forward(ctx, x, w, eps, offset, casting_mode):
        assert offset == 0.0 and casting_mode == "llama"
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return _rms(x, w, eps)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            x_, w_ = x.detach().requires_grad_(), w.detach().requires_grad_()
            gx, gw = torch.autograd.grad(_rms(x_, w_, ctx.eps), (x_, w_), g)
        return gx, gw, None, None, None


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return (torch.nn.functional.silu(a.float()) * b.float()).to(a.dtype)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        with torch.enable_grad():
            a_, b_ = a.detach().requires_grad_(), b.detach().requires_grad_()
            out = (torch.nn.functional.silu(a_.float()) * b_.float()).to(a.dtype)
            return torch.autograd.grad(out, (a_, b_), g)


@dataclasses.dataclass
class NormOut:
    y: torch.Tensor
    rstd: torch.Tensor


def test_an_autograd_function_with_positional_switches_passes_forward_and_backward():
    kern = nc.adapt(RMSFunction, lambda x, weight, eps: (x, weight, eps, 0.0, "llama"))
    v = quiet_verify("rms_norm", kern)
    assert v.passed and v.executed > 10
    assert {r.output for r in v.records} >= {"out", "grad_x", "grad_weight"}


def test_a_function_without_args_takes_the_op_arguments_by_its_forward_signature():
    kern = nc.adapt(SwiGLUFunction)
    assert list(__import__("inspect").signature(kern).parameters) == ["a", "b"]
    v = quiet_verify("swiglu", kern)
    assert v.passed and v.executed > 10


@pytest.mark.parametrize("output,call", [
    (0, lambda x, w, eps: (_rms(x, w, eps), torch.zeros(x.shape[:-1]))),
    ("y", lambda x, w, eps: NormOut(_rms(x, w, eps), torch.zeros(x.shape[:-1]))),
    ("y", lambda x, w, eps: {"y": _rms(x, w, eps)}),
])
def test_the_op_output_is_picked_from_a_tuple_a_dataclass_or_a_dict(output, call):
    kern = nc.adapt(call, lambda x, weight, eps: (x, weight, eps), output=output, name="lib")
    v = quiet_verify("rms_norm", nc.kernel("rms_norm", name="lib", forward_only=True)(kern))
    assert v.passed and v.executed > 10


def test_a_kernel_writing_into_a_given_buffer():
    def rms_into(out, x, w, eps):  # a launcher's contract: returns nothing
        out.copy_(_rms(x, w, eps))

    kern = nc.adapt(rms_into, lambda x, weight, eps: (torch.empty_like(x), x, weight, eps),
                    output=lambda res, args: args[0])
    v = quiet_verify("rms_norm", kern)
    assert v.passed and v.executed > 10


def test_a_wrong_mapping_fails_the_cases_and_names_the_call():
    kern = nc.adapt(lambda x, w, eps: (_rms(x, w, eps),), lambda x, weight, eps: (x, weight, eps),
                    output=3, name="two_outputs")
    v = quiet_verify("rms_norm", nc.kernel("rms_norm", name="bad", forward_only=True)(kern))
    errors = [r.reason for r in v.records if r.status == "error"]
    assert not v.passed and len(errors) == v.executed > 10
    assert all("adapt(two_outputs, output=3)" in e and "a tuple of 1" in e for e in errors)


def test_a_dropped_switch_is_caught():
    """The same Function adapted without its casting switch would pass an assertion error
    through as the kernel's failure, never as a pass."""
    kern = nc.adapt(RMSFunction, lambda x, weight, eps: (x, weight, eps, 0.0, "none"))
    v = quiet_verify("rms_norm", kern)
    assert not v.passed and {r.status for r in v.records} == {"error"}


def test_parameter_names_that_are_not_the_ops_ask_for_args():
    class Swapped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, X, W, eps):
            return _rms(X, W, eps)

    v = quiet_verify("rms_norm", nc.kernel("rms_norm", name="swapped", forward_only=True)(
        nc.adapt(Swapped)))
    assert not v.passed
    reasons = {r.reason for r in v.records if r.status == "error"}
    assert reasons and all("Swapped takes (X, W, eps), numcheck passed (x, weight, eps): give "
                           "args=" in r for r in reasons), reasons


@pytest.mark.parametrize("kw,message", [
    ({"call": 3}, "call must be a function or a torch.autograd.Function"),
    ({"call": _rms, "args": (1, 2)}, "args must be a function"),
    ({"call": _rms, "output": 1.5}, "an int, a field name or a function"),
])
def test_usage_errors_name_the_argument(kw, message):
    with pytest.raises(UsageError, match=message):
        nc.adapt(**kw)
