"""The parts a ``Telemetry`` composes, each built and checked without a watch: the accumulator
(rows and producer checks merged at flush), the step's memo (each tensor read once), the float64
shadows, the hooks (attached, read, detached with nothing left behind) and the generator
states the replay and the shadows run from."""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from numcheck.quant.recipe import get_recipe
from numcheck.telemetry import fields
from numcheck.telemetry.accumulator import Accumulator, NonFinite
from numcheck.telemetry.hooks import ROOT, Hooks
from numcheck.telemetry.op_classes import classify
from numcheck.telemetry.observation import Pending, StepReads, finite, read_back
from numcheck.telemetry.passes import all_finite, sqnr_pair
from numcheck.telemetry.rng import own_rng, rng_states, set_rng_states
from numcheck.telemetry.sentinel import Sentinel
from numcheck.telemetry.shadows import Shadows

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _row(rows: list[dict], **key) -> dict:
    got = [r for r in rows if all(r[k] == v for k, v in key.items())]
    assert len(got) == 1, (key, got)
    return got[0]


def _plain(values) -> list[float]:
    """fields.PLAIN of a list of values, written out by hand (the reference)."""
    fin = [abs(v) for v in values if math.isfinite(v)]
    nz = [a for a in fin if a > 0]
    return [1.0, float(len(values)), float(sum(v != v for v in values)),
            float(sum(math.isinf(v) for v in values)), float(sum(v == 0 for v in values)),
            max(fin, default=-math.inf), min(nz, default=math.inf), float(sum(a * a for a in fin))]


# ---- the accumulator -----------------------------------------------------------------------

def test_the_accumulator_merges_a_rows_tensors_by_the_fields_rules():
    """Two tensors added under one key make one row: counts and sums add, amax takes the max,
    min_nonzero the min (small integers: every sum is exact); the rank and step of flush()."""
    acc = Accumulator(StepReads(), [], rank=3)
    a = torch.tensor([1.0, -2.0, 0.0, 4.0])
    b = torch.tensor([[0.5, 3.0], [0.0, 0.0]])
    acc.add("fc", "linear", "input", a)
    acc.add("fc", "linear", "input", b)
    acc.add("fc", "linear", "grad_output", b)
    assert acc.pending()
    acc.flush(7)
    assert not acc.pending() and acc.first is None
    row = _row(acc.rows, role="input")
    assert (row["step"], row["rank"], row["module"], row["op"], row["pass"], row["recipe"],
            row["what_if"]) == (7, 3, "fc", "linear", "forward", "", False)
    pa, pb = _plain(a.tolist()), _plain(b.flatten().tolist())
    want = [pa[0] + pb[0], pa[1] + pb[1], 0.0, 0.0, pa[4] + pb[4], max(pa[5], pb[5]),
            min(pa[6], pb[6]), pa[7] + pb[7]]
    assert [row[k] for k in fields.PLAIN] == want == [2.0, 8.0, 0.0, 0.0, 3.0, 4.0, 0.5, 30.25]
    assert _row(acc.rows, role="grad_output")["pass"] == "backward"
    assert len(acc.records()) == 2


def test_a_what_if_recipe_adds_its_row_beside_the_observed_one():
    """A linear layer's input under a what-if recipe alone: the observed row and the what-if's,
    whose quantization fields are the reference quantizer's (fields.quant_stats)."""
    recipe = get_recipe("mxfp8")
    acc = Accumulator(StepReads(), [("mxfp8", recipe, True)], rank=0)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    acc.add("fc", "linear", "input", x)
    acc.add("fc", "linear", "output", x)   # not a quantized role: the observed row alone
    acc.flush(0)
    keys = sorted((r["role"], r["recipe"], r["what_if"]) for r in acc.rows)
    assert keys == [("input", "", False), ("input", "mxfp8", True), ("output", "", False)]
    row = _row(acc.rows, role="input", recipe="mxfp8")
    want = {k: float(v) for k, v in fields.quant_stats(x, recipe.x).items()}
    for k in ("q_n", "q_underflow", "q_saturated", "blk_n", "blk_clip"):
        assert row[k] == want[k], k
    assert row["q_err_sq"] == pytest.approx(want["q_err_sq"], rel=1e-12)
    assert _row(acc.rows, role="input", recipe="")["q_n"] == 0.0


