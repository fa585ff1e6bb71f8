"""What the ranks of a process group agree on, once per recorded step (docs/telemetry.md,
"Distributed"): the first non-finite producer across ranks, and whether the data-parallel
replicas of each parameter are still equal.

One collective per recorded step (an ``all_gather`` of one float64 vector per rank over the
watch's group: whether and at which step it named a producer, whether its rows hold NaN/Inf,
and a digest of each replicated parameter's bits, numcheck/telemetry/digest.py); a second only
when a rank named a producer earlier than the agreed one (the producers, as objects) or when
some digests differ (those parameters themselves, to measure the largest difference). Every rank computes the same answer
from the same gathered values, so ``first_nonfinite()`` and ``replicas()`` agree on every rank.
Every rank must call ``step()`` (and ``close()``) the same number of times, as every rank runs
a collective's other calls.

Replicated parameters: those of a ``DistributedDataParallel`` root (every parameter is a
replica), or every parameter of a model watched with ``replicas=True`` (a data-parallel loop
of one's own); parameters that are DTensors (FSDP2 shards, tensor-parallel shards) are not
replicas and are left out. With ``watch(..., optimizer=opt)`` each replicated parameter's
optimizer state (``opt.state[p]``: Adam's moments and step, SGD's momentum, ...) is a replica
too: one more digest per parameter in the same vector (its state entries' digests combined),
and a mismatch names the entry, ``"fc2.weight:exp_avg_sq"`` (a rank that skipped an update, or
whose state was restored from another checkpoint, shows here before its weights part).
"""
from __future__ import annotations

import zlib

import torch
from torch import nn

from numcheck.telemetry.observation import is_dtensor


__all__ = ["Ranks", "gather_vector", "is_data_parallel", "replica_columns"]

# ranks: the lowest rank and the ranks whose copy differs from its copy; max_abs_diff: the
# largest |difference| from the lowest rank's copy
replica_columns = ["step", "parameter", "ranks", "max_abs_diff"]


