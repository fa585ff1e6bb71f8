"""The convergence family's rules: its absolute verdict (the gate, ``numcheck.convergence.gate``,
applied where the per-seed curves live: ``converge`` stores its messages on each record as
``findings``), its golden rule (a curve that leaves its golden band) and its report section
(the loss-gap table and the curves)."""
from __future__ import annotations

import math

from numcheck.records import Record
from numcheck.verdicts.family import Family, Section
from numcheck.convergence.gate import window_regression
from numcheck.convergence.plot import plot_series


class ConvergenceRules(Family):
    name = family = "convergence"

    def holds(self, row: dict) -> bool:
        return row.get("series") is not None

    def merges(self, old: dict, new: dict) -> bool:
        return False  # a curve is always replaced: its band is the golden rule's own envelope

    def html_section(self, records: list[Record], mode: str) -> Section | None:
        from numcheck.convergence.convergence_html import curves_section
        return curves_section(records)

    def no_histogram_reason(self, record: Record) -> str | None:
        if record.series is None:
            return None
        return "a convergence record holds a loss curve, not element errors"

    def absolute(self, record: Record, policy=None) -> list[str]:
        return list(record.findings)

    def golden(self, old: dict, new: dict, foreign: bool = False):
        """A smoothed window of the paired loss difference above the golden band regresses; one
        below it is reported as improved (lower loss than recorded)."""
        if new.get("series") is None or old.get("series") is None:
            return [], [], []
        band = old.get("series_band") or []
        worse = window_regression(new["series"], old["series"], band, sides="upper")
        better = [m.replace("above", "below").replace("by +", "by -") for m in window_regression(
            [-v for v in new["series"]], [-v for v in old["series"]], band, sides="upper")
            if "non-finite" not in m and "length" not in m]
        return worse, better, []

    def section(self, records: list[Record], plot_path=None) -> str:
        conv = [r for r in records if r.series is not None]
        if not conv:
            return ""
        parts = ["### Convergence (loss gap per recipe)", "", table(conv, markdown=True), ""]
        if plot_path is not None:
            from pathlib import Path
            parts += [f"![{Path(p).stem}]({Path(p).name})" for p in plot_series(conv, plot_path)]
            parts.append("")
        return "\n".join(parts)


CONVERGENCE_RULES = ConvergenceRules()


def _pct(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{100 * v:+.2f}%"


def table(records: list[Record], *, markdown: bool = False) -> str:
    """Per model and recipe: the mean window loss gap (after warm-up) to bf16 and to fp32, the
    final loss, the largest saturated fraction and gradient bias, and the verdict."""
    cols = ("gap to bf16", "gap to fp32", "final", "max saturated", "grad bias")
    rows = []
    for r in sorted(records, key=lambda r: (r.op, r.kernel)) if markdown else records:
        fin = r.metric("final_loss")
        status = str(r.status) + (f": {r.reason[:120]}" if r.reason and not markdown else "")
        rows.append((r.op, r.kernel, _pct(r.metric("gap_bf16_mean")),
                     _pct(r.metric("gap_fp32_mean")), "-" if fin is None else f"{fin:.4f}",
                     _pct(r.metric("sat_max")), _pct(r.metric("grad_bias_mean")), status))
    if markdown:
        out = ["| model | recipe | " + " | ".join(cols) + " | status |",
               "|---|---|" + "---:|" * len(cols) + "---|"]
        return "\n".join(out + ["| " + " | ".join(row) + " |" for row in rows])
    out = [f"{'recipe':24} " + " ".join(f"{c:>13}" for c in cols) + "  status"]
    return "\n".join(out + [f"{row[1]:24} " + " ".join(f"{c:>13}" for c in row[2:7]) +
                            f"  {row[7]}" for row in rows])
