"""Telemetry goldens: a model's per-layer floors (numcheck.telemetry.floors) through the golden
store and rules (numcheck.telemetry.telemetry_rules).

The plugin's behaviour runs in pytest subprocesses (pytester's in-process runs import triton's
extension twice here): a refresh records, a strict rerun passes; an MXFP8 recipe whose
quantizer keeps one mantissa bit less fails naming layer, role, statistic, golden and now; a
quantizer that returns NaN fails and is not written at refresh; a missing golden fails under
strict. The rules' edges run in process on golden rows.
"""
from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch

from numcheck import telemetry
from numcheck.goldens import store as golden
from numcheck.records import Record, Status
from numcheck.verdicts.families import family_of_row
from numcheck.goldens.regression import compare_row
from numcheck.goldens.session import GoldenSession
from numcheck.telemetry.floors import as_records, floors
from numcheck.telemetry.telemetry_rules import (PCT_SLACK_ELEMENTS, SHADOW_CROSS_DB,
                                               SHADOW_SLACK_DB, SQNR_SLACK_DB, merge_metrics,
                                               unbakeable)
from numcheck.verdicts.judge import judge

pytest_plugins = ["pytester"]

# A user's test: a two-layer MLP trained 3 steps under watch with MXFP8 (observed) and NVFP4
# (what-if) and shadows; TELE_MODE plants a fault into the observed recipe's quantizer.
USER_TEST = '''
import os

import torch

from numcheck import telemetry
from numcheck.ops.variants import planted_mx_recipe


def recipe():
    mode = os.environ.get("TELE_MODE", "")
    return planted_mx_recipe(mode) if mode else "mxfp8"


def test_mlp_floors(numcheck):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    with telemetry.watch(model, recipe=recipe(), what_if=("nvfp4",), shadow=True) as t:
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            t.step()
    numcheck.telemetry_floors(t, model="mlp2", inputs="seed 0")
'''

GOLDEN = os.path.join("golden", "cpu", "user_floors.parquet")


def _run(pytester, *args, mode=""):
    os.environ["TELE_MODE"] = mode
    try:
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    finally:
        os.environ.pop("TELE_MODE", None)


@pytest.fixture
def project(pytester):
    pytester.makepyfile(test_user_floors=USER_TEST)
    pytester.makeini("[pytest]\nnumcheck_golden_dir = golden\n")
    return pytester


def test_refresh_then_strict_passes_and_a_lost_mantissa_bit_fails(project):
    rec = _run(project, "--numcheck-refresh")
    assert rec.ret == 0, rec.stdout.str()
    rows = golden.read(project.path / GOLDEN).rows
    # fc 0 and 2: input, weight, grad_output x (mxfp8, nvfp4), and the outputs' shadows
    assert len(rows) == 2 * 3 * 2 + 2, sorted(rows)
    key = ("user_floors", "telemetry", "linear", "mlp2/mxfp8/0/input", "telemetry", "cpu")
    m = json.loads(rows[key]["metrics"])
    assert m["steps"] == 3 and 25 < m["sqnr_db_floor"] < 40 and m["nonfinite_ceiling"] == 0
    assert (project.path / GOLDEN).with_suffix(".txt").read_text().count("\n") == len(rows)

    same = _run(project, "--numcheck-strict")
    assert same.ret == 0, same.stdout.str()
    assert f"golden: {len(rows)} same" in same.stdout.str()

    lost = _run(project, "--numcheck-strict", mode="lost_bit")
    out = lost.stdout.str()
    assert lost.ret == 1, out
    # the failure names layer, role, recipe, statistic, golden and now, and the what-if rows
    # (another recipe, untouched) stay the same
    line = next(ln for ln in out.splitlines() if "0 input [mlp2, mxfp8]: SQNR floor" in ln)
    got = re.search(r"0 input \[mlp2, mxfp8\]: SQNR floor \(sqnr_db\) golden ([\d.]+) dB, "
                    r"now ([\d.]+) dB \(-[\d.]+, slack 0.25\)", line)
    assert got and float(got[2]) < float(got[1]) - 3, line
    assert "telemetry/linear/mlp2/mxfp8/0/input:" in out
    assert "nvfp4" not in "".join(ln for ln in out.splitlines() if "regressed" in ln)


