"""Built-in convergence suite: one test per (model, recipe) of the case set.

Each test trains the model under the recipe for every seed of the case set, paired with the fp32
reference and the bf16 baseline (computed once per (model, seed) in the session: under xdist the
workers share them through a folder of the session's base temp, ``share_references``), and
runs the gate (numcheck.convergence.gate). Tests are not grouped under xdist: one worker running
every recipe of a transformer left the other idle (measured: 5.0 min wall grouped, quick set).

quick: 3 seeds x 100 steps on mlp (every recipe, torchao's among them), 3 x 60 on tiny_lm and
tiny_dit (a subset: FP8 tensor-wise, NVFP4 with RHT+SR; torchao's FP8 in the full set only, see
QUICK). full: every recipe on every model, 5 seeds x 200 steps. The quick set gives the full
set's verdicts and, up to ties within the seed bands, its ranking by loss gap, planted faults
included (bench/bench_convergence_quick_vs_full.py;
bench/results/2026-12-02-convergence-quick-vs-full.md: measured when the transformers' quick
set still had torchao's tensor-wise recipe; it passed there as in the full set).
"""
from __future__ import annotations

import os
import warnings

import pytest

from numcheck.convergence.recipes import DEFAULT_RECIPES
from numcheck.convergence.runs import converge, share_references
from numcheck.frontends.plugin import case_set

# Costliest first (the transformers' quantized recipes: 15-35 s each), so that under `-n 2` the
# short tests fill the tail instead of one worker finishing a long one alone. torchao's FP8
# recipes run in the quick set on mlp only: they compute with torch._scaled_mm, which on a CPU
# is whatever oneDNN has for fp8 matmul there; on an Intel Xeon with AMX and AVX512-FP16
# (2026-12-06) that is its reference loop ("ref:any"), 580 ms for a 512x128x256 product (fp32
# mm: 0.46 ms), and tiny_lm's torchao test alone took 370 s of the suite's 500 s (tiny_dit's
# 297 s). On mlp it takes ~40 s; the transformers keep it in the full set.
QUICK = {
    "tiny_dit": ("nvfp4_rht_sr", "fp8_tensor", "fp32", "bf16"),
    "tiny_lm": ("nvfp4_rht_sr", "fp8_tensor", "fp32", "bf16"),
    "mlp": DEFAULT_RECIPES,
}


# quick: the transformers run 60 steps (two gated windows after warm-up): numcheck's exact
# float64 quantizers cost ~200 ms a step on them (66 qdq calls), and 3 seeds x 100 steps of two
# quantized recipes per transformer took the quick suite to 3.8 min on 2 cores (budget 3).
QUICK_STEPS = {"mlp": 100, "tiny_lm": 60, "tiny_dit": 60}


# Layout equivalence (numcheck.convergence.layouts; docs/convergence.md, "Layouts"): each recipe
# on one process against 2 gloo ranks under DDP and FSDP2, 3 seeds x 100 steps. quick: mlp,
# fp32 and one recipe of each tolerance family (~60 s on 2 cores); full: every model, every
# quantized recipe numcheck implements.
LAYOUT_MODELS = ("mlp", "tiny_lm", "tiny_dit")
LAYOUT_QUICK = ("fp32", "fp8_tensor", "nvfp4_rht_sr")
LAYOUT_FULL = ("fp32", "bf16", "fp8_tensor", "fp8_row", "fp8_block", "mxfp8", "mxfp4", "nvfp4",
               "nvfp4_rht_sr")


def _items(cases: str):
    for model, recipes in QUICK.items():
        for recipe in (DEFAULT_RECIPES if cases == "full" else recipes):
            yield pytest.param((model, recipe), id=f"{model}/{recipe}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conv_case" in metafunc.fixturenames:
        metafunc.parametrize("conv_case", list(_items(case_set(metafunc.config))))
    if "layout_model" in metafunc.fixturenames:
        models = LAYOUT_MODELS if case_set(metafunc.config) == "full" else ("mlp",)
        metafunc.parametrize("layout_model", models)


@pytest.fixture(scope="session")
def shared_references(tmp_path_factory):
    # Under xdist a worker's base temp is a folder of the session's base temp (shared by the
    # workers); in one process the base temp itself is the session's.
    base = tmp_path_factory.getbasetemp()
    share_references((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
                     / "convergence-references")


def test_convergence(conv_case, request, numcheck, shared_references):
    model, recipe = conv_case
    cs = case_set(request.config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = converge(model, recipes=[recipe], cases=cs, device="cpu",
                       steps=QUICK_STEPS[model] if cs == "quick" else None)
    # The gate's verdict (numcheck.verdicts.judge) and the golden band are judged by check_records,
    # which also skips a recipe that cannot run here, with its reason.
    numcheck.check_records([r for r in run.records() if r.kernel == recipe])


def test_layout_equivalence(layout_model, request):
    import torch
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    from numcheck.convergence.layouts import layout_equivalence
    full = case_set(request.config) == "full"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = layout_equivalence(layout_model, LAYOUT_FULL if full else LAYOUT_QUICK)
    print(run.table())
    assert run.passed, run.table()
