"""The full hooks of a watch, and what each of them reads (docs/telemetry.md).

Every submodule gets a forward pre-hook and a forward hook (the module stack, the forward
producer check); the forward hook puts tensor hooks on the call's outputs and on its inputs
that need a gradient (grad_output, grad_input), and hooks on the autograd nodes the call made
that consume its inputs (the backward producer check, per call; no module full backward hooks:
they add graph nodes and change the gradients' last bits); watched modules (``classify``:
linear, attention, norm) record their roles, their weight's gradient through a tensor hook on
the parameter. While the root module's forward runs, a TorchFunctionMode records
``F.scaled_dot_product_attention`` (op "sdpa"), softmax (op "softmax", the attention
probabilities of models that write attention out, as the tiny models do) and the functions a
user registered (``register``: a torch function, or a Python function through its wrapper)
under the innermost module that called them: their rows, float64 shadows and producer checks,
forward and backward, carry that op (which ones: op_classes.py). A ``torch.compile`` region (an
OptimizedModule, or a module compiled in place) is watched from its boundary: its modules carry
no hook (``region_of``). Nothing is read back from a device in a hook: ``step()`` reads a
step's statistics once (numcheck/telemetry/accumulator.py).

Hooks that run inside the root's forward take the watch's own TorchFunctionMode off the mode
stack while they work, so telemetry's own torch ops are not intercepted.
"""
from __future__ import annotations

import torch
from torch import nn

from numcheck.telemetry._structs import tensors
from numcheck.telemetry.observation import is_dtensor, merge_obs
from numcheck.telemetry.op_classes import FUNCTION_OPS, WATCHING, Observer, compiled_in_place

ROOT = "<model>"
class _BoundaryCall:
    """A module compiled in place, watched from its boundary: its ``_compiled_call_impl``
    replaced by this call, which runs the watch's pre and post hooks eagerly around the
    compiled call (a module hook would run inside it: Dynamo traces it); ``remove()`` puts
    the compiled call back."""

    def __init__(self, m: nn.Module, pre, post) -> None:
        self.m, self.compiled, self.pre, self.post = m, m._compiled_call_impl, pre, post
        m._compiled_call_impl = self

    def __call__(self, *args, **kwargs):
        self.pre(self.m, args, kwargs)
        out = self.compiled(*args, **kwargs)
        self.post(self.m, args, kwargs, out)
        return out

    def remove(self) -> None:
        if self.m.__dict__.get("_compiled_call_impl") is self:
            self.m._compiled_call_impl = self.compiled


def _weight(m: nn.Module) -> torch.Tensor | None:
    w = getattr(m, "weight", None)
    if w is None:
        w = getattr(m, "in_proj_weight", None)
    return w if isinstance(w, torch.Tensor) else None


def _eager(fn):
    """fn, run eagerly where Dynamo traces a compiled module's hooks (fn itself where Dynamo
    cannot be imported here: then nothing is compiled either; importing it costs ~1.5 s once)."""
    try:
        return torch._dynamo.disable(fn)
    except Exception:  # noqa: BLE001 - a torch build or Python without Dynamo
        return fn


class _NoGrad:
    """torch.no_grad() for the hooks, at a fifth of its cost (measured ~2 us an entry, a few
    hundred entries a step): most hooks run in the backward, where grad mode is off already."""

    __slots__ = ("on",)

    def __enter__(self) -> None:
        self.on = torch.is_grad_enabled()
        if self.on:
            torch._C._set_grad_enabled(False)

    def __exit__(self, *exc) -> None:
        if self.on:
            torch._C._set_grad_enabled(True)


class _OpMode(Observer):
    def __init__(self, watch, on_op) -> None:
        super().__init__()
        self.watch, self.on_op = watch, on_op

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # every op of the model's forward comes through here: as little as possible per op
        out = func(*args, **kwargs) if kwargs else func(*args)
        op = FUNCTION_OPS.get(func)
        if op is not None and not self.watch.busy:
            self.on_op(op, func, (args, kwargs), out)
        return out

    def observed(self, func, call: tuple, out) -> None:
        # a registered Python function returned (this mode is on the stack: take it off
        # while telemetry's own ops run, when it is the innermost mode)
        if self.watch.busy or not self.watch.enabled:
            return
        n = torch._C._len_torch_function_stack()
        top = n and torch._C._get_function_stack_at(n - 1) is self
        if top:
            torch._C._pop_torch_function_stack()
        try:
            self.on_op(func.__numcheck_op__, func, call, out)
        finally:
            if top:
                torch._C._push_on_torch_function_stack(self)


