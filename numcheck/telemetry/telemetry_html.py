"""The telemetry family's HTML: its section of the results report (per (model, recipe), a
layer x gated-statistic heatmap and, folded, the same statistics per step) and ``telemetry_html``,
the page of a numcheck.telemetry ``records()`` frame (``numcheck inspect``: per layer x step
heatmaps; docs/telemetry.md). Torch-free; the frame's pandas is the caller's."""
from __future__ import annotations

import math

from numcheck.records import Record, failing
from numcheck.report.htmlkit import (Section, badge as _badge, e as _e, heat_colour as _heat_colour,
                                     num as _num, page as _page, show as _show, table as _table)
from numcheck.telemetry.telemetry_rules import BY_KEY, case_parts, worse


def floors_section(records: list[Record], mode: str) -> Section | None:
    """Telemetry goldens' records (numcheck.telemetry.floors): per (model, recipe), a heatmap
    of layer (module, op, role) x gated statistic, coloured per column from worst to best,
    failing records outlined; then every record in a table, folded."""
    rows = [r for r in records if "telemetry" in (r.family, r.suite)]
    if not rows:
        return None
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in rows:
        model, recipe, _ = case_parts(r.case_id)
        groups.setdefault((model, recipe), []).append(r)
    body = []
    for (model, recipe), rs in groups.items():
        keys = [k for k in BY_KEY if any(isinstance(r.metric(k), (int, float)) for r in rs)]
        if not keys:  # no gated statistic (an errored test, a user's own record): table only
            continue
        what_if = any("what_if=True" in (r.params or "") for r in rs)
        cols = {}
        for k in keys:
            vals = [float(r.metric(k)) for r in rs if isinstance(r.metric(k), (int, float))
                    and math.isfinite(float(r.metric(k)))]
            cols[k] = (min(vals), max(vals)) if vals else (0.0, 0.0)
        trs = []
        for r in rs:
            bad = failing(r, mode)
            layer = case_parts(r.case_id)[2]
            tds = []
            for k in keys:
                v, (lo, hi) = r.metric(k), cols[k]
                v = float(v) if isinstance(v, (int, float)) else math.nan
                floor = BY_KEY[k].kind == "floor"
                colour = _heat_colour(v, lo, hi) if floor else _heat_colour(-v, -hi, -lo)
                tip = f"{layer} {BY_KEY[k].label}: {_num(v, '.4g')} {BY_KEY[k].unit}"
                if bad:
                    tip += f" | {r.golden_reason or r.reason}"
                tds.append(f'<td class="heat{" fail" if bad else ""}" data-key="{_e(k)}" '
                           f'style="background:{colour}" title="{_e(tip)}">'
                           f"{_num(v, '.4g')}{' FAIL' if bad else ''}</td>")
            trs.append(f'<tr data-case="{_e(r.case_id)}"><th>{_e(layer)} <span class="note">'
                       f'({_e(r.kernel)})</span></th>{"".join(tds)}</tr>')
        head = "".join(f"<th>{_e(BY_KEY[k].label)}{f' ({BY_KEY[k].unit})' if BY_KEY[k].unit else ''}"
                       "</th>" for k in keys)
        body.append(f"<h3>{_e(model)}: {_e(recipe)}{' (what-if)' if what_if else ''}</h3>"
                    f'<div class="wide"><table class="heatmap" data-model="{_e(model)}" '
                    f'data-recipe="{_e(recipe)}"><thead><tr><th>layer (op)</th>{head}</tr>'
                    f"</thead><tbody>{''.join(trs)}</tbody></table></div>")
        body.append(_telemetry_steps(rs, keys, recipe))
    keys = sorted({k for r in rows for k in (r.metrics or {})})
    table = _table(["op", "kernel", "case", "output", "device class", "status",
                    *map(_e, keys), "reason"],
                   [[_e(r.op), _e(r.kernel), _e(r.case_id), _e(r.output), _e(r.device_class),
                     _badge(r.status), *(_show(r.metric(k, "")) for k in keys), _e(r.reason)]
                    for r in rows])
    body.append('<p class="note">Each cell: the statistic over the run\'s steps (floors: the '
                "minimum, ceilings: the maximum; docs/telemetry.md), green the column's best, "
                "red its worst; under each table, folded, the same statistics per layer and "
                "step. Every recorded statistic per step: <code>numcheck inspect</code> "
                "(each record's repro command).</p>"
                f"<details><summary>All {len(rows)} telemetry records</summary>{table}</details>")
    return "telemetry", "Telemetry", "".join(body)