def test_nan_statistic_fails_and_is_never_written(project):
    nan = _run(project, "--numcheck-refresh", mode="nan")
    out = nan.stdout.str()
    assert nan.ret == 1, out
    assert "SQNR floor (sqnr_db) is NaN" in out
    assert "refused" in out and "sqnr_db_floor NaN" in out
    rows = golden.read(project.path / GOLDEN).rows
    assert rows and not any(r["case_id"].startswith("mlp2/mxfp8/") and
                            "sqnr_db_floor" in (r["metrics"] or "") and
                            math.isnan(json.loads(r["metrics"]).get("sqnr_db_floor", 0))
                            for r in rows.values())
    assert not any(k[3].startswith("mlp2/mxfp8/") and k[3].endswith(("/input", "/weight"))
                   for k in rows)


def test_missing_golden_fails_under_strict(project):
    strict = _run(project, "--numcheck-strict")
    out = strict.stdout.str()
    assert strict.ret == 1, out
    assert "missing" in out and not (project.path / GOLDEN).exists()


# --- in process: the floors and the rules on rows --------------------------------------------

def _frame(steps=3, zero_first=True):
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32)
    if zero_first:  # adaLN-zero: no signal at step 0, so no SQNR that step
        torch.nn.init.zeros_(lin.weight)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    with telemetry.watch(lin, recipe="mxfp8", shadow=True) as t:
        for _ in range(steps):
            lin(torch.randn(8, 32)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            t.step()
    return t.records()


def test_floors_skip_steps_without_signal_and_take_the_minimum():
    df = _frame()
    f = floors(df)
    w = f[(f.role == "weight") & (f.recipe == "mxfp8")].iloc[0]
    steps = df[(df.role == "weight") & (df.recipe == "mxfp8")].sort_values("step")
    assert math.isnan(steps.sqnr_db.iloc[0])  # all-zero at step 0
    assert w.sqnr_db_floor == steps.sqnr_db.iloc[1:].min() and w.steps == 3
    recs = as_records(df, model="m")
    assert {r.case_id for r in recs} >= {"m/mxfp8/<model>/weight", "m/fp32/<model>/output"}
    assert all(r.family == "telemetry" and r.output == "telemetry" for r in recs)
    # a NaN of a step that has signal poisons the floor and fails
    bad = df.copy()
    bad.loc[steps.index[1], "sqnr_db"] = float("nan")
    r = next(r for r in as_records(bad, model="m") if r.case_id == "m/mxfp8/<model>/weight")
    assert math.isnan(r.metric("sqnr_db_floor"))
    assert judge(r).status == Status.FAILED and "SQNR floor (sqnr_db) is NaN" in r.reason


def _row(case="m/mxfp8/fc/input", platforms="cpu, AVX512, torch 2.13.0+cpu", **metrics):
    m = {"sqnr_db_floor": 30.0, "worst_block_sqnr_db_floor": 22.0, "underflow_pct_ceiling": 0.0,
         "saturation_pct_ceiling": 1.0, "nonfinite_ceiling": 0.0, "steps": 4, "n": 16384.0}
    m.update(metrics)
    rec = Record(suite="s", op="telemetry", kernel="linear", case_id=case, output="telemetry",
                 family="telemetry", metrics=m, status=Status.PASSED, input_digest="d",
                 platforms=platforms)
    return golden.to_row(rec)


@pytest.mark.parametrize("change, kind", [
    ({}, "same"),
    ({"sqnr_db_floor": 30.0 - SQNR_SLACK_DB / 2}, "same"),
    ({"sqnr_db_floor": 28.5}, "regressed"),  # a quarter bit lost
    ({"sqnr_db_floor": 36.0}, "improved"),
    ({"worst_block_sqnr_db_floor": 19.0}, "regressed"),
    ({"saturation_pct_ceiling": 1.0 + 100.0 * (PCT_SLACK_ELEMENTS - 1) / 16384}, "same"),
    ({"saturation_pct_ceiling": 3.0}, "regressed"),
    ({"nonfinite_ceiling": 1.0}, "regressed"),
    ({"sqnr_db_floor": float("nan")}, "regressed"),
])
def test_golden_rules(change, kind):
    old, new = _row(), _row(**change)
    assert family_of_row(new) == "telemetry"
    ch = compare_row(old, new)
    assert ch.kind == kind, ch.messages
    if kind == "regressed":
        assert ch.messages[0].startswith("fc input [m, mxfp8]: "), ch.messages


def test_another_tier_within_the_slack_is_the_same_and_inputs_changed_is_its_own_verdict():
    new = _row(platforms="cpu, AVX2, torch 2.13.0+cpu", sqnr_db_floor=29.99)
    assert compare_row(_row(), new).kind == "same"
    other = _row()
    other["input_digest"] = "e"
    assert compare_row(_row(), other).kind == "inputs_changed"
    gone = _row()
    gone["metrics"] = json.dumps({k: v for k, v in json.loads(gone["metrics"]).items()
                                  if k != "worst_block_sqnr_db_floor"})
    ch = compare_row(_row(), gone)
    assert ch.kind == "regressed" and "no longer measured" in ch.messages[0]


def test_refresh_refuses_nan_and_new_nonfinite_and_merges_an_envelope(tmp_path):
    assert "NaN" in unbakeable(_row(sqnr_db_floor=float("nan")), None)
    assert "2 non-finite" in unbakeable(_row(nonfinite_ceiling=2.0), _row())
    assert unbakeable(_row(), _row()) == ""
    merged = json.loads(merge_metrics(_row(), _row(sqnr_db_floor=29.9,
                                                   saturation_pct_ceiling=0.5)))
    assert merged["sqnr_db_floor"] == 29.9 and merged["saturation_pct_ceiling"] == 1.0

    def rec(**m):
        r = Record.from_row({**_row(**m), "family": "telemetry"})
        r.metrics = json.loads(_row(**m)["metrics"])
        return r
    GoldenSession(tmp_path, "refresh").finish([rec()], {})
    rep = GoldenSession(tmp_path, "refresh").finish([rec(sqnr_db_floor=float("nan"))], {})
    assert rep.refused and not rep.written
    stored = golden.read(golden.path_for(tmp_path, "cpu", "s")).rows
    assert json.loads(next(iter(stored.values()))["metrics"])["sqnr_db_floor"] == 30.0
    assert "sqnr_db_floor=30" in golden.summary_text(stored.values())


def test_an_envelope_keeps_a_statistic_the_other_platform_does_not_measure():
    """merge_metrics is the worse of both, as golden.merge_envelope's statistics: a floor one
    platform measured and the other did not stays in the envelope (dropping it would leave the
    statistic ungated on both platforms)."""
    new = _row(platforms="cpu, AVX2, torch 2.13.0+cpu")
    m = json.loads(new["metrics"])
    del m["worst_block_sqnr_db_floor"]
    new["metrics"] = json.dumps(m)
    merged = json.loads(merge_metrics(_row(), new))
    assert merged["worst_block_sqnr_db_floor"] == 22.0
    env = {**_row(), "metrics": json.dumps(merged)}
    assert compare_row(env, _row(worst_block_sqnr_db_floor=12.0)).kind == "regressed"


def test_an_infinitely_bad_statistic_fails_and_is_never_written():
    """A quantizer that makes an Inf out of finite values (the planted ``nan`` fault's twin):
    its SQNR floors are -inf. Like a NaN, that fails and a refresh refuses it; a floor of +inf
    (no error at all) is fine."""
    from numcheck.ops.variants import FaultyMX, PlantedRecipe, _PlantedQuantizer
    from numcheck.quant.recipe import get_recipe

    class InfMX(FaultyMX):
        def decode(self, q):
            x = super(FaultyMX, self).decode(q).clone()
            x.view(-1)[0] = math.inf
            return x
    r = get_recipe("mxfp8")
    recipe = PlantedRecipe("mxfp8", *(_PlantedQuantizer(InfMX(q.fmt, q.block, q.scale_mode,
                                                              "inf")) for q in (r.x, r.w, r.grad)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    with telemetry.watch(model, recipe=recipe) as t:
        for _ in range(2):
            model(torch.randn(32, 64)).sum().backward()
            t.step()
    rec = next(x for x in as_records(t, model="mlp2") if x.case_id == "mlp2/mxfp8/0/input")
    assert rec.metric("sqnr_db_floor") == -math.inf
    assert judge(rec).status == Status.FAILED and "SQNR floor (sqnr_db) is -inf" in rec.reason
    assert "sqnr_db_floor -inf" in unbakeable(golden.to_row(rec), None)
    assert unbakeable(_row(sqnr_db_floor=math.inf), None) == ""


def test_underflow_slack_counts_in_the_finite_nonzero_elements():
    from numcheck.telemetry.telemetry_rules import BY_KEY, PCT_SLACK, slack
    under, sat = BY_KEY["underflow_pct_ceiling"], BY_KEY["saturation_pct_ceiling"]
    sparse = {"n": 100_000.0, "nz": 100.0}   # 99.9% zeros: one element is 1% of the rest
    assert slack(under, sparse) == pytest.approx(8.0)   # 8 elements of 100
    assert slack(sat, sparse) == PCT_SLACK               # 8 of 100000 is below the floor
    assert slack(under, {"n": 100_000.0}) == PCT_SLACK   # an older golden row: n


def test_per_step_values_are_the_frames_and_travel_in_results_only(tmp_path):
    df = _frame()
    recs = {r.case_id: r for r in as_records(df, model="m")}
    r = recs["m/mxfp8/<model>/weight"]
    rows = df[(df.role == "weight") & (df.recipe == "mxfp8") & ~df.what_if].sort_values("step")
    assert r.per_step["step"] == sorted(rows.step.astype(int))
    # step 0 (all-zero weights) does not define the SQNR: None there, the frame's value after
    assert r.per_step["sqnr_db_floor"][0] is None
    assert r.per_step["sqnr_db_floor"][1:] == rows.sqnr_db.iloc[1:].tolist()
    assert min(r.per_step["sqnr_db_floor"][1:]) == r.metric("sqnr_db_floor")
    assert r.per_step["nonfinite_ceiling"] == [0.0] * len(rows)
    # a module called twice in a step: that step holds the worse of its two rows
    import pandas as pd
    extra = rows.iloc[[2]].assign(sqnr_db=rows.sqnr_db.iloc[2] - 7.0)
    twice = pd.concat([df, extra], ignore_index=True)
    r2 = next(x for x in as_records(twice, model="m") if x.case_id == r.case_id)
    assert r2.per_step["sqnr_db_floor"][2] == rows.sqnr_db.iloc[2] - 7.0
    assert r2.per_step["step"] == r.per_step["step"]
    # a NaN of a defined step stays NaN (the floor fails on it)
    bad = df.copy()
    bad.loc[rows.index[1], "sqnr_db"] = float("nan")
    r3 = next(x for x in as_records(bad, model="m") if x.case_id == r.case_id)
    assert math.isnan(r3.per_step["sqnr_db_floor"][1])
    # results keep them (None included), goldens do not
    path = golden.write_results(tmp_path / "r.parquet", list(recs.values()), {})
    back = {x.case_id: x for x in golden.read_results(path)[0]}
    got = back[r.case_id].per_step
    assert got["step"] == r.per_step["step"] and got["sqnr_db_floor"][0] is None
    assert got["sqnr_db_floor"][1:] == r.per_step["sqnr_db_floor"][1:]
    assert "per_step" in golden.RESULTS_SCHEMA.names and "per_step" not in golden.COLUMNS


@pytest.mark.parametrize("platforms, floor, kind", [
    ("cpu, AVX512, torch 2.13.0+cpu", 134.3, "regressed"),  # same platform: 3 dB slack
    ("Intel Xeon, AVX512, torch 2.13.0+cpu", 134.3, "drift"),  # CI's 2026-12-03 case
    ("Intel Xeon, AVX512, torch 2.13.0+cpu", 137.6 - SHADOW_SLACK_DB - SHADOW_CROSS_DB - 0.1,
     "regressed"),
    ("Intel Xeon, AVX512, torch 2.13.0+cpu", 60.0, "regressed"),  # the layer ran in bf16
    ("Intel Xeon, AVX512, torch 2.13.0+cpu", float("nan"), "regressed"),
])
def test_shadow_floors_get_a_cross_platform_slack_on_another_platform_only(platforms, floor, kind):
    """An fp32 layer's error against float64 depends on the CPU's GEMM (its blocking, AMX): on
    a platform outside the golden's envelope a shadow floor within SHADOW_CROSS_DB more is drift,
    while a layer that lost its fp32 precision regresses everywhere."""
    old = _row(case="m/fp32/fc/output", shadow_sqnr_db_floor=137.6)
    new = _row(case="m/fp32/fc/output", platforms=platforms, shadow_sqnr_db_floor=floor)
    ch = compare_row(old, new)
    assert ch.kind == kind, ch.messages
    if kind == "drift":
        assert any("cross-platform slack" in m for m in ch.messages), ch.messages
