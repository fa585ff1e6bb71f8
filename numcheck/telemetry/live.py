"""Two configurations of one model, compared layer by layer in one process
(``nc.telemetry.compare``; docs/telemetry.md, "Two configurations, live").

The same batches run through configuration A and configuration B of copies of one model (the
same weights; no optimizer step, so every batch meets the same weights and a difference is the
configuration's alone). Each module's output (forward) and the gradient of its output
(backward) are kept from A's run and compared with B's: SQNR of B against A in float64, per
(batch, module, role), and so is each parameter's gradient (role ``grad_weight``,
``grad_bias``, ...: the weight-gradient GEMM, which no output gradient shows). The first row,
in A's execution order (the forward's modules in the order they ran, then the backward's in
the order their gradients arrived, then the parameters' gradients), whose SQNR is below the
threshold is ``first``: where B parts from A.

A configuration is a recipe name ("fp32"; "bf16": autocast, as the convergence suite runs it;
a name of numcheck.quant.recipe.RECIPES: every nn.Linear becomes a QuantLinear), a
QuantRecipe-like object (the same), or a function ``model -> model`` (anything else: one
layer's kernel swapped, a planted fault, a per-layer plan); it gets a deep copy.

The threshold: ``threshold_db``, or by default DROP_DB below the median SQNR of the batch's
rows of the same role: a layer that loses a factor of ~3 in amplitude against the layers
around it, whatever the recipe's own level (bf16 ~ 50 dB, e4m3 ~ 30 dB, e2m1 ~ 15 dB).
"""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from numcheck.errors import UsageError

# 10 dB: a factor of 3.2 in error amplitude against the median layer of the batch; the tiny
# models' layers under one uniform recipe spread by 3-9 dB around their median (measured in
# tests/test_telemetry_compare.py), a wrong scale or a dropped bit moves a layer by 10+
DROP_DB = 10.0


@dataclass
class Comparison:
    """``compare``'s answer: ``rows`` (a DataFrame: batch, module, role, sqnr_db, rel_l2, n,
    nonfinite_a, nonfinite_b), in A's execution order; ``first``: the first row below the
    threshold (a dict; None when none is), ``threshold``: how it was set."""
    rows: object
    first: dict | None
    threshold: str

    def __bool__(self) -> bool:
        """True where B parts from A somewhere (a row below the threshold)."""
        return self.first is not None

    def summary(self) -> str:
        df = self.rows
        head = f"{len(df)} rows (batch, module, role) compared, threshold: {self.threshold}"
        if self.first is None:
            return head + "; no layer below it"
        f = self.first
        return (f"{head}; the first below it: batch {f['batch']} {f['module']} {f['role']} "
                f"SQNR {f['sqnr_db']:.1f} dB (B against A)")


def _configure(model: nn.Module, config, seed: int, what: str):
    """(a configured deep copy, the context its forward and backward run in)."""
    from numcheck.convergence.linear import QuantState, apply_recipe, is_quant_recipe
    from numcheck.convergence.recipes import resolve

    m = copy.deepcopy(model)
    device = next((p.device for p in m.parameters()), torch.device("cpu"))
    plain = contextlib.nullcontext
    if config is None or config == "fp32":
        return m, plain
    if isinstance(config, str):
        spec = resolve(config)
        if spec.skip:
            raise UsageError(f"compare: {what}={config!r} cannot run here: {spec.skip}")
        if spec.kind == "bf16":
            return m, lambda: torch.autocast(device.type, dtype=torch.bfloat16)
        if spec.kind == "convert":
            return spec.obj(m), plain
        return apply_recipe(m, spec.obj, QuantState(seed, str(device))), plain
    if is_quant_recipe(config):
        return apply_recipe(m, config, QuantState(seed, str(device))), plain
    if callable(config):
        out = config(m)
        if not isinstance(out, nn.Module):
            raise UsageError(f"compare: {what} is a function that returned "
                             f"{type(out).__name__}, not the model (model -> model)")
        return out, plain
    raise UsageError(f"compare: {what}={config!r}: give a recipe name, a QuantRecipe or a "
                     "function model -> model")


def batch_loss(model: nn.Module, batch, loss, who: str = "compare"):
    """The scalar loss of ``model`` on ``batch``: ``loss(model, batch)`` when given, else
    ``model.loss(batch)``, else the model's output, its ``.loss`` or its first item."""
    if loss is not None:
        return loss(model, batch)
    if hasattr(model, "loss"):
        return model.loss(batch)
    out = model(**batch) if isinstance(batch, dict) else model(batch)
    out = getattr(out, "loss", out)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not (isinstance(out, torch.Tensor) and out.numel() == 1):
        raise UsageError(f"{who}: the model's output is no scalar loss; give "
                         "loss=lambda model, batch: <a scalar tensor>")
    return out


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):
        return next((t for t in x if isinstance(t, torch.Tensor)), None)
    if isinstance(x, dict):
        return next((t for t in x.values() if isinstance(t, torch.Tensor)), None)
    return getattr(x, "logits", None)   # a model library's output object


