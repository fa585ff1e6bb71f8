"""Quantized linear layer built on a recipe's fake-quant ``qdq``, and ``apply_recipe``.

GEMM operands and the axis each is quantized along (blocks run along the contraction dim):

    forward  y  = qdq("x", x, along K) @ qdq("w", w, along K)^T          x (M,K), w (N,K)
    dgrad    dx = qdq("grad", dy, along N) @ qdq("w", w, along N)         dy (M,N)
    wgrad    dw = qdq("grad", dy, along M)^T @ qdq("x", x, along M)

Everything else is straight-through: the quantizers have no derivative of their own, the
backward GEMMs above are the gradient. Master weights stay fp32 (the optimizer updates the
unquantized parameter); bias is added and reduced in fp32, unquantized.

Recipes with ``hadamard = h`` (a random Hadamard transform, RHT; ``QuantRecipe.qdq`` does not
apply it) get it here as NVIDIA's NVFP4 recipe applies it: to the two wgrad operands along M
only (``numcheck.quant.transforms.hadamard``, block h, one sign vector per run from its seed), so
(Q^T dy)^T (Q^T x) = dy^T x before quantization. (``numcheck.quant.scaled_matmul`` applies it to
every GEMM; the forward and dgrad GEMMs here follow the training recipe instead.) A recipe object
whose qdq applies its own transform can say so with ``applies_hadamard = True``.

Saturation: every qdq call counts the values that were clipped, defined as |t| greater than
SAT_MARGIN (1.125) x the largest magnitude the quantizer returned for that tensor, max|qdq(t)|.
For tensor-wise scales that is the clipped values (a stale FP8 scale clips everything above
448/scale to that value) except those clipped by less than 12.5%; for block scales a lower bound
(a block clipped below the tensor's maximum is not counted). FP4 blocks whose largest element
rounds down by more than 12.5% (MX floor scales: 4.6 -> 4) can count; at most one per tensor.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch import nn

from numcheck.errors import UsageError

__all__ = ["BF16", "QuantLinear", "QuantState", "apply_plan", "apply_recipe", "is_quant_recipe",
           "padded_qdq"]

# A value counts as saturated when |t| > 1.125 max|qdq(t)|: 1/8 is e4m3's relative spacing
# below 448 (2^-3), so an e4m3-rounded scale (NVFP4) or an fp32 scale rounding never counts;
# measured on healthy current-scaling runs: fraction 3e-5 (~1/numel) with margin 1, 0 with 1.125.
SAT_MARGIN = 1.125
# GEMM operands are zero-padded to multiples of 32 on both dims before qdq and cut back after:
# MX blocks need K % 32 == 0 and NVFP4 2-D weight tiles 16 x 16 (tiny_dit has 8-channel layers).
# Zeros change no block's amax and no product.
PAD = 32


def is_quant_recipe(obj) -> bool:
    return callable(getattr(obj, "qdq", None))


class QuantState:
    """Per-run state shared by every QuantLinear of a model: SR generator, RHT signs, counters.

    ``dp_rank``: the data-parallel rank (numcheck.convergence.layouts): each draws its own SR
    stream (rank 0's is the one-process stream), while the RHT signs depend on the seed alone,
    the same on every rank (numcheck.telemetry.random_state: the invariants, checked)."""

    def __init__(self, seed: int, device, dp_rank: int = 0) -> None:
        from numcheck.cases.inputs import seed_for
        sr = ("convergence-sr", seed) + ((dp_rank,) if dp_rank else ())
        self.generator = torch.Generator(device=device).manual_seed(seed_for(*sr))
        self._sign_seed = seed_for("convergence-rht", seed)
        self._signs: dict[int, torch.Tensor] = {}
        self.saturated: dict[str, int] = defaultdict(int)
        self.total: dict[str, int] = defaultdict(int)
        # Relative magnitude bias of the gradient quantizer, sum((q - t) sign t) / sum |t|:
        # ~0 for stochastic rounding (unbiased), negative when small gradients round to zero.
        self.grad_bias_num = 0.0
        self.grad_bias_den = 0.0

    def reset_counts(self) -> None:
        self.saturated.clear()
        self.total.clear()
        self.grad_bias_num = self.grad_bias_den = 0.0

    def count(self, role: str, t: torch.Tensor, q: torch.Tensor, margin: float = SAT_MARGIN
              ) -> None:
        with torch.no_grad():
            top = q.abs().amax() if q.numel() else q.new_zeros(())
            self.saturated[role] += int((t.abs() > margin * top).sum())
            self.total[role] += t.numel()
            if role == "grad":
                t64, q64 = t.double(), q.double()
                self.grad_bias_num += float(((q64 - t64) * t64.sign()).sum())
                self.grad_bias_den += float(t64.abs().sum())

    def random_state(self, recipe) -> tuple[dict, dict]:
        """(shared, distinct) items of numcheck.telemetry.random_state.check: the RHT signs a
        recipe with ``hadamard`` uses, the SR stream, and what a recipe that holds random
        state of its own declares by a ``random_state()`` method returning (shared,
        distinct)."""
        h = getattr(recipe, "hadamard", None)
        shared = {f"rht signs (h={h})": self.signs(h, None)} if h and not getattr(
            recipe, "applies_hadamard", False) else {}
        distinct = {"sr stream": self.generator}
        own = getattr(recipe, "random_state", None)
        if callable(own):
            more_shared, more_distinct = own()
            shared, distinct = {**shared, **more_shared}, {**distinct, **more_distinct}
        return shared, distinct

    def signs(self, h: int, device) -> torch.Tensor:
        if h not in self._signs:
            from numcheck.quant.transforms import rht_signs
            self._signs[h] = rht_signs(h, seed=self._sign_seed + h)
        return self._signs[h]


def _rht_rows(t: torch.Tensor, h: int, signs: torch.Tensor) -> torch.Tensor:
    """Q^T t along dim 0 (M) in blocks of h rows (numcheck.quant.transforms.hadamard). Both
    wgrad operands get the same signs, so the product is unchanged. An M that is not a multiple
    of h is zero-padded to one: zero rows add nothing to the product, transformed or not (a
    data-parallel rank's share of the rows can fall below h: tiny_dit's conditioning path
    has 16 rows in one process, 8 on each of 2 ranks)."""
    from numcheck.quant.transforms import hadamard
    pad = -t.shape[0] % h
    if pad:
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])])
    return hadamard(t, h, dim=0, signs=signs).to(t.dtype)


class _QLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, recipe, state):
        x2 = x.reshape(-1, x.shape[-1])
        qx = _q(recipe, state, "x", x2, -1)
        qw = _q(recipe, state, "w", w, -1)
        y = qx @ qw.T
        if b is not None:
            y = y + b
        ctx.save_for_backward(x2, w)
        ctx.recipe, ctx.state, ctx.has_bias, ctx.x_shape = recipe, state, b is not None, x.shape
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, w = ctx.saved_tensors
        r, st = ctx.recipe, ctx.state
        dy2 = dy.reshape(-1, dy.shape[-1])
        dx = _q(r, st, "grad", dy2, -1) @ _q(r, st, "w", w, 0)          # contraction over N
        gw, xw = dy2, x2
        h = getattr(r, "hadamard", None)
        if h and not getattr(r, "applies_hadamard", False):
            signs = st.signs(h, dy2.device)
            gw, xw = _rht_rows(dy2, h, signs), _rht_rows(x2, h, signs)
        dw = _q(r, st, "grad", gw, 0).T @ _q(r, st, "x", xw, 0)          # contraction over M
        db = dy2.sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.x_shape), dw, db, None, None


def padded_qdq(recipe, role: str, t: torch.Tensor, dim: int,
               generator: torch.Generator | None) -> torch.Tensor:
    """``recipe.qdq`` of a 2-D GEMM operand along ``dim``, zero-padded to multiples of PAD on
    both dims and cut back; t itself where the recipe leaves the role alone."""
    rows, cols = t.shape
    pr, pc = (-rows) % PAD, (-cols) % PAD
    tp = torch.nn.functional.pad(t, (0, pc, 0, pr)) if pr or pc else t
    qp = recipe.qdq(role, tp, dim=dim, generator=generator)
    if qp.shape != tp.shape or qp.dtype != tp.dtype:
        raise UsageError(f"recipe {getattr(recipe, 'name', recipe)!r}: qdq({role!r}) returned "
                         f"{tuple(qp.shape)} {qp.dtype} for {tuple(tp.shape)} {tp.dtype}; "
                         "fake-quant must keep shape and dtype")
    if qp is tp:
        return t
    return qp[:rows, :cols] if pr or pc else qp


def _q(recipe, state: QuantState, role: str, t: torch.Tensor, dim: int) -> torch.Tensor:
    q = padded_qdq(recipe, role, t, dim, state.generator)
    if q is not t:
        state.count(role, t, q, _margin(recipe, role))
    return q


class QuantLinear(nn.Module):
    """Drop-in nn.Linear whose GEMMs run through ``recipe.qdq``; fp32 master weight and bias."""

    def __init__(self, linear: nn.Linear, recipe, state: QuantState) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.recipe, self.state = recipe, state
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _QLinearFn.apply(x, self.weight, self.bias, self.recipe, self.state)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, "
                f"recipe={getattr(self.recipe, 'name', self.recipe)!r}")


def apply_recipe(model: nn.Module, recipe, state: QuantState | None = None) -> nn.Module:
    """Swap every ``nn.Linear`` of ``model`` (in place) and return it.

    ``recipe`` is a QuantRecipe-like object (has ``qdq(role, t, dim, generator)``): each Linear
    becomes a QuantLinear sharing the original parameters. Or a module factory
    ``f(linear: nn.Linear) -> nn.Module`` (a user's own quantized linear, torchao's
    Float8Linear.from_float, ...): each Linear is replaced by what it returns, which must keep
    training the parameters it was given.
    """
    if is_quant_recipe(recipe):
        if state is None:
            raise UsageError("apply_recipe: a QuantRecipe needs a QuantState (seeded SR stream)")
        make: Callable[[nn.Linear], nn.Module] = lambda lin: QuantLinear(lin, recipe, state)  # noqa: E731
    elif callable(recipe):
        make = recipe
    else:
        raise UsageError(f"recipe {recipe!r}: pass a QuantRecipe (has .qdq) or a callable "
                         "nn.Linear -> nn.Module")
    for name, child in list(model.named_children()):
        if type(child) is nn.Linear:
            setattr(model, name, make(child))
        else:
            apply_recipe(child, recipe, state)
    return model


class _BF16Operand:
    """A bf16 GEMM operand: the cast autocast makes (round to nearest even; bf16 has fp32's
    range, so nothing saturates or flushes that fp32 did not). A training-path cast, not a
    reference: numcheck's own rounding is for references."""

    @staticmethod
    def qdq(t: torch.Tensor, dim: int = -1, generator=None) -> torch.Tensor:
        return t.to(torch.bfloat16).to(t.dtype)


class _BF16Recipe:
    """``bf16`` as one layer's recipe (a per-layer plan's widest choice): both operands of each
    GEMM rounded to bf16, products summed in fp32, as torch.autocast runs a linear layer."""

    name = "bf16"
    x = w = grad = _BF16Operand()
    bits_per_element = 16.0

    def qdq(self, role: str, t: torch.Tensor, dim: int = -1, generator=None) -> torch.Tensor:
        return t.to(torch.bfloat16).to(t.dtype)


BF16 = _BF16Recipe()


def apply_plan(model: nn.Module, recipes: dict, state: QuantState) -> nn.Module:
    """Swap each named ``nn.Linear`` of ``model`` (module name -> QuantRecipe-like object) for
    a QuantLinear of its own recipe, in place; the other layers stay as they are."""
    missing = [n for n in recipes if not isinstance(_submodule(model, n), nn.Linear)]
    if missing:
        raise UsageError(f"per-layer plan: {', '.join(missing)}: no nn.Linear of that name in "
                         f"{type(model).__name__} (a plan is made for one model)")
    for name, recipe in recipes.items():
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, leaf, QuantLinear(getattr(owner, leaf), recipe, state))
    return model


def _submodule(model: nn.Module, name: str):
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _margin(recipe, role: str) -> float:
    """Saturation margin of a role: formats whose block amax lands above the element max by
    design (MX ``floor`` scales: the OCP rule puts it in [2^emax, 2^(emax+1)) of the element
    grid, above its max for every element type: e2m1 8/6, e4m3 512/448; the format's
    ``amax_overshoot``) count only values beyond that design ratio."""
    fmt = getattr(getattr(recipe, role, None), "format", None)
    return SAT_MARGIN if fmt is None else max(SAT_MARGIN, fmt.amax_overshoot)
