"""The one verdict path: every record, whatever produced it, is judged here.

The record's family (numcheck.verdicts.families: ``ops`` — built-in and users' ops —,
``quant``, ``convergence``, ``fingerprint``, ``telemetry``) says which absolute rules apply.
Thresholds live with the rules, each with its reason: the ops' policies in
``numcheck.verdicts.policy`` and the op files, the quantization floors in
``numcheck.quant.quant_rules``, the convergence gate in ``numcheck.convergence.gate``.

``judge(record)`` sets the record's status: failed when a rule fails, known when it fails where
the kernel declares a documented weakness, passed otherwise; skipped and errored records keep
their status. Whether a judged record fails a run is ``numcheck.records.failing``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from numcheck.records import Record, Status
from numcheck.verdicts import families
from numcheck.verdicts.findings import cite

if TYPE_CHECKING:
    from numcheck.verdicts.policy import Policy


def judge(record: Record, policy: Policy | None = None) -> Record:
    """Apply the record's family rules (``policy``: the op's, for op records) and set its
    status and reason."""
    if record.status in (Status.SKIPPED, Status.ERROR):
        return record
    messages = families.of(record).absolute(record, policy)
    record.reason = " | ".join(messages) if messages else record.reason
    if not messages:
        record.status, record.known = Status.PASSED, ""  # a weakness that did not show
    elif record.known:
        record.status = Status.KNOWN
        record.reason = f"known weakness {cite(record.known)}: {record.reason}"
    else:
        record.status = Status.FAILED
    return record