def _record(model: nn.Module, batch, loss, ctx) -> list[tuple[str, str, torch.Tensor]]:
    """(module, role, float64 CPU copy) of every named module's output and output gradient,
    in execution order (the forward's, then the backward's), then of every parameter's
    gradient (the module that owns it, ``grad_<name>``)."""
    fwd: list = []
    bwd: list = []
    handles = []

    def hook(name):
        def on_output(m, args, out):
            t = _first_tensor(out)
            if t is None or not t.is_floating_point():
                return
            fwd.append((name, "output", t.detach().to("cpu", torch.float64)))
            if t.requires_grad:
                t.register_hook(lambda g: bwd.append(
                    (name, "grad_output", g.detach().to("cpu", torch.float64))))
        return on_output

    for name, m in model.named_modules():
        if name:   # the root's output is the loss's input: its layers say more
            handles.append(m.register_forward_hook(hook(name)))
    try:
        with ctx():
            value = batch_loss(model, batch, loss)
        value.backward()
    finally:
        for h in handles:
            h.remove()
    params = []
    for full, p in model.named_parameters():
        if p.grad is not None:
            owner, _, leaf = full.rpartition(".")
            params.append((owner, f"grad_{leaf}", p.grad.detach().to("cpu", torch.float64)))
    model.zero_grad(set_to_none=True)
    return fwd + bwd + params


def _sqnr(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, int, int]:
    fin = torch.isfinite(a) & torch.isfinite(b)
    d = torch.where(fin, b - a, 0.0)
    sig = float(torch.where(fin, a * a, 0.0).sum())
    err = float((d * d).sum())
    bad_a, bad_b = int((~torch.isfinite(a)).sum()), int((~torch.isfinite(b)).sum())
    if bad_a != bad_b:
        return -math.inf, math.inf, bad_a, bad_b
    rel = math.sqrt(err / sig) if sig > 0 else (0.0 if err == 0 else math.inf)
    db = math.inf if err == 0 else (10.0 * math.log10(sig / err) if sig > 0 else -math.inf)
    return db, rel, bad_a, bad_b


def compare(model: nn.Module, batches, a="fp32", b="bf16", *, loss=None,
            threshold_db: float | None = None, seed: int = 0) -> Comparison:
    """Run ``batches`` through configurations ``a`` and ``b`` of ``model`` and compare every
    module's output and output gradient (module doc). ``loss``: ``(model, batch) -> scalar``
    (default: ``model.loss(batch)``, else the model's output, its ``.loss`` or first item).
    ``threshold_db``: absolute; default DROP_DB below the batch's median of the role."""
    import pandas as pd

    if not isinstance(model, nn.Module):
        raise UsageError(f"compare: model must be an nn.Module, got {type(model).__name__}")
    batches = list(batches)
    if not batches:
        raise UsageError("compare: no batches given")
    ma, ctx_a = _configure(model, a, seed, "a")
    mb, ctx_b = _configure(model, b, seed, "b")
    rows = []
    for i, batch in enumerate(batches):
        got_a = _record(ma, batch, loss, ctx_a)
        got_b = {(n, r): t for n, r, t in _record(mb, batch, loss, ctx_b)}
        for name, role, ta in got_a:
            tb = got_b.get((name, role))
            if tb is None or tb.shape != ta.shape:
                continue   # a module B does not have (a fused replacement): nothing to compare
            db, rel, na, nb = _sqnr(ta, tb)
            rows.append({"batch": i, "module": name, "role": role, "sqnr_db": db,
                         "rel_l2": rel, "n": ta.numel(), "nonfinite_a": na, "nonfinite_b": nb})
    df = pd.DataFrame(rows, columns=["batch", "module", "role", "sqnr_db", "rel_l2", "n",
                                     "nonfinite_a", "nonfinite_b"])
    if threshold_db is not None:
        limit = pd.Series(float(threshold_db), index=df.index)
        how = f"{threshold_db:g} dB"
    else:
        finite = df["sqnr_db"].where(df["sqnr_db"].abs() != math.inf)
        med = finite.groupby([df["batch"], df["role"]]).transform("median")
        limit = (med - DROP_DB).fillna(-math.inf)
        how = f"{DROP_DB:g} dB below the batch's median SQNR of the role"
    below = df.index[df["sqnr_db"] < limit]
    first = None
    if len(below):
        first = df.loc[below[0]].to_dict()
        first["threshold_db"] = float(limit[below[0]])
    return Comparison(df, first, how)