def _inputs(op: str, call, ins: list[torch.Tensor]) -> list[torch.Tensor]:
    """An op's data inputs: sdpa's ``attn_mask`` is not data (its rows, its backward)."""
    if op != "sdpa":
        return ins
    args, kwargs = call
    mask = kwargs.get("attn_mask") if kwargs else None
    if mask is None and len(args) > 3:
        mask = args[3]
    return [t for t in ins if t is not mask]


def _row_data(op: str, t: torch.Tensor) -> torch.Tensor:
    """What an input row reads of t: a softmax input's masked entries (-inf, or finfo.min
    added: at most -max/2) are left out (they put the row's amax at 3.4e38 and its range at
    142 binades). NaN stays in."""
    if op != "softmax":
        return t
    low = t <= -torch.finfo(t.dtype).max / 2
    return t[~low] if bool(low.any()) else t


def _remode(mode) -> None:
    """Put back the mode Hooks._unmode took off (None: nothing)."""
    if mode is not None:
        torch._C._push_on_torch_function_stack(mode)


def _consumers(ins, outs) -> dict | None:
    """The autograd nodes a call created that consume its inputs: {node: [edge index]},
    found walking back from the outputs' nodes. The walk stops at the inputs, at leaves
    and at nodes older than the newest input's (made before this call). None when some
    input has no consumer found (then its total gradient is checked, as before)."""
    targets, bound = {}, -1
    for t in ins:
        if t.grad_fn is not None:
            targets[(id(t.grad_fn), t.output_nr)] = t
            bound = max(bound, t.grad_fn._sequence_nr())
    leaves = {id(t) for t in ins if t.grad_fn is None}
    todo = [o.grad_fn for o in outs if o.grad_fn is not None]
    seen = {id(n) for n in todo}
    found: dict = {}
    hit: set[int] = set()
    while todo:
        node = todo.pop()
        for i, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            var = getattr(nxt, "variable", None)
            if (id(nxt), nr) in targets or (var is not None and id(var) in leaves):
                found.setdefault(node, []).append(i)
                hit.add(id(targets.get((id(nxt), nr), var)))
            elif var is None and id(nxt) not in seen and nxt._sequence_nr() > bound:
                seen.add(id(nxt))
                todo.append(nxt)
    return found if len(hit) == len({id(t) for t in ins}) else None


