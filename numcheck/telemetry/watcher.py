"""``watch(model, ...)``: hooks that gather telemetry (numcheck/telemetry/fields.py) while the
user's own steps run, and find the first non-finite producer (docs/telemetry.md).

Hooks: every submodule gets a forward pre-hook and a forward hook (the module stack, the
forward producer check); the forward hook puts tensor hooks on the call's outputs and on its
inputs that need a gradient (grad_output, grad_input), and hooks on the autograd nodes the
call made that consume its inputs (the backward producer check, per call; no module full
backward hooks: they add graph nodes and change the gradients' last bits); watched modules
(``classify``: linear, attention, norm) record their roles, their weight's gradient through
a tensor hook on the parameter. While the root module's forward runs, a
TorchFunctionMode records ``F.scaled_dot_product_attention`` (op "sdpa") and softmax (op
"softmax", the attention probabilities of models that write attention out, as the tiny models
do) under the innermost module that called them. Nothing is read back from a device in a
hook: ``step()`` reads a step's statistics once.

All of this runs on the steps ``every`` records (and on every step of a model whose root is
never called); the steps in between carry only the root's sentinel (numcheck/telemetry/
sentinel.py), which replays a step that went non-finite under these hooks at ``step()``.

Cost: CPU tensors take one compiled pass each (numcheck/telemetry/_fields_numba.py: all plain
fields and the finiteness the producer check needs, as Python floats accumulated on the host,
no torch op per observation); CUDA tensors the device pass (numcheck/telemetry/_fields_triton.py:
one Triton launch writes a tensor's plain fields as rows on its device), and the producer check
decides at ``step()`` from those rows; where neither applies, the torch route of
``fields.tensor_stats``. A step reads each tensor once (``Telemetry._pass``: the finiteness
check, the producer's input statistics and the recorded row share one pass, and a module's
output met again as the next module's input is not read again). Hooks that run
inside the root's forward take the watch's own TorchFunctionMode off the mode stack while they
work, so telemetry's own torch ops are not intercepted.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import warnings
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from numcheck.errors import UsageError
from numcheck.quant.mx import MXFormat
from numcheck.quant.nvfp4 import NVFP4Format
from numcheck.quant.recipe import QuantRecipe, get_recipe
from numcheck.telemetry import fields
from numcheck.telemetry._structs import map_tensors
from numcheck.telemetry._structs import tensors as _tensors
from numcheck.telemetry.sentinel import Sentinel

ROLES = ("input", "weight", "output", "grad_output", "grad_input", "grad_weight")
QUANT_ROLE = {"input": "x", "weight": "w", "grad_output": "grad"}  # linear roles a recipe has
ROOT = "<model>"
_OPS = {F.scaled_dot_product_attention: "sdpa", torch.softmax: "softmax",
        torch.Tensor.softmax: "softmax", F.softmax: "softmax"}
_DOWNCASTS = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)
_CASTS = frozenset((*_DOWNCASTS, torch.Tensor.to))


class _Where(NamedTuple):
    step: int
    module: str
    op: str
    role: str
    pass_: str


class NonFinite(_Where):
    """The first non-finite producer: a 5-tuple (step, module, op, role, pass_) that compares
    equal to a plain tuple; ``inputs`` holds the statistics of what it consumed (its forward
    inputs and own parameters, or its grad_output): n, n_nan, n_inf, amax, min_nonzero."""

    inputs: dict


def classify(m: nn.Module) -> str | None:
    """The op a watched module records under, or None (not watched: producer checks only)."""
    if isinstance(m, nn.MultiheadAttention):
        return "attention"
    w = getattr(m, "weight", None)
    if isinstance(m, nn.Linear) or (hasattr(m, "in_features") and hasattr(m, "out_features")
                                    and isinstance(w, torch.Tensor) and w.dim() == 2):
        return "linear"  # nn.Linear and drop-ins (convergence.linear.QuantLinear)
    if isinstance(m, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)) or \
            type(m).__name__.endswith("Norm"):
        return "norm"
    return None


def _weight(m: nn.Module) -> torch.Tensor | None:
    w = getattr(m, "weight", None)
    if w is None:
        w = getattr(m, "in_proj_weight", None)
    return w if isinstance(w, torch.Tensor) else None


def _own_params(m: nn.Module) -> list[torch.Tensor]:
    """m.parameters(recurse=False) that are floating point (read from ``_parameters``: a
    quarter of the generator's cost, once per module call)."""
    ps = [p for p in m._parameters.values() if p is not None and p.is_floating_point()]
    return list({id(p): p for p in ps}.values()) if len(ps) > 1 else ps


def _to64(obj):
    """A float64 detached copy of an argument structure's floating tensors."""
    return map_tensors(obj, lambda t: t.detach().to(torch.float64) if t.is_floating_point()
                       else t)


_FAST: dict = {}  # "module": numcheck.telemetry._fields_numba, or None (numba missing or failed)


def _fast():
    """The compiled CPU pass once imported, or None (warned once) where numba is missing."""
    if "module" not in _FAST:
        try:
            _FAST["module"] = importlib.import_module("numcheck.telemetry._fields_numba")
        except ImportError as exc:
            warnings.warn(f"numcheck.telemetry: no numba ({exc}); CPU tensors take the slower "
                          "torch route", RuntimeWarning, stacklevel=3)
            _FAST["module"] = None
    return _FAST["module"]


def _host_plain(t: torch.Tensor, sums: bool = True) -> list[float] | None:
    """A non-empty CPU tensor's plain fields (fields.PLAIN) from the compiled pass, or None
    where it does not apply (then the torch route: CUDA, subclasses, other dtypes).
    ``sums=False``: the integer pass alone, sum_sq NaN (the producer check's needs)."""
    fast = _fast()
    if fast is None or not fast.handles(t):
        return None
    try:
        return fast.raw(t, sums)
    except Exception as exc:  # noqa: BLE001 - numba that cannot compile here: the torch route
        return _broken(exc)


def _read(t: torch.Tensor, full: bool):
    """A non-empty tensor's plain fields: a host list (_host_plain) or device rows
    (_dev_rows)."""
    p = _host_plain(t, full)
    return p if p is not None else _dev_rows(t)


def _host_sqnr(out: torch.Tensor, ref64: torch.Tensor) -> tuple[float, float] | None:
    fast = _fast()
    if fast is None:
        return None
    try:
        return fast.sqnr(out, ref64)
    except Exception as exc:  # noqa: BLE001 - as in _host_plain
        return _broken(exc)


def _host_quants(t: torch.Tensor, quantizers: list) -> list[dict | None]:
    """A CPU tensor's quantization fields for each quantizer (None: none) from
    numcheck/telemetry/_quant_numba.py (the same fields as fields.quant_stats, as floats; the
    tensor widened once for the recipes whose blocks pad it alike; it warns once and answers
    None where numba is missing or fails, or for a format or tensor it does not take: then
    quant_stats)."""
    live = [q for q in quantizers if q is not None]
    if not live:
        return [None] * len(quantizers)
    got = iter(importlib.import_module("numcheck.telemetry._quant_numba").quant_fields_many(
        t, [q.format for q in live]))
    out = []
    for q in quantizers:
        r = None if q is None else next(got)
        out.append(r if r is not None or q is None else fields.quant_stats(t, q))
    return out


def _broken(exc: Exception) -> None:
    _FAST["module"] = None  # for the rest of the process: a compile failure does not heal
    warnings.warn(f"numcheck.telemetry: the compiled CPU pass failed ({type(exc).__name__}: "
                  f"{exc}); using the torch route", RuntimeWarning, stacklevel=4)


# "module": numcheck.telemetry._fields_triton (the device pass, for CUDA tensors), or None (Triton
# missing or the kernel failed); "cpu": its copy run by Triton's interpreter, which the tests
# put here to send CPU tensors through it (absent: CPU tensors never take the pass).
_KERNEL: dict = {}


def _kernel(t: torch.Tensor):
    if not t.is_cuda:
        return _KERNEL.get("cpu")
    if "module" not in _KERNEL:
        try:
            _KERNEL["module"] = importlib.import_module("numcheck.telemetry._fields_triton")
        except Exception as exc:  # noqa: BLE001 - ImportError, or a Triton that fails to load
            warnings.warn(f"numcheck.telemetry: no Triton ({type(exc).__name__}: {exc}); CUDA "
                          "tensors take the torch route (~20 kernel launches a tensor)",
                          RuntimeWarning, stacklevel=5)
            _KERNEL["module"] = None
    return _KERNEL["module"]


def _launch(t: torch.Tensor, fn, *args):
    """fn(*args), a device-pass function reading t; None where it raised (a GPU or Triton the
    kernel does not build on): the pass is then off for t's kind of device for the rest of the
    process, with one warning, and the caller takes the torch route."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of the pass: the torch route
        _KERNEL["module" if t.is_cuda else "cpu"] = None
        warnings.warn(f"numcheck.telemetry: the device pass failed ({type(exc).__name__}: "
                      f"{exc}); using the torch route", RuntimeWarning, stacklevel=5)
        return None


def _dev_rows(t: torch.Tensor) -> torch.Tensor:
    """A non-empty tensor's fields.PLAIN as rows on its device, read at step(): (r, 8) float64
    from the device pass (one kernel launch), or (1, 8) from the torch route
    (fields.tensor_stats) where the pass does not apply or failed."""
    k = _kernel(t)
    rows = _launch(t, k.plain_rows, t) if k is not None and k.handles(t) else None
    if rows is not None:
        return rows
    return torch.stack([v.to(torch.float64) for v in fields.tensor_stats(t).values()])[None]


_BLOCK_FORMATS = (MXFormat, NVFP4Format)   # the device pass's quantization statistics


def _put(parts: list, part: tuple | None) -> None:
    if part is not None:
        parts.append(part)


def _dev_quant(t: torch.Tensor, quantizer, acc: list[float]) -> tuple | None:
    """fields.quant_stats(t, quantizer) as a device part (field indices, rows[, what to apply to
    the rows read back]): for an MX or NVFP4 format (these exact classes: a subclass may change
    any rule), the device pass's rows (_stats_cuda.quant_rows: one launch, NVFP4 two; q_n merged
    into ``acc``), else the reference quantizer's torch ops, stacked."""
    fmt = quantizer.format
    k = _kernel(t)
    got = _launch(t, k.quant_rows, t, fmt) if k is not None and type(fmt) in _BLOCK_FORMATS \
        and t.dim() >= 1 and k.handles(t) else None
    if got is not None:
        fields.host_update(acc, {"q_n": float(t.numel())})
        rows, fix = got
        return (k.QUANT_INDEX, rows) if fix is None else (k.QUANT_INDEX, rows, fix)
    return _dev_part(fields.quant_stats(t, quantizer), acc)


