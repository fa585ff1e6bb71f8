"""Tiny, deterministic, CPU-friendly models; each owns its synthetic task and its loss.

All three stay within 2 blocks and width 128, and every projection is a plain ``nn.Linear`` so a
recipe is applied by swapping them (``linear.apply_recipe``). Attention, norms, embeddings and
the loss stay outside the swapped layers (as in FP8/FP4 training stacks, where only the GEMMs of
linear layers are quantized).

* ``mlp``: 32 -> 128 -> 128 -> 32 SiLU MLP regressing a random tanh teacher (MSE).
* ``tiny_lm``: 2-block pre-norm transformer LM, width 64, 4 heads, RMSNorm, RoPE causal
  attention, SwiGLU MLP (hidden 128), untied LM head; next-token cross-entropy on a synthetic
  second-order Markov grammar (vocab 64, sequence 32).
* ``tiny_dit``: 2-block diffusion transformer, width 64, 4 heads, adaLN-Zero modulation from
  (timestep, class) conditioning, GELU MLP (hidden 128); rectified-flow velocity MSE on
  class-conditional Gaussian-mixture latents (16 tokens x 8 channels, 8 classes).

``PLANTED`` holds variants with planted sensitive layers (``mlp_outliers``,
``tiny_lm_outliers``: massive activations and loud gradients, below), numcheck plan's test bed;
they train by name and stay out of MODELS' default list.

Initial weights are a pure function of the seed (``torch.random.fork_rng`` + a sha256 seed), so
every recipe of one seed starts from the same weights as the reference.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from numcheck.errors import UsageError
from numcheck.cases.inputs import seed_for
from numcheck.convergence.data import Grammar, Latents, Teacher
from numcheck.telemetry.op_classes import register

__all__ = ["MODELS", "PLANTED", "build"]


# Planted sensitivities (PLANTED, numcheck plan's test bed: docs/telemetry.md "Which layers can
# take which format"). A massive activation: a channel 2^8 large, ~2^10 x the SwiGLU product's
# rms (0.2-0.3 at init, measured), constant across tokens, as the massive activations of real
# LLMs are (Sun et al. 2024, "Massive activations in large language models": 10^3-10^4 x the
# median, input-agnostic, bias-like); a loud gradient: a channel whose output gradient is 2^10
# x the others'. Both channels are dead in exact arithmetic (their weight column / row is zero
# and held there), so the fp32 and bf16 models compute the plain model minus a few channels;
# only a quantizer whose block holds one loses the block's other values.
MASSIVE = 2.0 ** 8
LOUD = 2.0 ** 10


def _plant(model: nn.Module, width: int, massive, loud, dead: dict) -> None:
    """Give ``model`` the buffers of its planted channels (``keep``: 0 on the massive ones,
    ``massive``: MASSIVE there, ``gain``: LOUD on the loud ones) and zero its dead entries
    (``dead``: parameter name -> (dim, indices)), held at zero by ``_hold_dead``."""
    keep, gain = torch.ones(width), torch.ones(width)
    keep[list(massive)] = 0.0
    gain[list(loud)] = LOUD
    model.register_buffer("keep", keep, persistent=False)
    model.register_buffer("massive", (1.0 - keep) * MASSIVE, persistent=False)
    model.register_buffer("gain", gain, persistent=False)
    model._dead = {name: (dim, tuple(idx)) for name, (dim, idx) in dead.items()}
    with torch.no_grad():
        for name, (dim, idx) in model._dead.items():
            if idx:
                model.get_parameter(name).index_fill_(dim, torch.tensor(idx), 0.0)


def _hold_dead(model: nn.Module) -> None:
    """Zero the gradients of a planted model's dead entries (``model._dead``: parameter name ->
    (dim, indices)), so no optimizer moves them: a hook on the Parameter itself (a recipe's
    QuantLinear shares it), registered again after a deepcopy (which drops tensor hooks)."""
    for name, (dim, idx) in model._dead.items():
        w = model.get_parameter(name)
        if idx and not getattr(w, "_numcheck_dead", False):
            index = torch.tensor(idx, dtype=torch.long)
            w.register_hook(lambda g, d=dim, i=index: g.index_fill(d, i.to(g.device), 0.0))
            w._numcheck_dead = True


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, width: int = 128, d_out: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.silu(self.fc2(F.silu(self.fc1(x)))))

    def loss(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(self(b["x"]).float(), b["y"])


class PlantedMLP(MLP):
    """mlp with planted channels (PLANTED): ``massive`` input channels of fc3 (replaced by
    MASSIVE; fc3's columns there zero) and ``loud`` output channels of fc2 (their gradient
    scaled by LOUD; fc2's rows and bias there zero, so they output 0 and silu(0) = 0)."""

    def __init__(self, massive=(), loud=()) -> None:
        super().__init__()
        _plant(self, self.fc2.out_features, massive, loud,
               {"fc3.weight": (1, massive), "fc2.weight": (0, loud), "fc2.bias": (0, loud)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _hold_dead(self)
        h = F.silu(self.fc2(F.silu(self.fc1(x))) * self.gain)
        return self.fc3(h * self.keep + self.massive)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)) * self.weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on (B, H, S, D)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _residual(x: torch.Tensor, h: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
    """The residual add, gated in a DiT block (adaLN-Zero's gate)."""
    return x + h if gate is None else x + gate * h


def _attention(q, k, v, causal: bool) -> torch.Tensor:
    """Explicit softmax(QK^T / sqrt(d)) V in fp32 (outside the quantized GEMMs)."""
    q, k, v = q.float(), k.float(), v.float()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    return torch.softmax(s, dim=-1) @ v


# What telemetry watches between the linears of these models (numcheck.telemetry.register: the
# calls become rows, with float64 shadows, under these ops; nothing changes unwatched)
_rope = register(_rope, "rope")
_attention = register(_attention, "attention")
_residual = register(_residual, "residual")


class LMBlock(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.w_gate = nn.Linear(d, hidden, bias=False)
        self.w_up = nn.Linear(d, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = _attention(_rope(q.float(), cos, sin), _rope(k.float(), cos, sin), v, causal=True)
        x = _residual(x, self.proj(a.transpose(1, 2).reshape(b, s, d)))
        return _residual(x, self.mlp(self.norm2(x)))

    def mlp(self, h):
        return self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class PlantedLMBlock(LMBlock):
    """An LMBlock whose SwiGLU MLP carries planted channels: ``massive`` (w_down's input channels
    replaced by MASSIVE, w_down's columns there zero) and ``loud`` (w_up's output channels whose
    gradient is scaled by LOUD, w_up's rows there zero)."""

    def __init__(self, d: int, heads: int, hidden: int, massive=(), loud=()) -> None:
        super().__init__(d, heads, hidden)
        _plant(self, hidden, massive, loud, {"w_down.weight": (1, massive),
                                             "w_up.weight": (0, loud)})

    def mlp(self, h):
        _hold_dead(self)
        u = self.w_up(h) * self.gain
        return self.w_down(F.silu(self.w_gate(h)) * u * self.keep + self.massive)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 64, heads: int = 4, hidden: int = 128,
                 blocks: int = 2, seq: int = 32, plants=None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(PlantedLMBlock(d, heads, hidden, **plants[i]) if plants
                                    else LMBlock(d, heads, hidden) for i in range(blocks))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        s = tokens.shape[1]
        for blk in self.blocks:
            x = blk(x, self.cos[:s], self.sin[:s])
        return self.head(self.norm(x))

    def loss(self, b):
        logits = self(b["tokens"]).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["targets"].reshape(-1))


def _modulate(x, shift, scale):
    """adaLN: layernorm(x, no affine) * (1 + scale) + shift, per sample."""
    xf = x.float()
    return F.layer_norm(xf, xf.shape[-1:], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]


_modulate = register(_modulate, "modulate")


class DiTBlock(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.ada = nn.Linear(d, 6 * d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        nn.init.zeros_(self.ada.weight)  # adaLN-Zero: every block starts as the identity
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, c):
        b, s, d = x.shape
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(F.silu(c)).float().chunk(6, dim=-1)
        q, k, v = self.qkv(_modulate(x, sh1, sc1)).view(b, s, 3, self.heads, -1).permute(
            2, 0, 3, 1, 4)
        a = _attention(q, k, v, causal=False).transpose(1, 2).reshape(b, s, d)
        x = _residual(x, self.proj(a), g1[:, None])
        return _residual(x, self.fc2(F.gelu(self.fc1(_modulate(x, sh2, sc2)))), g2[:, None])


class TinyDiT(nn.Module):
    def __init__(self, tokens: int = 16, channels: int = 8, classes: int = 8, d: int = 64,
                 heads: int = 4, hidden: int = 128, blocks: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(channels, d)
        self.pos = nn.Parameter(torch.randn(tokens, d) * 0.02)
        self.t_fc1 = nn.Linear(d, d)
        self.t_fc2 = nn.Linear(d, d)
        self.cls = nn.Embedding(classes, d)
        self.blocks = nn.ModuleList(DiTBlock(d, heads, hidden) for _ in range(blocks))
        self.final_ada = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, channels)
        nn.init.zeros_(self.final_ada.weight)
        nn.init.zeros_(self.final_ada.bias)
        self.d = d

    def _t_embed(self, t: torch.Tensor) -> torch.Tensor:
        half = self.d // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device) / half)
        ang = t[:, None] * 1000.0 * freqs[None]
        return torch.cat((ang.cos(), ang.sin()), dim=-1)

    def forward(self, xt, t, c):
        x = self.inp(xt) + self.pos
        cond = self.t_fc2(F.silu(self.t_fc1(self._t_embed(t)))) + self.cls(c)
        for blk in self.blocks:
            x = blk(x, cond)
        shift, scale = self.final_ada(F.silu(cond)).float().chunk(2, dim=-1)
        return self.out(_modulate(x, shift, scale))

    def loss(self, b):
        return F.mse_loss(self(b["xt"], b["t"], b["c"]).float(), b["v"])


# name -> (model class, task class, optimizer learning rate). Learning rates were picked on the
# fp32 reference so that each loss falls steadily over 200 steps without spikes.
MODELS = {
    "mlp": (MLP, Teacher, 3e-3),
    "tiny_lm": (TinyLM, Grammar, 3e-3),
    "tiny_dit": (TinyDiT, Latents, 2e-3),
}
# Models with planted sensitive layers, trained by name but outside MODELS' default list (a
# uniform 4-bit recipe is meant to fail on them): mlp with four massive input channels of fc3
# (one in each of four 16-blocks along K) and two loud output-gradient channels of fc2; tiny_lm
# with four massive input channels of
# blocks.0.w_down (one in each of four 16-blocks along K) and two loud output-gradient channels
# of blocks.1.w_up.
PLANTED = {
    "mlp_outliers": (functools.partial(PlantedMLP, massive=(5, 40, 77, 110), loud=(20, 90)),
                     Teacher, 3e-3),
    "tiny_lm_outliers": (functools.partial(TinyLM, plants=({"massive": (5, 40, 77, 110)},
                                                           {"loud": (20, 90)})),
                         Grammar, 3e-3),
}


def build(name: str, seed: int, task_seed: int = 0) -> tuple[nn.Module, object, float]:
    """(model with seed-determined initial weights on the CPU, task, learning rate)."""
    known = {**MODELS, **PLANTED}
    if name not in known:
        raise UsageError(f"model={name!r}: use one of {', '.join(known)}")
    cls, task_cls, lr = known[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_for("convergence-init", name, seed))
        model = cls()
    return model, task_cls(task_seed=task_seed), lr
