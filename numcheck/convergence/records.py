"""Records and the loss-gap table of a ConvergenceRun (one record per (model, recipe)).

series: per-step mean over seeds of the paired loss difference (recipe - fp32 reference);
series_band: per-step max over seeds of |difference - mean| (the seeds' spread; 0 for fp32).
These are what the golden store keeps and ``gate.window_regression`` compares.
"""
from __future__ import annotations

import math

from ..environment import device_class
from . import gate

__all__ = ["case_id", "table", "to_records"]


def case_id(model: str, recipe: str, steps: int, n_seeds: int) -> str:
    return f"{model}-{recipe}-s{steps}-k{n_seeds}"


def _dtype(res) -> str:
    k = res.spec.kind
    if k in ("fp32", "bf16"):
        return k
    return f"fp32+{res.spec.name}"  # fp32 compute with the recipe's fake-quant GEMM operands


def to_records(run) -> list[dict]:
    ref = run.results["fp32"]
    out = []
    for name, res in run.results.items():
        if res.loss is not None and ref.loss is not None:
            series, band = gate.paired_series(res.loss, ref.loss)
            series, band = [float(v) for v in series], [float(v) for v in band]
        else:
            series, band = [], []
        status = {"skipped": "skipped"}.get(res.status, res.status)
        out.append({
            "suite": "convergence", "op": run.model, "kernel": name,
            "case_id": case_id(run.model, name, run.steps, len(run.seeds)),
            "output": "loss", "device_class": device_class(run.device), "dtype": _dtype(res), "shape": "", "dist": "synthetic",
            "seed": int(run.seeds[0]),
            "params": (f"steps={run.steps} seeds={','.join(map(str, run.seeds))} "
                       f"window={gate.WINDOW} device={run.device} kind={res.spec.kind}"),
            "status": status, "reason": "; ".join(res.reasons),
            "series": series, "series_band": band,
            "metrics": {k: float(v) for k, v in res.metrics.items()},
        })
    return out


def _pct(v) -> str:
    return "     -" if v is None or not math.isfinite(v) else f"{100 * v:+6.2f}%"


def table(run) -> str:
    """Loss-gap table: mean window gap (after warm-up) to bf16 and to fp32, final loss, max
    saturated fraction, status."""
    lines = [f"{run.model}: {run.steps} steps x seeds {list(run.seeds)} ({run.wall_s:.1f} s)",
             f"{'recipe':24} {'gap/bf16':>8} {'gap/fp32':>8} {'final':>8} {'sat max':>8}  status"]
    for name, res in run.results.items():
        m = res.metrics
        fin = m.get("final_loss")
        sat = m.get("sat_max")
        lines.append(
            f"{name:24} {_pct(m.get('gap_bf16_mean'))}  {_pct(m.get('gap_fp32_mean'))} "
            f"{'       -' if fin is None else f'{fin:8.4f}'} "
            f"{'       -' if sat is None or not math.isfinite(sat) else f'{sat:8.1e}'}  "
            f"{res.status}{': ' + '; '.join(res.reasons)[:120] if res.reasons else ''}")
    return "\n".join(lines)
