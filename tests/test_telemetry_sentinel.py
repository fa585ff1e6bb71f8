"""The producer check on steps ``every`` skips (numcheck/telemetry/sentinel.py): the sentinel
sees the non-finite value, the replay names the producer the full check names on the live step
(same step, module, op, role, pass and input statistics), and the run goes on as it would have
without the replay: parameters, their gradients and the generators' states bitwise equal."""
from __future__ import annotations

import math
import importlib
import warnings
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from numcheck import telemetry
from tests._telemetry_models import BareSqrt, Exp, InPlaceBoom

FAULT = 4   # the step the fault comes at: not recorded at every=3 (0, 3, 6 are)


class _Noise(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)  # the generator's draw: the replay must draw it again


class _NaNIfLarge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.large = bool(x.abs().max() > 10)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan") if ctx.large else g


class _BadBackward(nn.Module):
    def forward(self, x):
        return _NaNIfLarge.apply(x)


class _Parts(nn.Module):
    """Its root is never called: the children are (the sentinel cannot watch it)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = _eye(nn.Linear(8, 8), 100.0), Exp()


def _eye(lin: nn.Linear, scale: float) -> nn.Linear:
    with torch.no_grad():
        lin.weight.copy_(torch.eye(lin.in_features) * scale)
        lin.bias.zero_()
    return lin


def _fwd_overflow():
    return nn.Sequential(_eye(nn.Linear(8, 8), 100.0), _Noise(), Exp(), nn.Linear(8, 8),
                         nn.Dropout(0.3), nn.LayerNorm(8))


def _bwd_nan():
    return nn.Sequential(_eye(nn.Linear(8, 8), 1.0), _BadBackward(), nn.LayerNorm(8),
                         nn.Dropout(0.2), nn.Linear(8, 4))


def _bare_sqrt():
    m = BareSqrt(width=8)
    with torch.no_grad():
        m.l1.bias.fill_(-100.0)   # h == 0 exactly: sqrt's gradient is inf on every step
    return m


def _x(step: int, big: float, fault: int = FAULT) -> torch.Tensor:
    return torch.full((4, 8), big if step == fault else 1e-3)


def _train(make, big, every, micro=1, no_grad=False, parts=False, autocast=False, body=None,
           fault=FAULT, set_to_none=True, fault_in=-1):
    """A few SGD steps of ``make()`` under watch(every=every), the fault at step ``fault`` (in
    micro-batch ``fault_in``, the last by default; ``body(model, x)``: the step's own forward
    and backward;
    ``set_to_none=False``: gradients zeroed in place); returns (first_nonfinite, its inputs,
    parameters, their gradients, the CPU generator's state after the run, the warnings)."""
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = telemetry.watch(model, every=every) if every else None
        for step in range(7):
            opt.zero_grad(set_to_none=set_to_none)
            for k in range(micro):
                x = _x(step, big, fault) if k == fault_in % micro else _x(0, big)
                if body is not None:
                    body(model, x)
                    continue
                if no_grad:
                    with torch.no_grad():
                        model(x)
                    continue
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    out = model.b(model.a(x)) if parts else model(x)
                out.float().sum().backward()
            if not no_grad and any(p.grad is not None for p in model.parameters()):
                opt.step()
            torch.rand(3)   # the user's own draws after the forward: the replay keeps them
            if t is not None:
                t.step()
        if t is not None:
            t.close()
    nf = t.first_nonfinite() if t is not None else None
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    return (nf, getattr(nf, "inputs", None), [p.detach().clone() for p in model.parameters()],
            grads, torch.get_rng_state(), [str(w.message) for w in caught])


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


Batch = namedtuple("Batch", "x scale")


class _Batched(nn.Module):
    """Takes a namedtuple (the sentinel's copy rebuilds it from its fields)."""

    def __init__(self):
        super().__init__()
        self.net = _fwd_overflow()

    def forward(self, b):
        return self.net(b.x * b.scale)


def _eval_then_train(model, x):
    """A validation forward in eval mode (the fault), then a training forward and backward
    before the step ends: the replay needs the eval mode and BatchNorm's statistics as the
    eval forward found them."""
    model.eval()
    with torch.no_grad():
        model(x)
    model.train()
    model(_x(0, 0.0)).sum().backward()


def _grad_loop(model, x):
    """torch.autograd.grad instead of backward(): the parameters' .grad are set by hand."""
    ps = list(model.parameters())
    for p, g in zip(ps, torch.autograd.grad(model(x).sum(), ps), strict=True):
        p.grad = g


def _keeps_old_grads(model, x):
    """A backward that keeps each step's gradients (for a later metric): two live .grad
    tensors are compared by identity, never by value."""
    model(x).sum().backward()
    model.held = [*getattr(model, "held", []), [p.grad for p in model.parameters()]]


def _clip_then_grad_metric(model, x):
    """A clean backward, clip_grad_norm_ (in place: versions move), then a
    torch.autograd.grad metric that holds the fault."""
    model(_x(0, 0.0)).sum().backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    torch.autograd.grad(model(x).sum(), list(model.parameters()))


def _grad_loop_copy(model, x):
    """torch.autograd.grad, then copied into the .grad tensors (zeroed in place before)."""
    ps = list(model.parameters())
    for p, g in zip(ps, torch.autograd.grad(model(x).sum(), ps), strict=True):
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)