def _telemetry_steps(rs: list[Record], keys: list[str], recipe: str) -> str:
    """Per gated statistic of one (model, recipe): a layer x step heatmap of the records'
    ``per_step`` values (numcheck.telemetry.floors), steps with non-finite elements outlined
    (their own table only where there are any); folded. Records without per-step values
    (results written before they were recorded) are left out."""
    rs = [r for r in rs if isinstance(r.per_step, dict) and r.per_step.get("step")]
    if not rs:
        return ""
    order: dict = {}
    per_key: dict[str, Cells] = {k: {} for k in keys}
    for r in rs:
        module, _, role = case_parts(r.case_id)[2].rpartition("/")
        layer = (module, r.kernel, role)
        order.setdefault(layer, (len(order), 0))
        for k in keys:
            vals = _per_step(r, k)
            if vals is None:
                continue
            row = per_key[k].setdefault(layer, {})
            for step, v in vals:   # two records of one layer: the worse value
                row[step] = worse(BY_KEY[k].kind, row.get(step), v)
    for cells in per_key.values():
        for row in cells.values():
            for step, v in row.items():
                row[step] = math.nan if v is None else v   # shown as a dash
    flags = per_key.get("nonfinite_ceiling")
    bad_steps = {step for row in (flags or {}).values() for step, v in row.items() if v > 0}
    steps = shown_steps(sorted({step for cells in per_key.values() for row in cells.values()
                                 for step in row}), bad_steps)
    maps = []
    if flags and not bad_steps:
        per_key["nonfinite_ceiling"] = {}  # all zero: a table of zeros says nothing
    for k in keys:
        if not per_key[k]:
            continue
        s = BY_KEY[k]
        fmt = ".1f" if s.unit == "dB" else ".2f" if s.unit == "%" else ".4g"
        spec = (s.column, f"{s.label.removesuffix(' floor').removesuffix(' ceiling')}"
                f"{f' ({s.unit})' if s.unit else ''} per step", fmt,
                "up" if s.kind == "floor" else "down")
        maps.append(step_heatmap(per_key[k], order, steps, spec, recipe, flags))
    return (f"<details><summary>Per step ({len(steps)} step(s)): "
            f"{', '.join(_e(BY_KEY[k].label) for k in keys if per_key[k])}</summary>"
            f"{''.join(maps)}</details>") if maps else ""


def _per_step(r: Record, key: str) -> list[tuple[int, float | None]] | None:
    """(step, value) of a record's ``per_step[key]``; None where it has none or the file is
    malformed (a list of another length than the steps, a value that is not a number)."""
    steps, vals = r.per_step.get("step"), r.per_step.get(key)
    if not isinstance(vals, list) or not isinstance(steps, list) or len(vals) != len(steps):
        return None
    try:
        return [(int(s), None if v is None else float(v)) for s, v in zip(steps, vals)]
    except (TypeError, ValueError, OverflowError):
        return None


# --- telemetry: per layer x step heatmaps of a numcheck.telemetry records() frame --------------

# A heatmap: (column, what it shows, number format, colour: "up" = higher is better (red to
# green), "down" = lower is better, "log" = a neutral log-scale ramp).
_QUANT_MAPS = (("sqnr_db", "SQNR (dB): the quantized tensor vs its source", ".1f", "up"),
               ("worst_block_sqnr_db", "worst block's SQNR (dB)", ".1f", "up"),
               ("underflow_pct", "underflow: % of the non-zero elements quantized to zero",
                ".2f", "down"),
               ("saturation_pct", "saturation: % of the elements clipped", ".2f", "down"))
_SHADOW_MAPS = (("shadow_sqnr_db", "the layer's own error: output SQNR (dB) vs the layer run in "
                 "float64 on the same inputs", ".1f", "up"),
                ("e2e_sqnr_db", "accumulated error: output SQNR (dB) vs a float64 copy of the "
                 "whole model", ".1f", "up"))
_AMAX = ("amax", "amax: max |x| over the finite elements of each output (colour: log scale)",
         ".3g", "log")
# Steps shown at most: past these, evenly spaced ones (the first and the last among them).
MAX_STEPS = 60

Cells = dict[tuple[str, str, str], dict[int, float]]  # (module, op, role) -> step -> value


