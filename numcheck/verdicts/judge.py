"""The one verdict path: every record, whatever produced it, is judged here.

Each family (``ops`` — built-in and users' ops —, ``quant``, ``convergence``, ``fingerprint``,
``telemetry``)
contributes one
``Rules`` object: its absolute rules (messages for a record; empty = passed), its extra golden
rules (beyond the common statistics rules of ``numcheck.goldens.regression``) and its section of the
markdown report. Thresholds live with the rules, each with its reason: the ops' policies in
``numcheck.verdicts.policy`` and the op files, the quantization floors in ``numcheck.quant.quant_rules``, the
convergence gate in ``numcheck.convergence.gate``.

``judge(record)`` sets the record's status: failed when a rule fails, known when it fails where
the kernel declares a documented weakness, passed otherwise; skipped and errored records keep
their status. Whether a judged record fails a run is ``numcheck.records.failing``.
"""
from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Callable, Protocol

from numcheck.verdicts.findings import cite
from numcheck.records import Record, Status

if TYPE_CHECKING:
    from numcheck.verdicts.policy import Policy


class Rules(Protocol):
    family: str
    # (old, new) -> (worse, better) messages of the family's own golden rules for a golden row;
    # None where the common statistics rules (numcheck.goldens.regression) are all of them (then a
    # comparison of whole tables needs no row of the family as a dict)
    golden: Callable[[dict, dict], tuple[list[str], list[str]]] | None

    def absolute(self, record: Record, policy: Policy | None = None) -> list[str]:
        """Failure messages of the family's absolute rules for this record."""

    def section(self, records: list[Record], plot_path=None) -> str:
        """This family's markdown section of the report ("" when it has nothing to show)."""


# Each family's Rules, imported on first use: a reader of goldens or results (numcheck compare,
# report) loads the families its rows hold and no other (the quant and convergence rules import
# torch). Constant module names: the import-graph test sees these edges.
RULES: dict[str, Callable[[], Rules]] = {
    "ops": lambda: importlib.import_module("numcheck.verdicts.policy").OP_RULES,
    "quant": lambda: importlib.import_module("numcheck.quant.quant_rules").QUANT_RULES,
    "convergence": lambda: importlib.import_module("numcheck.convergence.convergence_rules").CONVERGENCE_RULES,
    "fingerprint": lambda: importlib.import_module("numcheck.forensics.fingerprint_rules").FINGERPRINT_RULES,
    "telemetry": lambda: importlib.import_module("numcheck.telemetry.telemetry_rules").TELEMETRY_RULES,
}


@functools.cache  # asked once per record or golden row
def rules(family: str) -> Rules:
    """The family's Rules (the ops' for a family without rules of its own: users' ops)."""
    return RULES.get(family, RULES["ops"])()


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
        record.reason = f"known weakness {cite(record.known)}: {record.reason}"
    else:
        record.status = Status.FAILED
    return record


def sections(records: list[Record], plot_path=None) -> str:
    """The sections of the families that have records, in RULES order."""
    by_family = {f: [r for r in records if r.family == f] for f in RULES}
    parts = [rules(f).section(rs, plot_path) for f, rs in by_family.items() if rs]
    return "\n".join(p for p in parts if p)
