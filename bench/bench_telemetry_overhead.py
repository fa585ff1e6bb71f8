"""numcheck.telemetry's cost on the tiny models: step time under `watch` over a plain step.

Targets (issue 14): <= 1.02x attached but disabled, <= 1.3x with everything on. Prints, per
model, the median step time (forward, backward, AdamW step, `t.step()`) of a plain run and,
each from a plain and a watched run stepped alternately, the ratios of: attached but
disabled, statistics only, a recipe's quantization statistics (mxfp8), plus two what-if
recipes, everything (recipe, what-if, float64 shadows), everything on every 10th step
and every 50th (``every=10``, ``every=50``: ratios of means, since the median step is an
unrecorded one), and the every=10 run's unrecorded steps alone (median: the cost of the
sentinel, numcheck/telemetry/sentinel.py), and a float64 forward of the model without hooks
(what each float64 shadow costs at least). Over --steps steps (a multiple of 50) after 3
warm-up steps, all in one process on one thread
(numcheck's pinned state for training runs), so the ratios come from one run on one machine.

On CUDA (``--device cuda``, bench/gpu_run.sh) each step ends with a synchronize, so a step's
time includes its kernels; the statistics stay on the device until ``t.step()`` reads them.

    python bench/bench_telemetry_overhead.py [--models mlp tiny_lm tiny_dit] [--steps 50]
        [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch

from numcheck import telemetry
from numcheck.convergence.models import build
from numcheck.telemetry.watcher import KeepFP64

_ALL = dict(recipe="mxfp8", what_if=("mxfp4", "nvfp4"), shadow=True)
SETTINGS = {
    "disabled": dict(enabled=False),
    "stats": dict(),
    "+digests": dict(digests=True),   # statistics and each row's digest (issue 34)
    "mxfp8": dict(recipe="mxfp8"),
    "+what-if": dict(recipe="mxfp8", what_if=("mxfp4", "nvfp4")),
    "everything": _ALL,
    # the shadows run the model again in float64 (a whole copy, and each layer on its own
    # inputs): at every=1 they cost more than one fp32 step by construction; `every` samples
    "all/every10": dict(_ALL, every=10),
    "all/every50": dict(_ALL, every=50),
}


class _Run:
    """One model, its optimizer and (when watched) its telemetry: steps timed one at a time."""

    def __init__(self, name: str, setting: dict | None, device: str = "cpu") -> None:
        self.model, self.task, lr = build(name, 0)
        self.model, self.device = self.model.to(device), device
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.ctx = telemetry.watch(self.model, **setting) if setting is not None \
            else contextlib.nullcontext()
        self.t = self.ctx.__enter__()
        self.index = 0

    def step(self) -> float:
        batch = self.batch(self.index)
        _sync(self.device)
        t0 = time.perf_counter()
        loss = self.model.loss(batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.t is not None:
            self.t.step()
        _sync(self.device)
        self.index += 1
        return time.perf_counter() - t0

    def batch(self, i: int, dtype: torch.dtype | None = None) -> dict:
        return {k: v.to(self.device, dtype if dtype and v.is_floating_point() else v.dtype)
                for k, v in self.task.batch_at(0, i).items()}

    def close(self) -> None:
        self.ctx.__exit__(None, None, None)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _ratio(name: str, steps: int, setting: dict,
           device: str = "cpu") -> tuple[float, float, float | None]:
    """(plain step seconds, watched / plain, unrecorded watched / plain): a plain and a watched
    run of the same model stepped alternately, so that a slower minute of a shared machine
    slows both. Median over median; with ``every`` > 1 mean over mean (the recorded steps are
    the rare ones: --steps a multiple of ``every`` gives each its share), and the third figure
    the median of the steps ``every`` does not record (the producer check alone) over the
    plain median (None at every=1)."""
    plain, watched = _Run(name, None, device), _Run(name, setting, device)
    every = setting.get("every", 1)
    a, b, off = [], [], []
    for i in range(steps + 3):
        pa, wb = plain.step(), watched.step()
        if i >= 3:  # warm-up: the allocator, dispatch caches, numba's compiled loops
            a.append(pa)
            b.append(wb)
            if i % every:
                off.append(wb)
    watched.close()
    avg = statistics.fmean if every > 1 else statistics.median
    unrec = statistics.median(off) / statistics.median(a) if off else None
    return statistics.median(a), avg(b) / avg(a), unrec


def _f64_forward(name: str, steps: int, device: str = "cpu") -> float:
    """A float64 forward of the model (no hooks, no gradient: what each shadow costs at least)
    over a plain training step, medians, the two alternated."""
    plain = _Run(name, None, device)
    m64 = copy.deepcopy(plain.model).to(torch.float64)
    a, b = [], []
    for i in range(steps + 3):
        pa = plain.step()
        batch = plain.batch(i, torch.float64)
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad(), KeepFP64():
            m64.loss(batch)
        _sync(device)
        if i >= 3:
            a.append(pa)
            b.append(time.perf_counter() - t0)
    return statistics.median(b) / statistics.median(a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "tiny_lm", "tiny_dit"])
    ap.add_argument("--steps", type=int, default=50, help="a multiple of 50 (of every)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default: %(default)s)")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch.cuda.is_available() is False here")
    torch.set_num_threads(1)
    print(f"device: {args.device}" + (f" ({torch.cuda.get_device_name(args.device)})"
                                      if args.device.startswith("cuda") else ""))
    print(f"{'model':10} {'plain ms':>9} " + " ".join(f"{k:>11}" for k in SETTINGS)
          + f" {'unrecorded':>11} {'f64 fwd':>9}")
    for name in args.models:
        res = [_ratio(name, args.steps, s, args.device) for s in SETTINGS.values()]
        plain_ms = statistics.median(p for p, _, _ in res) * 1e3
        unrec = next((u for _, _, u in res if u is not None), float("nan"))
        print(f"{name:10} {plain_ms:9.2f} " + " ".join(f"{r:10.2f}x" for _, r, _ in res)
              + f" {unrec:10.2f}x {_f64_forward(name, args.steps, args.device):8.2f}x")
    print("targets: disabled <= 1.02x, everything <= 1.3x (issue 14)")


if __name__ == "__main__":
    main()
