"""A watch's rows and producer checks: gathered while a step runs, merged once at ``step()``.

Each row key (module, op, role, pass, recipe, what_if) holds a host vector of fields.FIELDS
(Python floats: what the compiled CPU passes give) and device parts (field indices and rows on
a device: what the device pass or the torch route gives on a GPU). ``flush`` reads every
device part of the step with one device-to-host copy per device, merges them into the host
vectors by fields.FIELDS' rules, and decides the producer checks whose observations were on a
device: the first call that made a NaN or Inf out of finite inputs is ``first``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from numcheck.telemetry import fields
from numcheck.telemetry.observation import (Pending, StepReads, finite, is_dtensor, local,
                                            plain_of, read_back)
from numcheck.telemetry.passes import dev_part, dev_quant, digest_field, host_quants, put

ROLES = ("input", "weight", "output", "grad_output", "grad_input", "grad_weight")


def _shards(placement) -> bool:
    """A DTensor placement that shards a dim: Shard, or the _StridedShard FSDP2 lays over a
    tensor-parallel shard of the same dim (whose is_shard() is False)."""
    return placement.is_shard() or type(placement).__name__ == "_StridedShard"


def shard_extent(t) -> tuple | None:
    """Where this rank's shard of a sharded DTensor lies in the whole tensor (fields.cut_blocks'
    ``extent``): per dim, (offset, length, size), from torch's own arithmetic
    (compute_local_shape_and_global_offset: torch.chunk's, uneven last shards included); offset
    None along a dim a _StridedShard shards (its indices there are not one range); None for
    any other tensor."""
    if not is_dtensor(t) or not any(_shards(p) for p in t.placements):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    strided = {p.dim for p in t.placements if type(p).__name__ == "_StridedShard"}
    return tuple((None if d in strided else o, n, size)
                 for d, (o, n, size) in enumerate(zip(offset, shape, t.shape, strict=True)))


class _Where(NamedTuple):
    step: int
    module: str
    op: str
    role: str
    pass_: str


class NonFinite(_Where):
    """The first non-finite producer: a 5-tuple (step, module, op, role, pass_) that compares
    equal to a plain tuple; ``inputs`` holds the statistics of what it consumed (forward: its
    inputs and the parameters of it and its submodules; backward: its grad_output and what
    the forward saved, the call's inputs and those parameters): n, n_nan, n_inf, amax,
    min_nonzero. Under several ranks: ``rank``, the rank that made it (agreed on every rank),
    and ``received``, the other ranks whose rows hold NaN/Inf (they received it)."""

    inputs: dict
    rank = None
    received: tuple = ()


class NoProducer(NamedTuple):
    """Why ``first_nonfinite()`` names no producer; false in a boolean context, so ``if
    t.first_nonfinite():`` reads as before. ``reason``: ``all_finite`` (every value the check
    read was finite), ``propagated`` (the first non-finite value came in through a module's
    inputs: with the data, or parameters made non-finite outside the model), ``outside``
    (produced outside any module: the first non-finite gradient was already in a module's
    grad_output, from the loss's backward, a loss scale or a ``torch.autograd.grad`` seed),
    ``not_checked`` (the check never ran, and why), ``unattributed`` (rows hold NaN/Inf no
    check saw made: a bare op's masked backward, docs/telemetry.md's caveats); ``step``: where the first non-finite value
    was seen (None: none seen); ``detail``: one sentence for a person."""

    reason: str
    step: int | None
    detail: str

    def __bool__(self) -> bool:
        return False


class Accumulator:
    """The rows and producer checks of the current step, and the records of the steps before.

    ``reads``: the step's memo (each tensor read once); ``recipes``: (name, QuantRecipe-like,
    what_if) of the watch, whose quantizers add fields to a linear layer's x, w and grad rows;
    ``rank``: written into every row; ``digests``: each row's digest field as well (else NaN)."""

    def __init__(self, reads: StepReads, recipes: list, rank: int,
                 digests: bool = False, several: bool = False) -> None:
        self.reads, self.recipes, self.rank, self.digests = reads, recipes, rank, digests
        # several ranks in a process group: each row's sharding (fields.SHARDING)
        self.several = several
        self.sharding: dict[tuple, str] = {}
        # per row key: [host vector (floats), device parts: (field indices, (r, k) rows[, fix])]
        self.slots: dict[tuple, list] = {}
        # producer checks: (module, op, role, pass, flag (None: read at flush()), what the call
        # consumed, what it made): observations (observation.merge_obs) of both
        self.events: list[tuple] = []
        self.rows: list[dict] = []
        self.first: NonFinite | None = None
        # the first checked call whose output was not finite, when it named nobody (its
        # inputs were not finite either): (step, module, op, role, pass)
        self.seen: tuple | None = None
        self.nonfinite_rows = 0   # output and gradient rows so far holding a NaN or Inf

    def pending(self) -> bool:
        """Anything gathered in this step (rows or producer checks) that flush() would read."""
        return bool(self.slots or self.events)

    def discard(self) -> None:
        """Drop what this step gathered (a replay that failed: nothing to name from it)."""
        self.slots.clear()
        self.events.clear()
        self.sharding.clear()

    def records(self):
        """pandas DataFrame, one row per (step, module, op, role, pass, recipe)."""
        return fields.frame(self.rows)

    def event(self, name, op, role, pass_, ins, outs) -> None:
        """A producer check: the call consumed ``ins`` and made ``outs`` (observations); it
        produced a non-finite value where all of ins are finite and some of outs is not,
        decided now where both are on the host, at flush() otherwise."""
        flag = None
        if not isinstance(ins, Pending) and not isinstance(outs, Pending):
            flag = finite(ins) and not finite(outs)
        self.events.append((name, op, role, pass_, flag, ins, outs))

    def add(self, name, op, role, t: torch.Tensor, extra: list = ()) -> None:
        """Accumulate t's statistics into every row it belongs to (the recipe's and each
        what-if's for a quantized role of a linear layer). A row's host vector takes the
        fields known as floats (the compiled CPU passes; quantization / shadow fields given
        as floats or CPU tensors); fields on a device wait as device parts (read at
        flush()). ``extra``: more fields for the row (passes.sqnr_pair's: dicts, or device
        parts). A sharded DTensor's rows of a block format count the blocks that its shard's
        boundaries cut (blk_cut: fields.cut_blocks)."""
        sharding = self._sharding(t, role)
        whole, t = t, local(t)
        if t.numel() == 0:
            return
        tags = [("", None, False)]
        extent = None
        if op == "linear" and role in fields.QUANT_ROLE and self.recipes:
            tags = [(n, getattr(r, fields.QUANT_ROLE[role], None), w)
                    for n, r, w in self.recipes]
            if self.recipes[0][2]:  # what-ifs only: the observed row as well
                tags.insert(0, ("", None, False))
            extent = shard_extent(whole)
        pass_ = "backward" if role.startswith("grad") else "forward"
        p = self.reads.fields_of(t, True)
        host = isinstance(p, list)
        qs = host_quants(t, [q for _, q, _ in tags]) if host else None
        bits = digest_field(t) if self.digests else None
        for i, (tag, quantizer, what_if) in enumerate(tags):
            slot = self.slots.get((name, op, role, pass_, tag, what_if))
            if slot is None:
                slot = self.slots[(name, op, role, pass_, tag, what_if)] = \
                    [fields.host_identity(), []]
                self.sharding[(name, op, role, pass_, tag, what_if)] = sharding
            h = slot[0]
            if host:
                fields.host_plain(h, p)
                if qs[i] is not None:
                    fields.host_update(h, qs[i])
            else:
                slot[1].append((fields.PLAIN_INDEX, p))
                if quantizer is not None:
                    put(slot[1], dev_quant(t, quantizer, h))
            block = None if extent is None or quantizer is None else quantizer.format.block
            if block is not None:
                fields.host_update(h, {"blk_cut": fields.cut_blocks(extent, block)})
            for e in extra:
                put(slot[1], dev_part(e, h) if isinstance(e, dict) else e)
            if bits is not None:
                put(slot[1], dev_part(bits, h))

    def _sharding(self, t: torch.Tensor, role: str) -> str:
        """How t lies across the ranks (fields.SHARDING): a DTensor by its placements; a plain
        tensor under several ranks: a parameter replicated, its gradient a partial summand
        (before the all-reduce), anything else this rank's rows of the batch."""
        if is_dtensor(t):
            places = t.placements
            if any(_shards(p) for p in places):
                return "sharded"
            return "partial" if any(p.is_partial() for p in places) else "replicated"
        if not self.several:
            return ""
        return {"weight": "replicated", "grad_weight": "partial"}.get(role, "split")

    def flush(self, step: int) -> None:
        """The step's rows and its first producer: the device parts of its rows and of its
        producer checks read with one device-to-host copy per device (none on a CPU-only
        model: its host rows are Python floats already), then merged on the host."""
        ev = self.events if self.first is None else []
        pending = {id(part[1]): part[1] for slot in self.slots.values() for part in slot[1]}
        for e in ev:
            if e[4] is None:
                pending.update((id(x), x) for o in e[5:] if isinstance(o, Pending)
                               for x in o.rows)
        got = read_back(pending.values()) if pending else {}
        for k, (raw, parts) in self.slots.items():
            for idx, x, *fix in parts:
                fields.host_rows(raw, idx, fix[0](got[id(x)]) if fix else got[id(x)])
            row = {"step": step, "rank": self.rank, "module": k[0], "op": k[1], "role": k[2],
                   "pass": k[3], "recipe": k[4], "what_if": k[5],
                   "sharding": self.sharding.pop(k, ""),
                   **dict(zip(fields.NAMES, raw, strict=True))}
            if not self.digests:
                row["digest"] = math.nan
            self.rows.append(row)
        # rows of what modules made (outputs, gradients) holding NaN/Inf: an input row's -inf
        # may be a mask (masked softmax's logits), consumed, never a fault by itself
        self.nonfinite_rows += sum(r["n_nan"] + r["n_inf"] > 0 and r["role"] not in (
            "input", "weight") for r in self.rows[-len(self.slots):]) if self.slots else 0
        hit = next((e for e in ev if (e[4] if e[4] is not None else
                                      finite(e[5], got) and not finite(e[6], got))), None)
        if hit is None and self.seen is None:
            bad = next((e for e in ev if not finite(e[6], got)), None)
            if bad is not None:
                self.seen = (step, *bad[:4])
        if hit is not None:
            first = NonFinite(step, *hit[:4])
            vec = plain_of(hit[5], got)
            raw = {} if vec is None else dict(zip(fields.NAMES, vec))
            first.inputs = {k: raw[k] for k in ("n", "n_nan", "n_inf", "amax",
                                                "min_nonzero")} if raw else {}
            self.first = first
        self.slots.clear()
        self.events.clear()
