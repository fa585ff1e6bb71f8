"""``watch(model, ...)``: telemetry gathered (numcheck/telemetry/fields.py) while the user's own
steps run, and the first non-finite producer (docs/telemetry.md).

``Telemetry`` is the watch: it composes the parts, each in its own module, and arms the hooks
each step needs:

* hooks.py: the full hooks on the model's modules, its tensors and autograd nodes, and what
  each of them reads (the producer check, the rows of the watched modules); op_classes.py:
  which modules and functions record as which op (``classify``, ``register``), and what is
  a compiled region;
* observation.py: the step's memo (each tensor read once a step) and the producer check's
  observations; passes.py: which pass reads a tensor (compiled CPU pass, device pass, torch
  route);
* accumulator.py: the rows and producer checks of a step, merged on the host at ``step()``
  (one device-to-host copy per device), and the records;
* shadows.py: the float64 layer and whole-model shadows;
* sentinel.py and rng.py: the producer check on the steps ``every`` does not record (the
  root's sentinel), the replay of a step that went non-finite under the full hooks at
  ``step()``, and the generator states it (and the shadows) run from.

All of the hooks run on the steps ``every`` records (and on every step of a model whose root
is never called); the steps in between carry only the root's sentinel.
"""
from __future__ import annotations

import operator
import warnings

import torch
from torch import nn

from numcheck.errors import UsageError
from numcheck.quant.recipe import QuantRecipe, get_recipe
from numcheck.telemetry.accumulator import ROLES, Accumulator, NonFinite, NoProducer
from numcheck.telemetry.hooks import ROOT, Hooks
from numcheck.telemetry.op_classes import classify, compiled_region, region_body
from numcheck.telemetry.observation import StepReads
from numcheck.telemetry.passes import all_finite
from numcheck.telemetry.ranks import Ranks, is_data_parallel
from numcheck.telemetry.rng import devices, rng_states, set_rng_states
from numcheck.telemetry.sentinel import Sentinel
from numcheck.telemetry.shadows import KeepFP64, Shadows

# the public names of this module that live in its parts (numcheck.telemetry exports them)
__all__ = ["ROLES", "KeepFP64", "NonFinite", "Telemetry", "classify", "watch"]


def _several_ranks() -> bool:
    """A process group of more than one rank is up: a replay on one rank alone would wait on
    collectives (DDP's buffer broadcast, FSDP's all-gathers) the others never join."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _resolve(recipe) -> QuantRecipe | None:
    """None for no quantization statistics; a recipe name (RECIPES) or a QuantRecipe-like
    object with Quantizers (or None) under x, w, grad."""
    if recipe is None or recipe == "fp32":
        return None
    if isinstance(recipe, str):
        return get_recipe(recipe)
    if _is_recipe(recipe):
        return recipe
    raise UsageError(f"watch: recipe {recipe!r}: give a name from numcheck.quant.recipe.RECIPES "
                     "or a QuantRecipe")


def _display_name(path: str, m: nn.Module) -> str:
    """A module's name in rows and producers: its path without torch.compile's ``_orig_mod``
    (the module a compiled wrapper holds takes the wrapper's path; the wrapper itself, whose
    hooks see the same call from outside, is named ``<path> (compiled)``)."""
    name = ".".join(p for p in path.split(".") if p and p != "_orig_mod") or ROOT
    return f"{name} (compiled)" if compiled_region(m) else name


def _display_names(model: nn.Module) -> dict:
    """module -> its name in rows (``_display_name``), with DistributedDataParallel's own
    ``module`` level left out: the model it wraps takes its name, and the wrapper is named
    ``<its name> (ddp)``."""
    wrapped = {f"{p}.module" if p else "module" for p, m in model.named_modules()
               if is_data_parallel(m)}
    out = {}
    for path, m in model.named_modules():
        parts = path.split(".") if path else []
        keep = [seg for i, seg in enumerate(parts) if ".".join(parts[:i + 1]) not in wrapped]
        name = _display_name(".".join(keep), m)
        out[m] = f"{name} (ddp)" if is_data_parallel(m) else name
    return out


def _regions(model: nn.Module) -> dict:
    """The modules inside torch.compile'd regions (an OptimizedModule's ``_orig_mod`` and its
    submodules; a module compiled in place: its submodules) -> the region's wrapper."""
    inside = {}
    for m in model.modules():
        if compiled_region(m):
            for sub in region_body(m).modules():
                if sub is not m:
                    inside.setdefault(sub, m)
    return inside


