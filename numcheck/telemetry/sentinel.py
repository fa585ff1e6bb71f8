"""The producer check on the steps ``every`` does not record: a sentinel, and a replay.

On a recorded step every module carries the hooks of hooks.py: the producer check reads each
module call's inputs, outputs and gradients. On the steps in between (``every`` > 1) that check
was most of the watch's cost (1.6x a tiny model's step on CPU: Python per module call and per
tensor). There the model carries only this sentinel:

* the root's forward pre-hook keeps what the forward needs to run again: a copy of its
  arguments, the generator states it starts from (dropout draws the same mask), the grad,
  inference and autocast modes it runs in, each module's train/eval mode, and a copy of the
  buffers as it finds them (a forward that writes them, BatchNorm's statistics or a delayed
  scaling's amax history, must find them again);
* the root's forward hook reads the root's outputs (finite or not) and puts a hook on each one
  that needs a gradient: it keeps that gradient and queues one callback for the end of the
  backward;
* the callback reads the parameters' ``.grad`` that this backward wrote (a new tensor, or one
  accumulated into: its version moved; a tensor hook per parameter cost ~10 us each in the
  backward, a tenth of a tiny model's sentinel cost on CPU). A ``torch.autograd.grad`` writes
  no ``.grad`` (the output's hook asks the engine, which refuses to say whether it will run a
  parameter's accumulator there; where torch cannot tell: a backward that wrote no ``.grad``):
  its parameter gradients went unseen, so that step is replayed, naming a producer or nobody,
  without a warning, and from then on a hook on each parameter keeps its gradient as the
  backward makes it;
* at the end of a backward (before the optimizer) where anything read is not finite, the
  parameters and buffers are copied, and ``step()`` replays the step: those values put back
  into the model, each forward run again from what its pre-hook kept with hooks.py's full hooks
  on, and its backward run from the kept gradients of the root's outputs
  (``torch.autograd.grad``: the parameters' ``.grad`` are not touched), each seeded with what
  entered it from outside the graph: an output the others are computed from (logits returned
  beside a loss made of them) is seeded with its total less what the others send it, or its
  gradient would count twice (``_external``). The replay names the
  producer as the full check would have on the live step; the model's values, modes and the
  generator states are put back afterwards.

What the sentinel cannot see, it cannot replay: a non-finite value that never reaches the
root's outputs nor a parameter's gradient (produced and then masked, or flowing only into an
input's gradient), a module called outside the root's forward, a backward that does not pass
through the root's outputs (a separate penalty's ``backward()`` on the parameters). A forward that does not run
again the same way replays wrong: state outside the parameters and buffers (a counter in a
Python attribute), arguments inside objects other than tuples, lists and dicts (a dataclass:
not copied), a TorchFunctionMode or dispatch mode of the user's around the forward,
nondeterministic kernels. The replay runs the user's code again: forward hooks, tensor hooks
and Python state of the modules see one more forward and backward. A replay that names nobody
warns (the non-finite came with the data or from the loss, or the parameters were already
non-finite). Where the sentinel cannot work at all (a root whose outputs hold no tensor, a
process group of several ranks, where a replay on one rank would wait on collectives the
others never join, a hook that fails), the watch (watcher.py) keeps hooks.py's full hooks on
every step.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from numcheck.telemetry._structs import map_tensors, tensors


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A detached copy (one that needed a gradient needs one again: the replay's backward
    reaches it)."""
    c = t.detach().clone()
    return c.requires_grad_() if t.requires_grad and c.is_floating_point() else c


def _grad_key(p: torch.Tensor) -> tuple:
    """What tells a written ``.grad``: a new tensor (a weak reference: a freed gradient's id
    may be the next one's) or a moved version (accumulated into, or zeroed in place); compared
    by ``_same``. An inference tensor has no version: a key never equal to another."""
    g = p.grad
    if g is None:
        return (None, 0)
    try:
        return (weakref.ref(g), g._version)
    except RuntimeError:   # "Inference tensors do not track version counter"
        return (weakref.ref(g), object())


def _same(a: tuple, b: tuple) -> bool:
    """Two _grad_keys of one gradient: the same tensor, by identity (``==`` on two live
    weak references compares the tensors element by element), at the same version (``a``: the
    live one)."""
    ra, rb = a[0], b[0]
    if ra is None or rb is None:
        return ra is rb
    return ra() is rb() and a[1] == b[1]