def _replaces_first_layer(model, x):
    """model[0] replaced by a new Linear on the second step (after watch): its parameters are
    read from then on."""
    model.calls = getattr(model, "calls", 0) + 1
    if model.calls == 2:
        model[0] = _eye(nn.Linear(8, 8), 1.0)
    model(x).sum().backward()


def _grad_loop_but_first(model, x):
    """torch.autograd.grad over every parameter but the first: the engine answers for the
    first (it will not run its accumulator) and refuses for the others."""
    ps = list(model.parameters())[1:]
    for p, g in zip(ps, torch.autograd.grad(model(x).sum(), ps), strict=True):
        p.grad = g


def _inference(model, x):
    with torch.inference_mode():
        model(x)


class _HalfGrad(torch.autograd.Function):
    """Identity forward; a backward that multiplies in fp16 (inf past |g| = 65504 / 256)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return (g.half() * 256).float() / 256


class _LossAndLogits(nn.Module):
    """Returns (loss, logits), the loss computed from the logits (``model(..., labels=...)``):
    the logits' gradient arrives through the loss. Between the NaN-making backward (net.1) and
    the head, an fp16 backward (net.2) that overflows at twice the live gradient: a replay
    seeding the logits with their total gradient as well as the loss named net.2 at every=3."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(_eye(nn.Linear(8, 8), 1.0), _BadBackward(),
                                 _Module(_HalfGrad.apply), nn.Linear(8, 4))

    def forward(self, x):
        logits = self.net(x)
        return logits.float().pow(2).mean(), logits


