"""nc.telemetry.sensitivity and nc.telemetry.plan: which linear layer can take which format,
and the plan gated by training (docs/telemetry.md, "Which layers can take which format")."""
from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from numcheck import telemetry
from numcheck.convergence import converge
from numcheck.convergence.models import build
from numcheck.errors import UsageError
from numcheck.frontends import cli
from numcheck.records import failing
from numcheck.telemetry.planner import Plan, _shapes

GEMMS = ["output", "grad_input", "grad_weight"]


def _records(name, candidates=("nvfp4", "mxfp8", "bf16"), batches=2):
    model, task, _ = build(name, 0)
    return telemetry.sensitivity(model, [task.batch_at(0, s) for s in range(batches)],
                                 candidates)


@pytest.fixture(scope="module")
def planted_mlp():
    return _records("mlp_outliers")


def test_the_planted_layers_are_kept_wider_and_the_rest_cheapest(planted_mlp):
    p = telemetry.plan(planted_mlp)
    assert p.choices == {"fc1": "nvfp4", "fc2": "mxfp8", "fc3": "mxfp8"}
    why = p.fallbacks.set_index("module")
    # the massive input channels of fc3 cost its forward GEMM; fc2's loud output-gradient
    # channels its dgrad GEMM: each named by the GEMM they hurt
    assert (why.loc["fc3", "check"], why.loc["fc3", "role"]) == ("gemm_sqnr_db", "output")
    assert (why.loc["fc2", "check"], why.loc["fc2", "role"]) == ("gemm_sqnr_db", "grad_input")
    assert (why["value"] < why["limit"] - 5).all()          # far below, not at the edge
    # FLOPs: fc1 32->128, fc2 128->128, fc3 128->32 on the same rows: 1 : 4 : 1
    assert p.flops == pytest.approx({"nvfp4": 1 / 6, "mxfp8": 5 / 6})
    # every check of every tried candidate is explained, the cheapest first
    tried = p.explain.groupby("module")["candidate"].unique()
    assert list(tried["fc1"]) == ["nvfp4"] and list(tried["fc3"]) == ["nvfp4", "mxfp8"]
    assert "fc3: mxfp8  <- nvfp4: gemm_sqnr_db output" in p.summary()


@pytest.mark.parametrize("name,wider", [
    ("mlp", set()), ("tiny_lm", set()),
    ("tiny_lm_outliers", {"blocks.0.w_down", "blocks.1.w_up"})])
def test_no_layer_leaves_the_cheapest_format_without_a_planted_reason(name, wider):
    p = telemetry.plan(_records(name))
    assert {m for m, r in p.choices.items() if r != "nvfp4"} == wider
    assert set(p.fallbacks["module"]) == wider


def test_the_gemm_rows_match_an_independent_float64_computation():
    # bf16 as the candidate: both operands rounded by ml_dtypes (the oracle), products in fp64
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=False)
    x = torch.randn(6, 24)
    rec = telemetry.sensitivity(lin, [x], ("bf16",), loss=lambda m, b: m(b).pow(2).sum())
    got = rec.set_index("role").loc["output"]
    x64, w64 = x.double().numpy(), lin.weight.detach().double().numpy()

    def bf16(a):
        return a.astype(ml_dtypes.bfloat16).astype(np.float64)
    y, yq = x64 @ w64.T, bf16(x64) @ bf16(w64).T
    want = 10 * math.log10((y * y).sum() / ((yq - y) ** 2).sum())
    assert got["shadow_sqnr_db"] == pytest.approx(want, rel=1e-9)
    assert set(rec["role"]) == set(GEMMS)             # bf16: no block format, no operand rows
    assert _shapes(rec) == (6, 40, 24)                # M, N, K from the GEMM rows alone


class _Fp16Everywhere:
    """A recipe-like object with no quantizer formats: nothing but its qdq to go by."""
    name, bits_per_element, x, w, grad = "fp16_all", 16.0, None, None, None

    def qdq(self, role, t, dim=-1, generator=None):
        return t.half().to(t.dtype)


