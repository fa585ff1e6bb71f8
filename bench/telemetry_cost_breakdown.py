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

Two references close each model's table:

* the floor of a hook-based watch: the plain model with an empty forward pre-hook and hook on
  every module, an empty tensor hook on each call's outputs and non-leaf inputs that need a
  gradient, and a TorchFunctionMode that passes every forward op through (what any watch
  built on these hooks pays before it reads or records anything);
* the step's reads alone: the compiled pass (observation.StepReads' read) on copies of the
  tensors one recorded step reads, timed in a loop of their own, over the plain step.

    python bench/telemetry_cost_breakdown.py [--models mlp tiny_lm tiny_dit] [--steps 40]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_telemetry_overhead import _Run  # noqa: E402  (bench/: the same timed step)

from torch.overrides import TorchFunctionMode  # noqa: E402

from numcheck.telemetry import hooks, observation, watcher  # noqa: E402
from numcheck.telemetry._structs import tensors  # noqa: E402

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
        watched = _Run(name, setting)
        got = _alternate(_Run(name, None), watched, steps)
        watched.close()
    finally:
        if patch:
            setattr(patch[0], patch[1], old)
    return got


def _alternate(plain: _Run, other: _Run, steps: int) -> tuple[float, float]:
    """(plain median ms, other median ms): the two stepped alternately after 3 warm-up steps."""
    a, b = [], []
    for i in range(steps + 3):
        pa, ob = plain.step(), other.step()
        if i >= 3:
            a.append(pa)
            b.append(ob)
    return statistics.median(a) * 1e3, statistics.median(b) * 1e3


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _nothing(*_):
    return None


def _empty_hooks(model: torch.nn.Module) -> None:
    """The floor: hooks that do nothing, where the watch puts its hooks (the module doc)."""
    def post(m, args, kwargs, out):
        for t in tensors(out) + [t for t in tensors(args) + tensors(kwargs)
                                 if t.grad_fn is not None]:
            if t.requires_grad:
                t.register_hook(_nothing)
    for m in model.modules():
        m.register_forward_pre_hook(_nothing, with_kwargs=True)
        m.register_forward_hook(post, with_kwargs=True)
    loss = model.loss

    def passed(batch):
        with _PassThrough():
            return loss(batch)
    model.loss = passed


def _floor(name: str, steps: int) -> tuple[float, float]:
    """(plain median ms, median ms with the empty hooks), stepped alternately."""
    hooked = _Run(name, None)
    _empty_hooks(hooked.model)
    return _alternate(_Run(name, None), hooked, steps)


def _reads_alone(name: str, steps: int) -> tuple[float, float]:
    """(plain median ms, the reads of one recorded step in ms): copies of the tensors a
    statistics-only step reads (its third), each read again by the compiled pass in a loop."""
    run, seen = _Run(name, {}), []
    real = observation.read

    def keep(t, full):
        seen.append((t.detach().clone(), full))
        return real(t, full)
    for _ in range(2):
        run.step()
    observation.read = keep
    try:
        run.step()
    finally:
        observation.read = real
    run.close()
    plain, times = _Run(name, None), []
    for _ in range(steps):
        t0 = time.perf_counter()
        for t, full in seen:
            real(t, full)
        times.append(time.perf_counter() - t0)
    p = statistics.median(plain.step() for _ in range(steps))
    return p * 1e3, statistics.median(times) * 1e3


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
        p, w = _floor(name, args.steps)
        print(f"{'floor: empty hooks, op mode':32} plain {p:6.2f} ms  hooked  {w:6.2f} ms  "
              f"{w / p:5.2f}x  +{w - p:5.2f} ms", flush=True)
        p, r = _reads_alone(name, args.steps)
        print(f"{'reads of a step, alone':32} plain {p:6.2f} ms  reads   {r:6.2f} ms  "
              f"{r / p:5.2f}x of a step", flush=True)


if __name__ == "__main__":
    main()
