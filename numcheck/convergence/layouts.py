"""Layout equivalence: one recipe trained on one process and on ``world`` ranks (DDP, FSDP2;
gloo on the CPU, NCCL on GPUs) from the same seed and the same global batches, the curves gated
against each other (docs/convergence.md, "Layouts").

``Layout`` is a rank's view of a data-parallel layout, used by ``train``: it wraps the model
(``DistributedDataParallel`` around a ``launch.LossModule``: its forward is the model's loss; FSDP2's
``fully_shard`` on every block and the root), takes this rank's rows of each global batch,
and reduces what a run records over the ranks (the loss and the saturation counts: global
values, the same on every rank). Each data-parallel rank draws its own stochastic-rounding
stream (``QuantState(dp_rank=...)``); the Hadamard signs are the seed's on every rank. Both
invariants are checked when a rank's run ends (numcheck.telemetry.random_state) and a
violation is a failure of the run.

``layout_equivalence`` starts the ranks (torch.multiprocessing, spawn), trains every (recipe,
seed) under each layout and one process, and judges (``LayoutRun``):

1. every run's loss and gradient norm finite (``gate.nonfinite``);
2. layouts that must agree bitwise do: DDP and FSDP2 at the same world size compute each rank's
   local gradient from the same weights and rows, sum two ranks' gradients in the one order
   addition of two has and divide by a power of two, then update elementwise: their losses
   are the same bits up to the first step whose gradient norm is clipped (FSDP2 sums the
   norm's squares shard by shard, another order than DDP's; the clip coefficient can then
   differ in its last bit). Measured: bitwise at every step on mlp and tiny_lm (never
   clipped); on tiny_dit the curves part after its first clipped step;
3. each layout against one process: per seed, a window-mean relative loss gap within
   ``LAYOUT_TOL`` of the recipe's family after warm-up. What may differ: the loss is a mean of the ranks' means (a
   different summation order), a per-tensor scale of an activation or gradient is the rank's
   own rows' (current scaling as a real data-parallel run computes it), and the rank's SR
   stream is its own; from the first step on, rounding differences grow through training.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from numcheck.errors import UsageError
from numcheck.telemetry.launch import LossModule, free_port, share_batch

__all__ = ["LAYOUTS", "LAYOUT_TOL", "Layout", "LayoutRun", "layout_equivalence"]

LAYOUTS = ("ddp", "fsdp2")
# Allowed |relative window-mean loss gap| between a layout and one process, per seed, after
# warm-up, by the recipe's family (recipes.Spec.family; "" fp32 and bf16): about twice the
# largest healthy gap measured on mlp, tiny_lm and tiny_dit (3 seeds x 100 steps, 2 gloo
# ranks; docs/convergence.md "Layouts"): bf16 0.011%, fp8 0.229% (fp8_tensor: per-rank
# current scales), fp4 0.863% (nvfp4_rht_sr: per-rank SR streams, per-rank global scales)
LAYOUT_TOL = {"": 0.001, "fp8": 0.005, "fp4": 0.02}


class Layout:
    """A rank's view of a data-parallel layout in an initialized process group."""

    def __init__(self, name: str, group=None) -> None:
        dist = torch.distributed
        if name not in LAYOUTS:
            raise UsageError(f"layout={name!r}: use one of {', '.join(LAYOUTS)}")
        if not (dist.is_available() and dist.is_initialized()):
            raise UsageError(f"layout {name!r} needs an initialized process group "
                             "(torch.distributed.init_process_group)")
        self.name, self.group = name, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)

    def wrap(self, model: nn.Module):
        """(module to train, loss function batch -> loss)."""
        if self.name == "ddp":
            ddp = nn.parallel.DistributedDataParallel(LossModule(model, _model_loss),
                                                      process_group=self.group)
            return ddp, ddp
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
        dev = next(model.parameters()).device.type
        mesh = DeviceMesh.from_group(self.group or torch.distributed.group.WORLD, dev)
        for child in _shard_units(model):
            fully_shard(child, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, model.loss

    def share(self, batch: dict) -> dict:
        """This rank's rows of a global batch (every tensor split along dim 0)."""
        return share_batch(batch, self.rank, self.world, f"layout {self.name!r}")

    def mean(self, value: float) -> float:
        """The mean over the ranks of a per-rank value (each rank's loss is its rows' mean,
        every share the same size: the global batch's mean loss)."""
        return self.sum(value) / self.world

    def sum(self, *values: float):
        t = torch.tensor(values, dtype=torch.float64)
        torch.distributed.all_reduce(t, group=self.group)
        return float(t[0]) if len(values) == 1 else t.tolist()


def _model_loss(model: nn.Module, batch):
    return model.loss(batch)


def _shard_units(model: nn.Module) -> list[nn.Module]:
    """FSDP2's units: every element of a ModuleList (a block) and every other direct child
    that holds parameters (embeddings, heads, single linears)."""
    units = []
    for child in model.children():
        if isinstance(child, nn.ModuleList):
            units += [m for m in child if any(True for _ in m.parameters())]
        elif any(True for _ in child.parameters()):
            units.append(child)
    return units


@dataclass
class LayoutResult:
    """One recipe: per layout (and "single") its (seeds, steps) loss and grad-norm series."""

    recipe: str
    loss: dict[str, np.ndarray] = field(default_factory=dict)
    grad_norm: dict[str, np.ndarray] = field(default_factory=dict)
    bitwise: dict[str, bool] = field(default_factory=dict)      # "ddp=fsdp2" -> equal bits
    gap_max: dict[str, float] = field(default_factory=dict)     # layout -> max |window gap|
    random_state: list[str] = field(default_factory=list)       # invariant violations
    status: str = "passed"
    reasons: list[str] = field(default_factory=list)


@dataclass
class LayoutRun:
    model: str
    steps: int
    seeds: tuple[int, ...]
    world: int
    layouts: tuple[str, ...]
    results: dict[str, LayoutResult]
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r.status != "failed" for r in self.results.values())

    def table(self) -> str:
        lines = [f"{self.model}: {self.steps} steps x seeds {list(self.seeds)}, one process vs "
                 f"{self.world} ranks ({', '.join(self.layouts)}), {self.wall_s:.0f} s"]
        for r in self.results.values():
            gaps = ", ".join(f"{k} {100 * v:.3f}%" for k, v in r.gap_max.items())
            bits = ", ".join(f"{k} {'bitwise' if v else 'DIFFER'}" for k, v in r.bitwise.items())
            lines.append(f"  {r.recipe:<16} {r.status:<7} max gap to one process: {gaps}"
                         + (f"; {bits}" if bits else ""))
            lines += [f"      {m}" for m in r.reasons]
        return "\n".join(lines)


