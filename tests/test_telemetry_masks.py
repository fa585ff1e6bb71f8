"""What telemetry rows cover in attention (issue 32): masks are no data. sdpa's attn_mask is
not one of its input rows, and a written-out softmax's masked entries (-inf, or finfo.min added)
are left out of its input row, which read amax 3.4e38 and a range of 142 binades."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from numcheck import telemetry

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class _MaskedAttention(nn.Module):
    """Attention with a float mask of finfo.min (a model library's padding mask)."""

    def forward(self, q, k, v, mask, written_out: bool):
        if written_out:
            logits = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5 + mask
            return torch.softmax(logits, -1) @ v
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("written_out", [False, True], ids=["sdpa", "softmax"])
def test_masks_are_left_out_of_the_attention_input_rows(written_out):
    """The mask is no data: sdpa's attn_mask is not among its input rows, and a softmax input's
    masked entries (finfo.min added) are not in its row (amax 3.4e38 before)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, requires_grad=True) for _ in range(3))
    mask = torch.zeros(5, 5)
    mask[:, 3:] = torch.finfo(torch.float32).min   # the last two keys are padding
    model = _MaskedAttention()
    with telemetry.watch(model) as t:
        model(q, k, v, mask, written_out).sum().backward()
        t.step()
    df = t.records()
    op = "softmax" if written_out else "sdpa"
    row = df[(df.op == op) & (df.role == "input")].iloc[0]
    if written_out:
        assert row.n == 2 * 5 * 3 and row.amax < 100   # the unmasked logits only
    else:
        assert row.n == 3 * q.numel()                  # q, k and v; not the 5 x 5 mask
    assert row.nonfinite == 0 and not t.first_nonfinite()
