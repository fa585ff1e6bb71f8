"""Summation-order hypotheses of numcheck.forensics.kernel_fingerprint: each candidate order
(sequential, pairwise, blocked:k, split:s, strided:w, K tiles in interleaved lanes, promoted FP8
accumulation, permutations within K blocks, fixed trees) as a function that sums probe rows the way a kernel would, rounding each partial sum
to the accumulator's bits (``round_bits``); ``predict`` gives what a hypothesis makes of the
probes, which the prober compares with the kernel's outputs."""
from __future__ import annotations

from typing import Callable

import torch

from numcheck import formats

SIZES = (128, 256, 512)  # three lengths: blocked:k keeps k across them, split:s keeps s

def round_bits(s: torch.Tensor, e: torch.Tensor, p: int, mode: str) -> torch.Tensor:
    """The exact value s + e (s = fl64(s + e), |e| <= ulp64(s) / 2: a TwoSum pair) rounded to
    p fraction bits in ``mode`` ("rne", "rna", "rz", "rd", "ru"); no range limits."""
    m, ex = torch.frexp(s)
    x = torch.ldexp(m, torch.full_like(ex, p + 1))  # s's significand scaled to an integer grid
    lo, hi = torch.floor(x), torch.ceil(x)
    on_grid = lo == hi
    if mode in ("rne", "rna"):
        r = torch.round(x) if mode == "rne" else torch.trunc(x + torch.sign(x) * 0.5)
        tie = (x - lo) == 0.5
        r = torch.where(tie & (e > 0), hi, torch.where(tie & (e < 0), lo, r))
    elif mode == "rz":
        r = torch.where(on_grid, x - torch.sign(x) * ((e != 0) & (torch.sign(e) != torch.sign(x))),
                        torch.trunc(x))
    elif mode == "rd":
        r = torch.where(on_grid, x - (e < 0).double(), lo)
    else:  # ru
        r = torch.where(on_grid, x + (e > 0).double(), hi)
    out = torch.ldexp(r, ex - (p + 1))
    # one step toward zero from a power of two lands on the finer grid of the binade below
    below = on_grid & (x.abs() == 2.0 ** p) & (r.abs() < x.abs())
    out = torch.where(below, torch.ldexp(torch.sign(x) * (2.0 ** (p + 1) - 1), ex - (p + 2)),
                      out)
    return torch.where(s == 0, s, out)


class _Acc:
    """A column of partial sums; + rounds the exact sum to the accumulator's bits and mode."""

    __slots__ = ("t", "p", "mode")

    def __init__(self, t: torch.Tensor, p: int, mode: str) -> None:
        self.t, self.p, self.mode = t, p, mode

    def __add__(self, other: "_Acc") -> "_Acc":
        a, b = self.t, other.t
        s = a + b
        bb = s - a
        e = (a - (s - bb)) + (b - bb)  # TwoSum: s + e == a + b exactly
        return _Acc(round_bits(s, e, self.p, self.mode), self.p, self.mode)


def _sequential(xs):
    acc = xs[0]
    for x in xs[1:]:
        acc = acc + x
    return acc


def _pairwise(xs):
    if len(xs) == 1:
        return xs[0]
    h = len(xs) // 2
    return _pairwise(xs[:h]) + _pairwise(xs[h:])


def _blocked(k: int):
    return lambda xs: _sequential([_sequential(xs[i:i + k]) for i in range(0, len(xs), k)])


