"""Shards of a run for CI matrices, and the merge of their results files.

``--numcheck-shard I/N`` (``numcheck run --shard I/N``) keeps every N-th collected item,
starting at the I-th, round-robin over the node ids in sorted order: each shard gets its share of
every family (the costly convergence items included), whatever order plugins collect them in,
the same in every xdist worker. A case's verdict and golden verdict depend on that case alone,
so the shards' records together are the unsharded run's, provided every shard collected the
same tests: each records its collection's id (count and digest of the sorted node ids), and
``merge`` refuses shards whose collections differ (another selection, another torch, an
optional library missing on one runner). Three things need the whole run and move to ``numcheck merge``: DESIGN rule 11
(an op that executed nothing fails), the golden rows no case ran ("unused"), and refresh,
which a shard refuses (its file would hold only its share).
"""
from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

from numcheck.errors import UsageError
from numcheck.records import Record, Status, failing


def parse(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 1 <= I <= N; UsageError naming the remedy otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise UsageError(f"--numcheck-shard {text!r}: give I/N with 1 <= I <= N, e.g. 2/4")
    return int(m[1]), int(m[2])


def select(items: list, shard: tuple[int, int], key=str) -> tuple[list, list]:
    """(kept, deselected): the shard's share of ``items`` (by the sorted order of ``key``,
    a node id), each list in the items' own order."""
    i, n = shard
    order = sorted(range(len(items)), key=lambda k: key(items[k]))
    mine = {k for pos, k in enumerate(order) if pos % n == i - 1}
    return ([it for k, it in enumerate(items) if k in mine],
            [it for k, it in enumerate(items) if k not in mine])


def collection_id(nodeids: list[str]) -> str:
    """What a shard collected before it took its share: equal in every shard of one run."""
    digest = hashlib.sha256("\n".join(sorted(nodeids)).encode()).hexdigest()[:16]
    return f"{len(nodeids)} tests {digest}"


def idle_ops(records: list[Record]) -> list[str]:
    """Ops whose every record is a skip: DESIGN rule 11 fails the run for each."""
    ran: dict[str, bool] = {}
    for r in records:
        ran[r.op] = ran.get(r.op, False) or r.status != Status.SKIPPED
    return sorted(op for op, did in ran.items() if not did)


def merge(paths: list[str | Path]) -> tuple[list[Record], dict[str, str]]:
    """The records of the shards' results files as one run: every shard 1..N of one run
    exactly once (same N, case set and golden mode), no case in two shards. The records come
    sorted by golden key; the provenance is shard 1's without its shard. UsageError otherwise,
    naming the file."""
    from numcheck.goldens.store import KEY, read_results

    if not paths:
        raise UsageError("numcheck merge: give the shards' results files")
    by_shard: dict[int, tuple[Path, list[Record], dict]] = {}
    total = None
    for p in map(Path, paths):
        records, prov = read_results(p)
        if not prov.get("shard"):
            raise UsageError(f"{p}: not a shard's results (no shard in its provenance); run "
                             f"the shards with numcheck run --shard I/N")
        i, n = parse(prov["shard"])
        total = total or n
        if n != total:
            raise UsageError(f"{p}: shard {i}/{n}, but {paths[0]} is of a run in {total} shards")
        if i in by_shard:
            raise UsageError(f"{p} and {by_shard[i][0]} are both shard {i}/{n}")
        first = next(iter(by_shard.values()), None)
        for k in ("collection", "case_set", "golden_mode", "numcheck", "torch", "device_class"):
            if first and prov.get(k) != first[2].get(k):
                raise UsageError(f"{p}: {k} {prov.get(k)!r}, but {first[0]} has "
                                 f"{first[2].get(k)!r}: not shards of one run")
        by_shard[i] = (p, records, prov)
    missing = sorted(set(range(1, total + 1)) - set(by_shard))
    if missing:
        raise UsageError(f"shard(s) {', '.join(f'{i}/{total}' for i in missing)} missing: merge "
                         f"needs every shard's results file")
    seen: dict[tuple, int] = {}
    merged = []
    for i, (p, records, _) in sorted(by_shard.items()):
        for r in records:
            key = tuple(getattr(r, k) for k in KEY)
            if key in seen:
                raise UsageError(f"{p}: case {'/'.join(map(str, key[1:5]))} is in shard "
                                 f"{seen[key]} too: the shards overlap (different selections?)")
            seen[key] = i
            merged.append(r)
    merged.sort(key=lambda r: tuple(str(getattr(r, k)) for k in KEY))
    prov = {k: v for k, v in by_shard[1][2].items() if k != "shard"}
    prov["merged_shards"] = str(total)
    return merged, prov


def summary(records: list[Record], mode: str) -> tuple[list[str], bool]:
    """Lines that say what a merged run found, and whether it fails."""
    status = Counter(str(r.status) for r in records)
    golden = Counter(str(r.golden) for r in records if r.golden)
    bad = [r for r in records if failing(r, mode)]
    idle = idle_ops(records)
    lines = [f"{len(records)} records: " + ", ".join(f"{n} {s}" for s, n in sorted(status.items()))]
    if golden:
        lines.append("golden: " + ", ".join(f"{n} {g}" for g, n in sorted(golden.items())))
    lines += [f"  FAILED {r.label}: {r.reason or r.golden_reason}" for r in bad[:20]]
    if len(bad) > 20:
        lines.append(f"  ... and {len(bad) - 20} more failing records")
    lines += [f"  FAILED: op {op} executed no case (every case skipped) - DESIGN rule 11"
              for op in idle]
    return lines, bool(bad or idle)
