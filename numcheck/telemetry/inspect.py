"""``numcheck inspect``: train a model for a few steps under ``watch`` and say what it saw.

A model is a built-in tiny model (``mlp``, ``tiny_lm``, ``tiny_dit``: numcheck.convergence) or
``module:attr``, a callable ``attr(seed) -> (model, task, lr)`` like
``numcheck.convergence.models.build``: ``model.loss(batch)`` gives the loss and
``task.batch_at(seed, step)`` the batch of a step. The run is plain fp32 AdamW; the recipe and
the what-if recipes are measured on its tensors (what their reference quantizers would make of
them), never applied, so the statistics describe the model, not a perturbed run.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import torch

from numcheck.errors import UsageError
from numcheck.telemetry.fields import merge
from numcheck.telemetry.watcher import NonFinite, NoProducer, Telemetry, watch

# The per-layer table's columns: what a reader asks first of a layer's tensors.
TABLE = ("amax", "dynamic_range_binades", "underflow_pct", "saturation_pct", "sqnr_db",
         "worst_block_sqnr_db", "shadow_sqnr_db")


def load(ref: str, seed: int = 0):
    """(model, task, lr) of a built-in model name or ``module:attr``; UsageError otherwise."""
    if ":" not in ref:
        from numcheck.convergence.models import build
        return build(ref, seed)
    attr = ref.split(":", 1)[1]
    got = _callable(ref, "--model")(seed)
    if not (isinstance(got, tuple) and len(got) == 3 and isinstance(got[0], torch.nn.Module)):
        raise UsageError(f"--model {ref!r}: {attr}(seed) must return (model, task, lr)")
    return got


def measure_sensitivity(ref: str, batches: int, candidates, loss: str | None = None):
    """``layer_sensitivity.sensitivity`` records of a model reference (``load``) on its task's
    first ``batches`` batches (seed 0), its loss as ``loss_of`` finds it (``numcheck plan``)."""
    from numcheck.telemetry.layer_sensitivity import sensitivity

    model, task, _ = load(ref)
    got = [task.batch_at(0, i) for i in range(batches)]
    # sensitivity runs a deep copy: the loss is looked up on the model it is given
    return sensitivity(model, got, candidates, loss=lambda m, b: loss_of(m, loss, ref)(b))


def _callable(ref: str, what: str):
    mod_name, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise UsageError(f"{what} {ref!r}: cannot load it ({type(e).__name__}: {e}); give "
                         "module:attr on PYTHONPATH") from e


def _output_loss(out):
    """The loss in a model's output: a 0-d tensor, or the ``loss`` of a dict / an object with
    one (model libraries' ``model(..., labels=...)``), or the first item of a tuple when 0-d;
    None when there is none."""
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else None
    got = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if isinstance(got, torch.Tensor) and got.dim() == 0:
        return got
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor) \
            and out[0].dim() == 0:
        return out[0]
    return None


def loss_of(model: torch.nn.Module, loss: str | None, ref: str):
    """batch -> the step's loss: ``--loss module:attr`` (a callable (model, batch) -> loss),
    else ``model.loss(batch)``, else the loss in ``model(batch)``'s output (``_output_loss``;
    a tuple batch is spread as arguments, a dict as keywords)."""
    if loss is not None:
        fn = _callable(loss, "--loss")
        return lambda batch: fn(model, batch)
    if callable(getattr(model, "loss", None)):
        return model.loss

    def from_output(batch):
        out = model(*batch) if isinstance(batch, tuple) else \
            model(**batch) if isinstance(batch, dict) else model(batch)
        got = _output_loss(out)
        if got is None:
            raise UsageError(
                f"--model {ref!r}: {type(model).__name__} has no loss method and its output "
                f"({type(out).__name__}) holds no 0-d loss; give --loss module:attr, a callable "
                "(model, batch) -> loss")
        return got
    return from_output


def run(ref: str, *, recipe=None, what_if=(), shadow: bool = False, steps: int = 5,
        seed: int = 0, every: int = 1, loss: str | None = None) -> Telemetry:
    """Train ``ref`` for ``steps`` steps under ``watch`` (statistics on every ``every``-th),
    the loss as ``loss_of`` finds it; a step whose loss is not finite ends the run (the first
    non-finite producer is what a reader wants then)."""
    model, task, lr = load(ref, seed)
    step_loss = loss_of(model, loss, ref)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    with watch(model, recipe=recipe, shadow=shadow, what_if=what_if, every=every) as t:
        for step in range(steps):
            loss_value = step_loss(task.batch_at(seed, step))
            if not isinstance(loss_value, torch.Tensor) or loss_value.dim() != 0:
                got = (f"a tensor of shape {tuple(loss_value.shape)}"
                       if isinstance(loss_value, torch.Tensor) else type(loss_value).__name__)
                raise UsageError(f"the loss of --model {ref!r} is {got}; it must be a 0-d "
                                 "tensor (--loss: a callable (model, batch) -> loss)")
            opt.zero_grad(set_to_none=True)
            loss_value.backward()
            opt.step()
            t.step()
            if not torch.isfinite(loss_value.detach()).all():
                break
    return t


def table(frame, step: int | None = None) -> str:
    """The per-layer table of one step (default the last): one line per (module, op, role,
    recipe) of the observed run, the TABLE columns."""
    if frame.empty:
        return "(no records)"
    last = frame[(frame["step"] == (frame["step"].max() if step is None else step)) &
                 (~frame["what_if"])]
    cols = ["module", "op", "role", "recipe", *[c for c in TABLE if c in last.columns]]
    return last[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}")


def producer_line(where: NonFinite | NoProducer) -> str:
    if not where:
        return f"first non-finite producer: none ({where.reason}: {where.detail})"
    ins = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in (where.inputs or {}).items())
    return (f"first non-finite producer: step {where.step}, {where.module} ({where.op}), "
            f"{where.role} in the {where.pass_} pass; its inputs: {ins}")


def plot(frame, path: Path, column: str = "sqnr_db") -> Path | None:
    """A per-layer x step heatmap of ``column`` for the quantized inputs (``amax`` of every
    output when no recipe was measured); None when there is nothing to draw."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    obs = frame[~frame["what_if"]]
    sel = obs[(obs["role"] == "input") & obs[column].notna()] if column in obs else obs.iloc[0:0]
    if sel.empty:
        column, sel = "amax", obs[obs["role"] == "output"]
    if sel.empty:
        return None
    grid = sel.pivot_table(index="module", columns="step", values=column, aggfunc="min")
    # the cells' area grows with steps and layers (capped: 200 steps stay readable), the
    # margin with the longest layer name; the saved image's box is fitted to every label
    cols = min(grid.shape[1], 60)
    fig, ax = plt.subplots(figsize=(1.5 + 0.25 * cols, 1 + 0.3 * grid.shape[0]))
    im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="RdYlGn")
    ax.set_yticks(range(len(grid.index)), grid.index, fontsize=7)
    every = max(1, -(-grid.shape[1] // 20))   # at most ~20 step labels
    ticks = list(range(0, grid.shape[1], every))
    ax.set_xticks(ticks, [grid.columns[i] for i in ticks], fontsize=7)
    ax.set_xlabel("step")
    ax.set_title(f"{column} per layer and step")
    fig.colorbar(im, ax=ax)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def write_html(frame, path: Path, *, producer: str | None = None,
               title: str | None = None) -> Path:
    """The telemetry page (numcheck.telemetry.telemetry_html.telemetry_html: summary, per-layer x step
    heatmaps; ``producer``: the first non-finite producer line) written to ``path``."""
    from numcheck.telemetry.telemetry_html import telemetry_html
    path = Path(path)
    path.write_text(telemetry_html(frame, title=title, producer=producer), encoding="utf-8")
    return path


def merge_files(paths: list[str]):
    """Per-rank parquet files -> one frame (numcheck.telemetry.merge)."""
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise UsageError(f"--merge: no such file(s): {', '.join(missing)}")
    return merge(paths)
