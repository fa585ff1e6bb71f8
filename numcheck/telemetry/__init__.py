"""numcheck.telemetry: model-level numerics telemetry (docs/telemetry.md).

``watch(model, recipe=None, shadow=False, what_if=(), every=1, *, enabled=True, rank=None)``
returns a ``Telemetry`` (context manager): ``step()``, ``records()``, ``to_parquet(path)``,
``first_nonfinite()``, ``enable()`` / ``disable()`` / ``enabled``, ``close()``.
``merge(frames)`` merges per-rank records (frames or parquet paths); ``register(target, op)``
watches a module class, a function or "module:function" as an op; ``diff(a, b)`` says where
two runs' telemetry parts ways; ``compare(model, batches, a, b)`` runs two configurations of
one model and names the first layer where B parts from A; ``sensitivity(model, batches,
candidates)`` records what each candidate recipe does to each linear layer's own GEMMs, and
``plan(records, candidates, limits)`` picks the cheapest candidate per layer from them.

Names load on first use (PEP 562): the family's rules (``telemetry_rules``, torch-free) are read
by ``numcheck compare`` / ``report`` without importing torch.
"""
from __future__ import annotations

from typing import Any

__all__ = ["COLUMNS", "DERIVED", "FIELDS", "KEY", "ROLES", "NonFinite", "NoProducer", "Plan",
           "Telemetry", "classify", "compare", "diff", "merge", "plan", "quant_stats", "register",
           "sensitivity", "tensor_stats", "watch"]


def __getattr__(name: str) -> Any:
    # Explicit imports, not a name -> module table: the import-graph test sees every edge.
    if name in ("COLUMNS", "DERIVED", "FIELDS", "KEY", "merge", "quant_stats", "tensor_stats"):
        from numcheck.telemetry import fields as home
    elif name in ("ROLES", "NonFinite", "NoProducer", "Telemetry", "classify", "watch"):
        from numcheck.telemetry import watcher as home
    elif name == "register":
        from numcheck.telemetry import op_classes as home
    elif name == "diff":
        from numcheck.telemetry import divergence as home
    elif name == "compare":
        from numcheck.telemetry import live as home
    elif name in ("Plan", "plan"):
        from numcheck.telemetry import planner as home
    elif name == "sensitivity":
        from numcheck.telemetry import layer_sensitivity as home
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(home, name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
