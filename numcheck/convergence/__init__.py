"""Short-run convergence curves per precision recipe, gated (``numcheck converge``).

Modules, in data-flow order: ``data`` (seeded synthetic tasks), ``models`` (mlp, tiny_lm,
tiny_dit), ``linear`` (quantized linear via ``QuantRecipe.qdq``, ``apply_recipe``), ``recipes``
(what a recipe name means), ``train`` (one paired run), ``gate`` (pure verdict functions),
``runs`` (``converge`` / ``ConvergenceRun``), ``run_records`` (a run's ``Record``s),
``convergence_rules`` (the family: verdict, golden rule, table and report sections),
``convergence_html`` (its HTML section), ``plot``.

Names load on first use (PEP 562): the family's rules are read by ``numcheck compare`` /
``report`` without importing torch.
"""
from __future__ import annotations

from typing import Any

__all__ = ["RUN_SETTINGS", "MODELS", "ConvergenceRun", "QuantLinear", "apply_recipe", "converge",
           "to_records", "window_regression"]


def __getattr__(name: str) -> Any:
    # Explicit imports, not a name -> module table: the import-graph test sees every edge.
    if name == "window_regression":
        from numcheck.convergence import gate as home
    elif name in ("QuantLinear", "apply_recipe"):
        from numcheck.convergence import linear as home
    elif name == "MODELS":
        from numcheck.convergence import models as home
    elif name == "to_records":
        from numcheck.convergence import run_records as home
    elif name in ("RUN_SETTINGS", "ConvergenceRun", "converge"):
        from numcheck.convergence import runs as home
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(home, name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
