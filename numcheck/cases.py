"""Case grids: the fixed, enumerated cases that golden-gated runs use (DESIGN rule 8).

``quick`` is a pairwise-covering design over an op's factors with one seed (every pair of factor
values meets in some case); ``full`` covers wider factor lists pairwise over three seeds. Case ids
are stable.
"""
from __future__ import annotations

from typing import Any, Callable

from .errors import UsageError
from .ops import Case

CASE_SETS = ("quick", "full")
FULL_SEEDS = (0, 1, 2)  # three seeds separate a real regression from one unlucky draw


def make_grid(op: str, factors: dict[str, list], *, extra_full: dict[str, list] | None = None,
              keep: Callable[[dict[str, Any]], bool] | None = None,
              repair: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
              probes: list[dict[str, Any]] = ()) -> Callable[[str], list[Case]]:
    """A grid function for an op. ``factors`` must hold dtype, shape and dist; any other key is
    an op param (causal, layout, ...). ``extra_full`` adds values used by ``full`` only;
    ``keep`` drops combinations that make no sense (e.g. causal with a mask); ``repair`` turns
    a row into one that does (e.g. an fp16 GEMM too big for this CPU into bf16); ``probes`` are
    fixed rows added to both sets (e.g. the GEMM accumulation probes)."""
    missing = {"dtype", "shape", "dist"} - set(factors)
    if missing:
        raise UsageError(f"make_grid({op!r}): factors lack {sorted(missing)}")

    def grid(cases: str) -> list[Case]:
        from .inputs import pairwise
        if cases not in CASE_SETS:
            raise UsageError(f"cases={cases!r}: use one of {', '.join(CASE_SETS)}")
        if cases == "quick":
            rows, seeds = pairwise(factors), (0,)
        else:
            merged = {k: list(v) + [x for x in (extra_full or {}).get(k, []) if x not in v]
                      for k, v in factors.items()}
            # Pairwise again over the wider factor lists, times three seeds: the full product of
            # an op's factors runs to thousands of cases, beyond a nightly budget on 2 cores.
            rows, seeds = pairwise(merged), FULL_SEEDS
        out, seen = [], set()
        for row in [repair(r) if repair else r for r in rows] + list(probes):
            if keep is not None and not keep(row):
                continue
            params = tuple((k, row[k]) for k in factors if k not in ("dtype", "shape", "dist"))
            for seed in seeds:
                c = Case(op, row["dtype"], tuple(row["shape"]), row["dist"], seed, params)
                if c.id not in seen:
                    seen.add(c.id)
                    out.append(c)
        return out
    grid.factors = {k: list(v) + [x for x in (extra_full or {}).get(k, []) if x not in v]
                    for k, v in factors.items()}  # what the hypothesis search samples from
    grid.keep = keep
    grid.repair = repair
    return grid


def default_grid(op: str) -> Callable[[str], list[Case]]:
    """For user ops without a grid of their own: last-dim-ragged shapes, bf16 and fp32."""
    return make_grid(op, {"dtype": ["bf16", "fp32"], "shape": [(4, 128), (3, 129)],
                          "dist": ["normal", "outlier_channels"]},
                     extra_full={"dist": ["student_t", "zero_blocks", "large_mean"]})
