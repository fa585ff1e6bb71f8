"""Case grids and ids: the fixed, enumerated designs that golden-gated cases come from (DESIGN
rule 8): ``full_product`` (``full``), ``pairwise`` (``quick``: every pair of factor values
covered), each case named by a stable ``case_id``; the sizes that exercise tails and fast
paths. Pure index arithmetic (never iteration over a set of user values).
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping

import torch

from numcheck import formats
from numcheck.errors import UsageError

__all__ = ["ALIGNED_SIZES", "RAGGED_SIZES", "case_id", "full_product", "pairwise"]

# Sizes that exercise tails: 1, primes and one past / one short of the usual tile widths
# 16/32/128/1024.
RAGGED_SIZES = (1, 3, 7, 31, 33, 127, 129, 1025)
# Sizes the fast paths expect (multiples of 16 and the usual tiles).
ALIGNED_SIZES = (16, 32, 64, 128, 256, 1024)


def _check_factors(factors: Mapping) -> list[tuple[str, list]]:
    if not isinstance(factors, Mapping):
        raise UsageError(f"factors must be a dict of name -> list of values, got "
                         f"{type(factors).__name__}")
    out = []
    for name, values in factors.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise UsageError(f"factor {name!r}: values must be a list, got {values!r}")
        values = list(values)
        if not values:
            raise UsageError(f"factor {name!r} has no values: the grid would be empty")
        for i, v in enumerate(values):
            if any(type(w) is type(v) and w == v for w in values[:i]):
                raise UsageError(f"factor {name!r} lists {v!r} twice: case ids would repeat")
        out.append((name, values))
    return out


def full_product(factors: dict[str, list]) -> list[dict]:
    """Every combination, the first factor varying slowest (nested loops in dict order).

    Each row is a dict with the factors' keys in the given order; no factors give ``[{}]``.
    """
    items = _check_factors(factors)
    names = [n for n, _ in items]
    return [dict(zip(names, combo)) for combo in itertools.product(*(v for _, v in items))]


def pairwise(factors: dict[str, list]) -> list[dict]:
    """A pairwise-covering subset of the product: every two values of every two factors meet.

    Greedy and fully deterministic. Three constructions run on the value indices, factors taken
    largest first (ties in dict order): IPOG (Lei et al., 2007) with ties going to the first value,
    IPOG with ties going to the least-used value, and an AETG-style one-row-at-a-time greedy
    (Cohen et al., 1997) without its random candidates. Each gets its free slots filled with the
    least-used value and its redundant rows (every pair also covered elsewhere) dropped; the
    shortest wins (ties: that order). None is best everywhere, and each costs milliseconds.
    Nothing depends on hashes of the values or on set order, so the same input gives the same
    list in every process and Python version.

    Rows are dicts with the keys in the given order. One factor gives all its values, two the
    full product, no factors ``[{}]``.
    """
    items = _check_factors(factors)
    if len(items) <= 2:
        return full_product(factors)
    sizes = [len(v) for _, v in items]
    order = sorted(range(len(items)), key=lambda i: (-sizes[i], i))  # construction order
    osizes = [sizes[i] for i in order]
    candidates = [_ipog(osizes, spread=False), _ipog(osizes, spread=True), _aetg(osizes)]
    rows = min((_prune(_fill(r, osizes), osizes) for r in candidates), key=len)
    out = []
    for row in rows:
        by_factor = {order[pos]: val for pos, val in enumerate(row)}
        out.append({name: values[by_factor[i]] for i, (name, values) in enumerate(items)})
    return out


def _ipog(sizes: list[int], spread: bool) -> list[list[int | None]]:
    """IPOG for strength 2 on factors of these sizes (in this order); None marks a free slot.

    Horizontal growth gives each row the value of the next factor that covers the most uncovered
    pairs (ties: the first value, or with ``spread`` the least used so far); vertical growth puts
    each pair still missing, in sorted order, into a row with a free slot or a new row.
    """
    n = len(sizes)
    rows: list[list[int | None]] = [[a, b] + [None] * (n - 2)
                                    for a in range(sizes[0]) for b in range(sizes[1])]
    for k in range(2, n):
        uncovered = {(j, a, c) for j in range(k) for a in range(sizes[j]) for c in range(sizes[k])}
        used = [0] * sizes[k]
        for row in rows:
            def score(c: int, row=row) -> tuple[int, int, int]:
                gain = sum((j, row[j], c) in uncovered for j in range(k) if row[j] is not None)
                return gain, -used[c] if spread else 0, -c
            best = max(range(sizes[k]), key=score)
            row[k] = best
            used[best] += 1
            uncovered.difference_update((j, row[j], best) for j in range(k) if row[j] is not None)
        for j, a, c in sorted(uncovered):
            for row in rows:
                if row[k] == c and row[j] is None:
                    row[j] = a
                    break
            else:
                new: list[int | None] = [None] * n
                new[j], new[k] = a, c
                rows.append(new)
    return rows


def _aetg(sizes: list[int]) -> list[list[int | None]]:
    """AETG-style greedy, deterministic: one row at a time until every pair is covered.

    A row starts from the value in the most uncovered pairs; the other factors follow (those with
    the most uncovered pairs first), each taking the value that covers the most uncovered pairs
    with the factors already set (ties: more uncovered pairs overall, less used, first).
    """
    n = len(sizes)
    uncovered = {(i, a, j, b) for i in range(n) for j in range(i + 1, n)
                 for a in range(sizes[i]) for b in range(sizes[j])}
    pending = [[0] * s for s in sizes]  # uncovered pairs each (factor, value) is part of
    for i, a, j, b in uncovered:
        pending[i][a] += 1
        pending[j][b] += 1
    used = [[0] * s for s in sizes]
    rows: list[list[int | None]] = []

    def pair(f: int, c: int, h: int, d: int) -> tuple[int, int, int, int]:
        return (f, c, h, d) if f < h else (h, d, f, c)

    while uncovered:
        f0, v0 = max(((f, c) for f in range(n) for c in range(sizes[f])),
                     key=lambda p: (pending[p[0]][p[1]], -p[0], -p[1]))
        row: list[int | None] = [None] * n
        row[f0] = v0
        for f in sorted((f for f in range(n) if f != f0), key=lambda f: (-max(pending[f]), f)):
            def score(c: int, f=f, row=row) -> tuple[int, int, int, int]:
                gain = sum(pair(f, c, h, row[h]) in uncovered for h in range(n)
                           if row[h] is not None)
                return gain, pending[f][c], -used[f][c], -c
            row[f] = max(range(sizes[f]), key=score)
        for i in range(n):
            used[i][row[i]] += 1
            for j in range(i + 1, n):
                p = (i, row[i], j, row[j])
                if p in uncovered:
                    uncovered.discard(p)
                    pending[i][row[i]] -= 1
                    pending[j][row[j]] -= 1
        rows.append(row)
    return rows


def _fill(rows: list[list[int | None]], sizes: list[int]) -> list[list[int]]:
    """Fill free slots with the value of that factor used least so far (ties: the first)."""
    counts = [[0] * s for s in sizes]
    for row in rows:
        for p, v in enumerate(row):
            if v is not None:
                counts[p][v] += 1
    out = []
    for row in rows:
        full = []
        for p, v in enumerate(row):
            if v is None:
                v = min(range(sizes[p]), key=lambda c, p=p: (counts[p][c], c))
                counts[p][v] += 1
            full.append(v)
        out.append(full)
    return out


def _prune(rows: list[list[int]], sizes: list[int]) -> list[list[int]]:
    """Drop rows, last first, whose every pair is also covered by another remaining row."""
    n = len(sizes)
    times: dict[tuple[int, int, int, int], int] = {}
    for row in rows:
        for i in range(n):
            for j in range(i + 1, n):
                p = (i, row[i], j, row[j])
                times[p] = times.get(p, 0) + 1
    keep = [True] * len(rows)
    for r in range(len(rows) - 1, -1, -1):
        row = rows[r]
        pairs = [(i, row[i], j, row[j]) for i in range(n) for j in range(i + 1, n)]
        if all(times[p] >= 2 for p in pairs):
            keep[r] = False
            for p in pairs:
                times[p] -= 1
    return [row for row, k in zip(rows, keep) if k]


_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.x=]")


def _render(value) -> str:
    """One part of a case id (before sanitizing)."""
    if isinstance(value, torch.dtype):
        try:
            return formats.get(value).name
        except UsageError:
            return str(value).removeprefix("torch.")
    if isinstance(value, formats.Format):
        return value.name
    if isinstance(value, (tuple, list, torch.Size)):
        if not value:
            return "scalar"
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return "x".join(str(v) for v in value)
        return "_".join(_render(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def case_id(**parts) -> str:
    """A readable, stable case id (pytest id and parquet key): rendered parts joined by '-'.

    In the given order: ``seed`` as ``s<seed>``; a bool as its key name when True and nothing when
    False; None and empty strings omitted; tuples of ints as ``4x127x64`` (``()`` as ``scalar``),
    other tuples joined by '_'; torch dtypes by numcheck format name (``bf16``); floats by their
    shortest repr; anything else by ``str``. Characters outside ``[A-Za-z0-9_.x=]`` become '_'.
    ``case_id(dtype="bf16", shape=(4,127,64), dist="normal", seed=0, causal=True)`` is
    ``"bf16-4x127x64-normal-s0-causal"``.
    """
    out = []
    for key, value in parts.items():
        if value is None or value is False:
            continue
        if value is True:
            text = key
        elif key == "seed":
            text = f"s{_render(value)}"
        else:
            text = _render(value)
        if text:
            out.append(_ID_UNSAFE.sub("_", text))
    return "-".join(out)
