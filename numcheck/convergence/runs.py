"""``converge``: paired short training runs of one model under several recipes, gated.

For each seed every recipe starts from the reference's initial weights and sees its batches in
the same order; the fp32 reference and the bf16 baseline of a (model, seed, steps, device) are
computed once per process and cached, so recipes never rerun them. The verdict of a recipe:

1. any NaN/Inf in loss or gradient norm fails (``gate.nonfinite``);
2. divergence: a window-mean loss above ``gate.DIVERGENCE_FACTOR`` x the fp32 reference's;
3. regression against bf16: after warm-up, a window whose mean relative loss gap to bf16 exceeds
   the seed band plus ``gate.GAP_TOL`` of the recipe's family (fp8 or fp4);
4. saturation: a window whose mean fraction of clipped quantized values exceeds
   ``gate.SAT_TOL`` (QuantRecipes only; a module factory's quantizers are not visible).

fp32 and bf16 are the references and are judged by rules 1-2 only (bf16 against fp32). The
golden rule (``gate.window_regression``: the recipe's own paired series outside its golden band)
runs where goldens are compared (numcheck's golden store).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from numcheck.cases.grid import check_case_set
from numcheck.errors import UsageError
from numcheck.verdicts import judge as verdict
from numcheck.records import Record, failing
from numcheck.convergence import gate
from numcheck.convergence.models import MODELS, PLANTED
from numcheck.convergence.recipes import DEFAULT_RECIPES, Spec, resolve
from numcheck.convergence.run_records import to_records
from numcheck.convergence.convergence_rules import table
from numcheck.convergence.train import train

__all__ = ["RUN_SETTINGS", "ConvergenceRun", "converge", "reference_run", "share_references"]

# quick: 3 seeds x 100 steps on every model (CI minutes on 2 cores); full: 5 seeds x 200 steps.
# 3 seeds is the fewest that gives a seed band at all; 100 steps is 4 windows after warm-up.
RUN_SETTINGS = {"quick": {"steps": 100, "seeds": (0, 1, 2)},
             "full": {"steps": 200, "seeds": (0, 1, 2, 3, 4)}}

_REF_CACHE: dict[tuple, dict] = {}
_SHARED_DIR: Path | None = None
_ARRAYS = ("loss", "grad_norm", "sat", "grad_bias")


def share_references(directory) -> None:
    """Keep reference runs in ``directory`` as well, for other processes of the same session
    (pytest-xdist workers): the second worker that needs a (model, seed) reads it instead of
    training it again (6-9 s per transformer and recipe pair of references at quick settings),
    and one that needs it while another trains it waits for that run (an exclusive lock per
    run; without fcntl, as on Windows, each process trains its own). The directory must be
    private to one session of one numcheck and torch build: nothing in it is keyed by version.
    """
    global _SHARED_DIR
    _SHARED_DIR = Path(directory)
    _SHARED_DIR.mkdir(parents=True, exist_ok=True)


def reference_run(model: str, name: str, seed: int, steps: int, device: str = "cpu") -> dict:
    """The fp32 or bf16 run of (model, seed, steps, device), computed once per process (once
    per session with ``share_references``)."""
    key = (model, name, seed, steps, device)
    if key not in _REF_CACHE:
        _REF_CACHE[key] = (_shared_run(key) if _SHARED_DIR is not None
                           else train(model, resolve(name), seed, steps, device))
    return _REF_CACHE[key]


def _shared_run(key: tuple) -> dict:
    model, name, seed, steps, device = key
    path = _SHARED_DIR / f"{model}-{name}-seed{seed}-steps{steps}-{device}.npz"
    try:
        import fcntl
    except ImportError:
        fcntl = None
    with open(path.with_suffix(".lock"), "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.exists():
            with np.load(path) as z:
                run = {k: z[k] for k in _ARRAYS}
                run["sat_by_role"] = json.loads(str(z["sat_by_role"]))
                run["seconds"] = 0.0  # trained by another process
            return run
        run = train(model, resolve(name), seed, steps, device)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **{k: run[k] for k in _ARRAYS},
                 sat_by_role=np.array(json.dumps(run["sat_by_role"])))
        os.replace(tmp, path)  # readers never see a half-written file
        return run


@dataclass
class RecipeResult:
    spec: Spec
    loss: np.ndarray | None = None  # (seeds, steps)
    grad_norm: np.ndarray | None = None
    sat: np.ndarray | None = None
    grad_bias: np.ndarray | None = None
    sat_by_role: dict = field(default_factory=dict)
    seconds: float = 0.0
    # the run's own state: passed | failed (the gate found something) | error | skipped; the
    # verdict a run is judged by is its record's (ConvergenceRun.records, numcheck.verdicts.judge)
    status: str = "passed"
    reasons: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ConvergenceRun:
    model: str
    steps: int
    seeds: tuple[int, ...]
    device: str
    results: dict[str, RecipeResult]
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        """No recipe's record fails (numcheck.records.failing)."""
        return not any(failing(r) for r in self.records())

    @property
    def reference(self) -> RecipeResult:
        return self.results["fp32"]

    def records(self) -> list[Record]:
        """One judged record per recipe (numcheck.verdicts.judge)."""
        return [verdict.judge(r) for r in to_records(self)]

    def table(self) -> str:
        """The loss-gap table of the run (terminal text)."""
        return (f"{self.model}: {self.steps} steps x seeds {list(self.seeds)} "
                f"({self.wall_s:.1f} s)\n" + table(self.records()))

    def plot(self, path) -> str:
        from numcheck.convergence.plot import plot_run
        return plot_run(self, path)


