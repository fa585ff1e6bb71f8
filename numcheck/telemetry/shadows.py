"""The float64 shadows of ``watch(shadow=True)``: each watched layer's output in float64 on the
live inputs (a linear layer: F.linear on its weights in float64; a norm or attention: a float64
copy of the layer; a function-level op such as sdpa or a registered function: the function
on float64 copies of its arguments), and a whole-model float64 copy run on the root's inputs,
whose watched layers' and function-level ops' outputs the live ones are compared with (end to
end). Their SQNR sums go into the
output rows (passes.sqnr_pair: the sh_ and e2e_ fields of fields.FIELDS).

The copies are made once, at ``watch``, before any hook of the watch exists (deepcopy copies
hooks); their weights and train/eval modes are refreshed from the live model at each use.
"""
from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from numcheck.telemetry._structs import map_tensors, tensors
from numcheck.telemetry import op_classes
from numcheck.telemetry.hooks import ROOT
from numcheck.telemetry.op_classes import classify
from numcheck.telemetry.passes import sqnr_pair
from numcheck.telemetry.rng import own_rng, rng_states, set_rng_states

_DOWNCASTS = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)
_CASTS = frozenset((*_DOWNCASTS, torch.Tensor.to))


class KeepFP64(TorchFunctionMode):
    """Inside the float64 shadows: casts of a float64 tensor down to another float dtype
    (.float(), .half(), .bfloat16(), .to(float dtype)) keep it float64, so a model that casts
    to fp32 internally (the tiny models' norms and attention) stays float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # every op of a shadow comes through here: the cast test first, nothing else per op
        if func in _CASTS and args and isinstance(args[0], torch.Tensor) and \
                args[0].dtype == torch.float64:
            kwargs = kwargs or {}
            if func is not torch.Tensor.to:
                return args[0]
            args = tuple(a for a in args if not (isinstance(a, torch.dtype)
                                                 and a.is_floating_point))
            if isinstance(kwargs.get("dtype"), torch.dtype) and \
                    kwargs["dtype"].is_floating_point:
                kwargs = {k: v for k, v in kwargs.items() if k != "dtype"}
        return func(*args, **kwargs) if kwargs else func(*args)


class _Capture(KeepFP64, op_classes.Observer):
    """KeepFP64 for the whole-model copy, keeping the first output of each function-level op
    it runs (op_classes.FUNCTION_OPS, registered functions) in call order: op -> [outputs]."""

    def __init__(self, into: dict) -> None:
        super().__init__()
        self.into = into

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs)
        op = op_classes.FUNCTION_OPS.get(func)
        if op is not None:
            self._keep(op, out)
        return out

    def observed(self, func, call, out) -> None:
        self._keep(func.__numcheck_op__, out)

    def _keep(self, op, out) -> None:
        got = tensors(out)
        if got:
            self.into.setdefault(op, []).append(got[0].detach())


def _eager_stance():
    """The float64 copy of a compiled model runs eagerly: compiling it would add graphs to the
    user's process (and change nothing it measures)."""
    try:
        return torch.compiler.set_stance("force_eager")
    except Exception:  # noqa: BLE001 - a torch without compiler stances: nothing compiled
        return contextlib.nullcontext()


def _copy64(m: nn.Module) -> nn.Module:
    """A float64 copy of m that runs eagerly: a module compiled in place keeps its compiled
    call through deepcopy, and that call is the live module's (it would run the live model)."""
    c = copy.deepcopy(m).to(torch.float64)
    for sub in c.modules():
        if "_compiled_call_impl" in sub.__dict__:
            sub._compiled_call_impl = None
    return c


def _dropout(op: str, call) -> bool:
    """sdpa with dropout: a float64 call would draw another mask (no shadow then)."""
    if op != "sdpa":
        return False
    args, kwargs = call
    return bool((kwargs or {}).get("dropout_p", args[4] if len(args) > 4 else 0.0))


def to64(obj):
    """A float64 detached copy of an argument structure's floating tensors."""
    return map_tensors(obj, lambda t: t.detach().to(torch.float64) if t.is_floating_point()
                       else t)


def same_modes(live: nn.Module, copy64: nn.Module) -> None:
    """Give every module of a float64 copy the live module's train/eval mode (the copy was
    made once, at ``watch``; ``model.eval()`` after that must reach it too)."""
    for a, b in zip(live.modules(), copy64.modules(), strict=True):
        b.training = a.training


