"""What a user op gets from its reference alone (``nc.op(name, reference=fn)``): inputs drawn
from the case, and the careful same-precision baseline of DESIGN rule 4."""
from __future__ import annotations

import inspect
from typing import Callable

import torch

from numcheck import formats
from numcheck.cases import inputs as _inputs
from numcheck.cases.grid import Case
from numcheck.errors import UsageError

__all__ = ["careful_baseline", "default_inputs"]


def default_inputs(reference: Callable) -> Callable[[Case], tuple[dict, dict]]:
    """Each parameter of ``reference`` without a default is a tensor of the case's shape,
    stored in the case's dtype, drawn from the case's distribution (an independent stream per
    parameter); parameters with defaults take them."""
    params = [p.name for p in inspect.signature(reference).parameters.values()
              if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not params:
        raise UsageError(f"nc.op: reference {getattr(reference, '__name__', reference)} has no "
                         "parameter without a default to draw a tensor for; pass inputs=")

    def make(case: Case):
        dt = formats.get(case.dtype).torch
        return ({n: (_inputs.draw(case.dist, case.shape, seed=case.seed, fmt=case.dtype,
                                  stream=f"{case.id}/{n}"), dt) for n in params}, {})
    return make


def careful_baseline(reference: Callable) -> Callable[..., torch.Tensor]:
    """The reference's own formula run on the stored inputs widened to fp32 (bf16/fp16; fp32
    stays), its result rounded once to the first tensor input's dtype: where fused kernels
    compute and round (DESIGN rule 4). Gradients flow through the widening, so each is rounded
    once at its input."""
    def baseline(*args, **kwargs):
        first = next(a for a in list(args) + list(kwargs.values())
                     if isinstance(a, torch.Tensor) and a.is_floating_point())
        wide = [formats.widen(a) if isinstance(a, torch.Tensor) and a.is_floating_point()
                else a for a in args]
        kw = {k: formats.widen(v) if isinstance(v, torch.Tensor) and v.is_floating_point()
              else v for k, v in kwargs.items()}
        return reference(*wide, **kw).to(first.dtype)
    baseline.__name__ = f"careful_{getattr(reference, '__name__', 'reference')}"
    return baseline
