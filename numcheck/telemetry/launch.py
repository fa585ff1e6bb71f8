"""What a data-parallel rank that numcheck starts needs, shared by ``numcheck inspect --nproc``
(numcheck.telemetry.inspect) and the convergence suite's layout equivalence
(numcheck.convergence.layouts): a module whose forward is the loss (what DDP wraps), this
rank's share of a global batch, a free port for the rendezvous."""
from __future__ import annotations

import socket
from collections.abc import Callable

import torch
from torch import nn

from numcheck.errors import UsageError

__all__ = ["LossModule", "free_port", "share_batch"]


class LossModule(nn.Module):
    """What DistributedDataParallel wraps: its forward is ``loss(model, batch)``, since DDP
    prepares the gradient all-reduce in its own forward (a loss computed beside it would leave
    the gradients unreduced). It holds the model's own submodules, parameters and buffers (the
    same dicts), so rows, producers and replicas carry the model's names, as in one process;
    the model itself stays outside the module tree, for the loss to call (a deep copy, the
    float64 shadow, copies both and keeps them one)."""

    def __init__(self, model: nn.Module, loss: Callable) -> None:
        super().__init__()
        for part in ("_modules", "_parameters", "_buffers", "_non_persistent_buffers_set"):
            setattr(self, part, getattr(model, part))
        self.__dict__["model"] = model
        self.loss = loss

    def forward(self, batch):
        return self.loss(self.model, batch)


def share_batch(batch, rank: int, world: int, what: str, device=None):
    """This rank's rows of a global batch (on ``device``, where given): every tensor of a dict,
    tuple or list (or a lone tensor) cut along dim 0 into ``world`` equal parts; other values
    as they are. ``what`` names the batch's source in the UsageError of a batch whose rows do
    not split evenly."""
    def cut(v):
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            return v
        rows = v.shape[0]
        if rows % world:
            raise UsageError(f"{what}: the global batch has {rows} rows, which do not split "
                             f"into {world} equal shares; use a rank count that divides {rows}")
        n = rows // world
        v = v[rank * n:(rank + 1) * n]
        return v if device is None else v.to(device)

    if isinstance(batch, dict):
        return {k: cut(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        got = [cut(v) for v in batch]
        return type(batch)(*got) if hasattr(batch, "_fields") else type(batch)(got)
    return cut(batch)


def free_port() -> int:
    """A TCP port free on this host now, for the ranks' rendezvous (MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
