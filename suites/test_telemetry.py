"""Built-in telemetry suite (suite ``telemetry``): per-layer floors of the tiny models'
telemetry against golden/<device_class>/telemetry.parquet.

One test per model: the model (numcheck.convergence.models, seed 0) trains a few fp32 AdamW
steps on its fixed batches under ``numcheck.telemetry.watcher`` with MXFP8 as the observed
recipe, NVFP4 and FP8 tensor-wise as what-if recipes and the float64 shadows, as
``numcheck inspect`` does; each (module, role, recipe) becomes a record of its SQNR and
worst-block SQNR floors, underflow and saturation ceilings and shadow SQNR floors over the
steps (numcheck.telemetry.floors), judged against the golden with the slacks of
numcheck.telemetry.telemetry_rules. A quantizer that loses a quarter bit, a scale off by a binade, or a
layer computed in lower precision fails.

quick: the three models, 4 steps (about 2 s each on one thread). full: the same runs with more
what-if recipes measured on the same tensors (MXFP6, MXFP4, FP8 block, INT8): the recipes do not
change the run, so the quick set's records are the full set's, value for value.
"""
from __future__ import annotations

import pytest

from numcheck.convergence.train import STATE
from numcheck.measure.numerics import pinned
from numcheck.frontends.plugin import case_set
from numcheck.telemetry import inspect as ins

MODELS = ("tiny_lm", "tiny_dit", "mlp")  # costliest first (under -n 2)
RECIPE = "mxfp8"
WHAT_IF = {"quick": ("nvfp4", "fp8_tensor"),
           "full": ("nvfp4", "fp8_tensor", "mxfp6", "mxfp4", "fp8_block", "int8")}
STEPS = 4  # steps 0-3: the adaLN-zero weights of tiny_dit leave zero at step 1
SEED = 0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tele_model" in metafunc.fixturenames:
        metafunc.parametrize("tele_model", MODELS)


def test_telemetry(tele_model, request, numcheck):
    what_if = WHAT_IF[case_set(request.config)]
    # one thread, full fp32 (numcheck.convergence.train's pinned state): the sums of a run do
    # not depend on the CI machine's cores
    with pinned(STATE):
        t = ins.run(tele_model, recipe=RECIPE, what_if=what_if, shadow=True, steps=STEPS,
                    seed=SEED)
    assert not t.first_nonfinite(), f"{tele_model}: NaN/Inf at {t.first_nonfinite()}"
    flags = " ".join(f"--what-if {w}" for w in what_if)
    numcheck.telemetry_floors(
        t, model=tele_model, inputs=("seed", SEED), device="cpu",  # ins.run trains on the CPU
        repro=f"numcheck inspect --model {tele_model} --recipe {RECIPE} {flags} --shadow "
              f"--steps {STEPS} --out results/telemetry/{tele_model}")