def _dev_part(values: dict, acc: list[float]) -> tuple | None:
    """Split fields (name -> 0-d tensor or float): floats merged into the host vector ``acc``
    now, tensors as one device row (field indices, (1, k) float64) to merge at step()."""
    dev = {k: v for k, v in values.items() if isinstance(v, torch.Tensor) and not v.is_cpu}
    host = {k: v for k, v in values.items() if k not in dev}
    if host:
        fields.host_update(acc, host)
    if not dev:
        return None
    return (tuple(fields.INDEX[k] for k in dev),
            torch.stack([v.to(torch.float64).reshape(()) for v in dev.values()])[None])


# The sentinel's flags: Python bools (CPU tensors, known at once) or 0-d bool tensors on a
# device (read back at step()).
def _and(a, b):
    if isinstance(a, bool):
        if isinstance(b, bool):
            return a and b
        a, b = b, a
    if isinstance(b, bool):
        return a if b else torch.zeros((), dtype=torch.bool, device=a.device)
    return a & b.to(a.device)


class _Pending:
    """The producer check's statistics of some tensors, part of them still on a device: the
    host part (fields.PLAIN floats, or None) and device row blocks ((r, 8) float64, fields.PLAIN
    rows that merge by fields.FIELDS' rules), read at step(). Observations of CPU tensors alone
    stay plain host lists (``_merge_obs``), known at once."""

    __slots__ = ("host", "rows")

    def __init__(self, host: list[float] | None, rows: tuple) -> None:
        self.host, self.rows = host, rows


