"""numcheck.telemetry: model-level numerics telemetry (docs/telemetry.md).

``watch(model, recipe=None, shadow=False, what_if=(), every=1, *, enabled=True, rank=None)``
returns a ``Telemetry`` (context manager): ``step()``, ``records()``, ``to_parquet(path)``,
``first_nonfinite()``, ``enable()`` / ``disable()`` / ``enabled``, ``close()``.
``merge(frames)`` merges per-rank records (frames or parquet paths).
"""
from .fields import COLUMNS, DERIVED, FIELDS, KEY, merge, quant_stats, tensor_stats
from .watch import ROLES, NonFinite, Telemetry, classify, watch

__all__ = ["COLUMNS", "DERIVED", "FIELDS", "KEY", "ROLES", "NonFinite", "Telemetry", "classify",
           "merge", "quant_stats", "tensor_stats", "watch"]