def _stack(runs: list[dict], key: str) -> np.ndarray:
    return np.stack([r[key] for r in runs])


def _judge(res: RecipeResult, ref: RecipeResult, bf16: RecipeResult, steps: int) -> None:
    L, R, B = res.loss, ref.loss, bf16.loss
    reasons = gate.nonfinite(L, res.grad_norm)
    if res.spec.kind != "fp32":
        reasons += gate.divergence(L, R)
    if res.spec.kind not in ("fp32", "bf16") and not reasons:
        reasons += gate.bf16_gap(L, B, gate.GAP_TOL[res.spec.family or "fp8"])
        if res.sat is not None:
            reasons += gate.saturation(res.sat)
        if res.grad_bias is not None and _declares_sr_grads(res.spec):
            reasons += gate.grad_bias(res.grad_bias)
    warm = int(gate.WARMUP_FRACTION * steps)
    m = res.metrics
    with np.errstate(all="ignore"):
        m["final_loss"] = float(np.mean(L[:, -gate.WINDOW:]))
        m["ref_final_loss"] = float(np.mean(R[:, -gate.WINDOW:]))
        for base_name, base in (("bf16", B), ("fp32", R)):
            _, g = gate.relative_window_gap(L, base, gate.WINDOW, warm)
            m[f"gap_{base_name}_mean"] = float(np.mean(g)) if g.size else math.nan
            m[f"gap_{base_name}_max"] = float(np.max(g.mean(0))) if g.size else math.nan
            m[f"gap_{base_name}_band"] = (float(np.max(np.abs(g - g.mean(0))))
                                          if g.size else math.nan)
        m["grad_norm_ratio"] = float(np.nanmean(res.grad_norm[:, warm:])
                                     / np.nanmean(ref.grad_norm[:, warm:]))
        m["grad_bias_mean"] = (float(np.nanmean(res.grad_bias)) if res.grad_bias is not None
                               and np.isfinite(res.grad_bias).any() else math.nan)
        m["sat_max"] = (float(np.nanmax(res.sat)) if res.sat is not None
                        and np.isfinite(res.sat).any() else math.nan)
        for role, v in res.sat_by_role.items():
            m[f"sat_{role}_max"] = float(v)
    res.reasons = reasons
    res.status = "failed" if reasons else "passed"


