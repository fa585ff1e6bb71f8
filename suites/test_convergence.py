"""Built-in convergence suite: one test per (model, recipe) of the case set.

Each test trains the model under the recipe for every seed of the case set, paired with the fp32
reference and the bf16 baseline (computed once per (model, seed) in the process and cached), and
runs the gate (numcheck.convergence.gate). All recipes of one model share an xdist group (run
with ``-n 2 --dist loadgroup``) so the references are computed once per model, not per worker.

quick: 3 seeds x 100 steps; mlp runs every recipe, tiny_lm and tiny_dit a representative subset
(FP8 tensor-wise, NVFP4 with RHT+SR, torchao FP8): every recipe on the transformers costs ~10x
the CI budget on 2 cores (numcheck's bit-exact qdq runs in float64). full: every recipe on every
model, 5 seeds x 200 steps.
"""
from __future__ import annotations

import warnings

import pytest

from numcheck.convergence.recipes import DEFAULT_RECIPES
from numcheck.convergence.run import CASE_SETS, converge
from numcheck.plugin import case_set

QUICK = {
    "mlp": DEFAULT_RECIPES,
    "tiny_lm": ("fp32", "bf16", "fp8_tensor", "nvfp4_rht_sr", "torchao_fp8_tensorwise"),
    "tiny_dit": ("fp32", "bf16", "fp8_tensor", "nvfp4_rht_sr", "torchao_fp8_tensorwise"),
}


def _items(cases: str):
    for model, recipes in QUICK.items():
        for recipe in (DEFAULT_RECIPES if cases == "full" else recipes):
            yield pytest.param((model, recipe), id=f"{model}/{recipe}",
                               marks=pytest.mark.xdist_group(f"convergence-{model}"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conv_case" in metafunc.fixturenames:
        metafunc.parametrize("conv_case", list(_items(case_set(metafunc.config))))


def test_convergence(conv_case, request, numcheck):
    model, recipe = conv_case
    cs = case_set(request.config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = converge(model, recipes=[recipe], cases=cs, device="cpu")
    rec = [r for r in run.records() if r["kernel"] == recipe]
    res = run.results[recipe]
    if res.status == "skipped":
        pytest.skip("; ".join(res.reasons))
    # the gate's verdict is in each record's status; the golden band is judged here too
    numcheck.check_records(rec)
    assert res.status == "passed", (
        f"{model}/{recipe} ({CASE_SETS[cs]['steps']} steps): " + "; ".join(res.reasons)
        + "\n" + run.table())
