"""Random-state invariants across the ranks of a process group (docs/telemetry.md,
"Distributed"): what must be drawn alike and what must be drawn apart.

* **Shared**: random state every rank of a group must hold the same, e.g. the sign vector of a
  random Hadamard transform across the tensor-parallel ranks that shard one GEMM. A GEMM whose
  two operands are transformed on ranks with different signs no longer computes dy^T x
  ((Q_a^T dy)^T (Q_b^T x) != dy^T x): its result is wrong by an error as large as the values.
* **Distinct**: random state each rank of a group must draw on its own, e.g. the stochastic
  rounding stream of each data-parallel rank. Equal streams make the ranks' rounding errors
  add coherently in the gradient all-reduce instead of averaging out (world x the variance
  reduction is lost), a bias nobody sees on one GPU.

``check(shared, distinct, shared_group, distinct_group)`` gathers a 63-bit digest of each
named item per rank (one ``all_gather`` of an int64 vector per group) and returns the
violations, the same list on every rank. Items are tensors (digested by their bytes) or
``torch.Generator``s (by their state, i.e. the stream they will draw next).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from numcheck.telemetry.ranks import gather_vector

__all__ = ["RandomStateViolation", "check"]


@dataclass(frozen=True)
class RandomStateViolation:
    """``item`` breaks its invariant ("shared": ``ranks`` hold different values; "distinct":
    ``ranks`` hold the same stream)."""

    item: str
    invariant: str
    ranks: tuple[int, ...]

    def __str__(self) -> str:
        if self.invariant == "shared":
            return (f"{self.item}: differs across ranks {list(self.ranks)}, which must share "
                    "it (seed it from what the ranks have in common, not from their rank)")
        return (f"{self.item}: the same stream on ranks {list(self.ranks)}, which must each "
                "draw their own (seed it with the rank in this group)")


def _digest(item) -> int:
    if isinstance(item, torch.Generator):
        data = item.get_state().numpy().tobytes()
    elif isinstance(item, torch.Tensor):
        t = item.detach().contiguous().cpu()
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    else:
        raise TypeError(f"random_state.check: {type(item).__name__} is neither a tensor nor a "
                        "torch.Generator")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1   # fits int64


def _gather(items: dict, group) -> tuple[list[int], torch.Tensor]:
    """(global ranks of group, (ranks, items) digests)."""
    dist = torch.distributed
    ranks = dist.get_process_group_ranks(group) if group is not None else \
        list(range(dist.get_world_size()))
    return ranks, gather_vector([_digest(v) for v in items.values()], torch.int64, group)


def check(shared: dict | None = None, distinct: dict | None = None, shared_group=None,
          distinct_group=None) -> list[RandomStateViolation]:
    """The violations of the invariants (module doc) over the two groups (None: the default
    group); every rank of each group must call it with the same item names. Empty when no
    process group is up."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return []
    out = []
    if shared:
        ranks, d = _gather(shared, shared_group)
        for j, name in enumerate(shared):
            odd = [r for i, r in enumerate(ranks) if d[i, j] != d[0, j]]
            if odd:
                out.append(RandomStateViolation(name, "shared", (ranks[0], *odd)))
    if distinct:
        ranks, d = _gather(distinct, distinct_group)
        for j, name in enumerate(distinct):
            col = d[:, j].tolist()
            same = tuple(r for i, r in enumerate(ranks) if col.count(col[i]) > 1)
            if same:
                out.append(RandomStateViolation(name, "distinct", same))
    return out
