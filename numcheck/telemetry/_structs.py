"""Tensors inside the argument and output structures of a module call: tuples (named ones
too), lists and dict values, recursively; anything else is opaque (a dataclass's tensors are
not found: docs/telemetry.md)."""
from __future__ import annotations

from typing import Callable

import torch


def tensors(obj) -> list[torch.Tensor]:
    """Floating tensors in an argument structure."""
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.is_floating_point() else []
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors(o)]
    return []


def map_tensors(obj, fn: Callable[[torch.Tensor], torch.Tensor]):
    """The structure with every tensor t replaced by fn(t) (a namedtuple rebuilt from its
    fields, a tuple or list subclass from its items, a dict as a plain dict)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        items = [map_tensors(o, fn) for o in obj]
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*items)
        return type(obj)(items)
    if isinstance(obj, dict):   # a plain dict (a subclass's constructor may want more)
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj
