"""Plots (matplotlib, Agg backend): ``plot_run``, the loss-vs-step curves of a ConvergenceRun
(seed-mean loss of every recipe, the fp32 reference's min-max band across seeds shaded), and
``plot_series``, the recorded paired differences of convergence records (the report's plots)."""
from __future__ import annotations

import numpy as np

__all__ = ["plot_run", "plot_series"]


def plot_run(run, path) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    steps = np.arange(run.steps)
    ref = run.results["fp32"]
    if ref.loss is not None:
        ax.fill_between(steps, ref.loss.min(0), ref.loss.max(0), color="k", alpha=0.15,
                        label="fp32 seed band")
    for name, res in run.results.items():
        if res.loss is None:
            continue
        style = {"fp32": dict(color="k", lw=2), "bf16": dict(color="tab:blue", lw=2)}.get(
            name, dict(lw=1))
        label = name + ("" if res.status == "passed" else f" ({res.status})")
        ax.plot(steps, np.nanmean(res.loss, 0), label=label, **style)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over seeds)")
    ax.set_title(f"{run.model}: {len(run.seeds)} paired seeds")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def plot_series(records, path) -> list[str]:
    """One PNG per model: each recipe's seed-mean loss minus the fp32 reference's, per step,
    with its band across seeds shaded; returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from pathlib import Path

    written = []
    for model in sorted({r.op for r in records}):
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for r in sorted((r for r in records if r.op == model), key=lambda r: r.kernel):
            s = [float(v) for v in r.series]
            b = [float(v) for v in (r.series_band or [0.0] * len(s))]
            steps = range(len(s))
            line, = ax.plot(steps, s, lw=1.2, label=r.kernel)
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