def test_a_candidate_that_cannot_be_checked_never_passes_silently():
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    # forward only (a loss without a graph), no formats: the layer's shapes are unknown, so
    # there is no Gaussian level to hold its GEMM to
    rec = telemetry.sensitivity(lin, [torch.randn(6, 24)], (_Fp16Everywhere(),),
                                loss=lambda m, b: m(b).detach().sum())
    assert set(rec["role"]) == {"output"}
    p = telemetry.plan(rec, candidates=(_Fp16Everywhere(),))
    bad = p.explain[p.explain["check"] == "gemm_sqnr_db"]
    assert len(bad) == 1 and not bad["ok"].any() and bad["limit"].isna().all()
    assert "no candidate within the limits" in " ".join(p.fallbacks["check"])


def test_shapes_come_back_from_the_element_counts(planted_mlp):
    # a batch of 64 rows: fc2 is M=64, N=128, K=128
    assert _shapes(planted_mlp[planted_mlp["module"] == "fc2"]) == (64, 128, 128)
    assert _shapes(planted_mlp[planted_mlp["module"] == "fc1"]) == (64, 128, 32)


def test_limits_are_documented_switches(planted_mlp):
    # an absolute floor above nvfp4's level sends every layer to mxfp8
    p = telemetry.plan(planted_mlp, limits={"min_gemm_sqnr_db": 25})
    assert set(p.choices.values()) == {"mxfp8"}
    # the peer's 5% underflow rule: nvfp4 flushes ~7% of Gaussian elements, so no layer keeps it
    p = telemetry.plan(planted_mlp, limits={"underflow_pct": 5})
    assert "nvfp4" not in p.choices.values()
    assert set(p.fallbacks["check"]) >= {"underflow_pct"}
    # off: the planted layers pass (nothing left to check them by), so they take nvfp4
    p = telemetry.plan(planted_mlp, limits={"gemm_drop_db": None})
    assert set(p.choices.values()) == {"nvfp4"}
    # without bf16 and with nothing passing: the widest candidate, said so
    p = telemetry.plan(planted_mlp, candidates=("nvfp4",))
    assert p.choices["fc3"] == "nvfp4"
    assert "no candidate within the limits" in " ".join(p.fallbacks["check"])


def test_a_nonfinite_gemm_never_passes(planted_mlp):
    bad = planted_mlp.copy()
    row = (bad["module"] == "fc1") & (bad["role"] == "output") & (bad["recipe"] == "nvfp4")
    bad.loc[row, "n_nan"] = 3.0
    bad.loc[row, "nonfinite"] = 3.0
    p = telemetry.plan(bad)
    assert p.choices["fc1"] == "mxfp8"
    assert "nonfinite" in set(p.fallbacks["check"])


def test_zero_gemms_have_nothing_to_lose():
    # adaLN-Zero at init: the modulation layers output zeros and most gradients are zero
    p = telemetry.plan(_records("tiny_dit", batches=1))
    assert set(p.choices.values()) == {"nvfp4"}
    assert (p.explain["check"] == "no signal").any()
    assert not p.explain["value"].isna().any() or \
        (p.explain.loc[p.explain["value"].isna(), "check"] == "fallback").all()


def test_bad_input_is_a_usage_error(planted_mlp, tmp_path):
    with pytest.raises(UsageError, match="unknown limit 'sqnr'"):
        telemetry.plan(planted_mlp, limits={"sqnr": 3})
    with pytest.raises(UsageError, match="candidate 'fp5'"):
        telemetry.plan(planted_mlp, candidates=("fp5",))
    watched = pd.DataFrame({c: [] for c in telemetry.KEY})
    with pytest.raises(UsageError, match="nc.telemetry.sensitivity"):
        telemetry.plan(watched)
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(UsageError, match="junk.parquet"):
        telemetry.plan(str(junk))
    with pytest.raises(UsageError, match="junk.parquet"):
        Plan.from_json(junk)
    with pytest.raises(UsageError, match="no nn.Linear"):
        Plan({"fc9": "nvfp4"}, None, None, {}, ()).apply(build("mlp", 0)[0])


