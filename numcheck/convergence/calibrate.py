"""Measure the spreads behind the gate's thresholds: ``python -m numcheck.convergence.calibrate
[--steps 200] [--seeds 0,1,2,3,4] [--models mlp,tiny_lm,tiny_dit] [--json out.json]``.

Prints each model's loss-gap table and, per recipe, the largest window-mean relative gap to
bf16 after warm-up, its seed band, and the largest window ratio to fp32 (divergence headroom).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from numcheck.convergence import gate
from numcheck.convergence.runs import converge


def measure(model: str, steps: int, seeds, recipes=None) -> dict:
    run = converge(model, recipes=recipes, steps=steps, seeds=seeds)
    ref = run.results["fp32"].loss
    out = {"table": run.table(), "recipes": {}}
    for name, res in run.results.items():
        if res.loss is None:
            out["recipes"][name] = {"status": res.status, "reason": "; ".join(res.reasons)}
            continue
        _, lm = gate.window_means(res.loss)
        _, rm = gate.window_means(ref)
        d = dict(res.metrics)
        d["max_window_ratio_fp32"] = float(np.nanmax(lm / rm))
        d["seconds"] = res.seconds
        d["status"] = res.status
        d["reason"] = "; ".join(res.reasons)
        out["recipes"][name] = d
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--models", default="mlp,tiny_lm,tiny_dit")
    p.add_argument("--recipes", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    recipes = a.recipes.split(",") if a.recipes else None
    res = {}
    for m in a.models.split(","):
        res[m] = measure(m, a.steps, seeds, recipes)
        print(res[m]["table"], flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
