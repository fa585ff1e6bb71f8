"""Human-readable views of records: the table ``numcheck verify`` prints (markdown later)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .run import Verification


def _db(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "inf" if x == math.inf else f"{x:.1f}"


def verification_table(v: "Verification") -> str:
    """One line per case and output: status, kernel and baseline SQNR, max ULP, the reason."""
    head = f"{'case':46} {'output':9} {'status':7} {'SQNR dB':>8} {'base dB':>8} {'blk dB':>7} " \
           f"{'maxULP':>7}  reason"
    lines = [f"{v.op} / {v.kernel} on {v.device} ({v.cases}): {v.executed} case(s) run", head]
    for r in v.records:
        lines.append(
            f"{r['case_id'][:46]:46} {r['output'][:9]:9} {r['status']:7} "
            f"{_db(r.get('kernel_sqnr_db')):>8} {_db(r.get('baseline_sqnr_db')):>8} "
            f"{_db(r.get('kernel_min_block_sqnr_db')):>7} {r.get('kernel_max_ulp', '-')!s:>7}  "
            f"{r['reason']}")
    n_fail = len(v.failures)
    skipped = sum(r["status"] == "skipped" for r in v.records)
    verdict = "PASSED" if v.passed else "FAILED"
    if v.executed == 0:
        verdict += " (nothing executed: every case skipped)"
    lines.append(f"{verdict}: {len(v.records) - n_fail - skipped} passed, {n_fail} failed, "
                 f"{skipped} skipped")
    for r in v.failures:
        lines.append(f"  FAIL {r['case_id']} {r['output']}: {r['reason']}")
        if r.get("worst_elements"):
            lines.append(f"    worst elements: {r['worst_elements']}")
        if r.get("kernel_worst_block", -1) >= 0:
            lines.append(f"    worst block #{r['kernel_worst_block']} of "
                         f"{r.get('kernel_n_blocks')} ({r.get('kernel_min_block_sqnr_db', 0):.1f} dB)")
        if r.get("numerics"):
            lines.append(f"    numerics: {r['numerics']}")
        if r.get("saved_inputs"):
            lines.append(f"    inputs saved: {r['saved_inputs']}")
        lines.append(f"    repro: {r['repro']}")
    return "\n".join(lines)
