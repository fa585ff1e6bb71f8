"""The telemetry family as numcheck.verdicts.family.Family: its rules (telemetry_rules), its
markdown section (below) and its HTML section (telemetry_html). Torch-free."""
from __future__ import annotations

from numcheck.records import Record
from numcheck.telemetry.telemetry_html import floors_section
from numcheck.telemetry.telemetry_rules import (BY_KEY, FAMILY, OUTPUT, absolute, case_parts,
                                               compare, is_nan, merge_metrics, show_value,
                                               unbakeable)
from numcheck.verdicts.family import Family, Section


class TelemetryRules(Family):
    name = family = FAMILY
    metrics_in_summary = True

    def holds(self, row: dict) -> bool:
        return row.get("output") == OUTPUT

    def absolute(self, record: Record, policy=None) -> list[str]:
        return absolute(record)

    def golden(self, old: dict, new: dict, foreign: bool = False):
        return compare(old, new, foreign)

    def measured(self, record: Record) -> bool:
        return super().measured(record) or bool(record.metrics)

    def merge_envelope(self, old: dict, new: dict, merged: dict) -> dict:
        merged["metrics"] = merge_metrics(old, new)  # floors and ceilings: the lower, the higher
        return merged

    def unbakeable(self, row: dict, old: dict | None) -> str | None:
        return unbakeable(row, old)

    def html_section(self, records: list[Record], mode: str) -> Section | None:
        return floors_section(records, mode)

    def no_histogram_reason(self, record: Record) -> str | None:
        return "a telemetry record holds per-layer statistics, not element errors"

    def section(self, records: list[Record], plot_path=None) -> str:
        """Per (model, recipe): layers gated, failing ones, the lowest SQNR floors and the
        highest ceilings, each with its layer."""
        recs = [r for r in records if r.metrics]
        if not recs:
            return ""
        groups: dict[tuple, list[Record]] = {}
        for r in recs:
            groups.setdefault((r.suite, *case_parts(r.case_id)[:2]), []).append(r)
        head = ("suite", "model", "recipe", "records", "failing", "SQNR floor",
                "worst-block floor", "underflow max", "saturation max", "shadow floor")
        lines = ["### Telemetry floors (numcheck.telemetry)", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (suite, model, recipe), rs in sorted(groups.items()):
            bad = sum(r.status in ("failed", "error") or r.golden in ("regressed", "missing")
                      for r in rs)
            cells = [suite, model, recipe, str(len(rs)), str(bad)]
            for key in ("sqnr_db_floor", "worst_block_sqnr_db_floor", "underflow_pct_ceiling",
                        "saturation_pct_ceiling", "shadow_sqnr_db_floor"):
                s = BY_KEY[key]
                vals = [(float(r.metric(key)), r) for r in rs
                        if isinstance(r.metric(key), (int, float)) and not is_nan(r.metric(key))]
                if not vals:
                    cells.append("-")
                    continue
                v, r = (min if s.kind == "floor" else max)(vals, key=lambda p: p[0])
                at = "" if v == 0 and s.kind == "ceiling" else f" ({case_parts(r.case_id)[2]})"
                cells.append(show_value(v, s.unit) + at)
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines + [""])


TELEMETRY_RULES = TelemetryRules()
