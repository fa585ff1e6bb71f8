"""Small modules with planted numerical faults, shared by the telemetry tests."""
from __future__ import annotations

import torch
from torch import nn


class Exp(nn.Module):
    def forward(self, x):
        return torch.exp(x)  # fp32 overflows above ~88.7


class InPlaceBoom(nn.Module):
    def forward(self, x):
        return x.mul_(1e38)


class BareSqrt(nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.l1, self.l2 = nn.Linear(width, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = torch.relu(self.l1(x))
        return self.l2(h).sum() + torch.sqrt(h).sum()  # sqrt'(0) = inf: a bare op's overflow