def test_the_accumulator_names_the_first_producer_from_hand_made_observations():
    """Producer checks fed as observations (host lists, and a Pending whose rows wait for the
    read-back): the first call whose inputs are finite and outputs are not is named, with its
    inputs' statistics; a call fed a non-finite input is not a producer."""
    acc = Accumulator(StepReads(), [], rank=0)
    finite = [1.0, 4.0, 0.0, 0.0, 1.0, 3.0, 0.5, 10.0]
    nan_in = [1.0, 4.0, 1.0, 0.0, 0.0, 3.0, 0.5, 9.0]
    rows_ok = torch.tensor([[1, 6, 0, 0, 0, 2.0, 0.25, 5.0]], dtype=torch.float64)
    rows_inf = torch.tensor([[1, 6, 0, 2, 0, 2.0, 0.25, 5.0]], dtype=torch.float64)
    acc.event("a", "linear", "output", "forward", finite, finite)         # finite: no producer
    acc.event("b", "norm", "output", "forward", nan_in, nan_in)           # NaN came in with it
    acc.event("bb", "norm", "output", "forward", Pending(None, (rows_inf,)),
              Pending(None, (rows_inf,)))                                  # so did an Inf
    acc.event("c", "module", "output", "forward", Pending(finite, (rows_ok,)),
              Pending(None, (rows_inf,)))                                  # decided at flush
    acc.event("d", "linear", "output", "forward", finite, nan_in)         # a later producer
    acc.flush(5)
    assert acc.first == (5, "c", "module", "output", "forward")
    assert isinstance(acc.first, NonFinite)
    assert acc.first.inputs == {"n": 10.0, "n_nan": 0.0, "n_inf": 0.0, "amax": 3.0,
                                "min_nonzero": 0.25}
    acc.event("e", "linear", "output", "forward", finite, nan_in)
    acc.flush(6)
    assert acc.first.module == "c"   # the first producer stays the first


def test_the_step_memo_reads_a_tensor_once_until_it_changes():
    reads = StepReads()
    t = torch.tensor([1.0, -3.0, 0.0])
    p = reads.fields_of(t, True)
    assert reads.fields_of(t, True) is p   # met again: not read again
    t.add_(1.0)                            # a new version: read again
    q = reads.fields_of(t, True)
    assert q is not p and q[5] == 2.0
    reads.forwards += 1                    # another forward of the root: read again
    assert reads.fields_of(t, True) is not q
    # an observation of several tensors: finite only where each of them is
    bad = reads.observe([t, torch.tensor([math.inf])])
    good = reads.observe([t])
    for obs, want in ((bad, False), (good, True)):
        got = read_back(obs.rows) if isinstance(obs, Pending) else {}
        assert finite(obs, got) is want
    assert not all_finite([torch.tensor([math.inf])]) and all_finite([t])


# ---- the shadows ---------------------------------------------------------------------------

def _sqnr_db(parts: list, prefix: str) -> float:
    d = {}
    for p in parts:
        assert isinstance(p, dict)   # CPU: floats (compiled pass) or CPU tensors (torch route)
        d.update({k: float(v) for k, v in p.items()})
    assert d[f"{prefix}_n"] == 1.0
    return 10.0 * math.log10(d[f"{prefix}_sig_sq"] / d[f"{prefix}_err_sq"])


def test_the_shadow_of_a_linear_layer_gives_the_sqnr_of_a_float64_computation():
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    x = torch.randn(5, 16)
    watch = SimpleNamespace(busy=False)
    sh = Shadows(lin, {lin: "linear"}, True, watch)
    out = lin(x)
    ref = sh.layer_ref(lin, "linear", (x,), {})
    assert ref.dtype == torch.float64 and not watch.busy
    # the reference computed independently: a float64 sum of products, element by element
    w, b = lin.weight.detach().double(), lin.bias.detach().double()
    ind = (x.double()[:, None, :] * w[None]).sum(-1) + b
    sig = (ind * ind).sum().item()
    err = ((out.detach().double() - ind) ** 2).sum().item()
    assert 0 < err and _sqnr_db(sqnr_pair(out, ref, "sh"), "sh") == \
        pytest.approx(10.0 * math.log10(sig / err), abs=1e-6)
    assert _sqnr_db(sh.output_extra(lin, ROOT, "linear", (x,), {}, out), "sh") == \
        pytest.approx(10.0 * math.log10(sig / err), abs=1e-6)


