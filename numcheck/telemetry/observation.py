"""What the producer check reads of some tensors (an observation), and the step's memo that
reads each tensor once.

An observation is None (no tensors), a host list of fields.PLAIN (CPU tensors: known at once)
or a ``Pending`` (part of it still on a device, read at ``step()``). ``StepReads`` reads a
tensor's plain fields through numcheck/telemetry/passes.py once per step: the finiteness check,
the producer's input statistics and the recorded row share one pass, and a module's output met
again as the next module's input is not read again.
"""
from __future__ import annotations

import weakref

import torch

from numcheck.telemetry import fields
from numcheck.telemetry.passes import read


class Pending:
    """The producer check's statistics of some tensors, part of them still on a device: the
    host part (fields.PLAIN floats, or None) and device row blocks ((r, 8) float64, fields.PLAIN
    rows that merge by fields.FIELDS' rules), read at step(). Observations of CPU tensors alone
    stay plain host lists (``merge_obs``), known at once."""

    __slots__ = ("host", "rows")

    def __init__(self, host: list[float] | None, rows: tuple) -> None:
        self.host, self.rows = host, rows


def merge_obs(a, b):
    """Two producer-check observations (None: no tensors; a host list of fields.PLAIN; a
    Pending) as one; the arguments are left as they are."""
    if a is None or b is None:
        return b if a is None else a
    ha, ra = (a, ()) if isinstance(a, list) else (a.host, a.rows)
    hb, rb = (b, ()) if isinstance(b, list) else (b.host, b.rows)
    if ha is None or hb is None:
        h = hb if ha is None else ha
    else:
        h = list(ha)
        fields.host_plain(h, hb)
    return Pending(h, ra + rb) if ra or rb else h


def finite(obs, got: dict | None = None) -> bool:
    """No NaN and no Inf in the observed tensors (``got``: id -> the rows read back, for a
    Pending)."""
    if obs is None:
        return True
    if isinstance(obs, list):
        return obs[2] + obs[3] == 0
    if obs.host is not None and obs.host[2] + obs.host[3] != 0:
        return False
    return all(not (got[id(x)][:, 2:4] != 0).any() for x in obs.rows)


def plain_of(obs, got: dict) -> list[float] | None:
    """The observed tensors' fields.PLAIN, merged (None: no tensors)."""
    if obs is None or isinstance(obs, list):
        return obs
    h = list(fields.PLAIN_IDENTITY if obs.host is None else obs.host)
    for x in obs.rows:
        fields.host_rows(h, fields.PLAIN_INDEX, got[id(x)])
    return h


def is_dtensor(t) -> bool:
    """t is a torch.distributed DTensor (FSDP2's parameters, tensor-parallel shards), told by
    its type's name: torch.distributed need not import (a build without it has none)."""
    return type(t).__name__ == "DTensor"


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2's parameters and gradients, tensor-parallel shards):
    what this rank holds and computes with (docs/telemetry.md, "Distributed"); any other
    tensor as it is. Torch ops on the DTensor itself would run collectives per statistic."""
    return t.to_local() if is_dtensor(t) else t


def read_back(tensors) -> dict:
    """id -> numpy copy of each tensor (2-D), one device-to-host copy per device."""
    by_dev: dict = {}
    for x in tensors:
        by_dev.setdefault(x.device, []).append(x)
    got = {}
    for xs in by_dev.values():
        flat = torch.cat([x.reshape(-1) for x in xs]).cpu().numpy()
        at = 0
        for x in xs:
            k = x.numel()
            got[id(x)] = flat[at:at + k].reshape(x.shape)
            at += k
    return got


class StepReads:
    """This step's plain fields per tensor, each tensor read once (``fields_of``)."""

    def __init__(self) -> None:
        # id -> (weakref, tag, fields, full); cleared at each step's end
        self.memo: dict[int, tuple] = {}
        self.forwards = 0   # forward passes of the root so far (the hooks count): a memo tag

    def clear(self) -> None:
        self.memo.clear()

    def fields_of(self, t: torch.Tensor, full: bool, fresh: bool = False):
        """t's plain fields: a host list (fields.PLAIN, the compiled CPU pass) or a device row
        block (passes.dev_rows, read at step()), computed once per step: a tensor met again
        (one module's output is the next one's input, a container's input its first child's)
        takes the fields stored for it, while it is the same object with the same version,
        storage and forward pass (a parameter's ``.data`` can be written behind its version
        counter, between forwards: the optimizer's step); the CPU integer pass's fields
        (sum_sq NaN) do not answer ``full``; ``fresh``: read it again (and store that)."""
        t = local(t)
        e = self.memo.get(id(t))
        try:
            tag = (t._version, t.data_ptr(), self.forwards)
        except RuntimeError:   # an inference tensor keeps no version counter: no memo
            return read(t, full)
        if not fresh and e is not None and e[1] == tag and e[0]() is t and (e[3] or not full):
            return e[2]
        p = read(t, full)
        self.memo[id(t)] = (weakref.ref(t), tag, p, not isinstance(p, list) or p[7] == p[7])
        return p

    def observe(self, ts: list[torch.Tensor], full: bool = False, fresh: set = frozenset(),
                full_ids=()):
        """What the producer check reads of ts: their finiteness and plain statistics, as one
        observation (merge_obs; None for no tensors). CPU tensors take the compiled pass; on
        CPU only its integer half runs (sum_sq NaN: NonFinite.inputs does not show it)
        unless ``full`` (or the tensor's id is in ``full_ids``): the hooks record these
        tensors later in the step. Tensors whose id is in ``fresh`` are read again, not taken
        from the step's memo."""
        obs = None
        for t in ts:
            if t.numel() == 0:   # nothing to read: finite, identity statistics
                p = list(fields.PLAIN_IDENTITY)
            else:
                p = self.fields_of(t, full or id(t) in full_ids, id(t) in fresh)
            obs = merge_obs(obs, p if isinstance(p, list) else Pending(None, (p,)))
        return obs
