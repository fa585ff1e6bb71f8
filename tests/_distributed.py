"""Workers of the distributed telemetry tests (tests/test_telemetry_distributed.py): real
process groups, 2 ranks, gloo on the CPU, started with torch.multiprocessing (spawn: a fresh
interpreter per rank, as torchrun gives)."""
from __future__ import annotations

import json
import os
import socket
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GLOBAL_BATCH = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world: int, *args) -> None:
    """Run fn(rank, world, port, *args) on ``world`` ranks; raises if a rank fails."""
    mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, join=True,
                       start_method="spawn")


def batch(step: int):
    """The global batch of a step: the same on every rank, each rank takes its rows."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL_BATCH, 32, generator=g), torch.randn(GLOBAL_BATCH, 32, generator=g)


def mlp_run(rank: int, world: int, port: int, out: str, plant: str | None = None,
            steps: int = 4, layout: str = "ddp") -> None:
    """Train numcheck's mlp with SGD alone (world 1), under DDP or FSDP2 (``layout``
    "fsdp2": fully_shard on each linear and the root, gloo on the CPU), watched; write the
    records, the replica table and the first non-finite producer under ``out``.
    ``plant``: "drift" (rank 1 nudges fc2.weight[0, 0] by one ulp after step 1's update),
    "overflow" (rank 1's fc2 weights become 3e38 before step 2: its output overflows)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from numcheck import telemetry
    from numcheck.convergence.models import build

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, _, _ = build("mlp", 0)
        m = model
        if world > 1 and layout == "ddp":
            m = DDP(model)
        elif world > 1:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (world,))
            for layer in (model.fc1, model.fc2, model.fc3):
                fully_shard(layer, mesh=mesh)
            m = fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(m.parameters(), lr=1e-2)
        rows = GLOBAL_BATCH // world
        with telemetry.watch(m, digests=True) as t:
            for step in range(steps):
                if plant == "overflow" and rank == 1 and step == 2:
                    with torch.no_grad():
                        model.fc2.weight.fill_(3e38)
                x, y = batch(step)
                x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
                loss = torch.nn.functional.mse_loss(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if plant == "drift" and rank == 1 and step == 1:
                    with torch.no_grad():
                        w = model.fc2.weight
                        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf")))
                t.step()
        t.records().to_parquet(f"{out}/rank{rank}-of{world}.parquet", index=False)
        first = t.first_nonfinite()
        with open(f"{out}/rank{rank}-of{world}.json", "w") as f:
            json.dump({"first": list(first) if first else None,
                       "first_rank": getattr(first, "rank", None),
                       "received": list(getattr(first, "received", ())),
                       "replicas": t.replicas().assign(
                           ranks=lambda d: d["ranks"].map(list)).to_dict("records")}, f)
    finally:
        if world > 1:
            dist.destroy_process_group()
