"""How a statistics-only watch's cost over a plain step moves with the model's width (issue 32).

tiny_lm's architecture (numcheck.convergence.models.TinyLM: RMSNorm, RoPE, causal attention
written out, SwiGLU, tied-free head) at widths d = 64 (tiny_lm itself), 128, 256, 512, hidden
2d, 4 heads, the same Grammar batches; a plain run and a watched one (``watch(model)``,
statistics only, every=1) stepped alternately on one thread, as bench_telemetry_overhead.py
does. A watch's hooks cost about the same per module call whatever the width (Python work:
hooks, cells, rows), its reads grow with the tensors' size like the step's own arithmetic, so
the ratio says how much of the tiny models' overhead is per call and how much per element.

    python bench/telemetry_cost_by_width.py [--widths 64 128 256 512] [--steps 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_telemetry_overhead import _Run  # noqa: E402  (bench/: the same timed step)

from numcheck.convergence.models import TinyLM  # noqa: E402


class _WideRun(_Run):
    """_Run on TinyLM at width ``d`` (the task and learning rate of tiny_lm)."""

    def __init__(self, d: int, setting: dict | None) -> None:
        torch.manual_seed(0)
        model = TinyLM(d=d, hidden=2 * d)
        super().__init__("tiny_lm", None)
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        if setting is not None:
            from numcheck import telemetry
            self.ctx = telemetry.watch(model, **setting)
            self.t = self.ctx.__enter__()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", nargs="+", type=int, default=[64, 128, 256, 512])
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'width':>5} {'plain ms':>9} {'watched ms':>10} {'ratio':>6} {'added ms':>9}")
    for d in args.widths:
        plain, watched = _WideRun(d, None), _WideRun(d, {})
        a, b = [], []
        for i in range(args.steps + 3):
            pa, wb = plain.step(), watched.step()
            if i >= 3:   # warm-up: allocator, dispatch caches, numba's compiled loops
                a.append(pa)
                b.append(wb)
        watched.close()
        p, w = statistics.median(a) * 1e3, statistics.median(b) * 1e3
        print(f"{d:5} {p:9.2f} {w:10.2f} {w / p:5.2f}x {w - p:9.2f}", flush=True)
    print("target (issue 32): statistics only <= 1.5x at every=1 on the tiny models (width 64)")


if __name__ == "__main__":
    main()
