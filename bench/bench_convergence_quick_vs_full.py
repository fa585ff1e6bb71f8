"""Does the quick convergence set separate what the full set separates?

For each model, the recipes of the quick set (suites/test_convergence.py: QUICK, QUICK_STEPS)
are trained at quick settings (3 seeds, 100 steps on mlp, 60 on the transformers) and at full
settings (5 seeds x 200 steps), and on mlp also the faulty recipes that tests/test_convergence.py
injects (a stale delayed FP8 scale; FP4 gradients rounded to nearest while the recipe declares
stochastic rounding). Prints one table per model: each recipe's gate verdict and largest
window gap to bf16 (seed mean, after warm-up) under both settings, and its rank by that gap.
A rank swap between two recipes whose gaps differ by less than their seed bands is a tie,
not a disagreement. Ends with one line per model: verdicts equal, ranking equal (up to ties).

    .venv/bin/python bench/bench_convergence_quick_vs_full.py [--models mlp,tiny_lm,tiny_dit]
        [--json out.json]   # ~20 min CPU on one core, most of it the full transformer runs
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

from numcheck.frontends import process as _process
from numcheck.convergence.runs import RUN_SETTINGS, converge

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "suites"))
from test_convergence import QUICK, QUICK_STEPS  # noqa: E402  (suites/: the quick set itself)


def _faults() -> dict:
    # The planted faults of numcheck's own tests, so the table shows what those tests rely on.
    import importlib.util
    spec = importlib.util.spec_from_file_location("planted", ROOT / "tests" / "test_convergence.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {"stale_fp8": mod.StaleFP8(3), "ignores_sr": mod.IgnoresSR()}


def _summary(run) -> dict:
    out = {}
    for name, res in run.results.items():
        m = res.metrics
        out[name] = {"status": res.status, "reasons": res.reasons,
                     "gap": m.get("gap_bf16_max", float("nan")),
                     "band": m.get("gap_bf16_band", float("nan")), "seconds": res.seconds}
    return out


def _ranks(s: dict) -> list[str]:
    names = [n for n, v in s.items() if n not in ("fp32", "bf16") and v["gap"] == v["gap"]]
    return sorted(names, key=lambda n: s[n]["gap"])


def _swaps(q: dict, f: dict) -> tuple[list, list]:
    """Pairs ordered differently by quick and full: (real disagreements, ties within bands)."""
    real, ties = [], []
    names = [n for n in _ranks(q) if n in f and f[n]["gap"] == f[n]["gap"]]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if (q[a]["gap"] - q[b]["gap"]) * (f[a]["gap"] - f[b]["gap"]) < 0:
                tie = all(abs(s[a]["gap"] - s[b]["gap"]) <= s[a]["band"] + s[b]["band"]
                          for s in (q, f))
                (ties if tie else real).append((a, b))
    return real, ties


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mlp,tiny_lm,tiny_dit")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    _process.tune()  # as `numcheck run` does
    print(f"torch {torch.__version__}, quick: seeds {RUN_SETTINGS['quick']['seeds']} x "
          f"{QUICK_STEPS} steps; full: seeds {RUN_SETTINGS['full']['seeds']} x "
          f"{RUN_SETTINGS['full']['steps']} steps", flush=True)
    res = {}
    for model in a.models.split(","):
        recipes = {n: None for n in QUICK[model]}
        if model == "mlp":
            recipes.update(_faults())
        runs = {}
        for cs, steps in (("quick", QUICK_STEPS[model]), ("full", None)):
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runs[cs] = _summary(converge(model, recipes=dict(recipes), cases=cs, steps=steps))
            print(f"{model} {cs}: {time.perf_counter() - t0:.0f} s", flush=True)
        q, f = runs["quick"], runs["full"]
        rq, rf = _ranks(q), _ranks(f)
        print(f"\n{model}\n| recipe | quick verdict | quick gap % | quick rank | full verdict | "
              "full gap % | full rank |\n|---|---|---|---|---|---|---|")
        for n in q:
            print(f"| {n} | {q[n]['status']} | {100 * q[n]['gap']:+.2f} ± {100 * q[n]['band']:.2f} | "
                  f"{rq.index(n) + 1 if n in rq else '-'} | {f[n]['status']} | "
                  f"{100 * f[n]['gap']:+.2f} ± {100 * f[n]['band']:.2f} | "
                  f"{rf.index(n) + 1 if n in rf else '-'} |")
        real, ties = _swaps(q, f)
        same = all(q[n]["status"] == f[n]["status"] for n in q)
        print(f"{model}: verdicts equal: {same}; ranking equal: {not real and not ties}"
              f"{'' if not ties else f' up to ties within the seed bands {ties}'}"
              f"{'' if not real else f'; DISAGREE {real}'}\n", flush=True)
        res[model] = runs
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
