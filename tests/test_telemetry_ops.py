"""What telemetry watches between the linears, as ops (issue 32): function-level ops (sdpa,
softmax, a user's registered function: adaLN modulation, RoPE, a gated residual add) get rows
with float64 shadow and end-to-end SQNR, their producer checks name the op, forward and
backward, and a registered function changes nothing unwatched, compiled or not."""
from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from numcheck import telemetry
from numcheck.errors import UsageError
from numcheck.telemetry import op_classes

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(autouse=True)
def _no_registrations(monkeypatch):
    monkeypatch.setattr(op_classes, "_REGISTERED", {})
    # the torch functions' table is imported by name (the op mode's hot path): restored in place
    saved = dict(op_classes.FUNCTION_OPS)
    yield
    op_classes.FUNCTION_OPS.clear()
    op_classes.FUNCTION_OPS.update(saved)


def _gated_residual(x, h, gate):
    return x + gate * h


class _Block(nn.Module):
    """A DiT-like block whose gated residual add is a plain function call (no module)."""

    def __init__(self, residual) -> None:
        super().__init__()
        self.ada = nn.Linear(8, 8)
        self.proj = nn.Linear(8, 8)
        self.residual = residual

    def forward(self, x, c):
        return self.residual(x, self.proj(x), self.ada(c))


def _watched(model, x, c, **kw):
    with telemetry.watch(model, shadow=True, **kw) as t:
        model(x, c).sum().backward()
        t.step()
    return t


def _inputs(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.randn(4, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype)


def test_a_registered_function_is_an_op_with_shadows():
    """Unregistered, the residual add has no row; registered, it has input, output and
    gradient rows under op ``residual`` in the calling module, and its output row carries the
    shadow (the function on float64 copies of its arguments) and the end-to-end SQNR (the
    whole-model float64 copy's call): bf16 arithmetic sits near 50 dB, nowhere near fp64's."""
    x, c = _inputs(torch.bfloat16)
    torch.manual_seed(1)
    plain = _Block(_gated_residual).to(torch.bfloat16)
    assert "residual" not in set(_watched(plain, x, c).records().op)
    torch.manual_seed(1)
    model = _Block(telemetry.register(_gated_residual, "residual")).to(torch.bfloat16)
    df = _watched(model, x, c).records()
    rows = df[df.op == "residual"].set_index("role")
    assert set(rows.index) == {"input", "output", "grad_output", "grad_input"}
    assert set(df[df.op == "residual"].module) == {"<model>"}
    assert rows.loc["input", "n"] == 3 * x.numel()
    out = rows.loc["output"]
    assert 30 < out.shadow_sqnr_db < 80 and 30 < out.e2e_sqnr_db < 80, out


def test_a_registered_function_is_named_as_its_producer():
    """An overflow made by the function itself is produced by op ``residual``, not by the
    module around it (``module``) and not by nobody."""
    wrapped = telemetry.register(_gated_residual, "residual")
    x, c = _inputs(torch.float16)
    torch.manual_seed(1)
    model = _Block(wrapped).to(torch.float16)
    with torch.no_grad():
        model.ada.bias.fill_(6e4)   # the gate: finite; gate * h overflows fp16
    t = _watched(model, x, c)
    got = t.first_nonfinite()
    assert got and (got.module, got.op, got.role, got.pass_) == \
        ("<model>", "residual", "output", "forward"), got


def test_a_path_registration_replaces_the_function_where_it_is_looked_up(monkeypatch):
    """``register("package.module:function", op)``: library code that calls the function by
    its module-global name is watched without being edited."""
    lib = types.ModuleType("_nc_fake_lib")

    def modulate(x, shift, scale):
        return x * (1 + scale) + shift

    lib.modulate = modulate

    class Layer(nn.Module):
        def forward(self, x, c):
            return lib.modulate(x, c, c)

    monkeypatch.setitem(sys.modules, "_nc_fake_lib", lib)
    wrapped = telemetry.register("_nc_fake_lib:modulate", "modulate")
    assert lib.modulate is wrapped and wrapped.__wrapped__ is modulate
    x, c = _inputs()
    x.requires_grad_(True)
    df = _watched(Layer(), x, c).records()
    assert set(df[df.op == "modulate"].role) == {"input", "output", "grad_output", "grad_input"}


def test_a_registered_torch_function_is_an_op():
    """A torch function (every call of it in the forward) is intercepted like sdpa."""
    telemetry.register(torch.addcmul, "modulate")

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x, c):
            return torch.addcmul(c, x, self.lin(c))

    x, c = _inputs()
    df = _watched(Layer(), x, c).records()
    out = df[(df.op == "modulate") & (df.role == "output")].iloc[0]
    assert out.module == "<model>" and out.shadow_sqnr_db > 120   # fp32 vs float64


