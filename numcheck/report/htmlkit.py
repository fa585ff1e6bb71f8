"""The HTML report's building blocks, shared by the results report (numcheck.report.html) and
the families' own sections (quant heatmaps, convergence curves, fingerprints, telemetry): escaping,
number cells, status badges, tables, the heat colour scale, the stylesheet and the page. Inline
CSS only: no script, no font, nothing fetched. Torch-free."""
from __future__ import annotations

import math
from html import escape

from numcheck.verdicts.family import Section

__all__ = ["CSS", "PALETTE", "Section", "badge", "e", "heat_colour", "num", "page", "show",
           "table"]

# Line colours of the convergence curves (matplotlib's tab10: distinct, print-safe); past ten
# recipes the colours repeat dashed.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 76em;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; margin-top: 1.8em; }
h3 { font-size: 1.05em; margin: 1.2em 0 .4em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: .5em 0 1em; }
th, td { border: 1px solid #ddd; padding: 2px 7px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font: 12.5px ui-monospace, monospace; }
pre { background: #f5f5f5; border: 1px solid #ddd; padding: .5em; overflow-x: auto;
      white-space: pre-wrap; word-break: break-all; }
pre.repro { user-select: all; }  /* one click selects the whole command */
.st { padding: 0 .4em; border-radius: 3px; color: #fff; background: #777; }
.st-passed { background: #2a7d2e; } .st-failed, .st-regressed, .st-missing { background: #c62828; }
.st-error { background: #8e24aa; } .st-known, .st-drift { background: #ef6c00; }
.failure { border-left: 4px solid #c62828; padding: .1em 1em; margin: 1em 0; background: #fffafa; }
dl { display: grid; grid-template-columns: max-content auto; gap: .15em 1em; margin: .4em 0; }
dt { font-weight: 600; } dd { margin: 0; }
.note { color: #666; font-style: italic; }
td.heat { text-align: right; min-width: 3.5em; }
td.heat.fail { outline: 2px solid #c62828; font-weight: 700; }
.scale { display: inline-block; width: 12em; height: .8em; vertical-align: middle;
         background: linear-gradient(to right, hsl(0,70%,78%), hsl(60,70%,78%), hsl(120,70%,78%)); }
.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: .2em 1.2em; }
.swatch { display: inline-block; width: 1.6em; vertical-align: middle; margin-right: .3em; }
svg text { font: 10px system-ui, sans-serif; fill: #333; }
.scale.down { background: linear-gradient(to right, hsl(120,70%,78%), hsl(60,70%,78%),
              hsl(0,70%,78%)); }
.scale.log { background: linear-gradient(to right, hsl(210,60%,95%), hsl(210,60%,60%)); }
.wide { overflow-x: auto; }
table.heatmap th .note { font-weight: normal; }
"""


def e(x) -> str:
    return escape(str(x))


def num(x, fmt: str = ".1f") -> str:
    """A statistic as shown: a dash where it was not measured (None: a field a producer or an
    older results file leaves empty) or is NaN."""
    if x is None or x != x:  # NaN: the one value unequal to itself
        return "\u2014"  # an em dash
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, fmt)


def badge(value) -> str:
    return f'<span class="st st-{e(value)}">{e(value)}</span>'


def table(head: list[str], rows: list[list[str]]) -> str:
    """A table of already-escaped cells (a cell starting with "<td" is taken as it is)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in r)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


# A section: (id, heading, body HTML); a section builder returns None where it has no data.


def heat_colour(v: float, lo: float, hi: float) -> str:
    if math.isnan(v):
        return "#eee"
    t = 1.0 if v >= hi else 0.0 if v <= lo else (v - lo) / (hi - lo)
    return f"hsl({120 * t:.0f},70%,78%)"


def show(v) -> str:
    """A metric as read: integral floats (bit counts, block sizes) as integers."""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    return e(v)


def page(title: str, sections: list[Section]) -> str:
    """The document: title, links to the sections, the sections."""
    nav = " ".join(f'<a href="#{sid}">{e(heading)}</a>' for sid, heading, _ in sections)
    body = "\n".join(f'<section id="{sid}"><h2>{e(heading)}</h2>\n{html}\n</section>'
                     for sid, heading, html in sections)
    # ASCII, non-ASCII as character references: the CLI writes the page in the locale's encoding
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title><style>{CSS}</style></head>\n<body><h1>{e(title)}</h1>"
            f"<nav>{nav}</nav>\n{body}\n</body></html>\n").encode(
                "ascii", "xmlcharrefreplace").decode("ascii")
