"""Element-level views of one output beside its FP64 reference, beyond ErrorStats: the worst
elements and the ULP histogram a failing record lists, the componentwise bound's ratio (DESIGN
rule 5) and the case's conditioning (Record.cond)."""
from __future__ import annotations

import math

import torch

from numcheck import formats

N_WORST = 5  # worst elements listed in a failing record


def worst_elements(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None) -> str:
    """The N_WORST elements by error (normalized by scale when the op has one)."""
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to(torch.float64)
    err = (o - r).abs()
    err = torch.where(torch.isnan(o) != torch.isnan(r), math.inf, torch.nan_to_num(err, nan=0.0))
    key = err / scale.clamp(min=1e-300) if scale is not None else err
    flat = key.flatten()
    k = min(N_WORST, flat.numel())
    idx = torch.topk(torch.nan_to_num(flat, nan=math.inf), k).indices if k else []
    parts = []
    for i in idx:
        pos = tuple(int(p) for p in torch.unravel_index(i, o.shape)) if o.dim() else ()
        parts.append(f"{list(pos)}: out={o.flatten()[i].item():.6g} ref={r.flatten()[i].item():.6g}"
                     f" err={err.flatten()[i].item():.3g}")
    return "; ".join(parts)


def ulp_histogram(out: torch.Tensor, ref: torch.Tensor, fmt: str) -> list[int]:
    """Elements per |error| in ULPs of fmt (Record.ulp_hist): bucket 0 exact, bucket k
    [2^(k-1), 2^k), over the elements where out and the rounded reference are both finite (the
    ones ErrorStats compares)."""
    o = out.detach().to("cpu", torch.float64)
    r = formats.round_to(ref.detach().to("cpu", torch.float64), fmt, saturate=False)
    both = torch.isfinite(o) & torch.isfinite(r)
    ulps = formats.ulp_distance(o[both], r[both], fmt)
    edges = torch.tensor([1 << k for k in range(63)])  # integer edges: exact at any distance
    return torch.bincount(torch.bucketize(ulps, edges, right=True), minlength=1).tolist()


def bound_ratio(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor, fmt: str) -> float:
    """max |out - ref| / (u * scale) over the elements where both are finite (NaN: none)."""
    u = formats.get(fmt).unit_roundoff
    o = out.detach().to("cpu", torch.float64)
    fin = torch.isfinite(o) & torch.isfinite(ref)
    if not bool(fin.any()):
        return math.nan
    # An exact zero scale admits no error at all; 1e-300 keeps the ratio finite but huge.
    ratio = (o - ref).abs() / (u * scale).clamp(min=1e-300)
    # the ratios are >= 0 (or NaN): 0 where either is not finite leaves the maximum as it is,
    # and costs half of selecting the finite elements first
    return float(torch.where(fin, ratio, 0.0).max())


def condition(ref: torch.Tensor, scale: torch.Tensor) -> float:
    """||scale|| / ||ref|| over the elements where both are finite (Record.cond): the same for
    every kernel of the case."""
    fin = torch.isfinite(ref) & torch.isfinite(scale)
    rn = float(ref[fin].norm())
    return float(scale[fin].norm()) / rn if rn > 0 else 1.0