class Shadows:
    """The float64 shadows of ``model`` (``on=False``: no copies; the hooks then ask for no
    shadow). ``ops``: module -> its watched op (op_classes.classify) or None; ``watch``: whose ``busy``
    flag is up while a shadow runs (the watch's hooks stand aside for the shadows' own ops)."""

    def __init__(self, model: nn.Module, ops: dict, on: bool, watch,
                 names: dict | None = None) -> None:
        self.model, self.on, self.watch = model, on, watch
        # float64 copies of the watched layers but linear ones (F.linear in float64 needs none)
        self.layers = {m: _copy64(m) for m, op in ops.items()
                       if on and op not in (None, "linear", "compiled")}
        self.rng_at: dict = {}   # module -> generator states before its live forward
        self.model64 = _copy64(model) if on else None
        # per watched module name: the whole-model copy's outputs of this forward, in call order
        self.e2e_out: dict[str, list[torch.Tensor]] = {}
        # per function-level op: the whole-model copy's first outputs, in call order
        self.e2e_ops: dict[str, list[torch.Tensor]] = {}
        self.handles: list = []   # on the float64 copy
        if self.model64 is not None:
            # the copy's modules under the live ones' row names (``names``: the watch's,
            # without torch.compile's _orig_mod; the copy's modules are the live ones', in order)
            for (n, m), live in zip(self.model64.named_modules(), model.modules(), strict=True):
                if classify(live):   # (the copy of a module compiled in place is not)
                    name = names[live] if names else n or ROOT
                    self.handles.append(m.register_forward_hook(self._capture(name)))

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def note_rng(self, mod: nn.Module, args, kwargs) -> None:
        """Before a layer's live forward: the generator states it draws from, for its shadow
        (dropout: the same mask)."""
        self.rng_at[mod] = rng_states(mod, args, kwargs)

    def output_extra(self, mod, name, op, args, kwargs, out: torch.Tensor) -> list:
        """The shadow fields of a watched layer's first output (Accumulator.add's ``extra``):
        its own float64 output's (sh_) and the whole-model copy's (e2e_)."""
        extra = []
        ref = self.layer_ref(mod, op, args, kwargs)
        if ref is not None:
            extra += sqnr_pair(out, ref, "sh")
        pending = self.e2e_out.get(name)
        if pending:
            extra += sqnr_pair(out, pending.pop(0), "e2e")
        return extra

    def op_extra(self, func, op: str, call, out: torch.Tensor) -> list:
        """The shadow fields of a function-level op's first output: the function on float64
        copies of its arguments (sh_), the whole-model copy's call of it in the same place of
        the call order (e2e_; none where the shapes disagree: the order differed)."""
        extra = []
        ref = None if func is None or _dropout(op, call) else self._call64(func, call)
        if ref is not None and ref.shape == out.shape:
            extra += sqnr_pair(out, ref, "sh")
        pending = self.e2e_ops.get(op)
        if pending:
            ref = pending.pop(0)
            if ref.shape == out.shape and not _dropout(op, call):
                extra += sqnr_pair(out, ref, "e2e")
        return extra

    def _call64(self, func, call) -> torch.Tensor | None:
        args, kwargs = call
        ins = tensors(call)
        dev = ins[0].device.type if ins else "cpu"
        self.watch.busy = True
        try:
            with torch.no_grad(), torch.autocast(dev, enabled=False), KeepFP64():
                out = tensors(func(*to64(args), **to64(kwargs or {})))
            return out[0] if out else None
        finally:
            self.watch.busy = False

    def layer_ref(self, mod, op, args, kwargs) -> torch.Tensor | None:
        """The layer's own output in float64 on the same inputs (its weights copied to fp64;
        called with grad mode off, as the hooks run)."""
        ins = tensors(args) + tensors(kwargs)
        dev = ins[0].device.type if ins else "cpu"
        self.watch.busy = True
        try:
            with torch.autocast(dev, enabled=False), KeepFP64():
                if op == "linear":
                    x = args[0] if args else kwargs.get("input", ins[0] if ins else None)
                    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                        return None
                    b = getattr(mod, "bias", None)
                    return F.linear(to64(x), mod.weight.detach().to(torch.float64),
                                    None if b is None else b.detach().to(torch.float64))
                m64 = self.layers.get(mod)
                if m64 is None:
                    return None
                for p64, p in zip(m64.parameters(), mod.parameters(), strict=True):
                    p64.copy_(p.detach())
                same_modes(mod, m64)
                states = self.rng_at.pop(mod, None)
                with own_rng(mod, args, kwargs):
                    if states is not None:
                        set_rng_states(states)
                    out = tensors(m64(*to64(args), **to64(kwargs)))
                return out[0] if out else None
        finally:
            self.watch.busy = False

    def _capture(self, name):
        def hook(mod, args, out):
            t = tensors(out)
            if t:
                self.e2e_out.setdefault(name, []).append(t[0].detach())
        return hook

    def run_model(self, args, kwargs) -> None:
        """Refresh the float64 model copy from the live weights and run it on the same inputs;
        its watched modules' outputs wait in ``e2e_out`` for the live ones."""
        m64 = self.model64
        self.e2e_out.clear()
        self.e2e_ops.clear()
        params = tensors(args) + tensors(kwargs)
        dev = params[0].device.type if params else "cpu"
        self.watch.busy = True
        try:
            with torch.no_grad(), torch.autocast(dev, enabled=False), _eager_stance(), \
                    _Capture(self.e2e_ops):
                for d, s in zip(m64.state_dict().values(), self.model.state_dict().values(),
                                strict=True):
                    d.copy_(s.detach())
                same_modes(self.model, m64)
                with own_rng(self.model, args, kwargs):
                    m64(*to64(args), **to64(kwargs))
        finally:
            self.watch.busy = False
