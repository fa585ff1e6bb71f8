"""A telemetry frame's per-layer floors and ceilings as golden records (docs/telemetry.md,
"Telemetry goldens").

``as_records(frame_or_t, model=...)`` turns a ``records()`` frame (or the ``Telemetry``
itself) into one ``Record`` of family "telemetry" per (module, op, role, recipe) that has a
gated statistic: over the frame's steps, the floor (minimum) of ``sqnr_db``,
``worst_block_sqnr_db``, ``shadow_sqnr_db`` and ``e2e_sqnr_db`` and the ceiling (maximum) of
``underflow_pct``, ``saturation_pct`` and the non-finite elements. The golden store judges
them like every other record (numcheck.telemetry.telemetry_rules: slacks and rules).

A step where a statistic is undefined by construction is left out of its floor: an all-zero
tensor (zero-initialized adaLN weights at step 0) has no SQNR (0/0), a tensor without finite
non-zero elements no underflow percentage, a format without blocks no worst block. Any other
NaN of a step makes the floor NaN: it fails and is never stored.

Key: suite, op ``telemetry``, kernel = the module's telemetry op (``linear``, ``norm``, ...),
case_id ``<model>/<recipe>/<module>/<role>`` (recipe ``fp32`` for the shadow rows of
unquantized outputs), output ``telemetry``. ``params`` marks what-if recipes. The input digest
is of what the frame says about the run: model name, steps, the tensor's element count per step
and the pass, plus ``inputs`` (anything the caller hashes in: seed, data, recipe settings), so a
changed batch, step count or architecture reads as changed inputs, not as a regression.
"""
from __future__ import annotations

import hashlib

import numpy as np

from numcheck.measure import environment
from numcheck.records import Record
from numcheck.telemetry.telemetry_rules import FAMILY, OUTPUT, STATS, worse

__all__ = ["as_records"]

# Rows of (module, op, role, pass, recipe, what_if) are one record; rank is merged away by
# ``numcheck.telemetry.merge`` (a frame of several ranks: merge it first).
_GROUP = ["module", "op", "role", "pass", "recipe", "what_if"]


def _defined(df, column: str) -> np.ndarray:
    """Steps where ``column`` is defined by construction (see the module doc)."""
    def raw(name):
        return df[name].to_numpy(dtype=float) if name in df else np.full(len(df), np.nan)
    if column == "sqnr_db":
        return (raw("q_n") > 0) & ~((raw("q_sig_sq") == 0) & (raw("q_err_sq") == 0))
    if column == "worst_block_sqnr_db":
        return raw("blk_n") > 0
    if column == "underflow_pct":
        nz = raw("n") - raw("n_zero") - raw("n_nan") - raw("n_inf")
        return (raw("q_n") > 0) & (nz > 0)
    if column == "saturation_pct":
        return raw("q_n") > 0
    if column in ("shadow_sqnr_db", "e2e_sqnr_db"):
        p = "sh" if column == "shadow_sqnr_db" else "e2e"
        return (raw(f"{p}_n") > 0) & ~((raw(f"{p}_sig_sq") == 0) & (raw(f"{p}_err_sq") == 0))
    return np.ones(len(df), dtype=bool)


def _frame(frame_or_t):
    frame = frame_or_t.records() if hasattr(frame_or_t, "records") else frame_or_t
    ranks = frame["rank"].unique() if "rank" in frame and len(frame) else []
    if len(ranks) > 1:
        raise ValueError(f"a frame of {len(ranks)} ranks: merge it first "
                         f"(numcheck.telemetry.merge), then take its floors")
    return frame


def _by_step(steps: np.ndarray, vals: np.ndarray, at: dict, kind: str) -> list[float | None]:
    """Per step of ``at`` (step -> position), the worst of that step's values (a module called
    twice in a step: the lower floor, the higher ceiling; a NaN stays NaN); None where the step
    does not define the statistic."""
    out: list[float | None] = [None] * len(at)
    for step, v in zip(steps.tolist(), vals.tolist()):
        out[at[step]] = worse(kind, out[at[step]], float(v))
    return out


