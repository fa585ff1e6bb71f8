"""``Family``: what a family of records implements, whole, in its own package.

A family is a kind of measured result with rules of its own: ``ops`` (built-in and users' ops,
numcheck.verdicts.policy), ``quant`` (numcheck.quant), ``convergence``, ``fingerprint``
(numcheck.forensics), ``telemetry``. Everything that differs between families is a method
here, so that the verdict path, the golden store and session, and the reports ask the record's
family and never branch on its name. Families are registered in one place,
numcheck.verdicts.families. The defaults below are the answers of a family whose records hold
error statistics (``ErrorStats``) and nothing else, as the ops do.

A family module must import neither torch nor pandas at import time: the readers of goldens
and results (``numcheck compare``, ``show``, ``report``) load the families their rows hold.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from numcheck.records import Record

# (anchor id, title, html body) of one section of the HTML report
Section = tuple[str, str, str]


class Family:
    name: str = ""
    # Golden values belong to the platform they were measured on (fingerprints): a change on
    # another platform of the device class is drift, never a regression.
    platform_bound: bool = False
    # The golden row's ``metrics`` are what it holds (fingerprint properties, telemetry floors):
    # the sorted text summary beside each golden file shows them.
    metrics_in_summary: bool = False
    # (old row, new row, foreign) -> (worse, better, drift) messages of the family's own golden
    # rules, beyond the common statistics rules of numcheck.goldens.regression; ``foreign``: the
    # new row comes from a platform outside the golden's envelope, where a family may allow a
    # cross-platform slack (drift, not a regression). None: the common rules are all of them
    # (then a comparison of whole tables needs no row of the family as a dict).
    golden: Callable[[dict, dict, bool], tuple[list[str], list[str], list[str]]] | None = None

    def holds(self, row: dict) -> bool:
        """Is a golden or results row without a ``family`` column one of this family's? (asked
        in registration order; the ops family is the rest)"""
        return False

    def absolute(self, record: Record, policy=None) -> list[str]:
        """Failure messages of the family's absolute rules for this record (empty: passed)."""
        return []

    def measured(self, record: Record) -> bool:
        """Does the record hold something a golden row can keep?"""
        return record.kernel_stats is not None or record.series is not None

    def merges(self, old: dict, new: dict) -> bool:
        """May a refresh on another platform merge ``new`` into ``old``'s envelope (the worse
        of both) instead of replacing it? (asked when the inputs are the same)"""
        return True

    def merge_envelope(self, old: dict, new: dict, merged: dict) -> dict:
        """The family's own columns of an envelope merge; ``merged`` has the common ones."""
        return merged

    def unbakeable(self, row: dict, old: dict | None) -> str | None:
        """Why ``row`` must never be baked into a golden ("" = it may be); None: the common
        rule (numcheck.goldens.session: a NaN/inf the reference does not have)."""
        return None

    def section(self, records: list[Record], plot_path=None) -> str:
        """The family's section of the markdown report ("" when it has nothing to show)."""
        return ""

    def html_section(self, records: list[Record], mode: str) -> Section | None:
        """The family's section of the HTML report (None when it has nothing to show)."""
        return None

    def no_histogram_reason(self, record: Record) -> str | None:
        """Why the HTML report draws no ULP histogram for the record (None: the common one)."""
        return None
