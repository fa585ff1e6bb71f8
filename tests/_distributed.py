"""Workers of the distributed telemetry tests (tests/test_telemetry_distributed.py): real
process groups, 2 ranks, gloo on the CPU, started with torch.multiprocessing (spawn: a fresh
interpreter per rank, as torchrun gives)."""
from __future__ import annotations

import json
import os
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from numcheck.telemetry.launch import free_port

GLOBAL_BATCH = 64


def spawn(fn, world: int, *args) -> None:
    """Run fn(rank, world, port, *args) on ``world`` ranks; raises if a rank fails."""
    mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, join=True,
                       start_method="spawn")


def join(rank: int, world: int, port: int) -> None:
    """A rank's start: quiet, one thread (the ranks share the cores), in a gloo group when
    there are several."""
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)


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
    "overflow" (rank 1's fc2 weights become 3e38 before step 2: its output overflows),
    "state" (SGD with momentum; rank 1 nudges fc2.weight's momentum buffer [0, 0] by one ulp
    after step 1's update: its weights part only at step 2). The optimizer is watched."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from numcheck import telemetry
    from numcheck.convergence.models import build

    join(rank, world, port)
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
        opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9 if plant == "state" else 0)
        rows = GLOBAL_BATCH // world
        with telemetry.watch(m, digests=True, live_merge=True, optimizer=opt) as t:
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
                if plant in ("drift", "state") and rank == 1 and step == 1:
                    with torch.no_grad():
                        w = model.fc2.weight
                        if plant == "state":
                            w = opt.state[w]["momentum_buffer"]
                        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf")))
                t.step()
        t.records().to_parquet(f"{out}/rank{rank}-of{world}.parquet", index=False)
        t.merged().to_parquet(f"{out}/merged{rank}-of{world}.parquet", index=False)
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


def tp_run(rank: int, world: int, port: int, out: str) -> None:
    """numcheck's mlp with fc1 column-parallel and fc2 row-parallel over a tensor-parallel
    mesh of ``world`` ranks (torch.distributed.tensor.parallel; one process: the plain
    model), the same batches on every rank, SGD, watched; writes the records and the
    random-state invariants of the RHT signs across the tensor-parallel ranks (a QuantState
    of the run's seed, and one whose signs each rank seeds from its rank) and of the SR
    streams across the same ranks read as data-parallel ones (drawn per rank, and not)."""
    from numcheck import telemetry
    from numcheck.convergence.linear import QuantState
    from numcheck.convergence.models import build
    from numcheck.quant.recipe import RECIPES
    from numcheck.telemetry import random_state

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, _, _ = build("mlp", 0)
        checks = {}
        if world > 1:
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
            parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
            tp = mesh.get_group("tp")
            recipe = RECIPES["nvfp4_rht_sr"]
            for name, state in (("seeded", QuantState(0, "cpu")),
                                ("rank_seeded", QuantState(rank, "cpu"))):
                shared, _ = state.random_state(recipe)
                checks[name] = [str(v) for v in random_state.check(shared, shared_group=tp)]
            # the same group read as data-parallel ranks: SR streams drawn per rank, and a
            # QuantState that forgot its rank
            for name, state in (("sr_per_rank", QuantState(0, "cpu", dp_rank=rank)),
                                ("sr_same", QuantState(0, "cpu"))):
                _, distinct = state.random_state(recipe)
                checks[name] = [str(v) for v in random_state.check(distinct=distinct,
                                                                   distinct_group=tp)]
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        with telemetry.watch(model) as t:
            for step in range(2):
                x, y = batch(step)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                t.step()
        t.records().to_parquet(f"{out}/tp{rank}-of{world}.parquet", index=False)
        with open(f"{out}/tp{rank}-of{world}.json", "w") as f:
            json.dump(checks, f)
    finally:
        if world > 1:
            dist.destroy_process_group()


# ---- planted layout-dependent faults (tests/test_convergence_layouts.py) ---------------------

class ShardAmax:
    """A tensor-scaled recipe whose weight is cast shard by shard (dim 0 cut into one shard per
    rank, as FSDP2 holds it), each shard with its own amax, and read back with this rank's
    shard's scale: an fp8 all-gather whose amax was never all-reduced. On one process it is the
    recipe itself."""

    def __init__(self, name: str = "fp8_tensor") -> None:
        from numcheck.quant.recipe import RECIPES
        self._recipe = RECIPES[name]
        self.name = f"{name}_shard_amax"

    def __getattr__(self, name):
        if name.startswith("_"):   # unpickling in a rank looks up __setstate__ before _recipe
            raise AttributeError(name)
        return getattr(self._recipe, name)

    def qdq(self, role, t, dim, generator=None):
        if role != "w" or not dist.is_initialized() or dist.get_world_size() == 1:
            return self._recipe.qdq(role, t, dim, generator)
        shards = t.chunk(dist.get_world_size(), dim=0)
        amax = [s.abs().amax().clamp_min(torch.finfo(t.dtype).tiny) for s in shards]
        mine = amax[dist.get_rank()]
        return torch.cat([self._recipe.qdq(role, s, dim, generator) * (mine / a)
                          for s, a in zip(shards, amax)], dim=0)


class RankSeededSigns:
    """nvfp4_rht_sr whose Hadamard signs a rank seeds from its own rank (the bug the shared
    invariant is for): on one process the recipe itself."""

    def __init__(self) -> None:
        from numcheck.quant.recipe import RECIPES
        self._recipe = RECIPES["nvfp4_rht_sr"]
        self.name = "nvfp4_rht_sr_rank_signs"

    def __getattr__(self, name):
        if name.startswith("_"):   # unpickling in a rank looks up __setstate__ before _recipe
            raise AttributeError(name)
        return getattr(self._recipe, name)

    applies_hadamard = True   # QuantLinear leaves the transform to qdq

    def _signs(self):
        from numcheck.quant.transforms import rht_signs
        return rht_signs(self._recipe.hadamard, seed=dist.get_rank() if dist.is_initialized()
                         else 0)

    def random_state(self):
        return {f"rht signs (h={self._recipe.hadamard}, own)": self._signs()}, {}

    def qdq(self, role, t, dim, generator=None):
        if role in ("x", "grad") and dim == 0:   # the weight-gradient GEMM's operands
            from numcheck.quant.transforms import hadamard
            t = hadamard(t, self._recipe.hadamard, dim=0, signs=self._signs()).to(t.dtype)
        return self._recipe.qdq(role, t, dim, generator)


def llama_state_run(rank: int, world: int, port: int, out: str, plant: bool) -> None:
    """DDP over a tiny transformers LlamaForCausalLM (tied embeddings, loss and logits from
    ``labels=``), AdamW, watched with the optimizer; ``plant``: rank 1 nudges one exp_avg_sq
    entry of layers.0.mlp.down_proj.weight by one ulp after step 1's update. Rank 0 writes
    the replica table to ``out``/replicas.json."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from numcheck import telemetry

    join(rank, world, port)
    try:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        rows = 4 // world
        with telemetry.watch(ddp, optimizer=opt) as t:
            for step in range(4):
                ids = torch.randint(0, 64, (4, 16), generator=g)[rank * rows:(rank + 1) * rows]
                out_ = ddp(input_ids=ids, labels=ids)
                opt.zero_grad()
                out_.loss.backward()
                opt.step()
                if plant and rank == 1 and step == 1:
                    s = opt.state[model.model.layers[0].mlp.down_proj.weight]["exp_avg_sq"]
                    with torch.no_grad():
                        s[0, 0] = torch.nextafter(s[0, 0], torch.tensor(float("inf")))
                t.step()
        if rank == 0:
            with open(f"{out}/replicas.json", "w") as f:
                json.dump(t.replicas().assign(ranks=lambda d: d["ranks"].map(list))
                          .to_dict("records"), f)
    finally:
        dist.destroy_process_group()
