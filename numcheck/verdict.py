"""The one verdict path: every record, whatever produced it, is judged here.

Each family (``ops`` — built-in and users' ops —, ``quant``, ``convergence``) contributes one
``Rules`` object: its absolute rules (messages for a record; empty = passed), its extra golden
rules (beyond the common statistics rules of ``numcheck.regression``) and its section of the
markdown report. Thresholds live with the rules, each with its reason: the ops' policies in
``numcheck.policy`` and the op files, the quantization floors in ``numcheck.quant.rules``, the
convergence gate in ``numcheck.convergence.gate``.

``judge(record)`` sets the record's status: failed when a rule fails, known when it fails where
the kernel declares a documented weakness, passed otherwise; skipped and errored records keep
their status. Whether a judged record fails a run is ``numcheck.records.failing``.
"""
from __future__ import annotations

from typing import Protocol

from .convergence.rules import CONVERGENCE_RULES
from .policy import OP_RULES, Policy
from .quant.rules import QUANT_RULES
from .records import Record, Status


class Rules(Protocol):
    family: str

    def absolute(self, record: Record, policy: Policy | None = None) -> list[str]:
        """Failure messages of the family's absolute rules for this record."""

    def golden(self, old: dict, new: dict) -> tuple[list[str], list[str]]:
        """(worse, better) messages of the family's own golden rules for a golden row."""

    def section(self, records: list[Record], plot_path=None) -> str:
        """This family's markdown section of the report ("" when it has nothing to show)."""


RULES: dict[str, Rules] = {r.family: r for r in (OP_RULES, QUANT_RULES, CONVERGENCE_RULES)}


def rules(family: str) -> Rules:
    return RULES.get(family, OP_RULES)


def judge(record: Record, policy: Policy | None = None) -> Record:
    """Apply the record's family rules (``policy``: the op's, for op records) and set its
    status and reason."""
    if record.status in (Status.SKIPPED, Status.ERROR):
        return record
    messages = rules(record.family).absolute(record, policy)
    record.reason = " | ".join(messages) if messages else record.reason
    if not messages:
        record.status, record.known = Status.PASSED, ""  # a weakness that did not show
    elif record.known:
        record.status = Status.KNOWN
        record.reason = f"known weakness ({record.known}): {record.reason}"
    else:
        record.status = Status.FAILED
    return record


def sections(records: list[Record], plot_path=None) -> str:
    """The families' report sections, in RULES order."""
    parts = [rules(f).section([r for r in records if r.family == f], plot_path) for f in RULES]
    return "\n".join(p for p in parts if p)