def _declares_sr_grads(spec: Spec) -> bool:
    """The recipe's gradient quantizer says it rounds stochastically (an unbiased rounding)."""
    grad = getattr(spec.obj, "grad", None)
    return getattr(grad, "rounding", None) == "sr"


def converge(model: str, recipes=None, steps: int | None = None, seeds=None,
             cases: str = "quick", device: str = "cpu", out_dir=None) -> ConvergenceRun:
    """Train ``model`` under each recipe for every seed (paired), gate, return the run.

    recipes: None (every default recipe: fp32, bf16, each numcheck QuantRecipe, torchao fp8),
    a list of names, or a dict name -> None | QuantRecipe | module factory (nn.Linear ->
    nn.Module), e.g. ``{"mine": my_recipe}``. fp32 and bf16 are always added (reference and
    baseline). ``steps``/``seeds`` default to the case set's. ``out_dir``: where the plot
    (``<model>.png``) and the table (``<model>.txt``) are written, if given.
    """
    if model not in MODELS and model not in PLANTED:
        raise UsageError(f"model={model!r}: use one of {', '.join((*MODELS, *PLANTED))}")
    check_case_set(cases)
    steps = int(steps or RUN_SETTINGS[cases]["steps"])
    seeds = tuple(seeds if seeds is not None else RUN_SETTINGS[cases]["seeds"])
    if steps < 2 * gate.WINDOW or not seeds:
        raise UsageError(f"steps={steps}, seeds={seeds}: need >= {2 * gate.WINDOW} steps and a "
                         "seed")
    if recipes is None:
        wanted = {n: None for n in DEFAULT_RECIPES}
    elif isinstance(recipes, dict):
        wanted = dict(recipes)
    else:
        wanted = {n: None for n in recipes}
    wanted = {"fp32": None, "bf16": None, **wanted}
    t0 = time.perf_counter()
    results: dict[str, RecipeResult] = {n: None for n in wanted}
    # The recipes train first, the references last: under pytest-xdist another worker has often
    # trained (and shared) them by then (share_references).
    for name, value in sorted(wanted.items(), key=lambda kv: kv[0] in ("fp32", "bf16")):
        spec = resolve(name, value)
        res = RecipeResult(spec)
        results[name] = res
        if spec.skip:
            res.status, res.reasons = "skipped", [spec.skip]
            continue
        try:
            if spec.kind in ("fp32", "bf16") and value is None:
                runs = [reference_run(model, name, s, steps, device) for s in seeds]
            else:
                runs = [train(model, spec, s, steps, device) for s in seeds]
        except Exception as e:  # noqa: BLE001 - a recipe that crashes is an error, others go on
            res.status = "error"
            res.reasons = [f"{type(e).__name__}: {e}"]
            continue
        res.loss, res.grad_norm, res.sat, res.grad_bias = (
            _stack(runs, k) for k in ("loss", "grad_norm", "sat", "grad_bias"))
        for r in runs:
            for role, v in r["sat_by_role"].items():
                res.sat_by_role[role] = max(res.sat_by_role.get(role, 0.0), v)
        res.seconds = sum(r["seconds"] for r in runs)
    ref, bf16 = results["fp32"], results["bf16"]
    for res in results.values():
        if res.status == "passed" and res.loss is not None:
            if ref.loss is None or bf16.loss is None:
                res.status, res.reasons = "error", ["the fp32/bf16 reference runs failed"]
                continue
            _judge(res, ref, bf16, steps)
    run = ConvergenceRun(model, steps, seeds, device, results, time.perf_counter() - t0)
    if out_dir is not None:
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        run.plot(d / f"{model}.png")
        (d / f"{model}.txt").write_text(run.table() + "\n")
    return run
