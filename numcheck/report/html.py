"""The HTML report of a results file: one self-contained page (inline CSS and SVG; no script, no
font, no image or anything else fetched), readable offline and attachable to a CI run.

Sections: summary (counts by status and golden verdict, provenance, case sets), failures (every
record that fails the run in the results file's golden mode, with its reasons, repro command and
error histogram; past FULL_FAILURES one table row each), worst cases per op, quantization SQNR
heatmaps (worst case per path x distribution), convergence curves, kernel
fingerprints and telemetry: the families' own sections (``Family.html_section``, in each family's
package). A section without data is left out; failures says "none". Torch-free, like every
reader of results files. docs/report.md shows what each section holds.
"""
from __future__ import annotations

import math
from collections import Counter

from numcheck.records import Golden, Record, Status, failing
from numcheck.report.htmlkit import Section
from numcheck.report.htmlkit import badge as _badge
from numcheck.report.htmlkit import e as _e
from numcheck.report.htmlkit import num as _num
from numcheck.report.htmlkit import page as _page
from numcheck.report.htmlkit import table as _table
from numcheck.report.markdown import worst_cases
from numcheck.verdicts import families

__all__ = ["html_report"]

WORST_PER_OP = 3
# Failing records shown in full; past these, one table row each: a first strict run on a new
# device class fails every record as "missing", thousands of them.
FULL_FAILURES = 200
REASON_CHARS = 200  # a reason in that table is cut here


# --- summary ------------------------------------------------------------------------------------

def _summary(records: list[Record], prov: dict, mode: str) -> Section:
    status = Counter(r.status for r in records)
    gold = Counter(r.golden for r in records)
    n_failing = sum(failing(r, mode) for r in records)
    shown = [s for s in Status if s != Status.PENDING or status[s]]
    verdicts = [g for g in Golden if gold[g]]
    head = (f"<p>{len(records)} records on <b>{_e(prov.get('device_class', '?'))}</b> "
            f"({_e(prov.get('device_name', '?'))}), numcheck {_e(prov.get('numcheck', '?'))}, "
            f"torch {_e(prov.get('torch', '?'))}, {_e(prov.get('date', ''))}; golden mode "
            f"<code>{_e(mode)}</code>: <b>{n_failing}</b> failing the run.</p>")
    counts = _table([_badge(s) for s in shown], [[_count(status[s]) for s in shown]])
    golden = _table([_badge(g) for g in verdicts] + ["not compared"],
                    [[_count(gold[g]) for g in verdicts] + [_count(gold[None])]])
    sets = Counter((r.suite, r.case_set or "-") for r in records)
    case_sets = _table(["suite", "case set", "records"],
                       [[_e(s), _e(c), _count(n)] for (s, c), n in sorted(sets.items())])
    provenance = _table(["provenance", "value"],
                        [[_e(k), _e(v)] for k, v in sorted(prov.items())])
    return ("summary", "Summary",
            f"{head}<h3>Status</h3>{counts}<h3>Golden verdicts</h3>{golden}"
            f"<h3>Case sets</h3>{case_sets}<h3>Provenance</h3>{provenance}")


def _count(n: int) -> str:
    return f'<td class="num">{n}</td>'


# --- failures -----------------------------------------------------------------------------------

def _failures(records: list[Record], mode: str) -> Section:
    bad = sorted((r for r in records if failing(r, mode)),
                 key=lambda r: (r.golden != Golden.REGRESSED, r.op, r.kernel, r.case_id, r.output))
    if not bad:
        return "failures", "Failures", \
            '<p class="note">None: no failures and no golden regressions.</p>'
    full, rest = bad[:FULL_FAILURES], bad[FULL_FAILURES:]
    body = "\n".join(map(_failure, full))
    if rest:
        rows = [[_label(r), _badge(r.status), _badge(r.golden) if r.golden else "",
                 _e(_clip(" | ".join(filter(None, (r.reason, r.golden_reason)))))]
                for r in rest]
        body = (f"<p>{len(bad)} failing records: the first {len(full)} in full, the other "
                f"{len(rest)} one row each below.</p>{body}<h3>The other {len(rest)}</h3>"
                + _table(["record", "status", "golden", "reason"], rows))
    return "failures", f"Failures ({len(bad)})", body