def is_data_parallel(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


class Ranks:
    """The cross-rank agreement of one watch (module doc). ``on``: a process group of more
    than one rank is up; ``rows``: replica mismatches (replica_columns); ``first``: the agreed
    earliest producer, with ``.rank`` and ``.received`` (the other ranks whose rows hold
    NaN/Inf: they received it, through a collective or an optimizer step)."""

    def __init__(self, model: nn.Module, names: dict, replicas: bool | None, group=None,
                 optimizer=None) -> None:
        dist = torch.distributed
        self.on = dist.is_available() and dist.is_initialized() and \
            dist.get_world_size(group) > 1
        self.group, self.rows, self.first = group, [], None
        self.optimizer = optimizer
        self.gathered: list[dict] = []   # every rank's rows, with the live merge
        if replicas is None:
            replicas = is_data_parallel(model)
        self.params: list[tuple[str, torch.Tensor]] = []
        if self.on and replicas:
            owner = {id(p): names.get(m, "") for m in model.modules()
                     for p in m.parameters(recurse=False)}
            seen = set()
            for full, p in model.named_parameters():
                if id(p) in seen or is_dtensor(p):
                    continue
                seen.add(id(p))
                leaf = full.rpartition(".")[2]
                base = owner.get(id(p), "")
                self.params.append((f"{base}.{leaf}" if base and base != "<model>" else leaf,
                                    p))

    def after_step(self, step: int, first, nonfinite_rows: int, rows=None) -> None:
        """The step's collective: gather, agree on the first producer, compare the replicas.
        One ``all_gather`` of a float64 vector per rank: (named a producer, its step, rows
        hold NaN/Inf, one digest per replicated parameter: < 2^48, exact in float64); the
        producers themselves (strings) only when a rank named one earlier than the agreed.
        ``rows`` (the live merge): this rank's rows of the step, gathered with the vector in
        one ``all_gather_object`` instead; every rank's are kept in ``gathered``."""
        from numcheck.telemetry.passes import digest_field

        dist = torch.distributed
        world = dist.get_world_size(self.group)
        head = [float(first is not None), float(first.step if first is not None else -1),
                float(nonfinite_rows > 0)]
        digests = [float(digest_field(p.detach())["digest"]) for _, p in self.params]
        if self.optimizer is not None:
            digests += [_state_digest(self._state(p), digest_field) for _, p in self.params]
        if rows is not None:
            both: list = [None] * world
            dist.all_gather_object(both, (head + digests, rows), group=self.group)
            table = [b[0] for b in both]
            self.gathered += [r for b in both for r in b[1]]
        else:
            table = gather_vector(head + digests, torch.float64, self.group).tolist()
        named = [(int(t[1]), r) for r, t in enumerate(table) if t[0]]
        earlier = bool(named) and (self.first is None
                                   or min(named) < (self.first.step, self.first.rank))
        producers: list = [None] * world
        if earlier:   # every rank sees the same table, so every rank joins this one
            dist.all_gather_object(producers, None if first is None else (
                tuple(first), dict(getattr(first, "inputs", {}))), group=self.group)
        self._agree([(p, bool(t[2]) or bool(t[0])) for p, t in zip(producers, table)])
        self._compare(step, [t[3:] for t in table])

    def _agree(self, got: list) -> None:
        """got: per rank, (its producer (where, inputs) when gathered, else None; whether it
        saw a non-finite value)."""
        named = [(f[0][0], r, f) for r, (f, _) in enumerate(got) if f is not None]
        if named:
            step, rank, (where, inputs) = min(named, key=lambda x: (x[0], x[1]))
            if self.first is None or (step, rank) < (self.first.step, self.first.rank):
                from numcheck.telemetry.accumulator import NonFinite
                first = NonFinite(*where)
                first.inputs, first.rank, first.received = inputs, rank, ()
                self.first = first
        if self.first is not None:   # the ranks it reached: now, or in a later step
            self.first.received = tuple(sorted(set(self.first.received) | {
                r for r, (_, bad) in enumerate(got) if r != self.first.rank and bad}))

    def _state(self, p: torch.Tensor) -> dict:
        """p's optimizer state as {entry: float64 CPU tensor} (numbers as 0-d tensors)."""
        got = self.optimizer.state.get(p, {})
        return {str(k): torch.as_tensor(v.detach() if isinstance(v, torch.Tensor) else v
                                   ).to("cpu", torch.float64)
                for k, v in sorted(got.items(), key=lambda kv: str(kv[0]))
                if isinstance(v, (torch.Tensor, int, float))}

    def _compare(self, step: int, table: list) -> None:
        if not self.params or all(t == table[0] for t in table):
            return
        dist = torch.distributed
        n = len(self.params)
        differ = [i for i in range(len(table[0])) if len({t[i] for t in table}) > 1]
        # each differing digest's entries {suffix: float64 values}: a parameter's one, "";
        # an optimizer state's (i >= n) one per state entry, ":exp_avg"
        mine = [{"": self.params[i][1].detach().to("cpu", torch.float64)} if i < n
                else {f":{k}": v for k, v in self._state(self.params[i - n][1]).items()}
                for i in differ]
        values: list = [None] * len(table)
        dist.all_gather_object(values, mine, group=self.group)
        for k, i in enumerate(differ):
            ranks = [r for r, t in enumerate(table) if t[i] != table[0][i]]
            for key in sorted({e for v in values for e in v[k]}):
                ref = values[0][k].get(key)
                odd = tuple(r for r in ranks if not _same(values[r][k].get(key), ref))
                if odd:
                    self.rows.append({"step": step,
                                      "parameter": self.params[i % n][0] + key,
                                      "ranks": (0, *odd), "max_abs_diff": max(
                                          _diff(values[r][k].get(key), ref) for r in odd)})

    def frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows, columns=replica_columns)


def gather_vector(values: list, dtype: torch.dtype, group=None) -> torch.Tensor:
    """Every rank's ``values`` (the same length on each) as a (ranks, len) CPU tensor: one
    ``all_gather`` over ``group`` (on the GPU where the backend is NCCL, which gathers device
    tensors only)."""
    dist = torch.distributed
    mine = torch.tensor(values, dtype=dtype)
    if dist.get_backend(group) == "nccl":
        mine = mine.cuda()
    got = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(got, mine, group=group)
    return torch.stack(got).cpu()


def _state_digest(state: dict, digest_field) -> float:
    """One float64 for a parameter's optimizer state (Ranks._state): its entries' digests
    (numcheck/telemetry/digest.py, < 2^48) combined in key order, modulo 2^48 (exact in
    float64); -1 for no state (before the first update)."""
    if not state:
        return -1.0
    total = 0
    for key, v in state.items():
        d = int(digest_field(v.reshape(-1) if v.dim() == 0 else v)["digest"]) if v.numel() else 0
        # the key's CRC, not hash(): str hashes differ between processes
        total = (total * 1000003 + zlib.crc32(key.encode()) + d) % 2**48
    return float(total)


def _same(a, b) -> bool:
    """Two state entries (float64 tensors, or None where a rank has none) bitwise equal."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(torch.equal(a.view(torch.int64), b.view(torch.int64)))


def _diff(a, b) -> float:
    """The largest |a - b| of two state entries (inf where one rank has none or the shapes
    differ)."""
    if a is None or b is None or a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max()) if a.numel() else 0.0
