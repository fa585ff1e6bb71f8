"""Short-run convergence curves per precision recipe, gated (``numcheck converge``).

Modules, in data-flow order: ``data`` (seeded synthetic tasks), ``models`` (mlp, tiny_lm,
tiny_dit), ``linear`` (quantized linear via ``QuantRecipe.qdq``, ``apply_recipe``), ``recipes``
(what a recipe name means), ``train`` (one paired run), ``gate`` (pure verdict functions),
``run`` (``converge`` / ``ConvergenceRun``), ``records`` (a run's ``Record``s), ``rules`` (the
family's verdict, golden rule, table and report section), ``plot``.
"""
from numcheck.convergence.gate import window_regression
from numcheck.convergence.linear import QuantLinear, apply_recipe
from numcheck.convergence.models import MODELS
from numcheck.convergence.run_records import to_records
from numcheck.convergence.converge import RUN_SETTINGS, ConvergenceRun, converge

__all__ = ["RUN_SETTINGS", "MODELS", "ConvergenceRun", "QuantLinear", "apply_recipe", "converge",
           "to_records", "window_regression"]