def _rank_main(rank: int, world: int, port: int, model: str, recipes: dict, seeds, steps: int,
               layouts, out: str) -> None:
    """One rank: every (layout, recipe, seed) run; rank 0 writes the series to ``out``."""
    import warnings

    from numcheck.convergence.recipes import resolve
    from numcheck.convergence.train import train

    warnings.simplefilter("ignore")   # FSDP2 and DDP warn about CPU/gloo once per process
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist = torch.distributed
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        got = {}
        for layout in layouts:
            for name, value in recipes.items():
                spec = resolve(name, value)
                for s in seeds:
                    run = train(model, spec, s, steps, layout=Layout(layout))
                    got[f"{layout}|{name}|{s}|loss"] = run["loss"]
                    got[f"{layout}|{name}|{s}|grad_norm"] = run["grad_norm"]
                    got[f"{layout}|{name}|{s}|random_state"] = np.array(
                        "\n".join(run.get("random_state", [])))
        if rank == 0:
            np.savez(out, **got)
    finally:
        dist.destroy_process_group()


def layout_equivalence(model: str, recipes=("fp32",), layouts=LAYOUTS, world: int = 2,
                       seeds=(0, 1, 2), steps: int = 100, tol: float | None = None,
                       workdir=None) -> LayoutRun:
    """Train ``model`` under each recipe on one process and on ``world`` gloo ranks per layout
    (module doc), same seeds and global batches; judge and return the run.

    recipes: names, or a dict name -> None | QuantRecipe-like object (picklable: the ranks are
    fresh processes that import it by name). tol: the gap tolerance; default ``LAYOUT_TOL`` of
    the recipe's family. A recipe that cannot run here (``Spec.skip``) is "skipped", with
    the reason."""
    import tempfile

    import torch.multiprocessing as mp

    from numcheck.convergence import gate
    from numcheck.convergence.models import MODELS, PLANTED
    from numcheck.convergence.recipes import resolve
    from numcheck.convergence.train import train

    if model not in MODELS and model not in PLANTED:
        raise UsageError(f"model={model!r}: use one of {', '.join((*MODELS, *PLANTED))}")
    bad = [lay for lay in layouts if lay not in LAYOUTS]
    if bad or world < 2:
        raise UsageError(f"layouts={list(layouts)}, world={world}: layouts are "
                         f"{', '.join(LAYOUTS)} on at least 2 ranks")
    if steps < 2 * gate.WINDOW:
        raise UsageError(f"steps={steps}: need >= {2 * gate.WINDOW}")
    wanted = dict(recipes) if isinstance(recipes, dict) else {n: None for n in recipes}
    specs = {name: resolve(name, value) for name, value in wanted.items()}   # usage errors here
    runnable = {n: wanted[n] for n, spec in specs.items() if spec.skip is None}
    seeds, layouts = tuple(seeds), tuple(layouts)
    t0 = time.perf_counter()
    ranks = {}
    if runnable:
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            path = os.path.join(tmp, "ranks.npz")
            mp.start_processes(_rank_main, nprocs=world, join=True, start_method="spawn",
                               args=(world, free_port(), model, runnable, seeds, steps,
                                     layouts, path))
            with np.load(path) as z:
                ranks = {k: z[k] for k in z.files}
    results = {}
    for name, spec in specs.items():
        res = LayoutResult(name)
        results[name] = res
        if spec.skip is not None:
            res.status, res.reasons = "skipped", [spec.skip]
            continue
        single = [train(model, spec, s, steps) for s in seeds]
        res.loss["single"] = np.stack([r["loss"] for r in single])
        res.grad_norm["single"] = np.stack([r["grad_norm"] for r in single])
        for lay in layouts:
            res.loss[lay] = np.stack([ranks[f"{lay}|{name}|{s}|loss"] for s in seeds])
            res.grad_norm[lay] = np.stack([ranks[f"{lay}|{name}|{s}|grad_norm"] for s in seeds])
            res.random_state += sorted({f"{lay}: {m}" for s in seeds for m in
                                        str(ranks[f"{lay}|{name}|{s}|random_state"]).split("\n")
                                        if m})
        _judge(res, layouts, steps, LAYOUT_TOL[spec.family] if tol is None else tol)
    return LayoutRun(model, steps, seeds, world, layouts, results, time.perf_counter() - t0)


