"""The cost of telemetry's cross-rank agreement (numcheck/telemetry/ranks.py) per recorded
step: 2 gloo ranks on the CPU, a DistributedDataParallel tiny model, AdamW, one thread per
rank. Prints, per model, the median step time unwatched, watched (statistics, the producer
check and the agreement: one all_gather of each rank's producer flag and one digest per
parameter), and the median time of the agreement alone (``Ranks.after_step``); then the same
with the live merge (``watch(live_merge=True)``: the agreement becomes one all_gather_object
of that vector and the rank's rows of the step) and the time of ``merged()`` at the end, and
the agreement's time with the optimizer's state checked too (``watch(optimizer=opt)``: one
more digest per parameter), all from one run of the two ranks on one machine.

    python bench/bench_telemetry_ranks.py [--models mlp tiny_lm] [--steps 30]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, port: int, models: list, steps: int, q) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from numcheck import telemetry
    from numcheck.convergence.models import build
    from numcheck.telemetry import ranks as R

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    spent: dict = {"watched": [], "live": [], "state": []}
    mode = "plain"
    plain_after = R.Ranks.after_step

    def timed(self, *a):
        t0 = time.perf_counter()
        plain_after(self, *a)
        spent[mode].append(time.perf_counter() - t0)
    R.Ranks.after_step = timed
    out = {}
    for name in models:
        model, task, lr = build(name, 0)
        m = DDP(model)
        opt = torch.optim.AdamW(m.parameters(), lr=lr)
        times = {"plain": [], "watched": [], "live": [], "state": []}
        merged = []
        for mode in ("plain", "watched", "live", "state") * 2:
            t = None if mode == "plain" else telemetry.watch(
                m, live_merge=mode == "live", optimizer=opt if mode == "state" else None)
            for step in range(steps):
                b = task.batch_at(rank, step)
                t0 = time.perf_counter()
                loss = _loss(m, b)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if t is not None:
                    t.step()
                if step >= 3:
                    times[mode].append(time.perf_counter() - t0)
            if t is not None:
                t.close()
            if mode == "live":
                t0 = time.perf_counter()
                rows = len(t.merged())
                merged.append((time.perf_counter() - t0, rows))
        med = statistics.median
        out[name] = (med(times["plain"]), med(times["watched"]), med(spent["watched"]),
                     med(times["live"]), med(spent["live"]), merged[-1],
                     len(list(m.parameters())), med(spent["state"]))
        for v in spent.values():
            v.clear()
    if rank == 0:
        q.put(out)
    dist.destroy_process_group()


def _loss(ddp, batch):
    # through the DDP wrapper's forward (its hooks and the gradient all-reduce)
    inner = ddp.module
    if hasattr(inner, "blocks"):
        logits = ddp(batch["tokens"]).float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 batch["targets"].reshape(-1))
    return torch.nn.functional.mse_loss(ddp(batch["x"]).float(), batch["y"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["mlp", "tiny_lm"])
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    from numcheck.telemetry.launch import free_port
    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.start_processes(_rank, args=(2, port, args.models, args.steps, q), nprocs=2,
                       start_method="spawn")
    out = q.get()
    print(f"{'model':10s} {'params':>6s} {'plain ms':>9s} {'watched':>8s} {'agreement ms':>13s} "
          f"{'of a plain step':>16s} {'live merge':>11s} {'its agreement ms':>17s} "
          f"{'merged() ms (rows)':>19s} {'+opt. state ms':>15s}")
    for name, (plain, watched, agree, live, agree_live, (mt, rows), n, state) in out.items():
        print(f"{name:10s} {n:6d} {1e3 * plain:9.2f} {watched / plain:7.2f}x "
              f"{1e3 * agree:13.3f} {agree / plain:15.2f}x {live / plain:10.2f}x "
              f"{1e3 * agree_live:17.3f} {1e3 * mt:12.1f} ({rows}) {1e3 * state:15.3f}")


if __name__ == "__main__":
    main()
