"""What telemetry rows cover between the linears (issue 32): embeddings are watched (op
``embedding``: weight, output, grad_output, grad_weight rows), and a user's module class becomes
an op with ``telemetry.register(cls, op)`` (adaLN modulation here: shift, scale and gate
arithmetic written in a module of the user's), its rows and float64 shadow like a norm's."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from numcheck import telemetry
from numcheck.convergence.models import build
from numcheck.errors import UsageError
from numcheck.telemetry import op_classes

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(autouse=True)
def _no_registrations(monkeypatch):
    monkeypatch.setattr(op_classes, "_REGISTERED", {})


def test_an_embedding_is_watched():
    model, task, _ = build("tiny_lm", 0)
    with telemetry.watch(model, shadow=True) as t:
        model.loss(task.batch_at(0, 0)).backward()
        t.step()
    df = t.records()
    emb = df[df.op == "embedding"].set_index("role")
    assert set(emb.index) == {"weight", "output", "grad_output", "grad_weight"}
    assert emb.loc["weight", "n"] == model.embed.weight.numel()
    assert emb.loc["output", "shadow_sqnr_db"] > 100   # a lookup: exact in float64 too


class Modulate(nn.Module):
    """adaLN's modulation: x * (1 + scale) + shift, then a gate (a DiT block's arithmetic)."""

    def forward(self, x, shift, scale, gate):
        return gate * (x * (1 + scale) + shift)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ada = nn.Linear(4, 12)
        self.mod = Modulate()
        self.out = nn.Linear(8, 8)

    def forward(self, x, c):
        shift, scale, gate = self.ada(c).repeat_interleave(2, -1).chunk(3, -1)
        return self.out(self.mod(x, shift, scale, gate))


def _rows(model):
    torch.manual_seed(0)
    with telemetry.watch(model, shadow=True) as t:
        model(torch.randn(3, 8), torch.randn(3, 4)).sum().backward()
        t.step()
    return t.records()


def test_a_registered_module_class_is_an_op():
    torch.manual_seed(0)
    model = Block()
    assert "modulate" not in set(_rows(model).op)   # unregistered: producer checks only
    telemetry.register(Modulate, "modulate")
    df = _rows(model)
    mod = df[df.op == "modulate"]
    assert set(mod.module) == {"mod"}
    assert set(mod.role) == {"input", "output", "grad_output", "grad_input"}
    assert mod[mod.role == "input"].n.iloc[0] == 4 * 3 * 8   # x, shift, scale, gate
    assert mod[mod.role == "output"].shadow_sqnr_db.iloc[0] > 100   # fp32 vs its fp64 copy


@pytest.mark.parametrize("cls, op, says", [
    (object, "modulate", "not an nn.Module subclass"),
    (Modulate, "", "give the op a name"),
    (Modulate, "a b", "give the op a name"),
])
def test_a_bad_registration_is_a_usage_error(cls, op, says):
    with pytest.raises(UsageError, match=says):
        telemetry.register(cls, op)


def test_a_compiled_root_is_named_without_orig_mod():
    """``watch(torch.compile(model))``: rows and producers carry the names the user wrote
    (torch.compile's ``_orig_mod`` segment was in every name); the wrapper's own producer check
    is ``<model> (compiled)``. (Watched from the region's boundary, the layers inside keep their
    weight rows: tests/test_telemetry_compiled.py.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    compiled = torch.compile(model, backend="eager")   # Dynamo alone: no inductor build
    with telemetry.watch(compiled) as t:
        compiled(torch.randn(4, 8)).sum().backward()
        t.step()
    names = set(t.records().module)
    assert {"0", "1", "2"} <= names and not any("_orig_mod" in n for n in names), names