def _judge(res: LayoutResult, layouts: tuple[str, ...], steps: int, tol: float) -> None:
    from numcheck.convergence import gate

    reasons = []
    for lay in ("single", *layouts):
        reasons += [f"{lay}: {m}" for m in gate.nonfinite(res.loss[lay], res.grad_norm[lay])]
    reasons += res.random_state
    if "ddp" in layouts and "fsdp2" in layouts:
        from numcheck.convergence.train import CLIP
        a, b = res.loss["ddp"], res.loss["fsdp2"]
        # bitwise up to the first clipped step of either (module doc): FSDP2's gradient norm
        # sums the shards' squares in another order than DDP's, so a clip scales by a
        # coefficient that can differ in its last bit
        clipped = (res.grad_norm["ddp"] > CLIP) | (res.grad_norm["fsdp2"] > CLIP)
        until = np.where(clipped.any(1), clipped.argmax(1), a.shape[1] - 1)
        upto = np.arange(a.shape[1])[None, :] <= until[:, None]
        differ = (a.view(np.int64) != b.view(np.int64)) & upto
        res.bitwise["ddp=fsdp2"] = not differ.any()
        if differ.any():
            bad = np.argwhere(differ)[0]
            reasons.append(f"ddp and fsdp2 differ at step {bad[1]} (seed #{bad[0]}: "
                           f"{a[tuple(bad)]!r} vs {b[tuple(bad)]!r}), before any clipped step; "
                           "they must agree bitwise")
    warm = int(gate.WARMUP_FRACTION * steps)
    for lay in layouts:
        starts, g = gate.relative_window_gap(res.loss[lay], res.loss["single"], gate.WINDOW,
                                             warm)
        worst = float(np.max(np.abs(g))) if g.size else math.nan
        res.gap_max[lay] = worst
        if not worst <= tol:   # a NaN never passes
            i, j = np.unravel_index(np.nanargmax(np.abs(g)), g.shape)
            reasons.append(f"{lay}: seed #{i} steps {starts[j]}-{starts[j] + gate.WINDOW - 1} "
                           f"mean loss {100 * g[i, j]:+.3f}% from one process (tolerance "
                           f"{100 * tol:.2f}%)")
    res.reasons = reasons
    res.status = "failed" if reasons else "passed"