def _split(s: int):
    return lambda xs: _blocked(-(-len(xs) // s))(xs)


def _strided(w: int, combine):
    return lambda xs: combine([_sequential(xs[lane::w]) for lane in range(min(w, len(xs)))])


def _tiled(k: int, w: int, carry: bool):
    def tree(xs):
        acc = None
        for i in range(0, len(xs), k):
            lanes = [xs[i + lane:i + k:w] for lane in range(min(w, len(xs) - i))]
            if carry and acc is not None:
                lanes[0] = [acc, *lanes[0]]
            tile = _sequential([_sequential(lane) for lane in lanes])
            acc = tile if carry or acc is None else acc + tile
        return acc
    return tree


def promoted(k: int, bits: int, mode: str):
    """Blocks of k summed in order in a narrower accumulator (bits, mode), their sums added in
    order in the leaves' own (wider) one."""
    def tree(xs):
        parts = [_sequential([_Acc(x.t, bits, mode) for x in xs[i:i + k]])
                 for i in range(0, len(xs), k)]
        return _sequential([_Acc(q.t, xs[0].p, xs[0].mode) for q in parts])
    return tree


def _permuted(perm: list[int]):
    return lambda xs: _sequential([xs[i] for i in perm])


def fixed(tree):
    return lambda n: tree


def hypotheses() -> list[tuple[str, Callable]]:
    """Candidate orders, simplest first (the first that predicts every probe is reported):
    (name, n -> tree over n leaves)."""
    out: list[tuple[str, Callable]] = [("sequential", fixed(_sequential)),
                                       ("pairwise", fixed(_pairwise))]
    out += [(f"blocked:{k}", fixed(_blocked(k))) for k in (2, 4, 8, 16, 32, 64, 128, 256)]
    out += [(f"split:{s}", fixed(_split(s))) for s in (2, 4, 8, 16, 32, 64)]
    out += [(f"strided:{w}", fixed(_strided(w, _sequential))) for w in (2, 4, 8, 16, 32, 64)]
    out += [(f"strided:{w}", fixed(_strided(w, _pairwise))) for w in (2, 4, 8, 16, 32, 64)]
    # a GEMM's K tiles each summed in interleaved lanes (SIMD dot products over pairs or
    # quads of K, matrix units' tiles), tile sums added in order, the running sum either
    # apart from the lanes or carried in lane 0: both are measured, the probes decide
    out += [(f"blocked:{k}/strided:{w}{carry}", fixed(_tiled(k, w, bool(carry))))
            for k in (16, 32, 64) for w in (2, 4) for carry in ("", "+carry")]
    return out


def derived(sizes: dict[int, list[int]]) -> list[tuple[str, Callable]]:
    """Candidates read off the (0, j) probes, whose outputs count the units outside the
    smallest subtree holding leaves 0 and j (its size: n - count): blocks of k leaves (k may
    depend on n: a GEMM's K blocking) summed in order, or each in one permutation of its
    leaves (a dot-product instruction that takes a pair's second element first), block sums
    added in order. In a first block of k the sizes of j = 1..k-1 are 2..k once each."""
    out: list[tuple[str, Callable]] = []
    ks, perms = {}, {}
    for n, sz in sizes.items():
        # the longest first block that fits, its next leaf outside it (the later blocks'
        # sizes are not read: a narrow output format counts their units inexactly); the
        # probes then test the whole tree
        k = next((k for k in range(n, 1, -1) if sorted(sz[:k - 1]) == list(range(2, k + 1))
                  and (k == n or sz[k - 1] > k)), None)
        if k is None:
            return out
        ks[n] = k
        perms[n] = [0] + [j for _, j in sorted(zip(sz[:k - 1], range(1, k)))]
    blocked = any(k < n for n, k in ks.items())
    permuted = any(perm != list(range(len(perm))) for perm in perms.values())
    if not (blocked or permuted):
        return out  # sequential, already a hypothesis
    name = ("blocked:" + ",".join(str(ks[n]) for n in SIZES) if blocked else "sequential") + \
        (":permuted" if permuted else "")
    out.append((name, lambda n: _blocked_permuted(ks[n], perms[n])))
    return out


def _blocked_permuted(k: int, perm: list[int]):
    # a shorter last block keeps the permutation's order of the leaves it has
    return lambda xs: _sequential([_sequential([xs[i + q] for q in perm if i + q < len(xs)])
                                   for i in range(0, len(xs), k)])


def unit_classes(n: int, out_fmt: str) -> int:
    """Interleaved classes of unit positions, one probe row each, so that every count of units
    is exact in the output format (bf16 holds integers up to 256)."""
    return -(-n // 2 ** (formats.get(out_fmt).mbits + 1))


def order_rows(n: int, sc, classes: int) -> tuple[list, torch.Tensor]:
    """(pair, unit class) per row and the rows: +B at i, -B at j, a unit at the class's other
    positions."""
    keys = [(pair, c) for pair in [(0, j) for j in range(1, n)] + [(n - 1, j)
                                                                    for j in range(n - 1)]
            for c in range(classes)]
    rows = torch.zeros((len(keys), n), dtype=torch.float64)
    for r, ((i, j), c) in enumerate(keys):
        rows[r, c::classes] = 2.0 ** sc.unit
        rows[r, i], rows[r, j] = 2.0 ** sc.big, -(2.0 ** sc.big)
    return keys, rows


def predict(tree: Callable, rows: torch.Tensor, p: int, mode: str, out_fmt: str) -> torch.Tensor:
    """The output each probe row gives under the tree, the accumulator (p bits, mode) and an
    RNE conversion to the output format."""
    total = tree([_Acc(rows[:, k], p, mode) for k in range(rows.shape[1])]).t
    return formats.round_to(total, out_fmt)
