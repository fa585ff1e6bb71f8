"""Watching a ``torch.compile``d model (issue 32): the watched program is the unwatched one.

Dynamo's graphs and graph breaks are counted with a counting backend (each graph it hands the
backend is counted; the graph runs as its FX module: no inductor build) on fresh Dynamo caches,
unwatched and watched. Before, the per-module hooks ran eagerly inside the compiled program
(``torch._dynamo.disable``): 1 graph / 0 breaks became several graphs with breaks, and the op
mode was traced into it. Now a compiled region is watched from its boundary (op ``compiled``:
its inputs, outputs and gradients; the weights and weight gradients of the layers inside):
the counts and the outputs are the unwatched run's; ``inside_compiled=True`` keeps the
per-layer hooks and its first step says how many graphs and breaks that cost."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from numcheck import telemetry
from numcheck.convergence.models import build

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
dynamo = pytest.importorskip("torch._dynamo")


class _Count:
    """A Dynamo backend that counts the graphs it is given and runs them as they are."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _breaks() -> int:
    return sum(dynamo.utils.counters["graph_break"].values())


def _loss(model, batch):
    """tiny_lm's loss through ``model(...)``: a compiled wrapper's ``.loss`` is the inner
    model's method, which would call the inner, uncompiled forward."""
    logits = model(batch["tokens"]).float()
    return F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())


def _run(where: str, watched: bool, steps: int = 2, **kw):
    """tiny_lm compiled whole (``root``) or block by block (``blocks``), a few steps; returns
    (graphs, breaks, losses, telemetry or None)."""
    dynamo.reset()
    dynamo.utils.counters.clear()
    backend = _Count()
    model, task, _ = build("tiny_lm", 0)
    if where == "root":
        model = torch.compile(model, backend=backend)
    elif where == "root in place":
        model.compile(backend=backend)
    elif where == "blocks in place":
        for blk in model.blocks:
            blk.compile(backend=backend)
    else:
        for i, blk in enumerate(model.blocks):
            model.blocks[i] = torch.compile(blk, backend=backend)
    compiled_calls = [m.__dict__.get("_compiled_call_impl") for m in model.modules()]
    t = telemetry.watch(model, **kw) if watched else None
    losses = []
    for step in range(steps):
        loss = _loss(model, task.batch_at(0, step))
        loss.backward()
        losses.append(loss.detach())
        if t is not None:
            t.step()
    if t is not None:
        t.close()   # a module compiled in place gets its own compiled call back
        assert [m.__dict__.get("_compiled_call_impl") for m in model.modules()] == compiled_calls
    return backend.graphs, _breaks(), losses, t


@pytest.mark.parametrize("where", ["root", "blocks", "root in place", "blocks in place"])
def test_watching_adds_no_graph_and_no_break(where):
    """torch.compile(m) and m.compile() (in place: before, 1 graph / 0 breaks became 68 / 95
    and Dynamo hit its recompile limit on numcheck's code)."""
    graphs, breaks, losses, _ = _run(where, watched=False)
    assert graphs >= 1 and breaks == 0   # the model compiles whole: the baseline to keep
    with pytest.warns(UserWarning, match="a torch.compile region, watched from"):
        w_graphs, w_breaks, w_losses, t = _run(where, watched=True, shadow=True)
    assert (w_graphs, w_breaks) == (graphs, breaks)
    assert all(torch.equal(a, b) for a, b in zip(losses, w_losses, strict=True))
    df = t.records()
    # the region's rows (the root's input is integer tokens: no input or grad_input row)
    region, want = (("<model> (compiled)", {"output", "grad_output"}) if where.startswith("root")
                    else ("blocks.0 (compiled)", {"input", "output", "grad_output", "grad_input"}))
    assert set(df[df.module == region].role) == want
    # the float64 copy runs eagerly (no graph of its own) and gives the region's end-to-end
    # SQNR: fp32 against float64, ~140 dB
    out = df[(df.module == region) & (df.role == "output")].iloc[0]
    assert out.e2e_sqnr_db > 100, out
    # the layers inside: weight and weight-gradient rows, under their own names
    qkv = df[df.module == "blocks.0.qkv"]
    assert set(qkv.role) == {"weight", "grad_weight"} and set(qkv.op) == {"linear"}
    assert not t.first_nonfinite()
    if where.startswith("blocks"):   # outside the regions, per-layer rows as ever
        assert {"input", "output", "grad_output"} <= set(df[df.module == "head"].role)


def test_inside_compiled_says_what_it_cost():
    graphs, breaks, _, _ = _run("root", watched=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w_graphs, w_breaks, _, t = _run("root", watched=True, inside_compiled=True,
                                        shadow=True)
    said = [str(w.message) for w in caught if "changed the compiled program" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]   # once, at the first step
    assert w_graphs > graphs and f"compiled {w_graphs} graph(s)" in said[0], said
    assert f"broke {w_breaks} time(s)" in said[0]
    df = t.records()   # the per-layer rows it pays for, their end-to-end SQNR under their names
    qkv = df[(df.module == "blocks.0.qkv") & (df.role == "output")].iloc[0]
    assert qkv.e2e_sqnr_db > 100, qkv


def test_a_fault_inside_a_compiled_region_names_the_region():
    """The check sees a region from its boundary: an overflow made inside it is named as the
    region's (its inputs and parameters finite, its output not), not as propagated."""
    dynamo.reset()
    model, task, _ = build("tiny_lm", 0)
    model.blocks[1] = torch.compile(model.blocks[1], backend=_Count())
    with torch.no_grad():
        model.blocks[1].w_up.weight.fill_(3e38)   # finite; its products overflow
    with pytest.warns(UserWarning, match="a torch.compile region"):
        t = telemetry.watch(model)
    with t:
        _loss(model, task.batch_at(0, 0)).backward()
        t.step()
    got = t.first_nonfinite()
    assert got and (got.module, got.op, got.role, got.pass_) == \
        ("blocks.1 (compiled)", "compiled", "output", "forward"), got
