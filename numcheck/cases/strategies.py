"""Hypothesis beside the grid (DESIGN rule 8): the ``quick`` / ``full`` profiles (the case-set
names) and the strategies of shapes, distributions and seeds that the search draws cases from.
"""
from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from numcheck.cases.design import ALIGNED_SIZES, RAGGED_SIZES
from numcheck.cases.inputs import DISTRIBUTIONS, check_dist
from numcheck.errors import UsageError

__all__ = ["distributions", "register_profiles", "seeds", "shapes"]

# "quick" examples per test: enough to hit each distribution about twice in CI minutes.
_QUICK_EXAMPLES = 20
# "full" examples per test: the nightly search budget.
_FULL_EXAMPLES = 200


def register_profiles() -> None:
    """Register the hypothesis profiles ``quick`` and ``full`` (the case-set names). Idempotent.

    * ``quick`` (CI): derandomized, so a CI run is reproducible and its failures repeat locally;
      20 examples; no shrink phase (each example runs a kernel, and the shrinker can run hundreds
      of them; the failing example is printed as drawn); no example database (nothing to reuse
      with fixed examples, nothing written in CI).
    * ``full`` (nightly): 200 random examples with shrinking and the default database.

    Both: no deadline and no too_slow health check (a kernel plus an FP64 reference on a 1025-wide
    input is slow by nature, and its time varies with the machine).
    """
    # parent="default": otherwise a profile inherits whatever profile is loaded at the time
    # (the plugin loads "quick" first, and "full" would inherit quick's missing shrink phase).
    base = settings.get_profile("default")
    settings.register_profile(
        "quick", parent=base, derandomize=True, max_examples=_QUICK_EXAMPLES, deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate, Phase.target),
        suppress_health_check=(HealthCheck.too_slow,))
    settings.register_profile(
        "full", parent=base, derandomize=False, max_examples=_FULL_EXAMPLES, deadline=None,
        suppress_health_check=(HealthCheck.too_slow,))


# Small sides mixed in: every size up to here, so tails of 2, 4, 5, ... get drawn too.
_SMALL_SIDE_MAX = 17


def shapes(rank: int, *, min_side: int = 1, max_side: int = 130,
           ragged: bool = True) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes of ``rank`` with sides in [min_side, max_side].

    Each side comes from small integers (up to 17), RAGGED_SIZES (tails around tile widths) or
    ALIGNED_SIZES. ``ragged=False`` keeps to multiples of 16 (for kernels that require aligned
    shapes). Small sides come first, so shrinking heads toward small shapes.
    """
    if not isinstance(rank, int) or rank < 0:
        raise UsageError(f"shapes: rank={rank!r} must be an int >= 0")
    if min_side < 0 or max_side < min_side:
        raise UsageError(f"shapes: need 0 <= min_side <= max_side, got {min_side}, {max_side}")
    if ragged:
        small = st.integers(min_side, min(max_side, _SMALL_SIDE_MAX)) \
            if min_side <= _SMALL_SIDE_MAX else None
        named = [s for s in (*RAGGED_SIZES, *ALIGNED_SIZES) if min_side <= s <= max_side]
    else:
        lo, hi = -(-max(min_side, 1) // 16), max_side // 16
        small = st.integers(lo, hi).map(lambda k: 16 * k) if lo <= hi else None
        named = [s for s in ALIGNED_SIZES if min_side <= s <= max_side]
    parts = ([small] if small is not None else []) + ([st.sampled_from(sorted(set(named)))]
                                                      if named else [])
    if not parts:
        raise UsageError(f"shapes: no {'size' if ragged else 'multiple of 16'} lies in "
                         f"[{min_side}, {max_side}]")
    side = st.one_of(*parts)
    return st.tuples(*([side] * rank))


def distributions(exclude=()) -> st.SearchStrategy[str]:
    """One of DISTRIBUTIONS, minus ``exclude`` (e.g. ``("subnormal",)`` for an e8m0 input)."""
    if isinstance(exclude, str):
        exclude = (exclude,)
    for d in exclude:
        check_dist(d)
    left = [d for d in DISTRIBUTIONS if d not in exclude]
    if not left:
        raise UsageError("distributions: exclude removes every distribution")
    return st.sampled_from(left)


def seeds() -> st.SearchStrategy[int]:
    """Case seeds: 0 .. 2^31-1 (fits every RNG and reads well in a repro line)."""
    return st.integers(0, 2**31 - 1)