class MyRotaryEmbedding(nn.Module):
    """Named as a model library names its rotary embedding: watched as op ``rope``."""

    def forward(self, x):
        return torch.cos(x), torch.sin(x)


def test_a_rotary_embedding_class_is_watched_by_name():
    assert op_classes.classify(MyRotaryEmbedding()) == "rope"
    assert op_classes.classify(type("AdaLayerNormZero", (nn.Module,), {})()) == "modulate"


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, 8)).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2)


def test_sdpa_rows_carry_shadow_and_end_to_end_sqnr():
    torch.manual_seed(0)
    model = _Attention().to(torch.bfloat16)
    x = torch.randn(2, 32, 16, dtype=torch.bfloat16)
    with telemetry.watch(model, shadow=True) as t:
        model(x).float().sum().backward()
        t.step()
    df = t.records()
    out = df[(df.op == "sdpa") & (df.role == "output")].iloc[0]
    # bf16 attention: a few ulps of bf16 (8 bits: ~48 dB) against fp64; the end-to-end
    # reference also carries the qkv projection's rounding
    assert 35 < out.shadow_sqnr_db < 70 and 30 < out.e2e_sqnr_db < 70, out


@pytest.mark.parametrize("every", [1, 3])
def test_an_attention_backward_overflow_is_tagged_sdpa(every):
    """An fp16 sdpa whose backward overflows (grad_v sums 64 queries' 6e4 gradients) from
    finite grad_outputs and inputs: produced by op ``sdpa`` (it was the attention module,
    op ``module``), at every=1 and when the fault's step (1) is replayed at every=3."""
    torch.manual_seed(0)
    model = _Attention().to(torch.float16)
    x = torch.randn(1, 64, 16, dtype=torch.float16)
    with telemetry.watch(model, every=every) as t:
        for step in range(2):
            y = model(x)
            y.backward(torch.full_like(y, 6e4 if step == 1 else 1.0))
            model.zero_grad()
            t.step()
    got = t.first_nonfinite()
    assert got and (got.step, got.module, got.op, got.role, got.pass_) == \
        (1, "<model>", "sdpa", "grad_input", "backward"), got


def test_a_registered_function_changes_nothing_unwatched():
    """Unwatched, a registered function is the function (bitwise), and Dynamo compiles a
    caller into one graph (fullgraph=True: a graph break would raise)."""
    wrapped = telemetry.register(_gated_residual, "residual")
    x, c = _inputs()
    assert torch.equal(wrapped(x, c, c), _gated_residual(x, c, c))
    compiled = torch.compile(lambda a, b: wrapped(a, b, b) * 2, backend="eager",
                             fullgraph=True)
    assert torch.equal(compiled(x, c), _gated_residual(x, c, c) * 2)


@pytest.mark.parametrize("target, op, says", [
    (object, "modulate", "not an nn.Module subclass"),
    (3, "modulate", "neither a module class nor a function"),
    ("_nc_no_such_module:f", "rope", "cannot load it"),
    (_gated_residual, "a b", "give the op a name"),
])
def test_a_bad_registration_names_what_to_give(target, op, says):
    with pytest.raises(UsageError, match=says):
        telemetry.register(target, op)
