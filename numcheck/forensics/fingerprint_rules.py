"""The fingerprint family's rules (numcheck.forensics.kernel_fingerprint): no absolute verdict (a fingerprint is a
fact about a kernel, not an error), a golden rule (any changed property fails the run, e.g.
``acc_bits 23 -> 13``, ``batch_invariant True -> False``; on another platform than the
golden's it is drift, since fingerprints belong to the machine they were measured on), and the
report's fingerprint table per device. Reads golden and results rows only: no torch."""
from __future__ import annotations

import json

from numcheck.records import Record
from numcheck.verdicts.family import Family, Section

# The properties a golden row holds, in the order the table shows them (forensics.PROPERTIES;
# repeated here so that reading goldens does not import torch).
PROPERTIES = ("acc_bits", "promote_every", "acc_rounding", "order", "deterministic",
              "batch_invariant")


def _props(row: dict) -> dict:
    m = row.get("metrics")
    m = json.loads(m) if isinstance(m, str) else (m or {})
    return {p: m.get(p) for p in PROPERTIES}


def _show(v) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


class FingerprintRules(Family):
    name = family = "fingerprint"
    platform_bound = True  # regression.compare_row: a change on another platform is drift
    metrics_in_summary = True

    def holds(self, row: dict) -> bool:
        return row.get("output") == "fingerprint"

    def absolute(self, record: Record, policy=None) -> list[str]:
        return []

    def measured(self, record: Record) -> bool:
        return super().measured(record) or bool(record.metrics)

    def merges(self, old: dict, new: dict) -> bool:
        # another platform's fingerprint replaces the row (it is no envelope)
        return old.get("metrics") == new.get("metrics")

    def no_histogram_reason(self, record: Record) -> str | None:
        return "a fingerprint record holds a kernel's properties, not element errors"

    def html_section(self, records: list[Record], mode: str) -> Section | None:
        from numcheck.report.htmlkit import e, show, table
        fps = [r for r in records if r.family == self.name and r.metrics]
        if not fps:
            return None
        body = []
        for dev in sorted({r.device_class for r in fps}):
            rows = [[e(r.op), e(r.kernel), e(r.dtype)] + [show(r.metric(p)) for p in PROPERTIES]
                    for r in sorted((r for r in fps if r.device_class == dev),
                                    key=lambda r: (r.op, r.kernel, r.dtype))]
            body.append(f"<h3>{e(dev)}</h3>" + table(["op", "kernel", "dtype", *PROPERTIES], rows))
        return "fingerprints", "Kernel fingerprints", "".join(body)

    def golden(self, old: dict, new: dict, foreign: bool = False):
        o, n = _props(old), _props(new)
        label = f"{new.get('op')}/{new.get('kernel')} {new.get('dtype') or new.get('case_id')}"
        return [f"{label}: {p} {_show(o[p])} -> {_show(n[p])}" for p in PROPERTIES
                if o[p] != n[p]], [], []

    def section(self, records: list[Record], plot_path=None) -> str:
        fps = [r for r in records if r.metrics]
        if not fps:
            return ""
        head = ("device", "op", "kernel", "dtype") + PROPERTIES
        lines = ["### Kernel fingerprints (numcheck.forensics.kernel_fingerprint)", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in sorted(fps, key=lambda r: (r.device_class, r.op, r.kernel, r.dtype)):
            props = [_show(r.metric(p)) for p in PROPERTIES]
            lines.append("| " + " | ".join([r.device_class, r.op, r.kernel, r.dtype] + props)
                         + " |")
        return "\n".join(lines + [""])


FINGERPRINT_RULES = FingerprintRules()