class _Module(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


# the loss scale: net.2 overflows live above 139.9 (measured), on a doubled gradient above 70
LOSS_SCALE = 100.0


def _boom_net():
    return nn.Sequential(nn.Sequential(_eye(nn.Linear(8, 8), 1.0), InPlaceBoom()),
                         nn.Linear(8, 1))


def _bwd_case(fault=FAULT, **kw) -> dict:
    """A case of _bwd_nan's backward NaN at step ``fault``: its producer is module 1."""
    return dict(make=_bwd_nan, big=50.0, fault=fault,
                want=(fault, "1", "module", "grad_input", "backward"), **kw)


CASES = {
    "forward overflow": dict(make=_fwd_overflow, big=2.0,
                             want=(FAULT, "2", "module", "output", "forward")),
    "backward NaN": _bwd_case(),
    "under bf16 autocast": dict(make=_fwd_overflow, big=2.0, autocast=True,
                                want=(FAULT, "2", "module", "output", "forward")),
    "second micro-batch": dict(make=_fwd_overflow, big=2.0, micro=2,
                               want=(FAULT, "2", "module", "output", "forward")),
    "in-place, no backward": dict(make=_boom_net, big=100.0, no_grad=True,
                                  want=(FAULT, "0.1", "module", "output", "forward")),
    "in-place, inference mode": dict(make=_boom_net, big=100.0, body=_inference,
                                     want=(FAULT, "0.1", "module", "output", "forward")),
    "in-place on the root's argument, inference mode": dict(
        make=lambda: nn.Sequential(InPlaceBoom(), nn.Linear(8, 1)), big=100.0, body=_inference,
        want=(FAULT, "0", "module", "output", "forward")),
    "a namedtuple argument": dict(make=_Batched, big=2.0,
                                  body=lambda m, x: m(Batch(x, 1.0)).sum().backward(),
                                  want=(FAULT, "net.2", "module", "output", "forward")),
    "eval forward, then train (BatchNorm)": dict(
        make=lambda: nn.Sequential(_eye(nn.Linear(8, 8), 100.0), nn.BatchNorm1d(8),
                                   nn.Linear(8, 8), Exp(), nn.Dropout(0.3), nn.Linear(8, 4)),
        big=2.0, body=_eval_then_train, want=(FAULT, "3", "module", "output", "forward")),
    "torch.autograd.grad": _bwd_case(body=_grad_loop),
    # the first unrecorded step: its backward wrote no .grad, so the step is replayed
    "torch.autograd.grad, step 1": _bwd_case(1, body=_grad_loop),
    "backward NaN, gradients zeroed in place": _bwd_case(set_to_none=False),
    "the previous steps' gradients kept alive, fault on step 1": _bwd_case(
        1, body=_keeps_old_grads),
    "clip_grad_norm_, then a torch.autograd.grad metric": _bwd_case(body=_clip_then_grad_metric),
    "torch.autograd.grad copied into .grad zeroed in place": _bwd_case(
        body=_grad_loop_copy, set_to_none=False),
    "first layer replaced after watch, fault on step 2": _bwd_case(2, body=_replaces_first_layer),
    "torch.autograd.grad over all parameters but the first": _bwd_case(body=_grad_loop_but_first),
    "backward NaN in the first of two micro-batches": _bwd_case(micro=2, fault_in=0),
    "the loss and the logits returned, under a loss scale": dict(
        make=_LossAndLogits, big=50.0, body=lambda m, x: (m(x)[0] * LOSS_SCALE).backward(),
        want=(FAULT, "net.1", "module", "grad_input", "backward")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_replay_names_what_the_full_check_names(case):
    kw = dict(CASES[case])
    want = kw.pop("want")
    full = _train(every=1, **kw)
    sampled = _train(every=3, **kw)
    assert full[0] == want
    assert sampled[0] == want
    assert sampled[1] == full[1]   # the producer's input statistics: the same tensors
    # the replay leaves the run as it was: parameters, gradients, generator state
    plain = _train(every=0, **kw)
    assert all(_same(a, b) for a, b in zip(sampled[2], plain[2], strict=True))
    assert all(_same(a, b) for a, b in zip(sampled[3], plain[3], strict=True))
    assert torch.equal(sampled[4], plain[4])
    assert not [w for w in sampled[5] if "named no producer" in w]


def test_the_replay_draws_the_live_forwards_random_numbers():
    kw = dict(CASES["forward overflow"])
    kw.pop("want")
    a, b = _train(every=1, **kw), _train(every=3, **kw)
    # the producer's input went through _Noise: its amax is 200 plus this step's draw
    assert a[1]["amax"] != 200.0 and b[1]["amax"] == a[1]["amax"]


def test_a_replay_that_names_nobody_warns():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    with warnings.catch_warnings(record=True) as caught, telemetry.watch(model, every=3) as t:
        warnings.simplefilter("always")
        for step in range(6):
            loss = model(_x(step, 1.0)).sum()
            (loss * math.nan if step == FAULT else loss).backward()  # a NaN from the loss
            t.step()
    why = t.first_nonfinite()   # the layers only propagate it: made by the loss
    assert not why and (why.reason, why.step) == ("outside", FAULT), why
    assert [str(w.message) for w in caught if "named no producer" in str(w.message)]


def test_a_value_masked_before_any_gradient_is_not_seen():
    """sqrt'(0) = inf enters h's gradient, and relu's backward masks it (h == 0): the full
    check sees the module's total input gradient, the sentinel nothing (documented)."""
    full = _train(_bare_sqrt, 1e-3, every=1)
    sampled = _train(_bare_sqrt, 1e-3, every=3)
    assert not full[0] and not sampled[0]
    assert not [w for w in sampled[5] if "named no producer" in w]


def test_a_root_never_called_keeps_the_full_check_every_step():
    sampled = _train(_Parts, 2.0, every=3, parts=True)
    # Exp is reached directly: no root forward, so every step carries the full hooks
    assert sampled[0] == (FAULT, "b", "module", "output", "forward")


def _hooks(model) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_steps_between_recorded_ones_carry_only_the_roots_sentinel():
    torch.manual_seed(0)
    model = _fwd_overflow()
    counts = []
    with telemetry.watch(model, every=3) as t:
        for step in range(7):
            counts.append(_hooks(model))
            model(_x(step, 2.0)).sum().backward()
            t.step()
    full = 2 * len(list(model.modules()))
    # 0: full; 1, 2: sentinel; 3: full; 4: sentinel (the fault, replayed); 5: none (named)
    assert counts == [full, 2, 2, full, 2, 0, full]
    assert t.first_nonfinite()[0] == FAULT
    assert _hooks(model) == 0


def _param_hooks(model) -> int:
    return sum(len(p._backward_hooks or {}) for p in model.parameters())


@pytest.mark.parametrize("how", ["backward", "backward, zeroed in place", "autograd.grad"])
def test_the_sentinel_reads_grad_and_hooks_parameters_only_where_backward_writes_none(how):
    """A backward writes .grad (a new tensor or accumulated in place): the sentinel reads it,
    no hook on any parameter; torch.autograd.grad writes none: from its first unrecorded step
    on, a hook on each parameter, and no warning for that step's replay."""
    torch.manual_seed(0)
    model = _bwd_nan()
    counts = []
    with warnings.catch_warnings(record=True) as caught, telemetry.watch(model, every=3) as t:
        warnings.simplefilter("always")
        for step in range(6):
            counts.append(_param_hooks(model))
            model.zero_grad(set_to_none=how != "backward, zeroed in place")
            if how == "autograd.grad":
                _grad_loop(model, _x(step, 0.0))
            else:
                model(_x(step, 0.0)).sum().backward()
            t.step()
    n = len(list(model.parameters()))
    # the sentinel's steps 1, 2, 4, 5 (0 and 3 carry the full check's weight hooks)
    hooked = [c for i, c in enumerate(counts) if i % 3]
    assert hooked == ([0, n, n, n] if how == "autograd.grad" else [0, 0, 0, 0]), counts
    assert not t.first_nonfinite()
    assert not [w for w in caught if "named no producer" in str(w.message)]


def test_gradients_set_under_inference_mode_are_read_without_raising():
    """An inference tensor has no version counter: its .grad is read at every backward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    with warnings.catch_warnings(record=True) as caught, telemetry.watch(model, every=3) as t:
        warnings.simplefilter("always")
        for step in range(5):
            ps = list(model.parameters())
            grads = torch.autograd.grad(model(_x(step, 0.0)).sum(), ps)
            with torch.inference_mode():
                for p, g in zip(ps, grads, strict=True):
                    p.grad = g * 1.0
            t.step()
    assert not t.first_nonfinite()
    assert not [w for w in caught if "numcheck" in str(w.message)]


@dataclass
class _Out:
    y: torch.Tensor


class _Opaque(nn.Module):
    """Returns a dataclass: no tensor the sentinel can read."""

    def __init__(self):
        super().__init__()
        self.net = _fwd_overflow()

    def forward(self, x):
        return _Out(self.net(x))


def test_a_root_the_sentinel_cannot_read_keeps_the_full_check_with_a_warning():
    sampled = _train(_Opaque, 2.0, every=3, body=lambda m, x: m(x).y.sum().backward())
    assert sampled[0] == (FAULT, "net.2", "module", "output", "forward")
    assert [w for w in sampled[5] if "outputs hold no tensor" in w]


def test_several_ranks_keep_the_full_check(monkeypatch):
    # a replay on one rank would wait on collectives the other ranks never join
    watch_mod = importlib.import_module("numcheck.telemetry.watcher")
    monkeypatch.setattr(watch_mod, "_several_ranks", lambda: True)
    model = _fwd_overflow()
    with telemetry.watch(model, every=3) as t:
        for step in range(3):
            assert _hooks(model) == 2 * len(list(model.modules())), step
            model(_x(step, 2.0)).sum().backward()
            t.step()


class _FailsOnReplay(nn.Module):
    def __init__(self):
        super().__init__()
        self.net, self.calls = _fwd_overflow(), 0

    def forward(self, x):
        self.calls += 1
        if self.calls == FAULT + 2:   # the replay of step FAULT: its forward's second run
            raise RuntimeError("planted")
        return self.net(x)


def test_a_replay_that_fails_warns_and_the_run_goes_on():
    torch.manual_seed(0)
    model = _FailsOnReplay()
    with warnings.catch_warnings(record=True) as caught, telemetry.watch(model, every=3) as t:
        warnings.simplefilter("always")
        for step in range(7):
            model(_x(step, 2.0)).sum().backward()
            t.step()
    assert t.step_index == 7 and not t.first_nonfinite()
    assert [w for w in caught if "the replay of step 4 failed (RuntimeError: planted)"
            in str(w.message)]
    assert _hooks(model) == 0 and t.records().step.max() == 6   # steps 0, 3, 6 recorded


def test_a_fault_on_the_first_unrecorded_step_of_an_unreadable_root_is_named():
    torch.manual_seed(0)
    model = _Opaque()
    with warnings.catch_warnings(record=True), telemetry.watch(model, every=3) as t:
        for step in range(3):
            model(_x(step + FAULT - 1, 2.0)).y.sum().backward()   # the fault at step 1
            t.step()
    assert t.first_nonfinite() == (1, "net.2", "module", "output", "forward")


def test_a_loop_that_stops_on_a_nan_loss_before_step_still_gets_its_replay():
    torch.manual_seed(0)
    model = _fwd_overflow()
    with telemetry.watch(model, every=3) as t:
        for step in range(7):
            loss = model(_x(step, 2.0)).sum()
            if not torch.isfinite(loss):
                break   # no t.step(): close() ends the step
            loss.backward()
            t.step()
    assert t.first_nonfinite() == (FAULT, "2", "module", "output", "forward")


class _LastBatch(nn.Module):
    """Keeps the last batch in a buffer whose shape follows the batch."""

    def __init__(self):
        super().__init__()
        self.net = _fwd_overflow()
        self.register_buffer("last", torch.zeros(4, 8))

    def forward(self, x):
        y = self.net(x) + self.last.sum() * 0
        self.last = x.detach().clone()
        return y


def test_a_buffer_replaced_by_one_of_another_shape_replays():
    torch.manual_seed(0)
    model = _LastBatch()
    with telemetry.watch(model, every=3) as t:
        for step in range(6):
            rows = 6 if step == FAULT - 1 else 4
            model(torch.full((rows, 8), 2.0 if step == FAULT else 1e-3)).sum().backward()
            t.step()
    assert t.first_nonfinite() == (FAULT, "net.2", "module", "output", "forward")
    assert model.last.shape == (4, 8)


@pytest.mark.parametrize("every", [1, 3])
def test_a_layer_unfrozen_after_arming_is_watched(every):
    torch.manual_seed(0)
    model = _bwd_nan()
    model[0].requires_grad_(False)
    with telemetry.watch(model, every=every) as t:
        for step in range(6):
            if step == FAULT:
                model[0].requires_grad_(True)
                model[4].requires_grad_(False)
            model(_x(step, 50.0)).sum().backward()
            t.step()
    assert t.first_nonfinite() == (FAULT, "1", "module", "grad_input", "backward")
    if every == 1:   # the weight's gradient hook came with it: its row at step FAULT
        rows = t.records().query("module == '0' and role == 'grad_weight'")
        assert list(rows.step) == [FAULT, FAULT + 1]


class _SparseEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.e, self.l = nn.Embedding(10, 8, sparse=True), nn.Linear(8, 8)
        self.bad = _BadBackward()

    def forward(self, i):
        return self.l(self.bad(self.e(i) * self.scale))


def test_a_sparse_gradient_is_read_and_the_producer_named():
    """nn.Embedding(sparse=True): its gradient's values are read (the sentinel gave up on the
    sparse tensor before), and a backward NaN behind it is named as every=1 names it."""
    def run(every):
        torch.manual_seed(0)
        m = _SparseEmbed()
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        with warnings.catch_warnings(record=True) as caught, \
                telemetry.watch(m, every=every) as t:
            warnings.simplefilter("always")
            for step in range(6):
                m.scale = 100.0 if step == FAULT else 1e-3
                opt.zero_grad()
                m(torch.tensor([1, 2, 3])).sum().backward()
                t.step()
        return t.first_nonfinite(), [str(w.message) for w in caught]
    full, sampled = run(1), run(3)
    assert full[0] == (FAULT, "bad", "module", "grad_input", "backward")
    assert sampled[0] == full[0]
    assert not [w for w in sampled[1] if "numcheck" in w]
