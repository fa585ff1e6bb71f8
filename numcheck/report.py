"""Human-readable views of records: the verify table, the compare table, the markdown report."""
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
            f"{r['reason']}" + (f" [golden {r['golden']}: {r.get('golden_reason', '')}]"
                                if r.get("golden") not in (None, "same") else ""))
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


# --- goldens and results ------------------------------------------------------------------------

_ORDER = {"regressed": 0, "missing": 1, "inputs_changed": 2, "removed": 3, "new": 4,
          "improved": 5, "same": 6}


def change_table(changes: list, *, show_same: bool = False) -> str:
    """``numcheck compare``: one line per changed row, regressions first."""
    rows = sorted((c for c in changes if show_same or c.kind != "same"),
                  key=lambda c: (_ORDER.get(c.kind, 9), tuple(map(str, c.key))))
    counts = {}
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


def markdown_report(rows: list[dict], provenance: dict, *, worst_per_op: int = 3,
                    plot_path=None) -> str:
    """The PR-comment report of a results file: summary, failures and regressions with their
    repro commands, and the worst cases per op (kernel error over baseline error)."""
    from collections import Counter

    status = Counter(r.get("status") for r in rows)
    gold = Counter(r.get("golden") for r in rows if r.get("golden"))
    out = ["## numcheck report", "",
           f"{len(rows)} records on `{provenance.get('device_class', '?')}` "
           f"({provenance.get('device_name', '?')}, {provenance.get('cpu_isa', '')}), "
           f"numcheck {provenance.get('numcheck', '?')}, torch {provenance.get('torch', '?')}, "
           f"{provenance.get('date', '')}", "",
           "| passed | failed | kernel errors | known | skipped | golden regressed | improved | "
           "new | missing | inputs changed |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
           f"| {status['passed']} | {status['failed']} | {status['error']} | {status['known']} | "
           f"{status['skipped']} | {gold['regressed']} | {gold['improved']} | {gold['new']} | "
           f"{gold['missing']} | {gold['inputs_changed']} |", ""]
    bad = [r for r in rows if r.get("status") in ("failed", "error")
           or r.get("golden") in ("regressed", "missing", "inputs_changed")]
    if bad:
        out += ["### Failures and regressions", ""]
        for r in sorted(bad, key=lambda r: (r.get("golden") != "regressed", r.get("op"),
                                            r.get("kernel"), r.get("case_id"))):
            why = r.get("reason") if r.get("status") in ("failed", "error") else ""
            if r.get("golden") not in (None, "same", "new", "improved"):
                why = (why + "; " if why else "") + f"golden {r['golden']}: {r.get('golden_reason')}"
            out.append(f"- **{r['op']}/{r['kernel']}** `{r['case_id']}` {r.get('output')}: {why}")
            if r.get("repro"):
                out.append(f"  - repro: `{r['repro']}`")
        out.append("")
    else:
        out += ["No failures and no golden regressions.", ""]
    out += ["### Worst cases per op", "",
            "kernel error over the same-precision baseline's (rel_l2 ratio; 1 = as good as the "
            "naive baseline, the absolute gate is 2x + floor)", "",
            "| op | kernel | case | output | SQNR dB | baseline dB | worst block dB | ratio |",
            "|---|---|---|---|---:|---:|---:|---:|"]
    by_op: dict[str, list] = {}
    for r in rows:
        k, b = r.get("kernel_rel_l2"), r.get("baseline_rel_l2")
        if r.get("series") is not None or k is None or b is None or not b or \
                not math.isfinite(k) or not math.isfinite(b):
            continue
        by_op.setdefault(r["op"], []).append((k / b, r))
    for op in sorted(by_op):
        for ratio, r in sorted(by_op[op], key=lambda t: -t[0])[:worst_per_op]:
            out.append(f"| {op} | {r['kernel']} | `{r['case_id']}` | {r.get('output')} | "
                       f"{_cell(r.get('kernel_sqnr_db'))} | {_cell(r.get('baseline_sqnr_db'))} | "
                       f"{_cell(r.get('kernel_min_block_sqnr_db'))} | {ratio:.2f} |")
    extra = extra_sections(rows, plot_path)
    if extra:
        out += ["", extra]
    return "\n".join(out) + "\n"


# --- quantization and convergence sections ------------------------------------------------------

def _metrics(r: dict) -> dict:
    m = r.get("metrics") or {}
    if isinstance(m, str):
        import json
        m = json.loads(m)
    return m


def convergence_table(rows: list[dict]) -> str:
    """Markdown: per model and recipe, the mean window loss gap (after warm-up) to bf16 and to
    fp32, the largest saturated fraction and gradient bias, and the verdict."""
    conv = [r for r in rows if r.get("suite") == "convergence" and r.get("series") is not None]
    if not conv:
        return ""

    def pct(v):
        return "-" if v is None or not math.isfinite(v) else f"{100 * v:+.2f}%"

    out = ["| model | recipe | gap to bf16 | gap to fp32 | max saturated | grad bias | status |",
           "|---|---|---:|---:|---:|---:|---|"]
    for r in sorted(conv, key=lambda r: (r["op"], r["kernel"])):
        m = _metrics(r)
        out.append(f"| {r['op']} | {r['kernel']} | {pct(m.get('gap_bf16_mean'))} | "
                   f"{pct(m.get('gap_fp32_mean'))} | {pct(m.get('sat_max'))} | "
                   f"{pct(m.get('grad_bias_mean'))} | {r.get('status')} |")
    return "\n".join(out)


def convergence_plot(rows: list[dict], path) -> list[str]:
    """One PNG per model: each recipe's seed-mean loss minus the fp32 reference's, per step,
    with its band across seeds shaded; returns the paths written."""
    conv = [r for r in rows if r.get("suite") == "convergence" and r.get("series")]
    if not conv:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pathlib import Path

    written = []
    for model in sorted({r["op"] for r in conv}):
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for r in sorted((r for r in conv if r["op"] == model), key=lambda r: r["kernel"]):
            s = [float(v) for v in r["series"]]
            b = [float(v) for v in (r.get("series_band") or [0.0] * len(s))]
            steps = range(len(s))
            line, = ax.plot(steps, s, lw=1.2, label=r["kernel"])
            ax.fill_between(steps, [a - c for a, c in zip(s, b)], [a + c for a, c in zip(s, b)],
                            color=line.get_color(), alpha=0.15)
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set(xlabel="step", ylabel="loss - fp32 loss (seed mean, band: seed spread)",
               title=f"convergence: {model}")
        ax.legend(fontsize=7, ncol=2)
        p = Path(path).with_name(f"{Path(path).stem}-{model}.png")
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(p)
        plt.close(fig)
        written.append(str(p))
    return written


def extra_sections(rows: list[dict], plot_path=None) -> str:
    """The quantization SQNR tables and the convergence table (and plots) of a results file."""
    from .quant.suite import sqnr_table

    parts = []
    q = sqnr_table(rows)
    if q:
        parts += ["### Quantization", "", q, ""]
    c = convergence_table(rows)
    if c:
        parts += ["### Convergence (loss gap per recipe)", "", c, ""]
        if plot_path is not None:
            for p in convergence_plot(rows, plot_path):
                from pathlib import Path
                parts.append(f"![{Path(p).stem}]({Path(p).name})")
            parts.append("")
    return "\n".join(parts)
