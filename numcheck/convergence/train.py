"""One short training run: (model, recipe spec, seed, steps) -> per-step loss, grad norm,
saturation. Paired by construction: initial weights and batches depend on (model, seed) only.

Optimizer: AdamW (betas 0.9/0.95, no weight decay), linear warm-up over the first 10% of steps,
cosine decay to 10% of the peak, gradient clipping at norm 1.0 (the recorded grad norm is the
one before clipping). A run whose loss turns non-finite stops there; the rest of its series is
NaN (the gate fails it either way, and the remaining steps would only cost time).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import numpy as np
import torch

from numcheck.measure.numerics import PINNED, pinned
from numcheck.frontends.progress import training_step
from numcheck.convergence.linear import QuantState, apply_plan, apply_recipe
from numcheck.convergence.models import build
from numcheck.convergence.recipes import Spec

__all__ = ["train"]

CLIP = 1.0
# One thread: results must not depend on how many cores a CI machine has (sums differ between
# 1 and 2 threads), and these tiny GEMMs run faster on one thread than on two (measured: a
# tiny_lm step took 20 ms on 1 thread, ~10x longer on 2 threads of a loaded 2-core machine).
STATE = replace(PINNED, num_threads=1)
WARMUP_FRACTION = 0.1


def _lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, int(WARMUP_FRACTION * steps))
    if step < warm:
        return peak * (step + 1) / warm
    p = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def train(model_name: str, spec: Spec, seed: int, steps: int, device: str = "cpu",
          layout=None) -> dict:
    """Returns {"loss", "grad_norm", "sat" (fraction of quantized values clipped, NaN where
    not measured), "grad_bias" (relative magnitude bias of the gradient quantizer per step,
    NaN where not measured), "sat_by_role" {role: max fraction}, "seconds"} as numpy float64
    arrays. ``layout``: a ``layouts.Layout`` (this rank of a data-parallel run: its rows of
    each global batch, values reduced over the ranks, the same on each; plus "random_state",
    the violated random-state invariants)."""
    import time

    t0 = time.perf_counter()
    model, task, lr = build(model_name, seed)
    state = None
    dp_rank = layout.rank if layout is not None else 0
    if spec.kind == "quant":
        state = QuantState(seed, device, dp_rank)
        apply_recipe(model, spec.obj, state)
    elif spec.kind == "factory":
        apply_recipe(model, spec.obj)
    elif spec.kind == "convert":
        model = spec.obj(model)
    elif spec.kind == "plan":
        state = QuantState(seed, device, dp_rank)
        apply_plan(model, spec.obj, state)
    model.to(device)
    step_loss = model.loss
    if layout is not None:
        model, step_loss = layout.wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    loss_s = np.full(steps, np.nan)
    gn_s = np.full(steps, np.nan)
    sat_s = np.full(steps, np.nan)
    gbias_s = np.full(steps, np.nan)
    sat_role: dict[str, float] = {}
    dev_type = torch.device(device).type
    with pinned(STATE):
        for step in range(steps):
            training_step(step, steps)  # the terminal's progress line (numcheck.frontends.progress)
            batch = task.batch_at(seed, step)
            if layout is not None:
                batch = layout.share(batch)
            batch = {k: v.to(device) for k, v in batch.items()}
            for g in opt.param_groups:
                g["lr"] = _lr_at(step, steps, lr)
            if state is not None:
                state.reset_counts()
            ctx = (torch.autocast(dev_type, dtype=torch.bfloat16) if spec.kind == "bf16"
                   else contextlib.nullcontext())
            with ctx:
                loss = step_loss(batch)
            loss_v = float(loss.detach()) if layout is None else layout.mean(float(loss.detach()))
            loss_s[step] = loss_v
            if not math.isfinite(loss_v):
                break
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = _grad_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
            gn_s[step] = gn
            if layout is not None and state is not None:
                _reduce_counts(state, layout)
            if state is not None and state.total:
                sat_s[step] = sum(state.saturated.values()) / sum(state.total.values())
                if state.grad_bias_den > 0:
                    gbias_s[step] = state.grad_bias_num / state.grad_bias_den
                for role, n in state.total.items():
                    sat_role[role] = max(sat_role.get(role, 0.0), state.saturated[role] / n)
            if not math.isfinite(gn):
                break
            opt.step()
    if layout is not None and state is not None:
        from numcheck.telemetry.random_state import check
        violated = check(*state.random_state(spec.obj if spec.kind == "quant" else None),
                         shared_group=layout.group, distinct_group=layout.group)
        random_state = [str(v) for v in violated]
    else:
        random_state = []
    return {"loss": loss_s, "grad_norm": gn_s, "sat": sat_s, "grad_bias": gbias_s,
            "sat_by_role": sat_role, "random_state": random_state,
            "seconds": time.perf_counter() - t0}


def _grad_norm(gn) -> float:
    """A clip_grad_norm_ result as a float: FSDP2's is a DTensor (a partial sum of squares)."""
    full = getattr(gn, "full_tensor", None)
    return float(full() if callable(full) else gn)


def _reduce_counts(state: QuantState, layout) -> None:
    """The saturation and gradient-bias sums of every rank (each rank counted its own rows)."""
    roles = sorted(state.total)
    got = layout.sum(state.grad_bias_num, state.grad_bias_den,
                     *(state.saturated[r] for r in roles), *(state.total[r] for r in roles))
    state.grad_bias_num, state.grad_bias_den = got[0], got[1]
    n = len(roles)
    for i, r in enumerate(roles):
        state.saturated[r], state.total[r] = int(got[2 + i]), int(got[2 + n + i])
