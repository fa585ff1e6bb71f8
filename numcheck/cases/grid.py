"""Cases and case grids: what one run of an op is, and the fixed, enumerated sets of them that
golden-gated runs use (DESIGN rule 8).

``quick`` is a pairwise-covering design over an op's factors with one seed (every pair of factor
values meets in some case); ``full`` covers wider factor lists pairwise over three seeds. Case ids
are stable. The case-set names live here, once (``CASE_SETS``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from numcheck.errors import UsageError

CASE_SETS = ("quick", "full")
FULL_SEEDS = (0, 1, 2)  # three seeds separate a real regression from one unlucky draw


def check_case_set(cases: str, what: str = "cases") -> str:
    if cases not in CASE_SETS:
        raise UsageError(f"{what}={cases!r}: use one of {', '.join(CASE_SETS)}")
    return cases


@dataclass(frozen=True)
class Case:
    """One enumerated case of an op: the golden key's case part, with a readable stable id."""

    op: str
    dtype: str  # the compute dtype of the case (a numcheck format name: bf16, fp16, fp32, ...)
    shape: tuple[int, ...]  # the op's own shape convention (see its OpSpec.doc)
    dist: str
    seed: int
    params: tuple[tuple[str, Any], ...] = ()  # op variants: causal, gqa groups, layout, ...

    @property
    def id(self) -> str:
        # inputs imports torch and hypothesis: imported where used, so that this module (the
        # case-set names: the CLI's choices) loads without them
        from numcheck.cases.design import case_id

        return case_id(dtype=self.dtype, shape=self.shape, dist=self.dist, seed=self.seed,
                       **dict(self.params))

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)


Row = dict[str, Any]


@dataclass(frozen=True)
class Grid:
    """An op's case grid: ``grid("quick" | "full") -> [Case]``.

    ``factors`` must hold dtype, shape and dist; any other key is an op param (causal, layout,
    ...). ``extra_full`` adds values used by ``full`` only; ``keep`` drops combinations that make
    no sense (e.g. causal with a mask); ``repair`` turns a row into one that does (e.g. an fp16
    GEMM too big for this CPU into bf16); ``probes`` are fixed rows added to both sets (e.g. the
    GEMM accumulation probes), ``full_probes`` fixed rows of ``full`` only, after them (each
    over the set's seeds); ``transform`` rewrites each case (e.g. one ``attn`` factor into
    the causal and mask params). The hypothesis search samples from ``all_factors``."""

    op: str
    factors: dict[str, list]
    extra_full: dict[str, list] | None = None
    keep: Callable[[Row], bool] | None = None
    repair: Callable[[Row], Row] | None = None
    probes: tuple[Row, ...] = ()
    transform: Callable[[Case], Case] | None = None
    full_probes: tuple[Row, ...] = ()

    def __post_init__(self) -> None:
        missing = {"dtype", "shape", "dist"} - set(self.factors)
        if missing:
            raise UsageError(f"grid of {self.op!r}: factors lack {sorted(missing)}")

    @property
    def all_factors(self) -> dict[str, list]:
        """Every value either set knows, per factor."""
        extra = self.extra_full or {}
        return {k: list(v) + [x for x in extra.get(k, []) if x not in v]
                for k, v in self.factors.items()}

    def case(self, row: Row, seed: int) -> Case:
        params = tuple((k, row[k]) for k in self.factors if k not in ("dtype", "shape", "dist"))
        c = Case(self.op, row["dtype"], tuple(row["shape"]), row["dist"], seed, params)
        return self.transform(c) if self.transform else c

    def __call__(self, cases: str) -> list[Case]:
        from numcheck.cases.design import pairwise  # see Case.id

        check_case_set(cases)
        if cases == "quick":
            rows, seeds = pairwise(self.factors), (0,)
        else:
            # Pairwise again over the wider factor lists, times three seeds: the full product of
            # an op's factors runs to thousands of cases, beyond a nightly budget on 2 cores.
            rows, seeds = pairwise(self.all_factors), FULL_SEEDS
        out, seen = [], set()
        fixed = list(self.probes) + (list(self.full_probes) if cases == "full" else [])
        for row in [self.repair(r) if self.repair else r for r in rows] + fixed:
            if self.keep is not None and not self.keep(row):
                continue
            for seed in seeds:
                c = self.case(row, seed)
                if c.id not in seen:
                    seen.add(c.id)
                    out.append(c)
        return out


def make_grid(op: str, factors: dict[str, list], *, extra_full: dict[str, list] | None = None,
              keep: Callable[[Row], bool] | None = None,
              repair: Callable[[Row], Row] | None = None, probes: list[Row] = (),
              transform: Callable[[Case], Case] | None = None,
              full_probes: list[Row] = ()) -> Grid:
    """The Grid of an op (see ``Grid``)."""
    return Grid(op, factors, extra_full, keep, repair, tuple(probes), transform,
                tuple(full_probes))


def default_grid(op: str) -> Grid:
    """For user ops without a grid of their own: every float dtype, an aligned and a ragged
    last dim, contiguous and transposed layouts (issue 31: the first default had neither fp16
    nor layouts)."""
    return make_grid(op, {"dtype": ["bf16", "fp32", "fp16"], "shape": [(4, 128), (3, 129)],
                          "dist": ["normal", "outlier_channels"],
                          "layout": ["contiguous", "transposed"]},
                     extra_full={"dist": ["student_t", "zero_blocks", "large_mean"],
                                 "shape": [(2, 7, 1025)]})
