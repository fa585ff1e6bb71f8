"""The producer check's fault table (issue 32): each fault at ``every=1`` and ``every=3``, and
what a hand check with plain PyTorch hooks finds on the same step.

Faults, each planted at step 4 (not a recorded step at ``every=3``) of a small model:

* forward overflow: a module computing exp of large activations (fp32 inf);
* attention overflow: fp16 attention whose logits q k^T pass 65504 (sdpa's output NaN);
* backward-only NaN: a module whose backward multiplies by NaN, its forward exact;
* embedding-only gradient overflow: an fp16 embedding whose one row collects 256 tokens'
  gradients under a loss scale of 1000 (the head and the body stay finite);
* loss-cast overflow: the logits cast to fp16 and scaled by 2^17 after the model;
* tied weights: the embedding shared with an fp16 head, the shared gradient overflowing.

The hand check is written apart from numcheck's hooks: ``register_forward_hook`` on every
module (the first, in completion order, whose floating inputs and own parameters are finite and
whose output is not), ``register_full_backward_hook`` (the first whose grad_output is finite
and grad_input is not) and a tensor hook per parameter (the first whose gradient is not finite
while the grad_outputs of the modules holding it are). It runs the fault step alone, unwatched.
The attention fault's producer is the sdpa call inside a module: the hand check names that
module (forward hooks see modules, not function calls).

    python bench/telemetry_fault_table.py
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

from numcheck import telemetry

FAULT, STEPS = 4, 6


class _NaNBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.bad = bool(x.abs().max() > 10)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan") if ctx.bad else g


class Exp(nn.Module):
    def forward(self, x):
        return torch.exp(x)


class BadBackward(nn.Module):
    def forward(self, x):
        return _NaNBackward.apply(x)


class Attention(nn.Module):
    """fp16 attention written out (CPU sdpa accumulates fp16 logits in fp32: no overflow)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).half().view(x.shape[0], -1, 3, 2, 8).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        p = torch.softmax(q @ k.transpose(-2, -1), -1)   # q k^T past 65504: inf, then NaN
        return (p @ v).transpose(1, 2).reshape(x.shape).float()


class AttnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.out = Attention(), nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.attn(x))


class LM(nn.Module):
    def __init__(self, tied: bool):
        super().__init__()
        self.embed = nn.Embedding(16, 8).half()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        if tied:
            self.head.half()
            self.head.weight = self.embed.weight

    def forward(self, ids):
        h = self.body(self.embed(ids).float())
        return self.head(h.to(self.head.weight.dtype)).float()


def _mlp(*middle):
    return nn.Sequential(nn.Linear(8, 8), *middle, nn.Linear(8, 4))


def _dense(step):
    return torch.full((4, 8), 1000.0 if step == FAULT else 1e-2)


def _tokens(step):
    g = torch.Generator().manual_seed(step)
    return torch.zeros(4, 64, dtype=torch.long) if step == FAULT else \
        torch.randint(0, 16, (4, 64), generator=g)


def _attn_in(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(2, 6, 16, generator=g) * (300.0 if step == FAULT else 1.0)


# name: (model factory, batch of a step, loss of the output and the step)
FAULTS = {
    "forward overflow": (lambda: _mlp(Exp()), _dense, lambda out, s: out.sum()),
    "attention overflow": (AttnNet, _attn_in, lambda out, s: out.sum()),
    "backward-only NaN": (lambda: _mlp(BadBackward()), lambda s: _dense(s) / 50,
                          lambda out, s: out.sum()),
    "embedding-only gradient overflow": (
        lambda: LM(False), _tokens, lambda out, s: out.sum() * (1000.0 if s == FAULT else 1.0)),
    "loss-cast overflow": (
        lambda: _mlp(nn.ReLU()), lambda s: _dense(s) * 1e-3,
        lambda out, s: (out.half() * 2.0 ** 17).float().sum() if s == FAULT else out.sum()),
    "tied weights": (
        lambda: LM(True), _tokens, lambda out, s: out.sum() * (100.0 if s == FAULT else 1.0)),
}


def _run(make, batch, loss, every):
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with telemetry.watch(model, every=every) as t:
            for step in range(STEPS):
                opt.zero_grad()
                loss(model(batch(step)), step).backward()
                t.step()
                if step == FAULT:
                    break   # the fault step is the last (its optimizer step would spread it)
                opt.step()
    return t.first_nonfinite()


def _finite(ts) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def _hand(make, batch, loss):
    """The fault step's producer by plain hooks (module doc), on the model as the watched run
    had it at that step (the same seed and steps before)."""
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    for step in range(FAULT):
        opt.zero_grad()
        loss(model(batch(step)), step).backward()
        opt.step()
    names = {m: n or "<model>" for n, m in model.named_modules()}
    found, gouts = [], {}

    def fwd(m, args, out):
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        own = list(m.parameters(recurse=False))
        if _finite(list(args) + own) and not _finite(outs):
            found.append((names[m], "forward"))
        for o in outs:   # its grad_output, seen before any gradient of what it consumed
            if o.requires_grad:
                o.register_hook(lambda g, m=m: gouts.setdefault(m, []).append(_finite([g])))

    def bwd(m, gin, gout):
        if _finite(gout) and not _finite(gin):
            found.append((names[m], "backward grad_input"))

    handles = [m.register_forward_hook(fwd) for m in names]
    handles += [m.register_full_backward_hook(bwd) for m in names if m is not model]
    holders = {}
    for m in names:
        for p in m.parameters(recurse=False):
            holders.setdefault(id(p), (p, []))[1].append(m)
    for p, ms in holders.values():
        def pgrad(g, ms=ms):
            if all(all(gouts.get(m, [True])) for m in ms) and not _finite([g]):
                found.append((" + ".join(names[m] for m in ms), "backward grad_weight"))
        handles.append(p.register_hook(pgrad))
    opt.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss(model(batch(FAULT)), FAULT).backward()
    for h in handles:
        h.remove()
    return found[0] if found else ("nobody", "")


def _cell(nf) -> str:
    if not nf:   # (None before NoProducer: run on an older numcheck)
        return f"none ({nf.reason})" if nf is not None else "none"
    return f"step {nf.step}: {nf.module} ({nf.op}), {nf.role}, {nf.pass_}"


def main() -> None:
    print("| fault | every=1 | every=3 | hand check (plain hooks) |")
    print("|---|---|---|---|")
    for name, (make, batch, loss) in FAULTS.items():
        one, three = _run(make, batch, loss, 1), _run(make, batch, loss, 3)
        same = "" if _cell(one) == _cell(three) else " **differs**"
        hand = _hand(make, batch, loss)
        print(f"| {name} | {_cell(one)} | {_cell(three)}{same} | {hand[0]}: {hand[1]} |")


if __name__ == "__main__":
    main()
