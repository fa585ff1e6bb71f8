"""The page of a ``telemetry.diff`` (``numcheck diff A B --html PATH``; docs/telemetry.md,
"Where two runs part ways"): per (module, op, role) x step, how far each row's statistics
went beyond the band, and where the digests differ, with the first divergences listed.
Torch-free."""
from __future__ import annotations

import math

from numcheck.report.htmlkit import e as _e, num as _num, page as _page, table as _table
from numcheck.telemetry.divergence import Difference
from numcheck.telemetry.telemetry_html import shown_steps, step_heatmap

# Divergences drawn at most (in execution order): a picture of the first ones, not of a run
# that diverged everywhere after them
MAX_DRAWN = 200_000
# a count that differs or a row one run lacks: drawn as this many bands (the log scale's top)
STRUCTURE = 1e6
_EXCESS = ("excess", "statistics: the largest |B - A| / band of the row (counts that differ "
           f"and rows one run lacks: {STRUCTURE:g})", ".3g", "log")
_DIGEST = ("digest", "digests: 1 where the row's bits differ", ".0f", "down")


def diff_html(d: Difference, *, title: str = "numcheck diff", first: int = 20) -> str:
    """The page: the verdict, the first ``first`` divergences, and the two heatmaps."""
    excess: dict = {}
    bits: dict = {}
    order: dict = {}
    for x in d.divergences[:MAX_DRAWN]:
        key = (x.module, x.op, x.role)
        order.setdefault(key, len(order))
        if x.stat == "digest":
            bits.setdefault(key, {})[x.step] = 1.0
            continue
        v = x.excess if math.isfinite(x.excess) else STRUCTURE
        row = excess.setdefault(key, {})
        row[x.step] = max(row.get(x.step, 0.0), v)
    steps = sorted({s for row in (*excess.values(), *bits.values()) for s in row})
    shown = shown_steps(steps)
    named = [(m.where(), m.stat, tag) for m, tag in ((d.first, "the first (statistics)"),
                                                      (d.first_digest, "the first (digest)"))
             if m is not None]
    rows = []
    for x in d.divergences[:first]:
        tag = " ".join(t for w, s, t in named if (w, s) == (x.where(), x.stat))
        a, b = ((f"{int(x.a):012x}", f"{int(x.b):012x}") if x.stat == "digest"
                else (_num(x.a, ".6g"), _num(x.b, ".6g")))
        rows.append([_e(x.where()), _e(x.stat), a, b, _num(x.band, ".3g"),
                     _num(x.excess, ".3g"), _e(tag)])
    body = [f"<p>{_e(d.summary(first=0))}</p>"]
    if rows:
        body.append(_table(["where", "statistic", "A", "B", "band", "excess", ""], rows))
    if excess:
        body.append(step_heatmap(excess, order, shown, _EXCESS, ""))
    if bits:
        body.append(step_heatmap(bits, order, shown, _DIGEST, ""))
    if len(d) > MAX_DRAWN:
        body.append(f'<p class="note">The heatmaps draw the first {MAX_DRAWN} of '
                    f"{len(d)} divergences.</p>")
    return _page(title, [("diff", "Where the runs part ways", "\n".join(body))])