class Hooks:
    """The full hooks on the modules of ``root`` (``names``: module -> row name; ``ops``:
    module -> classify's op), attached by ``attach()``, removed by ``detach()``.

    What they read goes to the other parts: ``reads`` (observation.StepReads: each tensor read
    once a step), ``acc`` (accumulator.Accumulator: rows and producer checks), ``shadows``
    (shadows.Shadows: the float64 references of the output rows), ``sentinel`` (told when the
    root's outputs hold no tensor it could read). ``watch`` says when to act: ``enabled``,
    ``busy`` (a shadow runs: stand aside), ``recording`` (this step records rows),
    ``checking()`` (the producer check runs), ``every``."""

    def __init__(self, watch, root: nn.Module, names: dict, ops: dict, reads, acc, shadows,
                 sentinel, region_of: dict | None = None, boundaries=frozenset()) -> None:
        self.watch, self.root, self.names, self.ops = watch, root, names, ops
        self.reads, self.acc, self.shadows, self.sentinel = reads, acc, shadows, sentinel
        # modules inside a compiled region watched from its boundary -> the region's wrapper
        # (no hook on them: a hook inside a compiled program breaks its graph)
        self.region_of: dict = region_of or {}
        self.boundaries = boundaries   # the compiled regions watched from their boundary
        # per region wrapper: (name, op, weight) of the watched layers inside it (their
        # weight rows, recorded at the region's forward)
        self.region_weights: dict = {}
        for m, region in self.region_of.items():
            w = _weight(m)
            if ops[m] and w is not None:
                self.region_weights.setdefault(region, []).append((names[m], ops[m], w))
        self.suspended: list = []   # the op mode, taken off while a compiled region runs
        self.handles: list = []          # the module hooks, while attached
        # the weights' gradient hooks, and the parameters they were put on: (id,
        # requires_grad) of each, checked at each root forward (a layer unfrozen later)
        self.weight_handles: list = []
        self.params: tuple = ()
        self.row_params: frozenset = frozenset()
        self._subtree: dict = {}   # module -> the parameters its calls compute with
        self.leaf_handles: list = []     # tensor hooks on leaf tensors: removed at step end
        # running modules, innermost last: (name, the observation of its inputs read before
        # the forward ran, or None)
        self.stack: list[tuple] = []
        # per forward call of a module in this step: [its grad_outputs' observation], filled
        # by that call's grad_output hooks, read by its grad_input hooks and the weight's
        self.cells: dict[str, list[list]] = {}
        self.mode: _OpMode | None = None
        self.root_seen = False   # a root forward ran under these hooks
        self.ran = False   # a watched module's forward ran since the last step()

    # ---- attaching -----------------------------------------------------------------------

    def attach(self) -> None:
        for m, name in self.names.items():
            if m not in self.region_of:
                self._attach(m, name, self.ops[m], m is self.root)
        self.hook_weights()

    def detach(self) -> None:
        for h in (*self.handles, *self.weight_handles):
            h.remove()
        self.handles.clear()
        self.weight_handles.clear()

    def _attach(self, m: nn.Module, name: str, op: str | None, root: bool) -> None:
        h = self.handles
        if m in self.boundaries and compiled_in_place(m):   # around its compiled call
            h.append(_BoundaryCall(m, self._pre(name, root), self._post(name, op, root)))
            return
        # Dynamo must not trace the hooks of a torch.compile'd module (it cannot: "already
        # tracked for mutation"); it runs them eagerly, between graphs
        h.append(m.register_forward_pre_hook(_eager(self._pre(name, root)), with_kwargs=True))
        h.append(m.register_forward_hook(_eager(self._post(name, op, root)), with_kwargs=True))

    def params_key(self) -> tuple:
        """Which parameters the model's modules have and which need a gradient, and which
        submodules they hold (one replaced after ``watch``: its parameters are read); the
        modules of ``watch``'s own parameter and module dicts, a sixth of ``parameters()``'s
        walk."""
        return tuple((id(p), p.requires_grad) for m in self.names
                     for p in m._parameters.values() if p is not None) + \
            tuple(id(c) for m in self.names for c in m._modules.values())

    def hook_weights(self) -> None:
        """One hook on each parameter that needs a gradient, watched module or not: its
        gradient is checked against the grad_outputs of every module holding it (a tied
        embedding and head: both calls' shares are in the one gradient) and recorded as the
        grad_weight row of each watched module whose weight it is."""
        for h in self.weight_handles:
            h.remove()
        self.weight_handles.clear()
        holders: dict[int, tuple[torch.Tensor, list[str]]] = {}
        for m, name in self.names.items():
            for p in m._parameters.values():
                if p is not None and p.requires_grad and p.is_floating_point():
                    holders.setdefault(id(p), (p, []))[1].append(name)
        regions = {self.names[m]: self.names[r] for m, r in self.region_of.items()}
        for p, names in holders.values():
            rows = [(n, self.ops[m]) for m, n in self.names.items()
                    if n in names and self.ops[m] and _weight(m) is p]
            # the calls whose grad_outputs its gradient comes from: its holders' calls, or
            # the compiled region's around them
            calls = list(dict.fromkeys(regions.get(n, n) for n in names))
            hook = self._wgrad(names, rows, calls)
            if is_dtensor(p):
                # FSDP2's sharded parameters get their gradient by reduce-scatter, past any
                # autograd hook of theirs; FSDP2 (and accumulation into any DTensor) calls
                # the post-accumulate hooks with it: this rank's shard of the gradient
                self.weight_handles.append(p.register_post_accumulate_grad_hook(
                    lambda q, h=hook: h(q.grad)))
            else:
                self.weight_handles.append(p.register_hook(hook))
        # the parameters recorded as a watched module's weight row: a container's producer
        # check reads them before that module's forward does (read the full pass then, not the
        # integer pass and then the full one: at width 1024 a fifth of the elements read)
        self.row_params = frozenset(id(p) for p in (_weight(m) for m in self.names
                                                    if self.ops[m]) if p is not None)
        self.params = self.params_key()
        self._subtree = {}

    def params_of(self, m: nn.Module) -> list[torch.Tensor]:
        """The floating parameters a call of ``m`` computes with: its own and its submodules'
        (a container is not the producer of an Inf the optimizer wrote into a child's weight),
        listed once per arming (``hook_weights``)."""
        got = self._subtree.get(m)
        if got is None:
            got = self._subtree[m] = list({id(p): p for p in m.parameters()
                                           if p.is_floating_point()}.values())
        return got

    def keep(self, t: torch.Tensor, handle) -> None:
        if t.grad_fn is None:   # a leaf: the hook would stay on it after the graph is gone
            self.leaf_handles.append(handle)

    def drop_leaf_hooks(self) -> None:
        for h in self.leaf_handles:
            h.remove()
        self.leaf_handles.clear()

    def _boundary(self, m) -> bool:
        """m is a compiled region watched from its boundary (its modules carry no hook)."""
        return m in self.boundaries

    def suspend(self) -> None:
        """Take the op mode off while a compiled region runs: Dynamo would trace it (and the
        registered functions' wrappers, which look for it) into the compiled program."""
        m = self.mode
        n = torch._C._len_torch_function_stack()
        if m is not None and n and torch._C._get_function_stack_at(n - 1) is m:
            torch._C._pop_torch_function_stack()
            WATCHING[0] -= 1
            self.suspended.append(m)
        else:
            self.suspended.append(None)

    def resume(self) -> None:
        m = self.suspended.pop()
        if m is not None and m is self.mode:
            torch._C._push_on_torch_function_stack(m)
            WATCHING[0] += 1

    def exit_mode(self) -> None:
        while self.suspended:   # a compiled region's forward that raised
            self.resume()
        if self.mode is not None:
            mode, self.mode = self.mode, None
            mode.__exit__(None, None, None)

    def _unmode(self):
        """Take this watch's _OpMode off the torch-function mode stack when it is the innermost
        mode (a hook inside the root's forward), so that telemetry's own torch ops are not
        intercepted; returns it for _remode (None: nothing taken off)."""
        m = self.mode
        if m is None:
            return None
        n = torch._C._len_torch_function_stack()
        if n and torch._C._get_function_stack_at(n - 1) is m:
            return torch._C._pop_torch_function_stack()
        return None

    # ---- the module hooks ----------------------------------------------------------------

    def _pre(self, name, root):
        tel, reads, shadows, ops = self.watch, self.reads, self.shadows, self.ops

        def hook(mod, args, kwargs):
            if not tel.enabled or tel.busy:
                return
            self.ran = True   # a forward this step (Telemetry.step warns where none ran)
            if root:
                reads.forwards += 1
                self.root_seen = True
                if self.params_key() != self.params:   # unfrozen or replaced since armed
                    self.hook_weights()
            pre = None
            mode = self._unmode()
            try:
                if tel.checking():
                    # read before the forward runs: an in-place module changes its input
                    data = tensors(args) + tensors(kwargs)
                    ins = data + self.params_of(mod)
                    if ins:   # full: the tensors a recorded row reads later in the step
                        full = self.row_params if tel.recording else frozenset()
                        if ops[mod] is not None and tel.recording:
                            full = full | {id(t) for t in data}
                        with _NoGrad():
                            pre = reads.observe(ins, full_ids=full)
                if shadows.on and tel.recording and mod.training and mod in shadows.layers:
                    # the layer's shadow draws what this forward draws (dropout: same mask)
                    shadows.note_rng(mod, args, kwargs)
            finally:
                _remode(mode)
            self.stack.append((name, pre))
            if root:
                if shadows.model64 is not None and tel.recording:
                    shadows.run_model(args, kwargs)
                self.exit_mode()
                if not self._boundary(mod):
                    self.mode = _OpMode(tel, self.on_op)
                    self.mode.__enter__()
            elif self._boundary(mod):
                self.suspend()
        return hook

    def _post(self, name, op, root):
        tel, reads, acc = self.watch, self.reads, self.acc

        def hook(mod, args, kwargs, out):
            pre = None
            if self.stack and self.stack[-1][0] == name:
                pre = self.stack.pop()[1]
            if root:
                self.exit_mode()
            elif self.suspended and self._boundary(mod):
                self.resume()
            if not tel.enabled or tel.busy:
                return
            mode = self._unmode()
            try:
                with _NoGrad():
                    ins = tensors(args) + tensors(kwargs)
                    outs = tensors(out)
                    if root and not outs and tel.every > 1:   # before any sentinel step
                        self.sentinel.give_up("the root module's outputs hold no tensor the "
                                              f"sentinel can read ({type(out).__name__})")
                    rec = bool(op) and tel.recording
                    if tel.checking() and outs:
                        if pre is not None:
                            # an output that is one of the inputs is read again: a write
                            # through .data changes it behind its version counter
                            acc.event(name, op or "module", "output", "forward", pre,
                                      reads.observe(outs, full=rec,
                                                    fresh={id(t) for t in ins}))
                        else:
                            self.check(name, op or "module", "output", "forward",
                                       ins + self.params_of(mod), outs, full=rec)
                    if rec:
                        self.record_forward(mod, name, op, args, kwargs, ins, outs)
                if torch.is_grad_enabled() and (tel.checking() or (op and tel.recording)):
                    self._backward_hooks(name, op, ins, outs, self.params_of(mod))
            finally:
                _remode(mode)
        return hook

    def check(self, name, op, role, pass_, ins, outs, full: bool = False) -> None:
        """A producer check of a call that consumed the tensors ``ins`` and made ``outs``."""
        ins = [t for t in ins if t.is_floating_point()]
        self.acc.event(name, op, role, pass_, self.reads.observe(ins, full=full),
                       self.reads.observe(outs, full=full))

    def record_forward(self, mod, name, op, args, kwargs, ins, outs) -> None:
        """A watched module call's forward rows: its inputs, weight and outputs (the first
        output's row with the shadows' fields)."""
        acc = self.acc
        for t in ins:
            acc.add(name, op, "input", t)
        w = _weight(mod)
        if w is not None:
            acc.add(name, op, "weight", w)
        for inner, inner_op, inner_w in self.region_weights.get(mod, ()):
            acc.add(inner, inner_op, "weight", inner_w)
        if not outs:
            return
        extra = []
        if self.shadows.on:
            extra = self.shadows.output_extra(mod, name, op, args, kwargs, outs[0])
        acc.add(name, op, "output", outs[0], extra)
        for t in outs[1:]:
            acc.add(name, op, "output", t)

    # ---- the backward's hooks ------------------------------------------------------------

    def _backward_hooks(self, name, op, ins, outs, params=(), module_call=True) -> None:
        """Tensor hooks for this call's backward: on its outputs (grad_output) and on its
        inputs that need a gradient (grad_input). Tensor hooks add no node to the graph, so
        the backward sums in the same order as without telemetry (module full backward hooks
        do not: they change the last bits of the gradients). One cell per call: a module
        called twice checks each call's grad_input against that call's grad_output (and a
        module's weight gradient against all of its calls': ``module_call``). Hooks on
        leaf tensors (a Parameter fed to a module) outlive the graph: their handles are kept
        and removed at the step's end, on disable() and on close()."""
        # [the grad_outputs' observation, what the backward consumes besides: the call's
        # floating inputs and own parameters (a weight gradient g^T x is not finite where x is
        # not: a NaN that came with the data is not made by the last layer's backward)]
        cell: list = [None, None]
        if self.watch.checking():
            with _NoGrad():
                cell[1] = self.reads.observe([t for t in (*ins, *params)
                                              if t.is_floating_point()])
        if module_call:
            self.cells.setdefault(name, []).append(cell)
        for t in outs:
            if t.requires_grad:
                self.keep(t, t.register_hook(self._gout(name, op, cell)))
        need = [t for t in ins if t.requires_grad]
        own = _consumers(need, outs) if need and self.watch.checking() else None
        if own:   # check this call's own share of each input's gradient, edge by edge
            for node, edges in own.items():
                node.register_hook(self._edges(name, op or "module", cell, edges))
        if own and not (op and self.watch.recording):
            return   # such a hook would neither check (the node hooks do) nor record
        for t in need:
            self.keep(t, t.register_hook(self._gin(name, op or "module", cell,
                                                   check=not own)))

    def _edges(self, name, op, cell, edges):
        tel = self.watch

        def hook(grad_inputs, grad_outputs):
            if not tel.enabled or tel.busy or not tel.checking() or cell[0] is None:
                return None
            gs = [grad_inputs[i] for i in edges if grad_inputs[i] is not None]
            if gs:
                with _NoGrad():
                    self.acc.event(name, op, "grad_input", "backward",
                                   merge_obs(cell[0], cell[1]), self.reads.observe(gs))
            return None
        return hook

    def _gout(self, name, op, cell):
        tel = self.watch

        def hook(grad):
            if not tel.enabled or tel.busy:
                return None
            with _NoGrad():
                if tel.checking():   # (a call with several outputs: merged)
                    cell[0] = merge_obs(cell[0], self.reads.observe(
                        [grad], full=bool(op) and tel.recording))
                if op and tel.recording:
                    self.acc.add(name, op, "grad_output", grad)
            return None
        return hook

    def _gin(self, name, op, cell, check=True):
        tel = self.watch

        def hook(grad):
            if not tel.enabled or tel.busy:
                return None
            with _NoGrad():
                if check and tel.checking() and cell[0] is not None:
                    self.acc.event(name, op, "grad_input", "backward",
                                   merge_obs(cell[0], cell[1]),
                                   self.reads.observe([grad], full=op != "module"
                                                      and tel.recording))
                if op != "module" and tel.recording:
                    self.acc.add(name, op, "grad_input", grad)
            return None
        return hook

    def _wgrad(self, names: list[str], rows: list[tuple[str, str]], calls: list[str]):
        """The hook of a parameter held by the modules ``names`` (the first its owner, as
        ``named_parameters`` names it; the others share it: tied weights); ``rows``: (name, op)
        of the watched modules whose weight it is; ``calls``: the modules whose calls'
        grad_outputs it is checked against (``names``, or their compiled region)."""
        tel = self.watch
        op = rows[0][1] if rows and rows[0][0] == names[0] else "module"
        who = names[0] if len(names) == 1 else f"{names[0]} (tied: {', '.join(names[1:])})"

        def hook(grad):
            if not tel.enabled or tel.busy:
                return None
            if grad.layout is torch.sparse_coo:   # nn.Embedding(sparse=True): its values
                grad = grad.coalesce()._values()
            with _NoGrad():
                # the gradient sums every call of the step, of every module holding it: finite
                # grad_outputs of all the calls whose backward has run, and a non-finite sum,
                # name it
                cells = [merge_obs(c[0], c[1]) for n in calls for c in self.cells.get(n, ())
                         if c[0] is not None]
                if tel.checking() and cells:
                    ins = cells[0]
                    for c in cells[1:]:
                        ins = merge_obs(ins, c)
                    self.acc.event(who, op, "grad_weight", "backward", ins,
                                   self.reads.observe([grad], full=tel.recording and bool(rows)))
                if tel.recording:
                    for name, row_op in rows:
                        self.acc.add(name, row_op, "grad_weight", grad)
            return None
        return hook

    def on_op(self, op: str, func, call, out) -> None:
        """A function-level op (sdpa, softmax, a registered function ``func``) called with
        ``call`` = (args, kwargs) under the innermost running module: its producer checks,
        forward and backward, name the op; its rows (recording) leave masks out."""
        tel = self.watch
        name = self.stack[-1][0] if self.stack else ROOT
        ins, outs = tensors(call), tensors(out)
        data = _inputs(op, call, ins)
        if torch.is_grad_enabled() and (tel.checking() or tel.recording):
            # its own cell, not one of its module's calls (whose weight gradient check reads
            # those): the op's backward is checked against its own grad_outputs
            self._backward_hooks(name, op, data, outs, module_call=False)
        with _NoGrad():   # (the mode is off here: inside __torch_function__, or taken off)
            if tel.checking() and outs:
                self.check(name, op, "output", "forward", ins, outs, tel.recording)
            if tel.recording:
                for t in data:
                    self.acc.add(name, op, "input", _row_data(op, t))
                extra = []
                if outs and self.shadows.on:
                    extra = self.shadows.op_extra(func, op, call, outs[0])
                for i, t in enumerate(outs):
                    self.acc.add(name, op, "output", t, extra if i == 0 else ())