def test_a_plan_round_trips_through_json(planted_mlp, tmp_path):
    p = telemetry.plan(planted_mlp)
    back = Plan.from_json(p.to_json(tmp_path / "plan.json"))
    assert back.choices == p.choices and back.flops == pytest.approx(p.flops)
    model = back.apply(build("mlp_outliers", 0)[0])
    assert [type(model.get_submodule(m)).__name__ for m in p.choices] == ["QuantLinear"] * 3
    assert model.fc3.recipe.name == "mxfp8"


def test_the_plan_passes_the_convergence_gate_where_the_uniform_recipe_fails(planted_mlp):
    plan = telemetry.plan(planted_mlp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = converge("mlp_outliers", cases="quick", recipes={
            "nvfp4": None, "plan": plan,
            # the control: the same formats on the wrong layers
            "wrong": {"fc1": "mxfp8", "fc2": "nvfp4", "fc3": "nvfp4"}})
    verdict = {r.kernel: failing(r) for r in run.records()}
    assert verdict == {"fp32": False, "bf16": False, "nvfp4": True, "plan": False, "wrong": True}
    assert run.results["plan"].spec.family == "fp4"   # held to the 4-bit tolerance


def test_cli_plans_verifies_and_converge_takes_the_plan(tmp_path, capsys):
    out = tmp_path / "p"
    assert cli.main(["plan", "--model", "mlp_outliers", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fc3: mxfp8  <- nvfp4" in text and (out / "plan.json").exists()
    # from the records file alone, with a limit switched off
    assert cli.main(["plan", str(out / "sensitivity.parquet"), "--limit", "gemm_drop_db=none",
                     "--out", str(tmp_path / "q")]) == 0
    assert Plan.from_json(tmp_path / "q" / "plan.json").choices["fc3"] == "nvfp4"
    # --verify: the plan and uniform nvfp4 through the gate; the plan passes
    assert cli.main(["plan", "--model", "mlp_outliers", "--verify", "--out", str(out)]) == 0
    assert "nvfp4 " in capsys.readouterr().out
    assert cli.main(["plan", "--model", "mlp_outliers", "--verify", "--limit",
                     "gemm_drop_db=none", "--out", str(tmp_path / "r")]) == 1   # all nvfp4
    assert cli.main(["plan"]) == 2
    assert cli.main(["plan", "--model", "mlp_outliers", "--limit", "gemm_drop_db"]) == 2
    assert cli.main(["plan", "--model", "mlp_outliers", "--candidates", "fp5"]) == 2
    assert cli.main(["converge", "--model", "mlp_outliers", "--recipe", "bf16", "--plan",
                     str(out / "plan.json"), "--out", str(tmp_path / "c")]) == 0
    assert "plan " in capsys.readouterr().out


def test_mx_floor_scales_clip_the_cross_entropy_gradient_and_the_plan_sees_it():
    # OCP MX floor scales clip a block maximum just below a power of two by up to 12.5%: the
    # CE gradient's target entry (1 - p, near 1 at init) is one; rceil scales clip nothing
    rec = _records("tiny_lm", candidates=("mxfp8", "mxfp8_rceil", "bf16"))
    floor = telemetry.plan(rec, candidates=("mxfp8", "bf16"))
    assert floor.choices["head"] == "bf16"
    why = floor.fallbacks.set_index("module").loc["head"]
    assert (why["check"], why["role"]) == ("gemm_sqnr_db", "grad_input")
    assert {m for m, r in floor.choices.items() if r == "bf16"} == {"head"}
    rceil = telemetry.plan(rec, candidates=("mxfp8_rceil", "bf16"))
    assert set(rceil.choices.values()) == {"mxfp8_rceil"}
    sat = rec[(rec["module"] == "head") & (rec["role"] == "grad_output")]
    sat = sat.groupby("recipe")["saturation_pct"].max()
    assert sat["mxfp8"] > 1.0 and sat["mxfp8_rceil"] == 0.0
