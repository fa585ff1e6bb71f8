"""numcheck.telemetry's cost on the tiny models: step time under `watch` over a plain step.

Targets (issue 14): <= 1.02x attached but disabled, <= 1.3x with everything on. Prints, per
model, the median step time (forward, backward, AdamW step, `t.step()`) of a plain run and the
ratios of: attached but disabled, statistics only, a recipe's quantization statistics
(mxfp8), everything (recipe, two what-if recipes, float64 shadows). Medians over --steps
steps after 3 warm-up steps, all in one process on one thread (numcheck's pinned state for
training runs), so the ratios come from one run on one machine.

    python bench/bench_telemetry_overhead.py [--models mlp tiny_lm tiny_dit] [--steps 20]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from numcheck import telemetry
from numcheck.convergence.models import build

SETTINGS = {
    "disabled": dict(enabled=False),
    "stats": dict(),
    "mxfp8": dict(recipe="mxfp8"),
    "everything": dict(recipe="mxfp8", what_if=("mxfp4", "nvfp4"), shadow=True),
}


def _median_step(name: str, steps: int, setting: dict | None) -> float:
    model, task, lr = build(name, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ctx = telemetry.watch(model, **setting) if setting is not None else contextlib.nullcontext()
    times = []
    with ctx as t:
        for step in range(steps + 3):
            t0 = time.perf_counter()
            loss = model.loss(task.batch_at(0, step))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if t is not None:
                t.step()
            times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "tiny_lm", "tiny_dit"])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':10} {'plain ms':>9} " + " ".join(f"{k:>11}" for k in SETTINGS))
    for name in args.models:
        _median_step(name, args.steps, None)  # warms the allocator and dispatch caches
        plain = _median_step(name, args.steps, None)
        ratios = [_median_step(name, args.steps, s) / plain for s in SETTINGS.values()]
        print(f"{name:10} {plain * 1e3:9.2f} " + " ".join(f"{r:10.2f}x" for r in ratios))
    print("targets: disabled <= 1.02x, everything <= 1.3x (issue 14)")


if __name__ == "__main__":
    main()