def _label(r: Record) -> str:
    return f"{_e(r.op)}/{_e(r.kernel)} <code>{_e(r.case_id)}</code> {_e(r.output)}"


def _clip(text: str, n: int = REASON_CHARS) -> str:
    return text if len(text) <= n else text[:n - 1] + "\u2026"  # an ellipsis


def _failure(r: Record) -> str:
    k, b = r.kernel_stats, r.baseline_stats
    items = [("reason", r.reason)]
    if r.golden not in (None, Golden.SAME):
        items.append(("golden", f"{r.golden}: {r.golden_reason}" if r.golden_reason
                      else str(r.golden)))
    if k is not None:
        items.append(("error", f"SQNR {_num(k.sqnr_db)} dB (baseline "
                               f"{_num(b.sqnr_db if b else None)} dB), worst block "
                               f"{_num(k.min_block_sqnr_db)} dB, max {_num(k.max_ulp, '.0f')} "
                               f"ULP, p99 {_num(k.p99_ulp, '.0f')} ULP of {k.fmt}"))
    items += [("worst elements", r.worst_elements), ("numerics", r.numerics),
              ("inputs saved", r.saved_inputs)]
    dl = "".join(f"<dt>{name}</dt><dd>{_e(v)}</dd>" for name, v in items if v)
    repro = (f'<pre class="repro"><code>{_e(r.repro)}</code></pre>' if r.repro
             else '<p class="note">No repro command recorded.</p>')
    tb = (f"<details><summary>traceback</summary><pre>{_e(r.traceback)}</pre></details>"
          if r.traceback else "")
    return (f'<article class="failure"><h3>{_label(r)} {_badge(r.status)}</h3><dl>{dl}</dl>'
            f"{repro}{_histogram(r)}{tb}</article>")


def _histogram(r: Record) -> str:
    k = r.kernel_stats
    if r.ulp_hist is None or k is None:
        return f'<p class="note">No error histogram: {_no_histogram_reason(r)}.</p>'
    mismatch = k.nonfinite_mismatch if isinstance(k.nonfinite_mismatch, int) else 0
    return (f'<figure class="hist">{_histogram_svg(r.ulp_hist, mismatch)}<figcaption>'
            f"Elements per |error| in ULPs of {_e(k.fmt)} (bar heights log-scaled): "
            f"{_num(k.n_compared, '.0f')} compared, {_num(mismatch, '.0f')} non-finite "
            f"mismatches.</figcaption></figure>")


def _no_histogram_reason(r: Record) -> str:
    if r.status == Status.ERROR:
        return "the kernel gave no output to measure"
    own = families.of(r).no_histogram_reason(r)
    if own is not None:
        return own
    if r.status == Status.PASSED:  # failing on its golden alone
        rerun = "rerun its repro" if r.repro else "rerun the case"
        return (f"the case passed its rules and fails on its golden ({_e(r.golden)}); "
                f"{rerun} to see the errors (histograms are recorded where a rule fails)")
    return "none recorded (a results file from an older numcheck, or a producer that records none)"


def _bucket(k: int) -> tuple[str, str]:
    """A histogram bucket's short label and its ULP range."""
    if k == 0:
        return "0", "0 ULP (exact)"
    lo = 1 << (k - 1)
    short = str(lo) if k <= 10 else f"2^{k - 1}"
    return short, f"{lo} to {2 * lo - 1} ULP"


