"""Workers of tests/test_telemetry_shard_blocks.py: two linears sharded over 2 gloo ranks on the
CPU (tensor-parallel RowwiseParallel, or FSDP2), watched with block recipes as what-ifs, one
step; one process: the same model, unsharded, on the whole batch. Spawned with
tests/_distributed.py's ``spawn``."""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

import _distributed as D

BATCH = 8
RECIPES = ("mxfp8", "fp8_block")   # blocks of 32 along K; 1x128 and 128x128 weight tiles
# (in_features, out_features) of fc1 and fc2 (weights (out, in): blocks along in, dim 1).
# RowwiseParallel shards the weights' dim 1 (K): fc1's 128 into shards of 64, whole blocks
# of 32; fc2's 80 into shards of 40, which cut blocks of 32. FSDP2 shards dim 0: fc1's 256
# rows into 128s, whole 128x128 tiles; fc2's 81 into 41 and 40 (uneven), which cut 128x128
# tiles and never 1x32 blocks.
SHAPES = {"tp": ((128, 80), (80, 16)), "fsdp2": ((128, 256), (256, 81))}


def _model(layout: str) -> torch.nn.Module:
    """The layout's two linears, the same weights on every rank and in one process."""
    torch.manual_seed(0)
    (i1, o1), (i2, o2) = SHAPES[layout]
    m = torch.nn.Sequential()
    m.fc1 = torch.nn.Linear(i1, o1, bias=False)
    m.fc2 = torch.nn.Linear(i2, o2, bias=False)
    return m


def _shard(m: torch.nn.Module, layout: str, rank: int, world: int, x: torch.Tensor):
    """The model sharded by ``layout`` over a mesh of the ranks, and this rank's input: its
    slice of K (RowwiseParallel takes its input as Shard(-1)) or of the batch (FSDP2)."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    if layout == "tp":
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module
        # fc2 takes fc1's replicated output and shards it along K itself
        parallelize_module(m, mesh, {"fc1": RowwiseParallel(),
                                     "fc2": RowwiseParallel(input_layouts=Replicate())})
        return m, x.chunk(world, dim=1)[rank]
    from torch.distributed.fsdp import fully_shard
    fully_shard(m.fc1, mesh=mesh)
    fully_shard(m.fc2, mesh=mesh)
    return fully_shard(m, mesh=mesh), x.chunk(world, dim=0)[rank]


def strided_run(rank: int, world: int, port: int, out: str) -> None:
    """accumulator.shard_extent and the sharding of a DTensor that a _StridedShard shards (as
    FSDP2 over a tensor-parallel shard of the same dim lays it), to ``out``/strided{rank}.json."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    from numcheck.telemetry.accumulator import Accumulator, shard_extent

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        t = DTensor.from_local(torch.zeros(4, 8), mesh, [_StridedShard(0, split_factor=2)],
                               run_check=False)
        sharding = Accumulator(None, [], rank, several=True)._sharding(t, "weight")
        with open(f"{out}/strided{rank}.json", "w") as f:
            json.dump({"extent": [list(e) for e in shard_extent(t)], "sharding": sharding}, f)
    finally:
        dist.destroy_process_group()


def shard_run(rank: int, world: int, port: int, out: str, layout: str) -> None:
    """One step of the layout's model (world 1: unsharded), watched with RECIPES as
    what-ifs; writes the records to ``out``/``layout``{rank}-of{world}.parquet."""
    from numcheck import telemetry

    D.join(rank, world, port)
    try:
        m = _model(layout)
        x = torch.randn(BATCH, SHAPES[layout][0][0], generator=torch.Generator().manual_seed(1))
        if world > 1:
            m, x = _shard(m, layout, rank, world, x)
        with telemetry.watch(m, what_if=RECIPES) as t:
            m(x).square().mean().backward()
            t.step()
        t.records().to_parquet(f"{out}/{layout}{rank}-of{world}.parquet", index=False)
    finally:
        if world > 1:
            dist.destroy_process_group()
