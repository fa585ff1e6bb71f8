"""What each candidate recipe would do to each linear layer's own GEMMs, that layer alone
(``nc.telemetry.sensitivity``; the input of ``plan``: docs/telemetry.md, "Which layers can take
which format").

The model runs its batches once in its own precision (no optimizer step). Every ``nn.Linear``
call's operands are kept (x (M, K), w (N, K), and the gradient of its output dy (M, N)), and
for each candidate recipe the three GEMMs of that layer are recomputed in float64 with the
candidate's fake-quant operands, blocks along each GEMM's reduction dim as
``convergence.linear.QuantLinear`` quantizes them:

    output       y  = q(x, K) q(w, K)^T        against x w^T
    grad_input   dx = q(dy, N) q(w, N)         against dy w
    grad_weight  dw = q(dy, M)^T q(x, M)       against dy^T x

Rows are telemetry records (``fields.COLUMNS``; ``what_if`` True, ``recipe`` the candidate,
``step`` the batch): the GEMM rows carry the shadow fields (``shadow_sqnr_db``: the layer's
own GEMM under the candidate, every other layer exact), the operand rows (input, weight,
grad_output) the quantization fields (underflow, saturation, block statistics) of
``fields.quant_stats``. One layer at a time is what a per-layer plan needs: an end-to-end
comparison mixes every upstream layer's error into each layer's (``compare``). A recipe's
random Hadamard transform is not applied here (the wgrad operands of nvfp4_rht_sr): its rows
measure the recipe without it.

``gemm_fields(x, w, dy, recipe, generator)`` is the computation of one call, used by ``plan``
on Gaussian operands of each layer's shapes as well.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from numcheck.errors import UsageError
from numcheck.telemetry import fields
from numcheck.telemetry.live import batch_loss

__all__ = ["gemm_fields", "resolve_candidate", "sensitivity"]

# The GEMM roles (the row's role names the GEMM by what it makes) and the operand roles.
GEMM_ROLES = ("output", "grad_input", "grad_weight")
OPERANDS = (("input", "x"), ("weight", "w"), ("grad_output", "grad"))


def resolve_candidate(c):
    """(name, recipe object) of a candidate: "bf16", a name of numcheck.quant.recipe.RECIPES,
    or a QuantRecipe-like object (has ``qdq``)."""
    from numcheck.convergence.linear import BF16
    from numcheck.quant.recipe import RECIPES

    if isinstance(c, str):
        if c == "bf16":
            return "bf16", BF16
        if c not in RECIPES:
            raise UsageError(f"candidate {c!r}: use bf16 or one of numcheck.quant.recipe.RECIPES "
                             f"({', '.join(RECIPES)}), or pass a QuantRecipe")
        return c, RECIPES[c]
    if callable(getattr(c, "qdq", None)):
        return str(getattr(c, "name", type(c).__name__)), c
    raise UsageError(f"candidate {c!r}: give a recipe name or a QuantRecipe (has .qdq)")


def _shadow(y: torch.Tensor, yq: torch.Tensor) -> dict[str, float]:
    fin = torch.isfinite(y) & torch.isfinite(yq)
    return {"calls": 1.0, "n": float(y.numel()), "sh_n": 1.0,
            "sh_sig_sq": float(torch.where(fin, y * y, 0.0).sum()),
            "sh_err_sq": float(torch.where(fin, (yq - y) ** 2, 0.0).sum()),
            "n_nan": float(torch.isnan(yq).sum()), "n_inf": float(torch.isinf(yq).sum())}


def gemm_fields(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor | None, recipe,
                generator: torch.Generator | None = None) -> dict[str, dict[str, float]]:
    """role -> raw fields of one linear call's GEMMs (and operands) under ``recipe``: x (M, K),
    w (N, K), dy (M, N) or None (no backward), float64 on the CPU (module doc)."""
    from numcheck.convergence.linear import padded_qdq

    out: dict[str, dict[str, float]] = {}
    qx = padded_qdq(recipe, "x", x, -1, generator)
    qw = padded_qdq(recipe, "w", w, -1, generator)
    out["output"] = _shadow(x @ w.T, qx @ qw.T)
    if dy is not None:
        out["grad_input"] = _shadow(dy @ w, padded_qdq(recipe, "grad", dy, -1, generator)
                                    @ padded_qdq(recipe, "w", w, 0, generator))
        out["grad_weight"] = _shadow(dy.T @ x, padded_qdq(recipe, "grad", dy, 0, generator).T
                                     @ padded_qdq(recipe, "x", x, 0, generator))
    for role, attr in OPERANDS:
        t = {"input": x, "weight": w, "grad_output": dy}[role]
        quantizer = getattr(recipe, attr, None)
        if t is None or quantizer is None or not hasattr(quantizer, "format"):
            continue
        got = {k: float(v) for k, v in fields.tensor_stats(t).items()}
        got.update({k: float(v) for k, v in fields.quant_stats(t, quantizer).items()})
        out[role] = got
    return out


def sensitivity(model: nn.Module, batches, candidates=("nvfp4", "mxfp8", "bf16"), *, loss=None,
                seed: int = 0):
    """Telemetry records (a DataFrame, ``fields.COLUMNS``) of what each candidate does to each
    ``nn.Linear``'s own GEMMs and operands on ``batches`` (module doc). ``loss``:
    ``(model, batch) -> scalar`` (default: ``model.loss(batch)``, else the model's output, its
    ``.loss`` or first item). The model is not changed: a deep copy runs."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"sensitivity: model must be an nn.Module, got {type(model).__name__}")
    batches = list(batches)
    if not batches:
        raise UsageError("sensitivity: no batches given")
    cands = [resolve_candidate(c) for c in candidates]
    m = copy.deepcopy(model)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    acc: dict[tuple, list[float]] = {}
    order: list[tuple] = []
    for step, batch in enumerate(batches):
        calls: list[list] = []
        handles = []

        def hook(name):
            def on_output(mod, args, out):
                if not (args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor)):
                    return
                cell = [name, fields.as_2d(args[0].detach()).to("cpu", torch.float64),
                        mod.weight.detach().to("cpu", torch.float64), None]
                calls.append(cell)
                if out.requires_grad:
                    out.register_hook(lambda g, c=cell: c.__setitem__(
                        3, fields.as_2d(g.detach()).to("cpu", torch.float64)))
            return on_output

        for name, mod in m.named_modules():
            if isinstance(mod, nn.Linear):
                handles.append(mod.register_forward_hook(hook(name)))
        try:
            value = batch_loss(m, batch, loss, "sensitivity")
            if value.requires_grad:
                value.backward()
        finally:
            for h in handles:
                h.remove()
        m.zero_grad(set_to_none=True)
        for name, x, w, dy in calls:
            for cname, recipe in cands:
                for role, got in gemm_fields(x, w, dy, recipe, gen).items():
                    pass_ = "backward" if role.startswith("grad") else "forward"
                    key = (step, name, role, pass_, cname)
                    if key not in acc:
                        acc[key] = fields.host_identity()
                        order.append(key)
                    fields.host_update(acc[key], got)
    rows = [{"step": k[0], "rank": 0, "module": k[1], "op": "linear", "role": k[2],
             "pass": k[3], "recipe": k[4], "what_if": True,
             **dict(zip(fields.NAMES, acc[k], strict=True)), "digest": float("nan")}
            for k in order]
    return fields.frame(rows)
