"""The convergence family's section of the HTML report: per model, each recipe's paired loss
difference to the fp32 reference as inline SVG curves (docs/report.md)."""
from __future__ import annotations

import math

from numcheck.records import Record
from numcheck.report.htmlkit import (PALETTE, Section, badge as _badge, e as _e)


def curves_section(records: list[Record]) -> Section | None:
    curves = [r for r in records if r.family == "convergence"]
    if not curves:
        return None
    body = ["<p>Per model, each recipe's loss minus the fp32 reference's loss at every step "
            "(mean over the paired seeds; the shaded band is the seeds' spread). The results "
            "file holds these paired differences, not the absolute losses.</p>"]
    # one style per recipe across all models, so that a recipe reads the same in every chart
    styles = {k: (PALETTE[i % len(PALETTE)], i >= len(PALETTE))
              for i, k in enumerate(sorted({r.kernel for r in curves}))}
    for model in sorted({r.op for r in curves}):
        rs = sorted((r for r in curves if r.op == model), key=lambda r: r.kernel)
        body.append(f"<h3>{_e(model)}</h3>{_curves_svg(rs, styles)}")
        body.append('<ul class="legend">' + "".join(
            f'<li><span class="swatch" style="border-top:3px '
            f'{"dashed" if styles[r.kernel][1] else "solid"} {styles[r.kernel][0]}"></span>'
            f"{_e(r.kernel)} {_badge(r.status)}"
            f"{'' if r.series else ' <span class=note>(no curve)</span>'}</li>"
            for r in rs) + "</ul>")
    return "convergence", "Convergence curves", "".join(body)


def _finite_runs(points: list[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    """Runs of consecutive finite points: a NaN or inf step (a diverged run) breaks the line."""
    runs: list[list[tuple[int, float]]] = [[]]
    for p in points:
        if math.isfinite(p[1]):
            runs[-1].append(p)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _curves_svg(records: list[Record], styles: dict[str, tuple[str, bool]]) -> str:
    width, height, left, right, top, bottom = 640, 240, 64, 12, 10, 28
    lines = []  # (record, series, band: zeros where the record has none)
    for r in records:
        s = list(r.series or [])
        band = list(r.series_band or [])
        lines.append((r, s, band if len(band) == len(s) else [0.0] * len(s)))
    values = [0.0] + [x for _, s, band in lines for v, w in zip(s, band)
                      for x in (v - w, v + w) if math.isfinite(x)]
    lo, hi = min(values), max(values)
    hi = hi if hi > lo else lo + 1.0
    n = max((len(s) for _, s, _ in lines), default=1)

    def x_of(i: int) -> float:
        return left + (width - left - right) * i / max(n - 1, 1)

    def y_of(v: float) -> float:
        return top + (height - top - bottom) * (hi - v) / (hi - lo)

    def xy(i: int, v: float) -> str:
        return f"{x_of(i):.1f},{y_of(v):.1f}"

    parts = [f'<svg class="curves" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img">',
             f'<rect x="{left}" y="{top}" width="{width - left - right}" '
             f'height="{height - top - bottom}" fill="none" stroke="#bbb"/>']
    for v in sorted({lo, 0.0, hi}):
        y = y_of(v)
        if v != 0.0 and abs(y - y_of(0.0)) < 12:  # its label would overprint 0's
            continue
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="{"#555" if v == 0 else "#eee"}"/>'
                     f'<text x="{left - 4}" y="{y:.1f}" text-anchor="end" '
                     f'dominant-baseline="middle">{v:.3g}</text>')
    for i, label, anchor in ((0, "step 0", "start"), (n - 1, f"step {n - 1}", "end")):
        parts.append(f'<text x="{x_of(i):.1f}" y="{height - 8}" '
                     f'text-anchor="{anchor}">{label}</text>')
    for r, s, band in lines:
        colour, dashed = styles[r.kernel]
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        banded = [(j, v if math.isfinite(band[j]) and band[j] > 0 else math.nan)
                  for j, v in enumerate(s)]
        for run in _finite_runs(banded):
            upper = [xy(j, v + band[j]) for j, v in run]
            lower = [xy(j, v - band[j]) for j, v in reversed(run)]
            parts.append(f'<polygon points="{" ".join(upper + lower)}" fill="{colour}" '
                         f'fill-opacity="0.15" stroke="none"/>')
        for run in _finite_runs(list(enumerate(s))):
            parts.append(f'<polyline points="{" ".join(xy(j, v) for j, v in run)}" '
                         f'fill="none" stroke="{colour}" stroke-width="1.3"{dash}>'
                         f"<title>{_e(r.kernel)}</title></polyline>")
    return "".join(parts) + "</svg>"