def _merge_obs(a, b):
    """Two producer-check observations (None: no tensors; a host list of fields.PLAIN; a
    _Pending) as one; the arguments are left as they are."""
    if a is None or b is None:
        return b if a is None else a
    ha, ra = (a, ()) if isinstance(a, list) else (a.host, a.rows)
    hb, rb = (b, ()) if isinstance(b, list) else (b.host, b.rows)
    if ha is None or hb is None:
        h = hb if ha is None else ha
    else:
        h = list(ha)
        fields.host_plain(h, hb)
    return _Pending(h, ra + rb) if ra or rb else h


def _finite(obs, got: dict | None = None) -> bool:
    """No NaN and no Inf in the observed tensors (``got``: id -> the rows read back, for a
    _Pending)."""
    if obs is None:
        return True
    if isinstance(obs, list):
        return obs[2] + obs[3] == 0
    if obs.host is not None and obs.host[2] + obs.host[3] != 0:
        return False
    return all(not (got[id(x)][:, 2:4] != 0).any() for x in obs.rows)


def _plain_of(obs, got: dict) -> list[float] | None:
    """The observed tensors' fields.PLAIN, merged (None: no tensors)."""
    if obs is None or isinstance(obs, list):
        return obs
    h = list(fields.PLAIN_IDENTITY if obs.host is None else obs.host)
    for x in obs.rows:
        fields.host_rows(h, fields.PLAIN_INDEX, got[id(x)])
    return h


def _read_back(tensors) -> dict:
    """id -> numpy copy of each tensor (2-D), one device-to-host copy per device."""
    by_dev: dict = {}
    for x in tensors:
        by_dev.setdefault(x.device, []).append(x)
    got = {}
    for xs in by_dev.values():
        flat = torch.cat([x.reshape(-1) for x in xs]).cpu().numpy()
        at = 0
        for x in xs:
            k = x.numel()
            got[id(x)] = flat[at:at + k].reshape(x.shape)
            at += k
    return got


def _eager(fn):
    """fn, run eagerly where Dynamo traces a compiled module's hooks (fn itself where Dynamo
    cannot be imported here: then nothing is compiled either; importing it costs ~1.5 s once)."""
    try:
        return torch._dynamo.disable(fn)
    except Exception:  # noqa: BLE001 - a torch build or Python without Dynamo
        return fn


def _several_ranks() -> bool:
    """A process group of more than one rank is up: a replay on one rank alone would wait on
    collectives (DDP's buffer broadcast, FSDP's all-gathers) the others never join."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _same_modes(live: nn.Module, copy64: nn.Module) -> None:
    """Give every module of a float64 copy the live module's train/eval mode (the copy was
    made once, at ``watch``; ``model.eval()`` after that must reach it too)."""
    for a, b in zip(live.modules(), copy64.modules(), strict=True):
        b.training = a.training


def _devices(*objs) -> set[tuple[str, int]]:
    """(device type, index) of the accelerator devices the tensors of ``objs`` (modules,
    argument structures) live on: whose generators a forward on them draws from, with the
    CPU's."""
    devs = set()
    for o in objs:
        ts = [*o.parameters(), *o.buffers()] if isinstance(o, nn.Module) else _tensors(o)
        devs |= {(t.device.type, t.device.index or 0) for t in ts
                 if t.device.type not in ("cpu", "meta")}
    return devs


def _own_rng(*objs) -> contextlib.ExitStack:
    """A context in which the shadows draw random numbers (dropout) from a fork of the CPU
    generator and of the generators of the devices of ``objs`` (_devices): the live run's
    draws stay what they were."""
    kinds: dict[str, set[int]] = {}
    for kind, idx in _devices(*objs):
        kinds.setdefault(kind, set()).add(idx)
    stack = contextlib.ExitStack()
    if not kinds:
        stack.enter_context(torch.random.fork_rng(devices=[]))
    for kind, idx in kinds.items():
        stack.enter_context(torch.random.fork_rng(devices=sorted(idx), device_type=kind))
    return stack


def _rng_states(*objs, devs: set | None = None) -> tuple:
    """The CPU generator's state and those of the devices of ``objs`` (_devices) and ``devs``:
    what a module's forward is about to draw from."""
    devs = _devices(*objs) | (devs or set())
    return torch.get_rng_state(), {(k, i): getattr(torch, k).get_rng_state(i)
                                   for k, i in devs}


def _set_rng_states(states: tuple) -> None:
    cpu, devs = states
    torch.set_rng_state(cpu)
    for (k, i), st in devs.items():
        getattr(torch, k).set_rng_state(st, i)


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


class _OpMode(TorchFunctionMode):
    def __init__(self, tel: Telemetry) -> None:
        super().__init__()
        self.tel = tel

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # every op of the model's forward comes through here: as little as possible per op
        out = func(*args, **kwargs) if kwargs else func(*args)
        op = _OPS.get(func)
        if op is not None and not self.tel.busy:
            self.tel.on_op(op, (args, kwargs), out)
        return out


def _resolve(recipe) -> QuantRecipe | None:
    """None for no quantization statistics; a recipe name (RECIPES) or a QuantRecipe-like
    object with Quantizers (or None) under x, w, grad."""
    if recipe is None or recipe == "fp32":
        return None
    if isinstance(recipe, str):
        return get_recipe(recipe)
    if all(hasattr(recipe, r) for r in ("x", "w", "grad")):
        return recipe
    raise UsageError(f"watch: recipe {recipe!r}: give a name from numcheck.quant.recipe.RECIPES "
                     "or a QuantRecipe")