def _compact(n: int) -> str:
    for unit, size in (("G", 10 ** 9), ("M", 10 ** 6), ("k", 10 ** 3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _histogram_svg(hist: list[int], mismatch: int) -> str:
    bars = [(*_bucket(k), c, "#4a7fb5") for k, c in enumerate(hist)]
    if mismatch:
        bars.append(("NaN/inf", "non-finite mismatch", mismatch, "#c62828"))
    step, height, top, bottom = 30, 90, 14, 30
    width = 40 + step * len(bars)
    scale = math.log1p(max(c for *_, c, _ in bars) or 1)
    parts = [f'<svg class="hist" width="{width}" height="{top + height + bottom}" '
             f'viewBox="0 0 {width} {top + height + bottom}" role="img">',
             f'<line x1="30" y1="{top + height}" x2="{width - 5}" y2="{top + height}" '
             f'stroke="#888"/>']
    for i, (short, span, c, colour) in enumerate(bars):
        h = height * math.log1p(c) / scale
        x = 34 + step * i
        parts.append(f'<rect x="{x}" y="{top + height - h:.1f}" width="{step - 6}" '
                     f'height="{h:.1f}" fill="{colour}" data-count="{c}">'
                     f"<title>{span}: {c} elements</title></rect>")
        if c:
            parts.append(f'<text x="{x + (step - 6) / 2}" y="{top + height - h - 3:.1f}" '
                         f'text-anchor="middle">{_compact(c)}</text>')
        parts.append(f'<text x="{x + (step - 6) / 2}" y="{top + height + 12}" '
                     f'text-anchor="middle">{short}</text>')
    parts.append(f'<text x="30" y="{top + height + 26}">ULP (bucket from)</text></svg>')
    return "".join(parts)


# --- worst cases per op -------------------------------------------------------------------------

def _worst(records: list[Record]) -> Section | None:
    """As the markdown report ranks them: kernel error over the baseline's (rel_l2 ratio)."""
    # worst_cases takes a kernel rel_l2 for a number: one not measured (None) has no ratio
    worst = worst_cases([r for r in records if r.kernel_stats is None or
                         r.kernel_stats.rel_l2 is not None], WORST_PER_OP)
    if not worst:
        return None
    rows = []
    for op, cases in worst.items():
        for ratio, r in cases:
            k, b = r.kernel_stats, r.baseline_stats
            rows.append([_e(op), _e(r.kernel), f"<code>{_e(r.case_id)}</code>", _e(r.output),
                         _badge(r.status), *(f'<td class="num">{v}</td>' for v in (
                             _num(k.sqnr_db), _num(b.sqnr_db), _num(k.min_block_sqnr_db),
                             _num(k.max_ulp, ".0f"), f"{ratio:.2f}"))])
    note = ("<p>The worst cases of each op: kernel error over the same-precision baseline's "
            "(rel_l2 ratio; 1 = as good as the naive baseline, the absolute gate is 2x + "
            "floor).</p>")
    return "worst", "Worst cases per op", note + _table(
        ["op", "kernel", "case", "output", "status", "SQNR dB", "baseline dB",
         "worst block dB", "max ULP", "ratio"], rows)

# --- the page -----------------------------------------------------------------------------------

def html_report(records: list[Record], provenance: dict, *, title: str | None = None) -> str:
    """One complete, self-contained HTML document reporting ``records`` (a results file's,
    ``numcheck.goldens.store.read_results``). Failing means ``failing`` in the results file's golden
    mode (provenance ``golden_mode``; strict when unknown, as the markdown report)."""
    mode = provenance.get("golden_mode", "strict")
    title = title or f"numcheck report: {provenance.get('device_class', '?')} " \
                     f"{provenance.get('date', '')}".rstrip()
    # each family draws its own section from all the records (telemetry's takes the telemetry
    # suite's records of any family: an errored test's among them), in registration order
    own = [families.get(name).html_section(records, mode) for name in families.FAMILIES]
    sections = [s for s in (_summary(records, provenance, mode), _failures(records, mode),
                            _worst(records), *own) if s]
    return _page(title, sections)