def _grad_call(params: list[torch.Tensor]) -> bool | None:
    """Whether the running backward is ``torch.autograd.grad`` (which writes no ``.grad``):
    there the engine refuses to say whether it will run a parameter's gradient accumulator, in
    a ``.backward()`` it answers. A parameter it will not run (outside this graph, or not among
    ``inputs=``) tells nothing: the next one is asked. None where no parameter tells (then the
    ``.grad`` written decides) or this torch cannot tell."""
    for p in params:
        try:
            node = torch.autograd.graph.get_gradient_edge(p).node
        except Exception:  # noqa: BLE001 - no longer needs a gradient: ask the next one
            continue
        try:
            runs = torch._C._will_engine_execute_node(node)
        except RuntimeError:
            return True
        except Exception:  # noqa: BLE001 - a private API: tell by the .grad written instead
            return None
        if runs:
            return False
    return None


def _external(outs: list[torch.Tensor], totals: list[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients that entered the graph at each output from outside it, from the totals an
    output's hook saw: an output the others depend on (logits, beside a loss computed from
    them) receives their gradient through the graph too, and seeding the replay's backward
    with its total would count that part twice. external_i = total_i - what the others'
    external gradients send into output i; the outputs' dependencies are a DAG, so n - 1
    rounds settle it (one where no output depends on another)."""
    ext = list(totals)
    for _ in range(len(outs) - 1):
        new = []
        for i, (o, total) in enumerate(zip(outs, totals)):
            others = [j for j in range(len(outs)) if j != i]
            flow = torch.autograd.grad([outs[j] for j in others], o, [ext[j] for j in others],
                                       retain_graph=True, allow_unused=True)[0]
            new.append(total if flow is None else total - flow)
        settled = all(a is b or torch.equal(a, b) for a, b in zip(new, ext))
        ext = new
        if settled:
            break
    return ext


def _set_buffer(root: nn.Module, name: str, value: torch.Tensor | None) -> None:
    """Put ``value`` under a buffer's dotted name (None: remove it)."""
    path, _, leaf = name.rpartition(".")
    owner = root.get_submodule(path)
    if value is None:
        owner._buffers.pop(leaf, None)
    else:
        owner._buffers[leaf] = value


@dataclass
class _Forward:
    """One forward of the root in this step: what it takes to run it again."""

    args: tuple
    kwargs: dict
    rng: tuple
    grad: bool
    inference: bool
    autocast: tuple             # (device type, dtype) of each autocast region it ran in
    training: list              # each module's mode, in Telemetry._names' order
    buffers: dict               # name -> the buffer as the forward found it
    grads: dict = field(default_factory=dict)   # output index -> its gradient


class Sentinel:
    """The sentinel hooks of a Telemetry ``tel`` (watch.Telemetry) for one step."""

    def __init__(self, tel) -> None:
        self.tel = tel
        self.log: list[_Forward] = []
        self.flags: list = []          # all finite: bools (CPU) or 0-d device tensors
        self.snapshot: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.queued = False
        self.handles: list = []
        self.param_handles: list = []
        self.params: tuple = ()               # Telemetry._params_key() when they were hooked
        self.pending: list[torch.Tensor] = []  # parameter gradients, read at the backward's end
        # read the .grad a backward wrote (True) or keep each gradient by a hook (False, once a
        # backward wrote none); what each parameter's .grad was when last read
        self.via_grad = True
        self.grad_params: list[nn.Parameter] = []
        self.seen: list[tuple] = []
        self.unsure = False   # a backward's parameter gradients went unseen: replay the step
        self.grad_call: bool | None = False   # this backward is torch.autograd.grad (_grad_call)
        self.buffer_names: list[str] = []
        self.broken: str | None = None   # why it cannot work for this model: full hooks

    def attach(self, root: nn.Module) -> None:
        # names, not objects: a forward may put a new tensor under a buffer's name; read at
        # arming, not per forward (named_buffers walks the model)
        self.buffer_names = [n for n, _ in root.named_buffers()]
        self.handles.append(root.register_forward_pre_hook(self._guard(self._pre),
                                                           with_kwargs=True))
        self.handles.append(root.register_forward_hook(self._guard(self._post),
                                                       with_kwargs=True))
        self._guard(self._hook_params)()   # called from t.step(): never raises into it

    def _hook_params(self) -> None:
        """The parameters that need a gradient, and a hook on each where their ``.grad`` is not
        read (again at a root forward where that set changed: a layer unfrozen, a parameter
        replaced)."""
        for h in self.param_handles:
            h.remove()
        self.grad_params = [p for p in self.tel.model.parameters() if p.requires_grad]
        self.seen = [_grad_key(p) for p in self.grad_params]
        self.param_handles = [] if self.via_grad else [
            p.register_hook(self._guard(self._param_grad)) for p in self.grad_params]
        self.params = self.tel._params_key()

    def detach(self) -> None:
        for h in (*self.handles, *self.param_handles):
            h.remove()
        self.handles.clear()
        self.param_handles.clear()

    def clear(self) -> None:
        self.log.clear()
        self.flags.clear()
        self.pending.clear()
        self.snapshot = None
        self.queued = False
        self.unsure = False

    def give_up(self, why: str) -> None:
        """Stop the sentinel for this watch (watcher.py arms hooks.py's full hooks from the next
        step on) and say why, once."""
        if self.broken is None:
            self.broken = why
            warnings.warn(f"numcheck.telemetry: {why}; the full producer check runs on every "
                          "step instead (its cost: docs/telemetry.md)", RuntimeWarning,
                          stacklevel=4)

    def _guard(self, hook):
        """A hook that never raises into the user's step: a failure gives the sentinel up."""
        def guarded(*a):
            if self.broken is not None or not self.tel.enabled or self.tel.busy:
                return None
            try:
                hook(*a)
            except Exception as exc:  # noqa: BLE001 - the user's run goes on without us
                self.give_up(f"the sentinel failed ({type(exc).__name__}: {exc})")
            return None
        return guarded

    # ---- hooks ---------------------------------------------------------------------------

    def _pre(self, mod, args, kwargs) -> None:
        tel = self.tel
        if tel._params_key() != self.params:
            self._hook_params()
        kinds = {"cpu"} | {k for k, _ in tel._devs}
        amp = tuple((k, torch.get_autocast_dtype(k)) for k in sorted(kinds)
                    if torch.is_autocast_enabled(k))
        # every buffer, as this forward found it: BatchNorm updates its running statistics
        # in the kernel, without a version bump, so what a forward writes cannot be told
        bufs = {n: mod.get_buffer(n).detach().clone() for n in self.buffer_names}
        self.log.append(_Forward(
            map_tensors(args, _copy), map_tensors(kwargs, _copy), tel._rng_of(args, kwargs),
            torch.is_grad_enabled(), torch.is_inference_mode_enabled(), amp,
            [m.training for m in tel._names], bufs))

    def _post(self, mod, args, kwargs, out) -> None:
        if not self.log:
            return
        entry = self.log[-1]
        outs = tensors(out)
        if not outs:
            self.give_up("the root module's outputs hold no tensor the sentinel can read "
                         f"({type(out).__name__})")
            return
        self.flags.append(self.tel._all_finite(outs))
        if torch.is_grad_enabled():
            for i, o in enumerate(outs):
                if o.requires_grad:
                    self.tel._keep(o, o.register_hook(self._guard(self._out_grad(entry, i))))

    def _out_grad(self, entry: _Forward, i: int):
        def hook(grad):
            g = grad.detach()
            # a second backward through the same output (retain_graph) adds to the first
            entry.grads[i] = g if i not in entry.grads else entry.grads[i] + g
            self._queue()
        return hook

    def _param_grad(self, grad) -> None:
        self.pending.append(grad)   # read together at the end: a quarter of the cost
        self._queue()

    def _queue(self) -> None:
        if not self.queued:
            self.queued = True
            if self.via_grad and self.grad_params:
                self.grad_call = _grad_call(self.grad_params)
            torch.autograd.Variable._execution_engine.queue_callback(
                self._guard(self._end_of_backward))

    def _end_of_backward(self) -> None:
        """After the backward, before the optimizer: the parameters as the forward used them
        are copied where anything read was not finite."""
        self.queued = False
        if self.via_grad:
            self._read_grads()
        self.flags.append(self.tel._all_finite(self.pending))
        self.pending.clear()
        if self.snapshot is None and (self.unsure or not self.settled()):
            self._freeze()

    def _read_grads(self) -> None:
        """The ``.grad`` this backward wrote into ``pending``; after a ``torch.autograd.grad``
        (or, where torch cannot tell, a backward that wrote none), the parameter hooks from
        now on and this step replayed (the module doc)."""
        written = False
        for i, p in enumerate(self.grad_params):
            key = _grad_key(p)
            if not _same(key, self.seen[i]):
                self.seen[i] = key
                if p.grad is not None:   # not just set to None (zero_grad)
                    written = True
                    self.pending.append(p.grad)
        if self.grad_params and (self.grad_call or self.grad_call is None and not written):
            self.via_grad = False
            self.unsure = True
            self._hook_params()

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
        """The parameters' values now (the buffers each forward found are in its entry)."""
        with torch.no_grad():
            self.snapshot = [(p, p.detach().clone()) for p in self.tel.model.parameters()]

    def due(self) -> bool:
        """Whether this step needs a replay (a forward-only step is read here): something
        read was not finite and a root forward was seen to run again."""
        if self.broken is None and self.snapshot is None and self.log and not self.settled():
            self._freeze()
        return self.snapshot is not None and bool(self.log)

    def replay(self) -> None:
        """Run the step's forwards and backwards again with the full hooks on (``tel`` has
        attached them), from the frozen values; then put everything back."""
        tel = self.tel
        modules = list(tel._names)
        after = tel._rng_of(*(f.args for f in self.log))
        now = [(t, t.detach().clone()) for t, _ in self.snapshot]
        # buffers by name, object and value: a forward may put a new tensor (of another
        # shape) under a name; the model gets back the very objects, with their values
        bufs = {n: (b, b.detach().clone()) for n, b in tel.model.named_buffers()}
        modes = [m.training for m in modules]
        try:
            with torch.no_grad():
                for t, v in self.snapshot:
                    t.copy_(v)
            for entry in self.log:
                self._run(entry, modules)
        finally:
            with torch.no_grad():
                for t, v in now:
                    t.copy_(v)
                for n in [n for n, _ in tel.model.named_buffers() if n not in bufs]:
                    _set_buffer(tel.model, n, None)   # registered by the replay: gone again
                for n, (b, v) in bufs.items():
                    _set_buffer(tel.model, n, b)
                    b.copy_(v)
            for m, mode in zip(modules, modes, strict=True):
                m.training = mode
            tel._set_rng(after)

    def _run(self, entry: _Forward, modules: list[nn.Module]) -> None:
        tel = self.tel
        for m, mode in zip(modules, entry.training, strict=True):
            m.training = mode
        for n, v in entry.buffers.items():
            _set_buffer(tel.model, n, v.clone())
        tel._set_rng(entry.rng)
        with contextlib.ExitStack() as ctx:   # the live forward's modes
            ctx.enter_context(torch.inference_mode(entry.inference))
            ctx.enter_context(torch.set_grad_enabled(entry.grad))
            for kind, dtype in entry.autocast:
                ctx.enter_context(torch.autocast(kind, dtype=dtype))
            outs = tensors(tel.model(*entry.args, **entry.kwargs))
        pairs = [(outs[i], g) for i, g in entry.grads.items()
                 if i < len(outs) and outs[i].requires_grad]
        leaves = [p for p in tel.model.parameters() if p.requires_grad] + \
            [a for a in tensors((entry.args, entry.kwargs)) if a.requires_grad]
        if pairs and leaves:
            tel.busy = True   # the hooks stand aside while the seeds are worked out
            try:
                seeds = _external([o for o, _ in pairs], [g for _, g in pairs])
            finally:
                tel.busy = False
            torch.autograd.grad([o for o, _ in pairs], leaves, seeds, allow_unused=True)

    def named_nobody(self, step: int) -> None:
        warnings.warn(
            f"numcheck.telemetry: step {step} (not recorded: every={self.tel.every}) produced "
            "a non-finite value, and its replay named no producer: it came with the data, from "
            "the loss or from non-finite parameters, or the step does not replay the same way "
            "(docs/telemetry.md)", RuntimeWarning, stacklevel=3)