def _cells(sub, column: str, merge) -> Cells:
    """Per (module, op, role) and step, the rows' ``column`` merged with ``merge`` (several
    ranks, or a frame holding both passes): NaN only where every row is NaN."""
    cells: Cells = {}
    for m, o, r, step, v in zip(sub["module"], sub["op"], sub["role"], sub["step"], sub[column]):
        v, row = float(v), cells.setdefault((str(m), str(o), str(r)), {})
        old = row.get(int(step), math.nan)
        row[int(step)] = v if old != old else old if v != v else merge(old, v)
    return cells


def _colour(v: float, lo: float, hi: float, scale: str) -> str:
    if scale == "up":
        return _heat_colour(v, lo, hi)
    if scale == "down":
        return _heat_colour(-v, -hi, -lo)
    if not (v > 0 and math.isfinite(v)):
        return "#eee"
    x = math.log10(v)
    t = 0.5 if hi <= lo else min(max((x - lo) / (hi - lo), 0.0), 1.0)
    return f"hsl(210,60%,{95 - 35 * t:.0f}%)"


def step_heatmap(cells: Cells, order: dict, steps: list[int], spec: tuple, recipe: str,
                  flags: Cells | None = None) -> str:
    """One per-layer x step table; ``flags``: cells to outline and mark NaN/Inf."""
    column, what, fmt, scale = spec
    finite = [v for row in cells.values() for v in row.values() if math.isfinite(v)]
    if scale == "log":
        finite = [math.log10(v) for v in finite if v > 0]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    body = []
    for key in sorted(cells, key=order.__getitem__):
        m, o, r = map(_e, key)
        tds = []
        for step in steps:
            v = cells[key].get(step, math.nan)
            bad = bool(flags and flags.get(key, {}).get(step, 0) > 0)
            shown = _num(v, fmt) + (" NaN/Inf" if bad else "")
            tds.append(f'<td class="heat{" fail" if bad else ""}" data-step="{step}" '
                       f'data-value="{v!r}" style="background:{_colour(v, lo, hi, scale)}" '
                       f'title="{m} ({o}, {r}), step {step}: {column} {shown}">{shown}</td>')
        body.append(f'<tr data-module="{m}" data-op="{o}" data-role="{r}"><th>{m} '
                    f'<span class="note">({o}, {r})</span></th>{"".join(tds)}</tr>')
    head = "".join(f"<th>{s}</th>" for s in steps)
    if scale == "log":
        ends = f"{10 ** lo:.3g}" if finite else "\u2014", f"{10 ** hi:.3g}" if finite else "\u2014"
    else:
        ends = (_num(lo, fmt), _num(hi, fmt)) if scale == "up" else (_num(hi, fmt), _num(lo, fmt))
    css = {"up": "scale", "down": "scale down", "log": "scale log"}[scale]
    return (f"<h3>{_e(what)}</h3>"
            f'<div class="wide"><table class="heatmap" data-column="{_e(column)}" '
            f'data-recipe="{_e(recipe)}"><thead><tr><th>module (op, role) / step</th>{head}'
            f"</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
            f'<p>{ends[0]} <span class="{css}"></span> {ends[1]}</p>')


def shown_steps(steps: list[int], keep=()) -> list[int]:
    """The steps a heatmap shows: all of them up to MAX_STEPS, else evenly spaced ones and
    each step of ``keep`` (the steps with a NaN or Inf) that follows one not in it: where a
    run went non-finite is never sampled away, a run that stays non-finite adds no columns
    (at most MAX_STEPS such onsets)."""
    if len(steps) <= MAX_STEPS:
        return steps
    keep = set(keep)
    onsets = [s for prev, s in zip([None, *steps], steps) if s in keep and prev not in keep]
    return sorted({steps[round(i * (len(steps) - 1) / (MAX_STEPS - 1))]
                   for i in range(MAX_STEPS)} | set(onsets[:MAX_STEPS]))


def _present(sub, column: str) -> bool:
    return column in sub.columns and bool(sub[column].notna().any())


