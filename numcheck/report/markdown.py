"""Human-readable views of records: the verify table, the compare table, the markdown report."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from numcheck.records import Golden, Record, Status, failing
from numcheck.verdicts.families import sections

if TYPE_CHECKING:
    from numcheck.verification import Verification


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
        k, b = r.kernel_stats, r.baseline_stats
        lines.append(
            f"{r.case_id[:46]:46} {r.output[:9]:9} {r.status.value:7} "
            f"{_db(k and k.sqnr_db):>8} {_db(b and b.sqnr_db):>8} "
            f"{_db(k and k.min_block_sqnr_db):>7} {k.max_ulp if k else '-'!s:>7}  "
            f"{r.reason}" + (f" [golden {r.golden}: {r.golden_reason}]"
                             if r.golden not in (None, Golden.SAME) else ""))
    failures = v.failures
    skipped = sum(r.status == Status.SKIPPED for r in v.records)
    verdict = "PASSED" if v.passed else "FAILED"
    if v.executed == 0:
        verdict += " (nothing executed: every case skipped)"
    lines.append(f"{verdict}: {len(v.records) - len(failures) - skipped} passed, "
                 f"{len(failures)} failed, {skipped} skipped")
    for r in failures:
        lines.append(f"  FAIL {r.case_id} {r.output}: {r.reason}")
        if r.worst_elements:
            lines.append(f"    worst elements: {r.worst_elements}")
        k = r.kernel_stats
        if k is not None and k.worst_block >= 0:
            lines.append(f"    worst block #{k.worst_block} of {k.n_blocks} "
                         f"({k.min_block_sqnr_db:.1f} dB)")
        if r.numerics:
            lines.append(f"    numerics: {r.numerics}")
        if r.saved_inputs:
            lines.append(f"    inputs saved: {r.saved_inputs}")
        lines.append(f"    repro: {r.repro}")
    return "\n".join(lines)


# --- goldens and results ------------------------------------------------------------------------

_ORDER = {"regressed": 0, "missing": 1, "inputs_changed": 2, "removed": 3, "new": 4,
          "drift": 5, "merged": 6, "improved": 7, "same": 8}


def change_table(changes: list, *, show_same: bool = False, unchanged: int = 0) -> str:
    """``numcheck compare``: one line per changed row, regressions first (``unchanged``: rows
    left out of ``changes`` because they are the same, counted with them)."""
    rows = sorted((c for c in changes if show_same or c.kind != "same"),
                  key=lambda c: (_ORDER.get(c.kind, 9), tuple(map(str, c.key))))
    counts = {"same": unchanged} if unchanged else {}
    for c in changes:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    lines = [", ".join(f"{counts[k]} {k}" for k in sorted(counts, key=lambda k: _ORDER.get(k, 9)))
             or "no rows"]
    for c in rows:
        lines.append(f"{c.kind:>14}  {'/'.join(map(str, c.key[1:5]))} [{c.key[5]}]")
        lines.append(f"{'':16}{c.metrics_line()}")
        for m in c.messages:
            lines.append(f"{'':16}{m}")
    return "\n".join(lines)


def _cell(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return "inf" if x == math.inf else f"{x:.3g}"
    return str(x).replace("|", "\\|")


def worst_cases(records: list[Record], per_op: int) -> dict[str, list[tuple[float, Record]]]:
    """Per op (sorted), its ``per_op`` records with the largest kernel error over the
    baseline's (rel_l2 ratio), worst first: the reports' "worst cases per op"."""
    by_op: dict[str, list] = {}
    for r in records:
        k, b = r.kernel_stats, r.baseline_stats
        if k is None or b is None or k.rel_l2 is None or not b.rel_l2 or \
                not math.isfinite(k.rel_l2) or not math.isfinite(b.rel_l2):
            continue
        by_op.setdefault(r.op, []).append((k.rel_l2 / b.rel_l2, r))
    return {op: sorted(by_op[op], key=lambda t: -t[0])[:per_op] for op in sorted(by_op)}


def markdown_report(records: list[Record], provenance: dict, *, worst_per_op: int = 3,
                    plot_path=None) -> str:
    """The PR-comment report of a results file: summary, failures and regressions with their
    repro commands, the worst cases per op (kernel error over baseline error) and each
    family's section (numcheck.verdicts.judge). Failing means ``failing`` in the run's golden mode
    (provenance ``golden_mode``; strict when unknown)."""
    from collections import Counter

    mode = provenance.get("golden_mode", "strict")
    status = Counter(r.status for r in records)
    gold = Counter(r.golden for r in records if r.golden)
    out = ["## numcheck report", "",
           f"{len(records)} records on `{provenance.get('device_class', '?')}` "
           f"({provenance.get('device_name', '?')}, {provenance.get('cpu_isa', '')}), "
           f"numcheck {provenance.get('numcheck', '?')}, torch {provenance.get('torch', '?')}, "
           f"{provenance.get('date', '')}", "",
           "| passed | failed | kernel errors | known | skipped | golden regressed | "
           "drift (other platform) | improved | new | missing | inputs changed |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
           f"| {status['passed']} | {status['failed']} | {status['error']} | {status['known']} | "
           f"{status['skipped']} | {gold['regressed']} | {gold['drift']} | {gold['improved']} | "
           f"{gold['new']} | {gold['missing']} | {gold['inputs_changed']} |", ""]
    bad = [r for r in records if failing(r, mode)]
    if bad:
        out += ["### Failures and regressions", ""]
        for r in sorted(bad, key=lambda r: (r.golden != Golden.REGRESSED, r.op, r.kernel,
                                            r.case_id)):
            why = r.reason if r.status in (Status.FAILED, Status.ERROR) else ""
            if r.golden not in (None, Golden.SAME, Golden.NEW, Golden.IMPROVED):
                why = (why + "; " if why else "") + f"golden {r.golden}: {r.golden_reason}"
            out.append(f"- **{r.op}/{r.kernel}** `{r.case_id}` {r.output}: {why}")
            if r.repro:
                out.append(f"  - repro: `{r.repro}`")
        out.append("")
    else:
        out += ["No failures and no golden regressions.", ""]
    out += ["### Worst cases per op", "",
            "kernel error over the same-precision baseline's (rel_l2 ratio; 1 = as good as the "
            "naive baseline, the absolute gate is 2x + floor)", "",
            "| op | kernel | case | output | SQNR dB | baseline dB | worst block dB | ratio |",
            "|---|---|---|---|---:|---:|---:|---:|"]
    for op, worst in worst_cases(records, worst_per_op).items():
        for ratio, r in worst:
            k, b = r.kernel_stats, r.baseline_stats
            out.append(f"| {op} | {r.kernel} | `{r.case_id}` | {r.output} | "
                       f"{_cell(k.sqnr_db)} | {_cell(b.sqnr_db)} | "
                       f"{_cell(k.min_block_sqnr_db)} | {ratio:.2f} |")
    extra = sections(records, plot_path)
    if extra:
        out += ["", extra]
    return "\n".join(out) + "\n"
