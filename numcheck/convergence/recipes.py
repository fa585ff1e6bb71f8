"""What a recipe name or object means for a training run: resolved once into a ``Spec``.

* ``fp32``: the reference, everything in fp32.
* ``bf16``: ``torch.autocast(device, dtype=torch.bfloat16)`` over forward and loss, fp32 master
  weights and optimizer state (parameters stay fp32; autocast casts GEMM operands to bf16 and
  accumulates in fp32, attention GEMMs included). This is the BF16 baseline of the gap gate.
* a QuantRecipe name from ``numcheck.quant.recipe.RECIPES`` or a QuantRecipe object: every
  ``nn.Linear`` swapped for ``linear.QuantLinear`` (fake-quant GEMM operands, fp32 elsewhere,
  so the differences from the reference are the quantizers' alone).
* ``torchao_fp8_tensorwise`` / ``torchao_fp8_rowwise``: torchao's
  ``convert_to_float8_training`` with that recipe name (a third-party implementation run through
  the same gate); layers whose in/out features are not multiples of 16 stay high precision
  (``torch._scaled_mm`` needs that). Skipped, with the reason, where torchao does not import.
* a user's module factory ``f(nn.Linear) -> nn.Module``: applied by ``apply_recipe``.
* a per-layer plan (``numcheck.telemetry.Plan``, or a dict module name -> recipe name): each
  named ``nn.Linear`` a QuantLinear of its own recipe (``linear.apply_plan``), the rest fp32;
  held to the 4-bit gap tolerance when any layer is 4-bit.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from numcheck.errors import UsageError
from numcheck.convergence.linear import is_quant_recipe

__all__ = ["DEFAULT_RECIPES", "TORCHAO_RECIPES", "Spec", "plan_recipes", "resolve"]

TORCHAO_RECIPES = {"torchao_fp8_tensorwise": "tensorwise", "torchao_fp8_rowwise": "rowwise"}
QUANT_NAMES = ("fp8_tensor", "fp8_row", "fp8_block", "mxfp8", "mxfp4", "nvfp4", "nvfp4_rht_sr")
DEFAULT_RECIPES = ("fp32", "bf16", *QUANT_NAMES, *TORCHAO_RECIPES)


@dataclass(frozen=True)
class Spec:
    """kind: "fp32" | "bf16" | "quant" (obj: QuantRecipe) | "factory" (obj: nn.Linear ->
    nn.Module) | "convert" (obj: model -> model) | "plan" (obj: module name -> recipe object).
    skip: why it cannot run here, or None."""

    name: str
    kind: str
    obj: object = None
    family: str = ""  # "fp8" | "fp4" | "" (gap tolerance class, gate.GAP_TOL)
    skip: str | None = None


def _family(recipe=None) -> str:
    """The gap-tolerance class, from the recipe's operand formats (the first of x, w that has a
    quantizer): "fp4" for 4-bit elements, else "fp8". A recipe without formats to ask (a module
    factory, a recipe that does not import) is held to the stricter 8-bit tolerance."""
    for role in ("x", "w"):
        fmt = getattr(getattr(recipe, role, None), "format", None)
        if fmt is not None:
            return "fp4" if fmt.bits <= 4 else "fp8"
    return "fp8"


def _quant_registry():
    try:
        from numcheck.quant.recipe import RECIPES
    except ImportError as e:
        return None, f"numcheck.quant.recipe does not import: {e}"
    return RECIPES, None


def _torchao_converter(recipe_name: str) -> tuple[Callable | None, str | None]:
    import logging
    import warnings
    # torchao logs a warning per prebuilt extension it cannot load (_C_mxfp8, _C_cutlass_90a on
    # a CPU build of torch) and torch's pytree one per Enum it registers, on every import:
    # quiet while numcheck imports it (its own failure still says why, below)
    noisy = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in noisy]
    try:
        for log in noisy:
            log.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except Exception as e:  # noqa: BLE001 - any import failure means "skip, with the reason"
        return None, f"torchao.float8 does not import: {type(e).__name__}: {e}"
    finally:
        for log, level in zip(noisy, levels):
            log.setLevel(level)
    config = Float8LinearConfig.from_recipe_name(recipe_name)

    def keep(mod, _fqn: str) -> bool:
        return mod.in_features % 16 == 0 and mod.out_features % 16 == 0

    def convert(model):
        return convert_to_float8_training(model, module_filter_fn=keep, config=config)
    return convert, None


def plan_recipes(choices: dict) -> dict:
    """module -> recipe object of a per-layer plan's choices (module -> "bf16", a name of
    numcheck.quant.recipe.RECIPES, or a QuantRecipe-like object)."""
    from numcheck.convergence.linear import BF16

    reg, why = _quant_registry()
    out = {}
    for module, r in dict(choices).items():
        if r == "bf16":
            out[module] = BF16
        elif isinstance(r, str):
            if reg is None or r not in reg:
                raise UsageError(f"plan: {module} -> {r!r}: use bf16 or one of "
                                 "numcheck.quant.recipe.RECIPES" + (f" ({why})" if why else ""))
            out[module] = reg[r]
        elif is_quant_recipe(r):
            out[module] = r
        else:
            raise UsageError(f"plan: {module} -> {r!r}: give a recipe name or a QuantRecipe")
    return out


def _plan_spec(name: str, value) -> Spec:
    recipes = plan_recipes(getattr(value, "choices", value))
    family = "fp4" if any(_family(r) == "fp4" for r in recipes.values()) else "fp8"
    return Spec(name, "plan", recipes, family)


def resolve(name: str, value=None) -> Spec:
    """A Spec for ``name`` (and an optional object: QuantRecipe or module factory)."""
    if value is not None:
        if isinstance(value, dict) or hasattr(value, "choices"):
            return _plan_spec(name, value)
        if is_quant_recipe(value):
            return Spec(name, "quant", value, _family(value))
        if callable(value):
            return Spec(name, "factory", value, _family())
        raise UsageError(f"recipes[{name!r}] = {value!r}: pass a QuantRecipe, a callable "
                         "nn.Linear -> nn.Module or a per-layer plan")
    if name in ("fp32", "bf16"):
        return Spec(name, name)
    if name in TORCHAO_RECIPES:
        conv, why = _torchao_converter(TORCHAO_RECIPES[name])
        return Spec(name, "convert", conv, "fp8", skip=why)
    reg, why = _quant_registry()
    if reg is None:
        return Spec(name, "quant", None, _family(), skip=why)
    if name not in reg:
        raise UsageError(f"recipe {name!r}: use fp32, bf16, {', '.join(TORCHAO_RECIPES)} or one "
                         f"of numcheck.quant.recipe.RECIPES ({', '.join(sorted(reg))})")
    return Spec(name, "quant", reg[name], _family(reg[name]))
