"""``numcheck inspect``: train a model for a few steps under ``watch`` and say what it saw.

A model is a built-in tiny model (``mlp``, ``tiny_lm``, ``tiny_dit``: numcheck.convergence) or
``module:attr``, a callable ``attr(seed) -> (model, task, lr)`` like
``numcheck.convergence.models.build``: ``model.loss(batch)`` gives the loss and
``task.batch_at(seed, step)`` the batch of a step. The run is plain fp32 AdamW; the recipe and
the what-if recipes are measured on its tensors (what their reference quantizers would make of
them), never applied, so the statistics describe the model, not a perturbed run.

On several ranks (``run_model(ref, nproc)``, ``numcheck inspect --nproc N``; or launched by
torchrun) each rank trains the same model under DistributedDataParallel on its share of each
global batch, watched, and writes its records; they are merged into the one-process outputs,
with the rank that made the first NaN/Inf and the ranks it reached (docs/telemetry.md,
"Distributed").
"""
from __future__ import annotations

import functools
import importlib
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

from numcheck.errors import NumcheckError, UsageError
from numcheck.telemetry.fields import merge
from numcheck.telemetry.launch import LossModule, free_port, share_batch
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
            loss_value = _train_step(step_loss(task.batch_at(seed, step)), opt, t, ref)
            if not torch.isfinite(loss_value.detach()).all():
                break
    return t


def _train_step(loss_value, opt, t: Telemetry, ref: str):
    """Backward, optimizer step and the watch's step of one step's loss (a 0-d tensor, else
    a UsageError); returns the loss."""
    if not isinstance(loss_value, torch.Tensor) or loss_value.dim() != 0:
        got = (f"a tensor of shape {tuple(loss_value.shape)}"
               if isinstance(loss_value, torch.Tensor) else type(loss_value).__name__)
        raise UsageError(f"the loss of --model {ref!r} is {got}; it must be a 0-d "
                         "tensor (--loss: a callable (model, batch) -> loss)")
    opt.zero_grad(set_to_none=True)
    loss_value.backward()
    opt.step()
    t.step()
    return loss_value


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


# ---- several ranks: numcheck inspect --nproc N -----------------------------------------------

# How long a rank waits in a collective for the others before it fails. A rank that raises
# ends the run at once (torch.multiprocessing stops the other ranks); this bounds the rest (a
# rank stuck outside the collectives the others wait in) by an error instead of a hang.
RANK_TIMEOUT_S = 300
# The replica mismatches the printed line names (all of them are in rank{r}.json).
REPLICA_LINES = 5


class RankFailed(NumcheckError, RuntimeError):
    """A rank of ``run_ranks`` failed; the message ends with the last line of its error (its
    traceback is the chained exception's)."""


def _step_loss(model: nn.Module, batch, loss: str | None, ref: str):
    """The LossModule's loss: ``loss_of``'s (looked up on the model it is given: a deep copy's
    own)."""
    return loss_of(model, loss, ref)(batch)