class Telemetry:
    """What ``watch`` returns; see the module doc and docs/telemetry.md."""

    def __init__(self, model: nn.Module, recipe=None, shadow: bool = False, what_if=(),
                 every: int = 1, enabled: bool = True, rank: int | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise UsageError(f"watch: model must be an nn.Module, got {type(model).__name__}")
        if int(every) < 1:
            raise UsageError(f"watch: every={every}; give a positive int")
        lazy = next((n for n, t in (*model.named_parameters(), *model.named_buffers())
                     if t.is_meta or isinstance(t, nn.parameter.UninitializedTensorMixin)), None)
        if lazy is not None:
            raise UsageError(f"watch: {lazy} is on the meta device or not initialized yet (a "
                             "lazy module): no values to measure; watch the model once it is "
                             "materialized (to_empty() and its initialization, or a first "
                             "forward of its lazy modules)")
        self.model, self.every, self.enabled, self.shadow = model, int(every), False, shadow
        self._closed = False
        main = _resolve(recipe)
        self.recipes = ([(getattr(main, "name", "recipe"), main, False)] if main else []) + \
            [(getattr(r, "name", str(n)), r, True) for n, r in
             ((n, _resolve(n)) for n in what_if) if r is not None]
        names = [n for n, _, _ in self.recipes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:   # their rows would share a key (records, goldens)
            raise UsageError(f"watch: recipe {', '.join(twice)} given twice (recipe= and "
                             "what_if=, or twice in what_if): name each recipe once")
        if rank is None:
            dist = torch.distributed
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank, self.step_index, self.busy = rank, 0, False
        # per row key: [host vector (floats), device parts: (field indices, (r, k) rows[, fix])]
        self._acc: dict[tuple, list] = {}
        # producer checks: (module, op, role, pass, flag (None: read at step()), what the call
        # consumed, what it made): observations (_merge_obs) of both
        self._events: list[tuple] = []
        self._rows: list[dict] = []
        self._first: NonFinite | None = None
        # running modules, innermost last: (name, the observation of its inputs read before
        # the forward ran, or None)
        self._stack: list[tuple] = []
        # per forward call of a module in this step: [its grad_outputs' observation], filled
        # by that call's grad_output hooks, read by its grad_input hooks and the weight's
        self._cells: dict[str, list[list]] = {}
        # this step's plain fields per tensor (``_pass``): id -> (weakref, tag, fields, full)
        self._memo: dict[int, tuple] = {}
        self._forwards = 0   # forward passes of the root so far: a tag of ``_memo``'s entries
        self._leaf_handles: list = []     # tensor hooks on leaf tensors: removed at step end
        self._mode: _OpMode | None = None
        self._e2e_out: dict[str, list[torch.Tensor]] = {}
        self._handles: list = []          # the full hooks: on the model while armed "full"
        # the hooks the current step carries (``_arm``): "full", "sentinel" (the root's, on
        # the steps ``every`` skips: numcheck/telemetry/sentinel.py), "off", None (detached)
        self._armed: str | None = None
        self._sentinel = Sentinel(self)
        self._root_seen = False   # a root forward ran under the full hooks
        self._devs: set = set()   # the model's accelerator devices, read when armed
        # the weights' gradient hooks (full hooks), and the parameters they were put on:
        # (id, requires_grad) of each, checked at each root forward (a layer unfrozen later)
        self._weight_handles: list = []
        self._params: tuple = ()
        self._shadow_handles: list = []   # on the float64 copy
        self._names = names = {m: (n or ROOT) for n, m in model.named_modules()}
        self._ops = {m: classify(m) for m in names}
        # float64 shadows, copied before any hook of ours exists (deepcopy copies hooks)
        self._layer64 = {m: copy.deepcopy(m).to(torch.float64) for m, op in self._ops.items()
                         if shadow and op in ("norm", "attention")}
        self._rng_at: dict = {}   # module -> generator states before its live forward
        self._model64 = copy.deepcopy(model).to(torch.float64) if shadow else None
        if self._model64 is not None:
            for n, m in self._model64.named_modules():
                if classify(m):
                    self._shadow_handles.append(m.register_forward_hook(
                        self._capture(n or ROOT)))
        if enabled:
            self.enable()

    # ---- public --------------------------------------------------------------------------

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def enable(self) -> None:
        """Attach the hooks (again) and record from the current step on."""
        if self._closed:
            raise UsageError("telemetry: enable() after close(); start a new watch")
        self.enabled = True
        self._arm()

    def disable(self) -> None:
        """Stop recording and take the hooks off the model (the watch stays, with its records
        and shadows: ``enable()`` resumes). Setting ``enabled = False`` instead leaves the
        hooks in place, returning at once."""
        self.enabled = False
        self._exit_mode()
        self._stack.clear()
        self._detach()
        self._sentinel.clear()
        self._drop_leaf_hooks()

    def close(self) -> None:
        """End the pending step (if anything was recorded, or its sentinel saw a non-finite
        value: a loop that stops on a NaN loss before ``step()``) and remove every hook."""
        self._replay_if_due()
        self.disable()
        if self._acc or self._events:
            self._flush()
        self._cells.clear()
        self._memo.clear()
        for h in self._shadow_handles:
            h.remove()
        self._shadow_handles.clear()
        self._closed = True

    def step(self) -> None:
        """Mark the end of a step: its statistics are read back to the host here, once (and a
        step ``every`` skipped is replayed with the full hooks where its sentinel saw a
        non-finite value: numcheck/telemetry/sentinel.py)."""
        self._replay_if_due()
        if self._acc or self._events:
            self._flush()
        self._cells.clear()
        self._memo.clear()
        self._sentinel.clear()
        self._drop_leaf_hooks()
        self.step_index += 1
        if self.enabled:
            self._arm()

    def records(self):
        """pandas DataFrame, one row per (step, module, op, role, pass, recipe)."""
        return fields.frame(self._rows)

    def to_parquet(self, path) -> None:
        self.records().to_parquet(path, index=False)

    def first_nonfinite(self) -> NonFinite | None:
        """(step, module, op, role, pass) of the first module/op that made a NaN or Inf out of
        finite inputs (forward: inputs and weight; backward: grad_output), or None."""
        return self._first

    # ---- hooks ---------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        return self.enabled and not self.busy and self.step_index % self.every == 0

    def _checking(self) -> bool:
        return self.enabled and not self.busy and self._first is None

    def _arm(self) -> None:
        """Put on the hooks this step needs: all of them on a recorded step, and on every step
        until a root forward has run under them (the sentinel watches the root's forward:
        a model whose root is never called keeps the full check), and on every step where the
        sentinel cannot work (sentinel.py: it gave up, or several ranks); the root's sentinel
        on the steps in between while no producer is named; none once one is."""
        if self.step_index % self.every == 0 or (self._first is None and not (
                self._root_seen and self._sentinel.broken is None and not _several_ranks())):
            want = "full"
        else:
            want = "sentinel" if self._first is None else "off"
        if want == self._armed:
            return
        self._detach()
        if want == "full":
            self._attach_full()
        elif want == "sentinel":
            self._devs = _devices(self.model)
            self._sentinel.attach(self.model)
        self._armed = want

    def _attach_full(self) -> None:
        for m, name in self._names.items():
            self._attach(m, name, self._ops[m], m is self.model)
        self._hook_weights()
        self._armed = "full"

    def _detach(self) -> None:
        for h in (*self._handles, *self._weight_handles):
            h.remove()
        self._handles.clear()
        self._weight_handles.clear()
        self._sentinel.detach()
        self._armed = None

    def _replay_if_due(self) -> None:
        """On a step the sentinel watched: its replay where it saw a non-finite value (the
        producer named, or a warning)."""
        self._exit_mode()   # a forward that raised left the op mode on
        self._stack.clear()
        if not (self._armed == "sentinel" and self._sentinel.due()):
            return
        try:
            self._replay()
        except Exception as exc:  # noqa: BLE001 - a diagnostic: the user's run goes on
            self._acc.clear()
            self._events.clear()
            warnings.warn(f"numcheck.telemetry: the replay of step {self.step_index} failed "
                          f"({type(exc).__name__}: {exc}); no producer named for it",
                          RuntimeWarning, stacklevel=3)
            return
        self._flush()
        if self._first is None and not self._sentinel.unsure:   # unsure: nothing was seen
            self._sentinel.named_nobody(self.step_index)
        self._sentinel.clear()

    def _replay(self) -> None:
        """The sentinel's replay of this step under the full hooks (checking, not recording:
        the step is not a recorded one)."""
        self._detach()
        self._attach_full()
        try:
            self._sentinel.replay()
        finally:
            self._exit_mode()
            self._stack.clear()
            self._drop_leaf_hooks()

    # for numcheck/telemetry/sentinel.py
    _set_rng = staticmethod(_set_rng_states)

    def _rng_of(self, *objs) -> tuple:
        return _rng_states(*objs, devs=self._devs)

    def _attach(self, m: nn.Module, name: str, op: str | None, root: bool) -> None:
        h = self._handles
        # Dynamo must not trace the hooks of a torch.compile'd module (it cannot: "already
        # tracked for mutation"); it runs them eagerly, between graphs
        h.append(m.register_forward_pre_hook(_eager(self._pre(m, name, root)),
                                             with_kwargs=True))
        h.append(m.register_forward_hook(_eager(self._post(m, name, op, root)),
                                         with_kwargs=True))

    def _params_key(self) -> tuple:
        """Which parameters the model's modules have and which need a gradient, and which
        submodules they hold (one replaced after ``watch``: its parameters are read); the
        modules of ``watch``'s own parameter and module dicts, a sixth of ``parameters()``'s
        walk."""
        return tuple((id(p), p.requires_grad) for m in self._names
                     for p in m._parameters.values() if p is not None) + \
            tuple(id(c) for m in self._names for c in m._modules.values())

    def _hook_weights(self) -> None:
        for h in self._weight_handles:
            h.remove()
        self._weight_handles.clear()
        for m, name in self._names.items():
            op = self._ops[m]
            w = _weight(m) if op else None
            if w is not None and w.requires_grad:
                self._weight_handles.append(w.register_hook(self._wgrad(name, op)))
        self._params = self._params_key()

    def _pre(self, m, name, root):
        def hook(mod, args, kwargs):
            if not self.enabled or self.busy:
                return
            if root:
                self._forwards += 1
                self._root_seen = True
                if self._params_key() != self._params:   # unfrozen or replaced since armed
                    self._hook_weights()
            pre = None
            mode = self._unmode()
            try:
                if self._checking():
                    # read before the forward runs: an in-place module changes its input
                    ins = _tensors(args) + _tensors(kwargs) + \
                        _own_params(mod)
                    if ins:   # full: a recorded row reads the same tensors next
                        with _NoGrad():
                            pre = self._observe(ins, full=self._ops[mod] is not None
                                                and self.recording)
                if self.shadow and self.recording and mod.training and mod in self._layer64:
                    # the layer's shadow draws what this forward draws (dropout: same mask)
                    self._rng_at[mod] = _rng_states(mod, args, kwargs)
            finally:
                _remode(mode)
            self._stack.append((name, pre))
            if root:
                if self._model64 is not None and self.recording:
                    self._run_model64(args, kwargs)
                self._exit_mode()
                self._mode = _OpMode(self)
                self._mode.__enter__()
        return hook

    def _post(self, m, name, op, root):
        def hook(mod, args, kwargs, out):
            pre = None
            if self._stack and self._stack[-1][0] == name:
                pre = self._stack.pop()[1]
            if root:
                self._exit_mode()
            if not self.enabled or self.busy:
                return
            mode = self._unmode()
            try:
                with _NoGrad():
                    ins = _tensors(args) + _tensors(kwargs)
                    outs = _tensors(out)
                    if root and not outs and self.every > 1:   # before any sentinel step
                        self._sentinel.give_up("the root module's outputs hold no tensor the "
                                               f"sentinel can read ({type(out).__name__})")
                    rec = bool(op) and self.recording
                    if self._checking() and outs:
                        if pre is not None:
                            # an output that is one of the inputs is read again: a write
                            # through .data changes it behind its version counter
                            self._event(name, op or "module", "output", "forward", pre,
                                        self._observe(outs, full=rec,
                                                      fresh={id(t) for t in ins}))
                        else:
                            self._check(name, op or "module", "output", "forward",
                                        ins + _own_params(mod), outs,
                                        full=rec)
                    if rec:
                        self._record_forward(mod, name, op, args, kwargs, ins, outs)
                if torch.is_grad_enabled() and (self._checking() or (op and self.recording)):
                    self._backward_hooks(name, op, ins, outs)
            finally:
                _remode(mode)
        return hook

    def _unmode(self):
        """Take this watch's _OpMode off the torch-function mode stack when it is the innermost
        mode (a hook inside the root's forward), so that telemetry's own torch ops are not
        intercepted; returns it for _remode (None: nothing taken off)."""
        m = self._mode
        if m is None:
            return None
        n = torch._C._len_torch_function_stack()
        if n and torch._C._get_function_stack_at(n - 1) is m:
            return torch._C._pop_torch_function_stack()
        return None

    def _backward_hooks(self, name, op, ins, outs) -> None:
        """Tensor hooks for this call's backward: on its outputs (grad_output) and on its
        inputs that need a gradient (grad_input). Tensor hooks add no node to the graph, so
        the backward sums in the same order as without telemetry (module full backward hooks
        do not: they change the last bits of the gradients). One cell per call: a module
        called twice checks each call's grad_input against that call's grad_output. Hooks on
        leaf tensors (a Parameter fed to a module) outlive the graph: their handles are kept
        and removed at the step's end, on disable() and on close()."""
        cell: list = [None]   # [the grad_outputs' observation]
        self._cells.setdefault(name, []).append(cell)
        for t in outs:
            if t.requires_grad:
                self._keep(t, t.register_hook(self._gout(name, op, cell)))
        need = [t for t in ins if t.requires_grad]
        own = self._consumers(need, outs) if need and self._checking() else None
        if own:   # check this call's own share of each input's gradient, edge by edge
            for node, edges in own.items():
                node.register_hook(self._edges(name, op or "module", cell, edges))
        if own and not op:
            return   # such a hook would neither check (the node hooks do) nor record
        for t in need:
            self._keep(t, t.register_hook(self._gin(name, op or "module", cell,
                                                    check=not own)))

    @staticmethod
    def _consumers(ins, outs) -> dict | None:
        """The autograd nodes this call created that consume its inputs: {node: [edge index]},
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

    def _edges(self, name, op, cell, edges):
        def hook(grad_inputs, grad_outputs):
            if not self.enabled or self.busy or not self._checking() or cell[0] is None:
                return None
            gs = [grad_inputs[i] for i in edges if grad_inputs[i] is not None]
            if gs:
                with _NoGrad():
                    self._event(name, op, "grad_input", "backward", cell[0],
                                self._observe(gs))
            return None
        return hook

    def _keep(self, t: torch.Tensor, handle) -> None:
        if t.grad_fn is None:   # a leaf: the hook would stay on it after the graph is gone
            self._leaf_handles.append(handle)

    def _drop_leaf_hooks(self) -> None:
        for h in self._leaf_handles:
            h.remove()
        self._leaf_handles.clear()

    def _gout(self, name, op, cell):
        def hook(grad):
            if not self.enabled or self.busy:
                return None
            with _NoGrad():
                if self._checking():   # (a call with several outputs: merged)
                    cell[0] = _merge_obs(cell[0],
                                         self._observe([grad], full=bool(op) and self.recording))
                if op and self.recording:
                    self._add(name, op, "grad_output", grad)
            return None
        return hook

    def _gin(self, name, op, cell, check=True):
        def hook(grad):
            if not self.enabled or self.busy:
                return None
            with _NoGrad():
                if check and self._checking() and cell[0] is not None:
                    self._event(name, op, "grad_input", "backward", cell[0],
                                self._observe([grad], full=op != "module" and self.recording))
                if op != "module" and self.recording:
                    self._add(name, op, "grad_input", grad)
            return None
        return hook

    def _wgrad(self, name, op):
        def hook(grad):
            if not self.enabled or self.busy:
                return None
            with _NoGrad():
                # the weight's gradient sums every call of the step: finite grad_outputs of
                # all the calls whose backward has run, and a non-finite sum, name it
                cells = [c[0] for c in self._cells.get(name, ()) if c[0] is not None]
                if self._checking() and cells:
                    ins = cells[0]
                    for c in cells[1:]:
                        ins = _merge_obs(ins, c)
                    self._event(name, op, "grad_weight", "backward", ins,
                                self._observe([grad], full=self.recording))
                if self.recording:
                    self._add(name, op, "grad_weight", grad)
            return None
        return hook

    def on_op(self, op: str, args, out) -> None:
        """A function-level op (sdpa, softmax) under the innermost running module."""
        name = self._stack[-1][0] if self._stack else ROOT
        ins, outs = _tensors(args), _tensors(out)
        if self.recording and torch.is_grad_enabled():
            # its backward rows (grad_output, grad_input): tensor hooks, recording only; the
            # backward producer check stays with the modules (an op's cell is not one of its
            # module's calls, whose weight gradient check reads them)
            cell: list = [None]
            for t in outs:
                if t.requires_grad:
                    self._keep(t, t.register_hook(self._gout(name, op, cell)))
            for t in ins:
                if t.requires_grad:
                    self._keep(t, t.register_hook(self._gin(name, op, cell, check=False)))
        with _NoGrad():   # (inside __torch_function__: the mode is off already)
            if self._checking() and outs:
                self._check(name, op, "output", "forward", ins, outs, self.recording)
            if self.recording:
                for t in ins:
                    self._add(name, op, "input", t)
                for t in outs:
                    self._add(name, op, "output", t)

    # ---- recording -----------------------------------------------------------------------

    def _pass(self, t: torch.Tensor, full: bool, fresh: bool = False):
        """t's plain fields: a host list (fields.PLAIN, the compiled CPU pass) or a device row
        block (_dev_rows, read at step()), computed once per step: a tensor met again (one
        module's output is the next one's input, a container's input its first child's) takes
        the fields stored for it, while it is the same object with the same version, storage
        and forward pass (a parameter's ``.data`` can be written behind its version counter,
        between forwards: the optimizer's step); the CPU integer pass's fields (sum_sq NaN) do
        not answer ``full``; ``fresh``: read it again (and store that)."""
        e = self._memo.get(id(t))
        try:
            tag = (t._version, t.data_ptr(), self._forwards)
        except RuntimeError:   # an inference tensor keeps no version counter: no memo
            return _read(t, full)
        if not fresh and e is not None and e[1] == tag and e[0]() is t and (e[3] or not full):
            return e[2]
        p = _read(t, full)
        self._memo[id(t)] = (weakref.ref(t), tag, p, not isinstance(p, list) or p[7] == p[7])
        return p

    @staticmethod
    def _all_finite(ts: list[torch.Tensor]):
        """No NaN and no Inf in any of ts, nothing else read: a bool (CPU tensors: the
        compiled integer max) or a 0-d device flag (the sentinel's reads)."""
        fast, ok = _fast(), True
        for t in ts:
            if t.layout is torch.sparse_coo:   # nn.Embedding(sparse=True)'s gradient
                t = t._values()
            f = None
            if fast is not None and t.numel() and fast.handles(t):
                try:
                    f = fast.finite(t)
                except Exception as exc:  # noqa: BLE001 - as in _host_plain
                    _broken(exc)
            ok = _and(ok, torch.isfinite(t.detach()).all() if f is None else f)
        return ok

    def _observe(self, ts: list[torch.Tensor], full: bool = False, fresh: set = frozenset()):
        """What the producer check reads of ts: their finiteness and plain statistics, as one
        observation (_merge_obs; None for no tensors). CPU tensors take the compiled pass; on
        CPU only its integer half runs (sum_sq NaN: NonFinite.inputs does not show it)
        unless ``full``: the hook records these tensors next. Tensors whose id is in
        ``fresh`` are read again, not taken from the step's memo."""
        obs = None
        for t in ts:
            if t.numel() == 0:   # nothing to read: finite, identity statistics
                p = list(fields.PLAIN_IDENTITY)
            else:
                p = self._pass(t, full, id(t) in fresh)
            obs = _merge_obs(obs, p if isinstance(p, list) else _Pending(None, (p,)))
        return obs

    def _check(self, name, op, role, pass_, ins, outs, full: bool = False) -> None:
        ins = [t for t in ins if t.is_floating_point()]
        self._event(name, op, role, pass_, self._observe(ins, full=full),
                    self._observe(outs, full=full))

    def _event(self, name, op, role, pass_, ins, outs) -> None:
        """A producer check: the call consumed ``ins`` and made ``outs`` (observations); it
        produced a non-finite value where all of ins are finite and some of outs is not,
        decided now where both are on the host, at step() otherwise."""
        flag = None
        if not isinstance(ins, _Pending) and not isinstance(outs, _Pending):
            flag = _finite(ins) and not _finite(outs)
        self._events.append((name, op, role, pass_, flag, ins, outs))

    def _add(self, name, op, role, t: torch.Tensor, extra: list = ()) -> None:
        """Accumulate t's statistics into every row it belongs to (the recipe's and each
        what-if's for a quantized role of a linear layer). A row's host vector takes the
        fields known as floats (the compiled CPU passes; quantization / shadow fields given
        as floats or CPU tensors); fields on a device wait as device parts (read at
        step()). ``extra``: more fields for the row (_sqnr_pair's: dicts, or device
        parts)."""
        if t.numel() == 0:
            return
        tags = [("", None, False)]
        if op == "linear" and role in QUANT_ROLE and self.recipes:
            tags = [(n, getattr(r, QUANT_ROLE[role], None), w) for n, r, w in self.recipes]
            if self.recipes[0][2]:  # what-ifs only: the observed row as well
                tags.insert(0, ("", None, False))
        pass_ = "backward" if role.startswith("grad") else "forward"
        p = self._pass(t, True)
        host = isinstance(p, list)
        qs = _host_quants(t, [q for _, q, _ in tags]) if host else None
        for i, (tag, quantizer, what_if) in enumerate(tags):
            slot = self._acc.get((name, op, role, pass_, tag, what_if))
            if slot is None:
                slot = self._acc[(name, op, role, pass_, tag, what_if)] = \
                    [fields.host_identity(), []]
            h = slot[0]
            if host:
                fields.host_plain(h, p)
                if qs[i] is not None:
                    fields.host_update(h, qs[i])
            else:
                slot[1].append((fields.PLAIN_INDEX, p))
                if quantizer is not None:
                    _put(slot[1], _dev_quant(t, quantizer, h))
            for e in extra:
                _put(slot[1], _dev_part(e, h) if isinstance(e, dict) else e)

    def _record_forward(self, mod, name, op, args, kwargs, ins, outs) -> None:
        for t in ins:
            self._add(name, op, "input", t)
        w = _weight(mod)
        if w is not None:
            self._add(name, op, "weight", w)
        if not outs:
            return
        extra = []
        if self.shadow:
            ref = self._layer_ref(mod, op, args, kwargs)
            if ref is not None:
                extra += _sqnr_pair(outs[0], ref, "sh")
            pending = self._e2e_out.get(name)
            if pending:
                extra += _sqnr_pair(outs[0], pending.pop(0), "e2e")
        self._add(name, op, "output", outs[0], extra)
        for t in outs[1:]:
            self._add(name, op, "output", t)

    # ---- shadows -------------------------------------------------------------------------

    def _layer_ref(self, mod, op, args, kwargs) -> torch.Tensor | None:
        """The layer's own output in float64 on the same inputs (its weights copied to fp64)."""
        ins = _tensors(args) + _tensors(kwargs)
        dev = ins[0].device.type if ins else "cpu"
        self.busy = True
        try:
            with torch.autocast(dev, enabled=False), KeepFP64():
                if op == "linear":
                    x = args[0] if args else kwargs.get("input", ins[0] if ins else None)
                    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                        return None
                    b = getattr(mod, "bias", None)
                    return F.linear(_to64(x), mod.weight.detach().to(torch.float64),
                                    None if b is None else b.detach().to(torch.float64))
                m64 = self._layer64.get(mod)
                if m64 is None:
                    return None
                for p64, p in zip(m64.parameters(), mod.parameters(), strict=True):
                    p64.copy_(p.detach())
                _same_modes(mod, m64)
                states = self._rng_at.pop(mod, None)
                with _own_rng(mod, args, kwargs):
                    if states is not None:
                        _set_rng_states(states)
                    out = _tensors(m64(*_to64(args), **_to64(kwargs)))
                return out[0] if out else None
        finally:
            self.busy = False

    def _capture(self, name):
        def hook(mod, args, out):
            t = _tensors(out)
            if t:
                self._e2e_out.setdefault(name, []).append(t[0].detach())
        return hook

    def _run_model64(self, args, kwargs) -> None:
        """Refresh the float64 model copy from the live weights and run it on the same inputs;
        its watched modules' outputs wait in ``_e2e_out`` for the live ones."""
        m64 = self._model64
        self._e2e_out.clear()
        params = _tensors(args) + _tensors(kwargs)
        dev = params[0].device.type if params else "cpu"
        self.busy = True
        try:
            with torch.no_grad(), torch.autocast(dev, enabled=False), KeepFP64():
                for d, s in zip(m64.state_dict().values(), self.model.state_dict().values(),
                                strict=True):
                    d.copy_(s.detach())
                _same_modes(self.model, m64)
                with _own_rng(self.model, args, kwargs):
                    m64(*_to64(args), **_to64(kwargs))
        finally:
            self.busy = False

    # ---- the one read-back per step ------------------------------------------------------

    def _exit_mode(self) -> None:
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def _flush(self) -> None:
        """The step's rows and its first producer: the device parts of its rows and of its
        producer checks read with one device-to-host copy per device (none on a CPU-only
        model: its host rows are Python floats already), then merged on the host."""
        ev = self._events if self._first is None else []
        pending = {id(part[1]): part[1] for slot in self._acc.values() for part in slot[1]}
        for e in ev:
            if e[4] is None:
                pending.update((id(x), x) for o in e[5:] if isinstance(o, _Pending)
                               for x in o.rows)
        got = _read_back(pending.values()) if pending else {}
        for k, (raw, parts) in self._acc.items():
            for idx, x, *fix in parts:
                fields.host_rows(raw, idx, fix[0](got[id(x)]) if fix else got[id(x)])
            self._rows.append({"step": self.step_index, "rank": self.rank, "module": k[0],
                               "op": k[1], "role": k[2], "pass": k[3], "recipe": k[4],
                               "what_if": k[5], **dict(zip(fields.NAMES, raw, strict=True))})
        hit = next((e for e in ev if (e[4] if e[4] is not None else
                                      _finite(e[5], got) and not _finite(e[6], got))), None)
        if hit is not None:
            first = NonFinite(self.step_index, *hit[:4])
            vec = _plain_of(hit[5], got)
            raw = {} if vec is None else dict(zip(fields.NAMES, vec))
            first.inputs = {k: raw[k] for k in ("n", "n_nan", "n_inf", "amax",
                                                "min_nonzero")} if raw else {}
            self._first = first
        self._acc.clear()
        self._events.clear()


def _remode(mode) -> None:
    """Put back the mode Telemetry._unmode took off (None: nothing)."""
    if mode is not None:
        torch._C._push_on_torch_function_stack(mode)


def _sqnr_pair(out: torch.Tensor, ref64: torch.Tensor, prefix: str) -> list:
    """fields.sqnr_pair as contributions to a row (Telemetry._add's ``extra``): Python floats
    from the compiled CPU pass; on a device, the device pass's rows (_stats_cuda.sqnr_rows: one
    launch); else the torch route's fields."""
    r = _host_sqnr(out, ref64)
    if r is not None:
        return [{f"{prefix}_n": 1.0, f"{prefix}_sig_sq": r[0], f"{prefix}_err_sq": r[1]}]
    k = _kernel(out)
    rows = _launch(out, k.sqnr_rows, out, ref64) if k is not None and k.handles(out) and \
        ref64.dtype is torch.float64 and ref64.shape == out.shape and \
        ref64.device == out.device else None
    if rows is not None:
        return [{f"{prefix}_n": 1.0},
                ((fields.INDEX[f"{prefix}_sig_sq"], fields.INDEX[f"{prefix}_err_sq"]), rows)]
    return [fields.sqnr_pair(out, ref64, prefix)]


def watch(model: nn.Module, recipe=None, shadow: bool = False, what_if=(), every: int = 1, *,
          enabled: bool = True, rank: int | None = None) -> Telemetry:
    """Attach telemetry to ``model`` (docs/telemetry.md); use as a context manager, or call
    ``close()``. ``recipe``/``what_if``: QuantRecipe names (numcheck.quant.recipe.RECIPES) or
    objects; ``every``: record statistics on every n-th step (the producer check covers every
    step: in between, numcheck/telemetry/sentinel.py); ``enabled=False`` attaches disabled; ``rank`` defaults to torch.distributed's."""
    return Telemetry(model, recipe, shadow, what_if, every, enabled, rank)