def telemetry_html(frame, *, title: str | None = None, producer: str | None = None) -> str:
    """One self-contained HTML page (as ``html_report``: inline CSS, no script, nothing
    fetched) of a numcheck.telemetry ``records()`` frame (or a merged one): a summary
    (``producer``: the first non-finite producer line, shown there when given) and per-layer x
    step heatmaps. Per recipe, the observed one first, then each what-if recipe: SQNR,
    worst-block SQNR, underflow and saturation of the quantized operands (where measured);
    the outputs' shadow and end-to-end SQNR (where measured); the outputs' amax, always. Rows:
    (module, op, role) in the frame's order of first appearance, a module's rows together;
    columns: steps. A cell merges the rows of its key (ranks): the worst value."""
    title = title or "numcheck telemetry"
    cols = set(frame.columns)
    flagged = frame["what_if"].astype(bool) if "what_if" in cols else None
    observed = frame[~flagged] if flagged is not None else frame
    what_ifs = frame[flagged] if flagged is not None else frame.iloc[0:0]
    steps = sorted({int(s) for s in frame["step"]}) if len(frame) else []
    shown = shown_steps(steps, {int(x) for x in frame.loc[frame["nonfinite"] > 0, "step"]}
                         if "nonfinite" in cols and len(frame) else ())
    modules = list(dict.fromkeys(str(m) for m in frame["module"])) if len(frame) else []
    at = {m: i for i, m in enumerate(modules)}
    keys = list(dict.fromkeys(zip(map(str, frame["module"]), map(str, frame["op"]),
                                  map(str, frame["role"])))) if len(frame) else []
    order = {k: (at[k[0]], i) for i, k in enumerate(keys)}

    recipes = []  # (what_if, recipe, its rows), the observed recipe(s) first
    for what_if, part in ((False, observed), (True, what_ifs)):
        named = part["recipe"].astype(str) if "recipe" in cols else None
        for rec in dict.fromkeys(named) if named is not None else ():
            if rec:
                recipes.append((what_if, rec, part[named == rec]))

    summary = [f"<p>{len(frame)} rows: {len(steps)} step(s)"
               + (f" ({steps[0]} to {steps[-1]})" if steps else "")
               + f", {len(modules)} module(s)"
               + (f", ranks {', '.join(_e(r) for r in sorted(set(frame['rank'])))}"
                  if "rank" in cols and len(frame) else "") + ".</p>"]
    if recipes:
        summary.append("<p>Recipes measured (never applied to the run): " + ", ".join(
            f"<code>{_e(rec)}</code>{' (what-if)' if what_if else ''}"
            for what_if, rec, _ in recipes) + ".</p>")
    else:
        summary.append('<p class="note">No recipe measured: no quantization statistics.</p>')
    if "nonfinite" in cols and len(observed):
        bad = observed[observed["nonfinite"] > 0]
        masks = int(((bad["op"] == "softmax") & (bad["role"] == "input")).sum())
        summary.append(f"<p>{len(bad)} row(s) hold a NaN or Inf"
                       + (f", the first at step {int(bad['step'].min())}" if len(bad) else "")
                       + (f" ({masks} of them softmax inputs, where -inf is an attention mask)"
                          if masks else "") + ".</p>")
    if producer:
        summary.append(f'<p class="producer"><code>{_e(producer)}</code></p>')
    if len(shown) < len(steps):
        summary.append(f'<p class="note">The heatmaps show {len(shown)} of the {len(steps)} '
                       f"steps, evenly spaced; the parquet file holds them all.</p>")
    if not len(frame):
        summary.append('<p class="note">No records.</p>')
    sections: list[Section] = [("summary", "Summary", "".join(summary))]

    def maps(sub, specs, recipe: str, flags: Cells | None = None) -> list[str]:
        out = []
        for spec in specs:
            column, _, _, scale = spec
            if scale == "log" and column in sub.columns or _present(sub, column):
                rows = sub[sub[column].notna()] if scale != "log" else sub
                worst = max if scale in ("down", "log") else min
                out.append(step_heatmap(_cells(rows, column, worst), order, shown, spec,
                                         recipe, flags))
        return out

    for i, (what_if, rec, sub) in enumerate(recipes):
        body = maps(sub, _QUANT_MAPS, rec)
        if body:
            sections.append((f"recipe-{i}", f"{'What-if recipe' if what_if else 'Recipe'} "
                             f"{rec}: its quantized operands", "".join(body)))
    outputs = observed[observed["role"] == "output"] if len(observed) else observed
    shadow = maps(outputs, _SHADOW_MAPS, "")
    if shadow:
        sections.append(("shadow", "Shadow SQNR of the outputs", "".join(shadow)))
    if len(outputs) and "amax" in cols:
        amax = outputs.assign(amax=outputs["amax"].where(outputs["amax"] > -math.inf))
        flags = _cells(outputs, "nonfinite", lambda a, b: a + b) if "nonfinite" in cols \
            else None
        sections.append(("amax", "Output amax", "".join(maps(amax, (_AMAX,), "", flags))))
    return _page(title, sections)