def run_model(ref: str, nproc: int = 1, out="results/telemetry", **kwargs) -> tuple:
    """(records, first non-finite producer, the producer line to print) of ``ref`` trained as
    ``run`` trains it (``kwargs``: its arguments): in this process (``nproc`` 1), on ``nproc``
    ranks that this starts (``run_ranks``, their files under ``out``), or as one rank of a
    torchrun launch (``torchrun_rank``)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise UsageError(f"--nproc {nproc!r}: give a positive number of ranks")
    if _torchrun_world() > 1:
        return torchrun_rank(ref, nproc, out, **kwargs)
    if nproc == 1:
        t = run(ref, **kwargs)
        where = t.first_nonfinite()
        return t.records(), where, producer_line(where)
    return run_ranks(ref, nproc, out, **kwargs)


def _torchrun_world() -> int:
    """The world size of the torchrun launch this process is a rank of (RANK and WORLD_SIZE
    in the environment, no process group up yet), else 1."""
    dist = torch.distributed
    if "RANK" not in os.environ or not dist.is_available() or dist.is_initialized():
        return 1
    return int(os.environ.get("WORLD_SIZE", "1"))


def run_ranks(ref: str, nproc: int, out, **kwargs) -> tuple:
    """Train ``ref`` on ``nproc`` ranks started here (torch.multiprocessing, spawn: a fresh
    interpreter each, as torchrun gives; gloo on the CPU, NCCL with one GPU per rank where
    there are that many), each ``train_rank``; then ``collect`` their files from ``out``. A
    rank's UsageError is raised as such; any other failure as RankFailed."""
    import torch.multiprocessing as mp

    if not torch.distributed.is_available():
        raise UsageError(f"--nproc {nproc}: this torch build has no torch.distributed; run "
                         "with --nproc 1")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= nproc
    try:
        mp.start_processes(_spawned, args=(nproc, free_port(), cuda, ref, str(out), kwargs),
                           nprocs=nproc, join=True, start_method="spawn")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        last = str(e).strip().splitlines()[-1]
        kind, _, text = last.partition(": ")
        if kind == f"{UsageError.__module__}.{UsageError.__name__}":
            raise UsageError(text) from None
        raise RankFailed(f"--nproc {nproc}: rank {e.error_index} failed: {last}") from e
    return collect(out, nproc)


def torchrun_rank(ref: str, nproc: int, out, **kwargs) -> tuple:
    """This process as one rank of a torchrun launch (RANK, WORLD_SIZE, LOCAL_RANK and the
    rendezvous in the environment; NCCL on GPU LOCAL_RANK where every local rank has one, else
    gloo): ``train_rank``, then rank 0 ``collect``s every rank's files (``out`` must be one
    folder for all of them: shared storage across nodes). The other ranks return (None, None,
    None): rank 0 reports."""
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", "0"))
    if nproc not in (1, world):
        raise UsageError(f"--nproc {nproc} under torchrun ({world} ranks): torchrun starts "
                         "the ranks; drop --nproc")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and \
        torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", world))
    Path(out).mkdir(parents=True, exist_ok=True)
    _as_rank(rank, world, local if cuda else None, ref, str(out), kwargs)
    return collect(Path(out), world) if rank == 0 else (None, None, None)


def _spawned(rank: int, world: int, port: int, cuda: bool, ref: str, out: str,
             kwargs: dict) -> None:
    """A rank started by ``run_ranks``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _as_rank(rank, world, rank if cuda else None, ref, out, kwargs)


def _as_rank(rank: int, world: int, gpu: int | None, ref: str, out: str, kwargs: dict) -> None:
    """Join the process group (NCCL on GPU ``gpu``, gloo on the CPU without one), run
    ``train_rank``, wait for every rank's files, leave the group."""
    dist = torch.distributed
    device = torch.device("cpu") if gpu is None else torch.device("cuda", gpu)
    if gpu is not None:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if gpu is None else "nccl", rank=rank, world_size=world,
                            timeout=timedelta(seconds=RANK_TIMEOUT_S))
    try:
        train_rank(ref, out, device=device, **kwargs)
        dist.barrier()   # every rank's files are written before any rank reads them
    finally:
        dist.destroy_process_group()


def train_rank(ref: str, out, *, device=None, recipe=None, what_if=(), shadow: bool = False,
               steps: int = 5, seed: int = 0, every: int = 1, loss: str | None = None) -> None:
    """One rank in an initialized process group: ``ref`` built as ``run`` builds it (the
    seed's weights: the same on every rank, and DDP starts from rank 0's anyway), wrapped in
    DistributedDataParallel, trained with one thread on this rank's share of each global batch
    (``launch.share_batch``) under ``watch``; writes ``out/rank{r}.parquet`` (its records) and
    ``out/rank{r}.json`` (its first non-finite producer, the replica table)."""
    from torch.nn.parallel import DistributedDataParallel

    dist = torch.distributed
    torch.set_num_threads(1)   # the ranks share the machine's cores
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu") if device is None else torch.device(device)
    model, task, lr = load(ref, seed)
    ddp = DistributedDataParallel(LossModule(model.to(device), functools.partial(
                                      _step_loss, loss=loss, ref=ref)),
                                  device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=lr)
    stop = False
    with watch(ddp, recipe=recipe, shadow=shadow, what_if=what_if, every=every,
               optimizer=opt) as t:
        for step in range(steps):
            share = share_batch(task.batch_at(seed, step), rank, world, f"--nproc {world}",
                                device)
            loss_value = _train_step(ddp(share), opt, t, ref)
            if stop:
                break
            # every rank stops together (one leaving alone would leave the others waiting in
            # a collective), one step after any rank's loss went non-finite: the ranks that
            # received it through that step's all-reduce show it in their rows
            stop = not _finite_on_every_rank(loss_value)
    _write_rank(t, Path(out), rank)


