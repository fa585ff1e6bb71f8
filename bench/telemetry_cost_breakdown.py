"""Where a recorded step of a statistics-only watch spends its time (issue 32's cost target).

Per tiny model, a plain run and a watched run stepped alternately (as
bench_telemetry_overhead.py does), with one part of the watch switched off at a time by
replacing an internal for the run (a diagnostic: the answers of such a watch are wrong):

* reads replaced by a constant: StepReads.fields_of returns fixed fields (no compiled pass,
  no memo): what the hooks, cells, producer checks and rows cost without reading a tensor;
* producer check off: Telemetry.checking() is False (rows only);
* rows off: Telemetry.recording is False (the producer check only);
* function ops ignored: Hooks.on_op does nothing (sdpa, softmax, RoPE, modulation, residual
  adds: no rows, no checks; the torch-function mode still sees every op);
* attached but disabled.

    python bench/telemetry_cost_breakdown.py [--models mlp tiny_lm tiny_dit] [--steps 40]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_telemetry_overhead import _Run  # noqa: E402  (bench/: the same timed step)

from numcheck.telemetry import hooks, observation, watcher  # noqa: E402

_FIELDS = [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]   # fields.PLAIN of one finite element
PARTS = {
    "statistics (every=1)": ({}, None),
    "reads replaced by a constant": ({}, (observation.StepReads, "fields_of",
                                          lambda self, t, full, fresh=False: list(_FIELDS))),
    "producer check off (rows only)": ({}, (watcher.Telemetry, "checking",
                                            lambda self: False)),
    "rows off (producer check only)": ({}, (watcher.Telemetry, "recording",
                                            property(lambda self: False))),
    "function ops ignored": ({}, (hooks.Hooks, "on_op", lambda *a, **k: None)),
    "attached but disabled": ({"enabled": False}, None),
}


def _part(name: str, steps: int, setting: dict, patch) -> tuple[float, float]:
    """(plain median ms, watched median ms) with ``patch`` = (class, attribute, value) in
    place for the watched run."""
    old = patch and patch[0].__dict__[patch[1]]
    if patch:
        setattr(*patch)
    try:
        plain, watched = _Run(name, None), _Run(name, setting)
        a, b = [], []
        for i in range(steps + 3):
            pa, wb = plain.step(), watched.step()
            if i >= 3:
                a.append(pa)
                b.append(wb)
        watched.close()
    finally:
        if patch:
            setattr(patch[0], patch[1], old)
    return statistics.median(a) * 1e3, statistics.median(b) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "tiny_lm", "tiny_dit"])
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.models:
        print(f"== {name}")
        for label, (setting, patch) in PARTS.items():
            p, w = _part(name, args.steps, setting, patch)
            print(f"{label:32} plain {p:6.2f} ms  watched {w:6.2f} ms  {w / p:5.2f}x  "
                  f"+{w - p:5.2f} ms", flush=True)


if __name__ == "__main__":
    main()
