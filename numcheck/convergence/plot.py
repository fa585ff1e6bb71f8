"""Loss-vs-step plot of a ConvergenceRun (matplotlib, Agg backend): seed-mean loss of every
recipe, with the fp32 reference's min-max band across seeds shaded."""
from __future__ import annotations

import numpy as np

__all__ = ["plot_run"]


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