def _finite_on_every_rank(loss_value: torch.Tensor) -> bool:
    """Whether every rank's loss is finite: one all_reduce (min) of a flag."""
    flag = torch.isfinite(loss_value.detach()).to(torch.float32).reshape(1)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag.item())


def _write_rank(t: Telemetry, out: Path, rank: int) -> None:
    t.records().to_parquet(out / f"rank{rank}.parquet", index=False)
    where = t.first_nonfinite()
    first = where._asdict() if isinstance(where, NoProducer) else {
        "where": list(where), "inputs": dict(where.inputs or {}), "rank": where.rank,
        "received": list(where.received)}
    replicas = t.replicas().assign(ranks=lambda d: d["ranks"].map(list))
    info = {"rank": rank, "first": first, "replicas": replicas.to_dict("records")}
    (out / f"rank{rank}.json").write_text(json.dumps(info, default=float), encoding="utf-8")


def collect(out, world: int) -> tuple:
    """(merged records of ``out/rank*.parquet``, the producer the ranks agreed on, the line
    to print: the producer line, the rank that made it and those it reached, the replicas
    that differed) of a run of ``world`` ranks."""
    out = Path(out)
    infos = [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8"))
             for r in range(world)]
    where = _agreed(infos)
    lines = [producer_line(where)]
    if where:
        got = where.received
        lines.append(f"made on rank {where.rank} of {world}; " + (
            f"received by rank{'s' if len(got) > 1 else ''} {', '.join(map(str, got))}"
            if got else "no other rank saw it before the run stopped"))
    rows = infos[0]["replicas"]   # (the same on every rank)
    if rows:
        shown = "; ".join(f"{r['parameter']} after step {r['step']} (ranks "
                          f"{', '.join(map(str, r['ranks']))}: max |diff| "
                          f"{r['max_abs_diff']:.3g})" for r in rows[:REPLICA_LINES])
        more = f"; {len(rows)} in all (rank0.json)" if len(rows) > REPLICA_LINES else ""
        lines.append(f"replicas differ across ranks: {shown}{more}")
    return merge([out / f"rank{r}.parquet" for r in range(world)]), where, "\n".join(lines)


def _agreed(infos: list[dict]) -> NonFinite | NoProducer:
    """The first non-finite producer of the ranks' files: the earliest (step, rank) any rank
    named (the watches' own rule, so also where the run ended between two of their
    agreements), ``received``: the other ranks the watches found it reached, or that saw a
    non-finite value themselves; without one, the NoProducer of the rank that saw a
    non-finite value first (else rank 0's)."""
    firsts = [i["first"] for i in infos]
    named = [f for f in firsts if "where" in f]
    if not named:
        seen = [f for f in firsts if f["step"] is not None]
        return NoProducer(**min(seen, key=lambda f: f["step"]) if seen else firsts[0])
    first = min(named, key=lambda f: (f["where"][0], f["rank"]))
    # a rank's own sighting: its own producer, or a non-finite value it could not attribute
    # (a rank that reports an agreed producer of another rank has its sighting in received)
    saw = {i["rank"] for i, f in zip(infos, firsts, strict=True)
           if f.get("rank", i["rank"]) == i["rank"] and ("where" in f or f["step"] is not None)}
    told = {r for f in named for r in f["received"]}
    where = NonFinite(*first["where"])
    where.inputs, where.rank = first["inputs"], first["rank"]
    where.received = tuple(sorted((saw | told) - {first["rank"]}))
    return where