def test_the_whole_model_shadow_runs_the_live_weights_in_float64():
    """The model copy is refreshed from the live weights at each run; its watched layers'
    outputs wait per name for the live ones; a norm's own shadow is its float64 copy; the
    watch is busy while a shadow runs (a hook the copies took along sees it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.LayerNorm(8))
    ops = {m: classify(m) for m in model.modules()}
    watch = SimpleNamespace(busy=False)
    seen = []
    model[2].register_forward_hook(lambda *a: seen.append(watch.busy))
    sh = Shadows(model, ops, True, watch)
    assert set(sh.layers) == {model[2]}
    with torch.no_grad():
        model[0].weight.mul_(2.0)   # after watch: the copy must take the live weights
    x = torch.randn(3, 8)
    sh.run_model((x,), {})
    assert seen == [True] and not watch.busy
    ref = copy.deepcopy(model).double()(x.double())   # (its copy of the hook sees False)
    seen.clear()
    assert sorted(sh.e2e_out) == ["0", "2"]
    assert torch.equal(sh.e2e_out["2"][0], ref)
    with torch.no_grad():   # as the hooks call it
        h = model[1](model[0](x))
        assert torch.equal(sh.layer_ref(model[2], "norm", (h,), {}),
                           F.layer_norm(h.double(), (8,), model[2].weight.double(),
                                        model[2].bias.double()))
    assert seen == [True] and not watch.busy
    assert len(sh.model64[0]._forward_hooks) == 1
    sh.close()
    assert len(sh.model64[0]._forward_hooks) == 0 and len(sh.model64[2]._forward_hooks) == 1


def test_no_shadows_when_off():
    lin = nn.Linear(4, 4)
    sh = Shadows(lin, {lin: "linear"}, False, SimpleNamespace(busy=False))
    assert sh.model64 is None and sh.layers == {} and sh.handles == []


# ---- the hooks -----------------------------------------------------------------------------

def _hooks(model: nn.Module):
    watch = SimpleNamespace(enabled=True, busy=False, recording=True, every=1,
                            checking=lambda: acc.first is None)
    names = {m: (n or ROOT) for n, m in model.named_modules()}
    ops = {m: classify(m) for m in names}
    reads = StepReads()
    acc = Accumulator(reads, [], rank=0)
    hooks = Hooks(watch, model, names, ops, reads, acc,
                  Shadows(model, ops, False, watch), Sentinel(watch))
    return hooks, acc


def _left(model: nn.Module, *tensors) -> list[str]:
    """Every hook still on the model's modules, parameters or the given tensors."""
    left = [f"module {n}" for n, m in model.named_modules()
            if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks]
    return left + [f"tensor {i}" for i, t in enumerate([*model.parameters(), *tensors])
                   if t._backward_hooks]


def test_the_hooks_record_every_role_and_leave_nothing_behind():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 2))
    hooks, acc = _hooks(model)
    hooks.attach()
    # a forward pre- and post-hook per module; a gradient check per parameter (weights and
    # biases: every parameter's gradient is checked, watched module or not)
    assert len(hooks.handles) == 2 * 4 and len(hooks.weight_handles) == 6
    assert _left(model)
    x = torch.randn(3, 4, requires_grad=True)   # a leaf: its hook is dropped at the step's end
    model(x).sum().backward()
    assert hooks.root_seen and hooks.leaf_handles and x._backward_hooks
    acc.flush(0)
    got = {(r["module"], r["role"]) for r in acc.rows}
    assert {("0", role) for role in ("input", "weight", "output", "grad_output",
                                     "grad_input", "grad_weight")} <= got
    assert {("1", "weight"), ("2", "grad_weight")} <= got and acc.first is None
    hooks.detach()
    hooks.drop_leaf_hooks()
    assert _left(model, x) == []
    model(x).sum().backward()   # detached: nothing more is read
    assert not acc.pending()


def test_the_hooks_name_the_module_that_made_the_first_inf():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with torch.no_grad():
        model[1].weight.fill_(1e30)
    hooks, acc = _hooks(model)
    hooks.attach()
    model(torch.full((2, 4), 1e10)).sum().backward()
    acc.flush(0)
    assert acc.first == (0, "1", "linear", "output", "forward")
    hooks.detach()
    assert _left(model) == []


# ---- the generator states ------------------------------------------------------------------

def test_generator_states_put_back_replay_the_same_draws():
    drop = nn.Dropout(0.5)
    x = torch.ones(64)
    states = rng_states(drop, (x,))
    a = drop(x)
    set_rng_states(states)
    assert torch.equal(drop(x), a)


def test_the_shadows_fork_leaves_the_live_generator_where_it_was():
    lin = nn.Linear(2, 2)
    torch.manual_seed(1)
    before = torch.get_rng_state()
    with own_rng(lin, (torch.ones(2),)):
        inside = torch.rand(100)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(torch.rand(100), inside)   # the fork drew what the live run draws next