def _dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process, by Dynamo's own counters."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - a torch build without Dynamo
        return 0, 0
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def _is_recipe(obj) -> bool:
    return all(hasattr(obj, r) for r in ("x", "w", "grad"))


def _steps(every) -> int:
    """``every`` as a positive int; a float (2.5) or a bool is refused, not truncated."""
    try:
        n = operator.index(every) if not isinstance(every, bool) else None
    except TypeError:
        n = None
    if n is None or n < 1:
        raise UsageError(f"watch: every={every!r}: give a positive int (record statistics on "
                         "every n-th step)")
    return n


class Telemetry:
    """What ``watch`` returns; see the module doc and docs/telemetry.md."""

    def __init__(self, model: nn.Module, recipe=None, shadow: bool = False, what_if=(),
                 every: int = 1, enabled: bool = True, rank: int | None = None,
                 inside_compiled: bool = False, digests: bool = False,
                 replicas: bool | None = None, live_merge: bool = False,
                 optimizer=None) -> None:
        if not isinstance(model, nn.Module):
            raise UsageError(f"watch: model must be an nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(getattr(optimizer, "state", None), dict):
            raise UsageError(f"watch: optimizer={type(optimizer).__name__}: pass the "
                             "torch.optim.Optimizer that updates the model (its .state is read)")
        every = _steps(every)
        if isinstance(what_if, str) or _is_recipe(what_if):  # one recipe, not a sequence
            what_if = (what_if,)
        lazy = next((n for n, t in (*model.named_parameters(), *model.named_buffers())
                     if t.is_meta or isinstance(t, nn.parameter.UninitializedTensorMixin)), None)
        if lazy is not None:
            raise UsageError(f"watch: {lazy} is on the meta device or not initialized yet (a "
                             "lazy module): no values to measure; watch the model once it is "
                             "materialized (to_empty() and its initialization, or a first "
                             "forward of its lazy modules)")
        self.model, self.every, self.enabled, self.shadow = model, every, False, shadow
        self.live_merge = bool(live_merge)
        self._sent = 0   # the live merge: rows gathered so far
        self._closed = False
        self._checked = 0   # steps that ran a forward under the check
        self._told_rows = False   # the warning that rows hold NaN/Inf with no producer named
        self._failed_replay: int | None = None   # the first step whose replay failed
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
        # the hooks the current step carries (``_arm``): "full", "sentinel" (the root's, on
        # the steps ``every`` skips: numcheck/telemetry/sentinel.py), "off", None (detached)
        self._armed: str | None = None
        self._sentinel = Sentinel(self)
        self._devs: set = set()   # the model's accelerator devices, read when armed
        self._names = names = _display_names(model)
        ops = {m: classify(m) for m in names}
        regions = _regions(model)
        # the regions watched from their boundary (a module compiled in place may hold none)
        boundaries = frozenset() if inside_compiled else \
            frozenset(m for m in names if compiled_region(m) and m not in regions)
        # inside_compiled: the per-layer hooks inside compiled regions, and Dynamo's counts
        # before them (the first step() says what watching did to the compiled program)
        self._compiled_from = _dynamo_counts() if inside_compiled and \
            any(compiled_region(m) for m in names) else None
        if boundaries:
            outer = sorted(names[r] for r in boundaries)
            warnings.warn(
                f"numcheck.telemetry: {', '.join(outer)}: a torch.compile region, watched from "
                f"the compiled region's boundary (op 'compiled': its inputs, outputs and their "
                f"gradients; the weights and weight gradients of the {len(regions)} modules "
                "inside), so the compiled program stays the unwatched one; watch(..., "
                "inside_compiled=True) for per-layer rows, at the cost of graph breaks "
                "(docs/telemetry.md)", UserWarning, stacklevel=3)
        self.reads = StepReads()
        self.ranks = Ranks(model, names, replicas, optimizer=optimizer)
        self.acc = Accumulator(self.reads, self.recipes, rank, bool(digests), self.ranks.on)
        # float64 shadows, copied before any hook of ours exists (deepcopy copies hooks)
        self.shadows = Shadows(model, ops, shadow, self, names)
        self.hooks = Hooks(self, model, names, ops, self.reads, self.acc, self.shadows,
                           self._sentinel, {} if inside_compiled else regions, boundaries)
        # for numcheck/telemetry/sentinel.py
        self._params_key, self._keep = self.hooks.params_key, self.hooks.keep
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
        self.hooks.exit_mode()
        self.hooks.stack.clear()
        self._detach()
        self._sentinel.clear()
        self.hooks.drop_leaf_hooks()

    def close(self) -> None:
        """End the pending step (if anything was recorded, or its sentinel saw a non-finite
        value: a loop that stops on a NaN loss before ``step()``) and remove every hook."""
        self._replay_if_due()
        self.disable()
        if self.acc.pending():
            self.acc.flush(self.step_index)
        self.hooks.cells.clear()
        self.reads.clear()
        self.shadows.close()
        self._closed = True

    def step(self) -> None:
        """Mark the end of a step: its statistics are read back to the host here, once (and a
        step ``every`` skipped is replayed with the full hooks where its sentinel saw a
        non-finite value: numcheck/telemetry/sentinel.py)."""
        if self._closed:
            raise UsageError("telemetry: step() after close(); start a new watch")
        if self.enabled and self._armed in ("full", "sentinel") and not (
                self.hooks.ran or self._sentinel.log):
            warnings.warn(f"numcheck.telemetry: step {self.step_index} ended without a forward "
                          "of the watched model (step() called twice, or the model run "
                          "before watch()): nothing was measured for it", UserWarning,
                          stacklevel=2)
        self._checked += bool(self.enabled and (self.hooks.ran or self._sentinel.log))
        if self._compiled_from is not None and self.hooks.ran:
            graphs, breaks = (a - b for a, b in zip(_dynamo_counts(), self._compiled_from,
                                                    strict=True))
            self._compiled_from = None
            warnings.warn(f"numcheck.telemetry: watching inside the compiled regions changed "
                          f"the compiled program: Dynamo compiled {graphs} graph(s) and broke "
                          f"{breaks} time(s) in step {self.step_index} (the per-layer hooks run "
                          "eagerly, between graphs); compare with an unwatched step, or watch "
                          "from the regions' boundaries (inside_compiled=False)", UserWarning,
                          stacklevel=2)
        self.hooks.ran = False
        self._replay_if_due()
        if self.acc.pending():
            self.acc.flush(self.step_index)
        if self.ranks.on and self.enabled and self.step_index % self.every == 0:
            rows = self.acc.rows[self._sent:] if self.live_merge else None
            self._sent = len(self.acc.rows)
            self.ranks.after_step(self.step_index, self.acc.first, self.acc.nonfinite_rows,
                                  rows)
        why = self.first_nonfinite() if self.acc.first is None and self.acc.nonfinite_rows \
            and not self._told_rows else None
        if isinstance(why, NoProducer):   # (another rank's producer names it: no warning)
            self._told_rows = True
            warnings.warn(f"numcheck.telemetry: rows up to step {self.step_index} hold NaN or "
                          f"Inf and no producer is named: {why.detail}", RuntimeWarning,
                          stacklevel=2)
        self.hooks.cells.clear()
        self.reads.clear()
        self._sentinel.clear()
        self.hooks.drop_leaf_hooks()
        self.step_index += 1
        if self.enabled:
            self._arm()

    def records(self):
        """pandas DataFrame, one row per (step, module, op, role, pass, recipe)."""
        return self.acc.records()

    def to_parquet(self, path) -> None:
        self.records().to_parquet(path, index=False)

    def merged(self):
        """The records of every rank merged (``numcheck.telemetry.merge``: statistics of the
        whole tensors, rank -1), gathered at each recorded step: ``watch(...,
        live_merge=True)`` under a process group; the same on every rank."""
        if not self.live_merge:
            raise UsageError("telemetry: merged() needs watch(..., live_merge=True) (or merge "
                             "the ranks' files afterwards: numcheck.telemetry.merge)")
        from numcheck.telemetry.fields import frame, merge
        return merge([frame(self.ranks.gathered if self.ranks.on else self.acc.rows)])

    def replicas(self):
        """DataFrame (step, parameter, ranks, max_abs_diff) of the data-parallel replicas that
        differed after a recorded step (numcheck/telemetry/ranks.py); empty when all agree or
        with one rank; the same on every rank."""
        return self.ranks.frame()

    def first_nonfinite(self) -> NonFinite | NoProducer:
        """(step, module, op, role, pass) of the first module/op that made a NaN or Inf out of
        finite inputs (forward: inputs and weight; backward: grad_output); else a NoProducer
        (false in a boolean context) saying why none is named. Under several ranks, the
        earliest (step, rank) of all ranks', agreed at each recorded step (``.rank``,
        ``.received``)."""
        if self.ranks.first is not None:
            return self.ranks.first
        if self.acc.first is not None:
            if self.acc.first.rank is None:
                self.acc.first.rank = self.rank
            return self.acc.first
        if self.acc.seen is not None:
            step, module, op, role, pass_ = self.acc.seen
            if pass_ == "forward":
                return NoProducer("propagated", step, (
                    f"the first non-finite value seen (step {step}) was already in the inputs "
                    f"of {module} ({op}): it came with the data, or from parameters made "
                    "non-finite outside the model (the optimizer)"))
            return NoProducer("outside", step, (
                f"the first non-finite gradient seen (step {step}) was already in the "
                f"grad_output of {module} ({op}): produced outside any module's own "
                "computation (the loss, inside the root's forward or after it; a loss scale; "
                "a torch.autograd.grad seed)"))
        if self._failed_replay is not None:
            return NoProducer("not_checked", self._failed_replay, (
                f"step {self._failed_replay} went non-finite between recorded steps and its "
                f"replay failed (every={self.every}; its warning says why): watch with every=1"))
        if not self._checked:
            return NoProducer("not_checked", None, (
                "no step ran a forward of the watched model under an enabled watch (step() "
                "marks a step's end)"))
        if self.acc.nonfinite_rows:
            return NoProducer("unattributed", None, (
                "output or gradient rows hold NaN or Inf that no producer check saw made (a "
                "bare op's backward whose result was masked before any module consumed it, "
                "or a module the check cannot see: docs/telemetry.md, caveats)"))
        return NoProducer("all_finite", None, (
            f"every value the check read in {self._checked} step(s) was finite"))

    # ---- what the hooks do this step -----------------------------------------------------

    @property
    def recording(self) -> bool:
        return self.enabled and not self.busy and self.step_index % self.every == 0

    def checking(self) -> bool:
        """The producer check runs: no producer named yet."""
        return self.enabled and not self.busy and self.acc.first is None

    def _arm(self) -> None:
        """Put on the hooks this step needs: all of them on a recorded step, and on every step
        until a root forward has run under them (the sentinel watches the root's forward:
        a model whose root is never called keeps the full check), and on every step where the
        sentinel cannot work (sentinel.py: it gave up, or several ranks); the root's sentinel
        on the steps in between while no producer is named; none once one is."""
        first = self.acc.first
        if self.step_index % self.every == 0 or (first is None and not (
                self.hooks.root_seen and self._sentinel.broken is None
                and not _several_ranks())):
            want = "full"
        else:
            want = "sentinel" if first is None else "off"
        if want == self._armed:
            return
        self._detach()
        if want == "full":
            self._attach_full()
        elif want == "sentinel":
            self._devs = devices(self.model)
            self._sentinel.attach(self.model)
        self._armed = want

    def _attach_full(self) -> None:
        self.hooks.attach()
        self._armed = "full"

    def _detach(self) -> None:
        self.hooks.detach()
        self._sentinel.detach()
        self._armed = None

    # ---- the replay of a step the sentinel watched ---------------------------------------

    def _replay_if_due(self) -> None:
        """On a step the sentinel watched: its replay where it saw a non-finite value (the
        producer named, or a warning)."""
        self.hooks.exit_mode()   # a forward that raised left the op mode on
        self.hooks.stack.clear()
        if not (self._armed == "sentinel" and self._sentinel.due()):
            return
        try:
            self._replay()
        except Exception as exc:  # noqa: BLE001 - a diagnostic: the user's run goes on
            self.acc.discard()
            if self._failed_replay is None:
                self._failed_replay = self.step_index
            warnings.warn(f"numcheck.telemetry: the replay of step {self.step_index} failed "
                          f"({type(exc).__name__}: {exc}); no producer named for it",
                          RuntimeWarning, stacklevel=3)
            return
        self.acc.flush(self.step_index)
        if self.acc.first is None and not self._sentinel.unsure:   # unsure: nothing was seen
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
            self.hooks.exit_mode()
            self.hooks.stack.clear()
            self.hooks.drop_leaf_hooks()

    # for numcheck/telemetry/sentinel.py
    _set_rng = staticmethod(set_rng_states)
    _all_finite = staticmethod(all_finite)

    def _rng_of(self, *objs) -> tuple:
        return rng_states(*objs, devs=self._devs)


def watch(model: nn.Module, recipe=None, shadow: bool = False, what_if=(), every: int = 1, *,
          enabled: bool = True, rank: int | None = None,
          inside_compiled: bool = False, digests: bool = False,
          replicas: bool | None = None, live_merge: bool = False,
          optimizer=None) -> Telemetry:
    """Attach telemetry to ``model`` (docs/telemetry.md); use as a context manager, or call
    ``close()``. ``recipe``/``what_if``: QuantRecipe names (numcheck.quant.recipe.RECIPES) or
    objects; ``every``: record statistics on every n-th step (the producer check covers every
    step: in between, numcheck/telemetry/sentinel.py); ``enabled=False`` attaches disabled; ``rank`` defaults to torch.distributed's.
    ``inside_compiled``: a ``torch.compile``d model (or submodule) is watched from its compiled
    region's boundary (its program unchanged); True puts the per-layer hooks inside it too,
    which breaks its graphs (the first step says by how much). ``digests``: each row also
    holds a 48-bit digest of its tensors' bits (numcheck/telemetry/digest.py), for ``diff``.
    ``replicas``: check after each recorded step that the data-parallel replicas of every
    parameter agree across ranks (``Telemetry.replicas()``); default: for a
    DistributedDataParallel model under a process group of several ranks. ``live_merge``:
    gather every rank's rows at each recorded step (in the step's one collective), merged
    by ``Telemetry.merged()`` on every rank. ``optimizer``: with the replicas, check its state
    of each replicated parameter too (moments, momentum, step: ``"fc2.weight:exp_avg_sq"``)."""
    return Telemetry(model, recipe, shadow, what_if, every, enabled, rank, inside_compiled,
                     digests, replicas, live_merge, optimizer)