def floors(frame_or_t):
    """The floors and ceilings per (module, op, role, pass, recipe, what_if), a pandas frame:
    the group's columns, ``steps``, ``n`` and one column per gated statistic
    (numcheck.telemetry.telemetry_rules.STATS keys; NaN where the group never defines it), in the
    frame's row order, and ``per_step``: ``{"step": [steps], key: [the step's value]}`` for the
    statistics the group defines (the results report's layer x step heatmaps; None on a step
    that does not define it, NaN where it came out NaN). Groups without any gated statistic are left out."""
    import pandas as pd

    frame = _frame(frame_or_t)
    out = []
    for key, g in frame.groupby(_GROUP, sort=False, dropna=False):
        row = dict(zip(_GROUP, key))
        row["steps"] = int(g["step"].nunique())
        row["n"] = float(g["n"].min())
        # the fewest finite non-zero elements: the underflow percentage's denominator
        row["nz"] = float((g["n"] - g["n_zero"] - g["n_nan"] - g["n_inf"]).min())
        row["step_n"] = tuple(zip(g["step"].astype(int), g["n"].astype(float)))
        steps = g["step"].to_numpy(dtype=int)
        row["per_step"] = per_step = {"step": sorted({int(x) for x in steps})}
        at = {step: i for i, step in enumerate(per_step["step"])}
        gated = False
        for s in STATS:
            if s.column == "nonfinite":
                continue
            ok = _defined(g, s.column)
            vals = g[s.column].to_numpy(dtype=float)[ok]
            if not len(vals):
                row[s.key] = np.nan
                continue
            gated = True
            # NaN of a defined step poisons the floor: np.min/np.max propagate it
            row[s.key] = float(np.min(vals) if s.kind == "floor" else np.max(vals))
            row.setdefault("_defined", set()).add(s.key)
            per_step[s.key] = _by_step(steps[ok], vals, at, s.kind)
        if not gated:
            continue
        nonfinite = (g["n_nan"] + g["n_inf"]).to_numpy(dtype=float)
        row["nonfinite_ceiling"] = float(nonfinite.max())
        row["_defined"].add("nonfinite_ceiling")
        per_step["nonfinite_ceiling"] = _by_step(steps, nonfinite, at, "ceiling")
        out.append(row)
    return pd.DataFrame(out)


def _digest(model: str, row: dict, inputs) -> str:
    h = hashlib.sha256()
    h.update(repr((model, row["pass"], row["step_n"])).encode())
    if inputs is not None:
        h.update(inputs if isinstance(inputs, bytes) else repr(inputs).encode())
    return h.hexdigest()[:16]


def as_records(frame_or_t, *, model: str, suite: str = "telemetry", device: str = "cpu",
               inputs=None, repro: str = "", seed: int | None = None) -> list[Record]:
    """One telemetry Record per (module, op, role, recipe) with a gated statistic (module doc).

    ``frame_or_t``: a ``records()`` frame of one rank (or a merged one), or the Telemetry.
    ``model``: the name case ids start with. ``device``: where the model ran (the golden's
    device class). ``inputs``: hashed into each record's input digest (a seed, a data
    version, recipe settings). ``repro``: the command that reruns it."""
    recs = []
    dc = environment.device_class(device)
    for row in floors(frame_or_t).to_dict("records"):
        recipe = row["recipe"] or "fp32"
        what_if = bool(row["what_if"])
        metrics = {k: row[k] for k in row["_defined"]}
        metrics.update(steps=row["steps"], n=row["n"], nz=row["nz"])
        recs.append(Record(
            suite=suite, op="telemetry", kernel=str(row["op"]),
            case_id=f"{model}/{recipe}/{row['module']}/{row['role']}", output=OUTPUT,
            device_class=dc, dtype="", seed=seed,
            params=f"pass={row['pass']},recipe={recipe},what_if={what_if}",
            input_digest=_digest(model, row, inputs), metrics=metrics, family=FAMILY,
            per_step=row["per_step"],
            device=str(device), repro=repro,
            notes=f"floors and ceilings over {row['steps']} step(s) of {model}"
                  + (f" (what-if {recipe})" if what_if else "")))
    return recs
