"""Records of a ConvergenceRun (one ``Record`` per (model, recipe)), judged by the verdict path.

series: per-step mean over seeds of the paired loss difference (recipe - fp32 reference);
series_band: per-step max over seeds of |difference - mean| (the seeds' spread; 0 for fp32).
These are what the golden store keeps and ``convergence_rules.ConvergenceRules.golden`` compares. The gate's
messages (``converge`` applies it to the per-seed curves) travel as the record's ``findings``.
"""
from __future__ import annotations

from numcheck.measure.environment import device_class
from numcheck.records import Record, Status
from numcheck.convergence import gate

__all__ = ["case_id", "to_records"]


def case_id(model: str, recipe: str, steps: int, n_seeds: int) -> str:
    return f"{model}-{recipe}-s{steps}-k{n_seeds}"


def _dtype(res) -> str:
    k = res.spec.kind
    if k in ("fp32", "bf16"):
        return k
    return f"fp32+{res.spec.name}"  # fp32 compute with the recipe's fake-quant GEMM operands


def to_records(run) -> list[Record]:
    ref = run.results["fp32"]
    out = []
    for name, res in run.results.items():
        if res.loss is not None and ref.loss is not None:
            series, band = gate.paired_series(res.loss, ref.loss)
            series, band = [float(v) for v in series], [float(v) for v in band]
        else:
            series, band = [], []
        # skipped and errored runs keep their status; measured ones are judged from findings
        status = Status(res.status) if res.status in ("skipped", "error") else Status.PENDING
        out.append(Record(
            suite="convergence", family="convergence", op=run.model, kernel=name,
            case_id=case_id(run.model, name, run.steps, len(run.seeds)), output="loss",
            device_class=device_class(run.device), device=run.device, dtype=_dtype(res),
            dist="synthetic", seed=int(run.seeds[0]),
            params=(f"steps={run.steps} seeds={','.join(map(str, run.seeds))} "
                    f"window={gate.WINDOW} device={run.device} kind={res.spec.kind}"),
            status=status, reason="; ".join(res.reasons) if status != Status.PENDING else "",
            findings=tuple(res.reasons), series=series, series_band=band,
            metrics={k: float(v) for k, v in res.metrics.items()}))
    return out
