"""Helpers shared by the op-family tests (imported as a plain module: tests/ is on sys.path)."""
from __future__ import annotations

import warnings

import torch

from numcheck.run import verify


def gen(*shape, seed=0) -> torch.Tensor:
    """Standard normal float64 values from a fixed seed."""
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def quiet_verify(op, fn, **kw):
    """nc.verify on the CPU with torch's dtype-mismatch warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return verify(op, fn, device="cpu", **kw)
