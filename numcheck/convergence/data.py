"""Synthetic training data, generated on the CPU from a seed: identical on every device.

Every batch is a pure function of (task, seed, step): a ``torch.Generator`` on the CPU seeded
with ``numcheck.cases.inputs.seed_for(...)`` (sha256, the same in every process). Recipes of one seed
therefore see the same batches in the same order as the reference (paired runs), and nothing is
downloaded. Batches are made in float32 on the CPU and moved to the run's device afterwards.

* ``teacher``: regression onto a fixed random 2-layer tanh teacher network (for ``mlp``).
* ``grammar``: token sequences from a sparse random second-order Markov chain (for ``tiny_lm``):
  each (previous, current) pair allows 4 next tokens with Zipf-like weights, so the achievable
  loss is ~1 nat, well below log(vocab), and a model must use two tokens of context to reach it.
* ``latents``: class-conditional Gaussian-mixture "latents" (for ``tiny_dit``): each class has a
  fixed random mean pattern over (tokens, channels) plus isotropic noise; the rectified-flow
  time t ~ U(0,1) and the noise are drawn from the same generator.
"""
from __future__ import annotations

import torch

from numcheck.cases.inputs import seed_for

__all__ = ["Teacher", "Grammar", "Latents"]


def _gen(*parts: object) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed_for("convergence", *parts))


class Teacher:
    """y = W2 tanh(W1 x / sqrt(d_in)) for x ~ N(0, I); the task is fixed by ``task_seed``."""

    def __init__(self, d_in: int = 32, d_hidden: int = 64, d_out: int = 32, batch: int = 64,
                 task_seed: int = 0) -> None:
        g = _gen("teacher", task_seed)
        self.w1 = torch.randn(d_hidden, d_in, generator=g) * 2.0 / d_in ** 0.5
        self.w2 = torch.randn(d_out, d_hidden, generator=g) / d_hidden ** 0.5
        self.d_in, self.batch = d_in, batch

    def batch_at(self, seed: int, step: int) -> dict[str, torch.Tensor]:
        g = _gen("teacher-batch", seed, step)
        x = torch.randn(self.batch, self.d_in, generator=g)
        return {"x": x, "y": torch.tanh(x @ self.w1.T) @ self.w2.T}


class Grammar:
    """Second-order Markov chain over ``vocab`` tokens with ``fanout`` allowed successors."""

    def __init__(self, vocab: int = 64, seq: int = 32, batch: int = 8, fanout: int = 4,
                 task_seed: int = 0) -> None:
        g = _gen("grammar", task_seed)
        self.vocab, self.seq, self.batch = vocab, seq, batch
        # next-token table: for each (prev, cur) pair, `fanout` successors with weights 1/rank
        self.succ = torch.randint(0, vocab, (vocab, vocab, fanout), generator=g)
        w = 1.0 / torch.arange(1, fanout + 1, dtype=torch.float64)
        self.cum = torch.cumsum(w / w.sum(), 0)

    def batch_at(self, seed: int, step: int) -> dict[str, torch.Tensor]:
        g = _gen("grammar-batch", seed, step)
        toks = torch.empty(self.batch, self.seq + 1, dtype=torch.int64)
        toks[:, :2] = torch.randint(0, self.vocab, (self.batch, 2), generator=g)
        u = torch.rand(self.batch, self.seq - 1, dtype=torch.float64, generator=g)
        pick = torch.searchsorted(self.cum, u.contiguous()).clamp(max=self.cum.numel() - 1)
        for i in range(2, self.seq + 1):
            toks[:, i] = self.succ[toks[:, i - 2], toks[:, i - 1], pick[:, i - 2]]
        return {"tokens": toks[:, :-1].contiguous(), "targets": toks[:, 1:].contiguous()}


class Latents:
    """Class-conditional Gaussian mixture over (tokens, channels) latents, rectified-flow pairs."""

    def __init__(self, tokens: int = 16, channels: int = 8, classes: int = 8, batch: int = 16,
                 noise: float = 0.5, task_seed: int = 0) -> None:
        g = _gen("latents", task_seed)
        self.means = torch.randn(classes, tokens, channels, generator=g)
        self.tokens, self.channels, self.classes = tokens, channels, classes
        self.batch, self.noise = batch, noise

    def batch_at(self, seed: int, step: int) -> dict[str, torch.Tensor]:
        g = _gen("latents-batch", seed, step)
        c = torch.randint(0, self.classes, (self.batch,), generator=g)
        x0 = self.means[c] + self.noise * torch.randn(self.batch, self.tokens, self.channels,
                                                      generator=g)
        eps = torch.randn(self.batch, self.tokens, self.channels, generator=g)
        t = torch.rand(self.batch, generator=g)
        xt = (1 - t)[:, None, None] * x0 + t[:, None, None] * eps
        # rectified flow: x_t = (1-t) x0 + t eps, velocity target d x_t / dt = eps - x0
        return {"xt": xt, "t": t, "c": c, "v": eps - x0}
