"""The producer check on the steps ``every`` does not record: a sentinel, and a replay.

On a recorded step every module carries the hooks of watch.py: the producer check reads each
module call's inputs, outputs and gradients. On the steps in between (``every`` > 1) that check
was most of the watch's cost (1.6x a tiny model's step on CPU: Python per module call and per
tensor). There the model carries only this sentinel, on the root module:

* its forward pre-hook keeps what the forward needs to run again: a copy of its arguments, the
  generator states it starts from (dropout draws the same mask), the grad mode and the
  autocast regions it runs in;
* its forward hook reads the root's outputs (finite or not) and puts a hook on each one that
  needs a gradient: it keeps that gradient and queues one callback at the end of the backward,
  which reads the parameters' gradients (finite or not);
* where anything read is not finite, the parameters and buffers are copied then (the values
  the step's forward used: the optimizer has not run yet), and ``step()`` replays the step:
  those values put back into the model for the replay, each forward run again from its own
  arguments and generator states with watch.py's full hooks on, and its backward run from
  the kept gradients of the root's outputs (``torch.autograd.grad``: the parameters' ``.grad``
  are not touched). The replay names the producer as the full check would have on the live
  step; the model's values and the generator states are put back afterwards.

What the sentinel cannot see, it cannot replay: a non-finite value that never reaches the
root's outputs nor a parameter's gradient (produced and then masked, or flowing only into an
input's gradient), and a forward that does not run again the same way (state kept outside the
parameters and buffers or the grad and autocast modes, a TorchFunctionMode or dispatch mode
of the user's around the forward, nondeterministic kernels). A replay that names nobody (the non-finite
came with the data, from the loss, or from parameters already non-finite) warns.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn


def _copy_args(obj):
    """A copy of an argument structure whose tensors are detached copies (a tensor that
    needed a gradient needs one again: the replay's backward reaches it)."""
    if isinstance(obj, torch.Tensor):
        c = obj.detach().clone()
        return c.requires_grad_() if obj.requires_grad and c.is_floating_point() else c
    if isinstance(obj, (tuple, list)):
        return type(obj)(_copy_args(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _copy_args(v) for k, v in obj.items()}
    return obj


@dataclass
class _Forward:
    """One forward of the root in this step: what it takes to run it again."""

    args: tuple
    kwargs: dict
    rng: tuple
    grad: bool                  # grad mode (some modules take another path without it)
    autocast: tuple             # (device type, dtype) of each autocast region it ran in
    grads: dict = field(default_factory=dict)   # output index -> its gradient


class Sentinel:
    """The root's sentinel hooks of a Telemetry ``tel`` (watch.Telemetry) for one step."""

    def __init__(self, tel) -> None:
        self.tel = tel
        self.log: list[_Forward] = []
        self.flags: list = []          # all finite: bools (CPU) or 0-d device tensors
        self.snapshot: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.queued = False
        self.handles: list = []

    def attach(self, root: nn.Module) -> None:
        self.handles.append(root.register_forward_pre_hook(self._pre, with_kwargs=True))
        self.handles.append(root.register_forward_hook(self._post, with_kwargs=True))

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def clear(self) -> None:
        self.log.clear()
        self.flags.clear()
        self.snapshot = None
        self.queued = False

    # ---- hooks ---------------------------------------------------------------------------

    def _pre(self, mod, args, kwargs):
        tel = self.tel
        if not tel.enabled or tel.busy:
            return
        kinds = {"cpu"} | {k for k, _ in tel._devs}
        amp = tuple((k, torch.get_autocast_dtype(k)) for k in sorted(kinds)
                    if torch.is_autocast_enabled(k))
        self.log.append(_Forward(_copy_args(args), _copy_args(kwargs),
                                 tel._rng_of(args, kwargs), torch.is_grad_enabled(), amp))

    def _post(self, mod, args, kwargs, out):
        tel = self.tel
        if not tel.enabled or tel.busy or not self.log:
            return
        entry = self.log[-1]
        outs = tel._float_tensors(out)
        self.flags.append(tel._all_finite(outs))
        if torch.is_grad_enabled():
            for i, o in enumerate(outs):
                if o.requires_grad:
                    tel._keep(o, o.register_hook(self._grad(entry, i)))

    def _grad(self, entry: _Forward, i: int):
        def hook(grad):
            if not self.tel.enabled or self.tel.busy:
                return None
            entry.grads[i] = grad.detach()
            if not self.queued:
                self.queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            return None
        return hook

    def _end_of_backward(self) -> None:
        """After the backward, before the optimizer: the parameters' gradients, read."""
        self.queued = False
        self.flags.append(self.tel._all_finite(
            [p.grad for p in self.tel.model.parameters() if p.grad is not None]))
        if self.snapshot is None and not self.settled():
            self._freeze()

    # ---- after the step ------------------------------------------------------------------

    def settled(self) -> bool:
        """Whether everything read so far was finite (device flags read here, once)."""
        host = [f for f in self.flags if isinstance(f, bool)]
        dev = [f for f in self.flags if not isinstance(f, bool)]
        ok = all(host) and (not dev or bool(torch.stack([f.to(dev[0].device)
                                                           for f in dev]).all()))
        self.flags = [ok]
        return ok

    def _freeze(self) -> None:
        if self.snapshot is None:
            m = self.tel.model
            with torch.no_grad():
                self.snapshot = [(t, t.detach().clone())
                                 for t in (*m.parameters(), *m.buffers())]

    def due(self) -> bool:
        """Whether this step needs a replay (a forward-only step is read here)."""
        if self.snapshot is None and self.log and not self.settled():
            self._freeze()
        return self.snapshot is not None

    def replay(self) -> None:
        """Run the step's forwards and backwards again with the full hooks on (``tel`` has
        attached them), from the frozen parameter values; then put everything back."""
        tel = self.tel
        after = tel._rng_of(*(f.args for f in self.log))
        now = [(t, t.detach().clone()) for t, _ in self.snapshot]
        try:
            with torch.no_grad():
                for t, v in self.snapshot:
                    t.copy_(v)
            for entry in self.log:
                tel._set_rng(entry.rng)
                with contextlib.ExitStack() as ctx:   # the live forward's grad and autocast
                    ctx.enter_context(torch.set_grad_enabled(entry.grad))
                    for kind, dtype in entry.autocast:
                        ctx.enter_context(torch.autocast(kind, dtype=dtype))
                    out = tel.model(*entry.args, **entry.kwargs)
                outs = tel._float_tensors(out)
                pairs = [(outs[i], g) for i, g in entry.grads.items()
                         if i < len(outs) and outs[i].requires_grad]
                leaves = [p for p in tel.model.parameters() if p.requires_grad] + \
                    [a for a in tel._float_tensors((entry.args, entry.kwargs))
                     if a.requires_grad]
                if pairs and leaves:
                    torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                        allow_unused=True)
        finally:
            with torch.no_grad():
                for t, v in now:
                    t.copy_(v)
            tel._set_rng(after)

    def named_nobody(self, step: int) -> None:
        warnings.warn(
            f"numcheck.telemetry: step {step} (not recorded: every={self.tel.every}) produced "
            "a non-finite value, and its replay named no producer: it came with the data, from "
            "the loss or from non-finite parameters, or the step does not replay the same way "
            "(state outside the parameters and buffers, nondeterministic kernels)",
            RuntimeWarning, stacklevel=3)
