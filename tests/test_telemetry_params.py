"""Every parameter's gradient is checked, watched module or not (issue 32).

The weight-gradient check used to exist only for watched modules (linear, norms): a gradient
that overflowed only in an embedding (fp16, one token repeated 256 times under a loss scale)
gave ``first_nonfinite() is None`` at ``every=1`` and a "named no producer" warning at
``every=3``; with the embedding tied to the head, the head was blamed (its grad_weight hook saw
the tied total). Now each parameter has one check against the grad_outputs of every module that
holds it, named by its owner with its sharers, the same at ``every=1`` and ``every=3``.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from numcheck import telemetry

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FAULT = 4   # the step of the fault: not recorded at every=3


class _LM(nn.Module):
    """An fp16 embedding, an fp32 body, a head (fp32; fp16 and the embedding's weight when
    tied)."""

    def __init__(self, tied: bool):
        super().__init__()
        self.embed = nn.Embedding(16, 8).half()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        if tied:
            self.head.half()
            self.head.weight = self.embed.weight

    def forward(self, ids):
        h = self.body(self.embed(ids).float())
        return self.head(h.to(self.head.weight.dtype)).float()


# loss scales (measured, unwatched): untied, only the embedding's fp16 gradient overflows at
# 1000 (head and body stay finite); tied, the shared fp16 gradient overflows at 100
SCALE = {False: 1000.0, True: 100.0}


def _train(tied: bool, every: int | None):
    """Five steps; at FAULT every token is id 0 and the loss is scaled: (first_nonfinite, which
    gradients are finite (embed, head, body), warnings, records)."""
    torch.manual_seed(0)
    model = _LM(tied)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = telemetry.watch(model, every=every) if every else None
        for step in range(FAULT + 1):
            ids = torch.zeros(4, 64, dtype=torch.long) if step == FAULT else \
                torch.randint(0, 16, (4, 64))
            model.zero_grad()
            (model(ids).sum() * (SCALE[tied] if step == FAULT else 1.0)).backward()
            if t is not None:
                t.step()
        if t is not None:
            t.close()
    finite = tuple(bool(getattr(model, n).weight.grad.isfinite().all())
                   for n in ("embed", "head", "body"))
    return (t.first_nonfinite() if t else None, finite, [str(w.message) for w in caught],
            t.records() if t else None)


@pytest.mark.parametrize("every", [1, 3])
def test_an_embedding_only_gradient_overflow_is_named(every):
    nf, finite, warned, _ = _train(False, every)
    assert _train(False, None)[1] == finite == (False, True, True)  # the fault, unwatched too
    assert nf == (FAULT, "embed", "embedding", "grad_weight", "backward")
    assert nf.inputs["n_inf"] == 0 and nf.inputs["n_nan"] == 0
    assert not [w for w in warned if "named no producer" in w]


@pytest.mark.parametrize("every", [1, 3])
def test_a_tied_weight_is_named_by_its_owner_and_sharers(every):
    nf, finite, warned, df = _train(True, every)
    assert finite[0] is False and finite[1] is False  # one tensor
    assert nf == (FAULT, "embed (tied: head)", "embedding", "grad_weight", "backward")
    assert not [w for w in warned if "named no producer" in w]
    # the head's grad_weight row is still recorded (the watched module whose weight it is)
    assert ((df.module == "head") & (df.role == "grad_weight")).any()
