"""Golden regression rules (numcheck.goldens.regression) on rows, one rule at a time."""
from __future__ import annotations

import math

import pytest

from numcheck.goldens import store as golden
from numcheck.goldens.regression import S_E_FP32, S_E_LOW, Z, compare_row, error_slack

from _support import golden_record as _record


def _row(**kw):
    return golden.to_row(_record(**kw))


def test_no_golden_is_new_and_same_is_same():
    assert compare_row(None, _row()).kind == "new"
    assert compare_row(_row(), _row()).kind == "same"


def test_changed_inputs_are_reported_not_judged():
    ch = compare_row(_row(), _row(input_digest="cd", rel=1.0))
    assert ch.kind == "inputs_changed" and "input digest ab -> cd" in ch.messages[0]


@pytest.mark.parametrize("factor", [2 ** 0.5, 2.0])
def test_half_a_bit_lost_is_a_regression_naming_the_metric(factor):
    # kernel error as large as the baseline's yardstick over many elements: slack is S_E of it
    old = _row(rel=1e-3, kernel_n=4096, kernel_n_compared=4096)
    old["baseline_rel_l2"] = 1e-3
    new = dict(old, kernel_rel_l2=1e-3 * factor, kernel_sqnr_db=60 - 20 * math.log10(factor))
    ch = compare_row(old, new)
    assert ch.kind == "regressed" and ch.messages[0].startswith("rel_l2 0.001 ->")


def test_slack_follows_rounding_noise_not_a_fixed_percentage():
    # few elements: the RMS of 7 errors moves by ~1/sqrt(14) between benign rewrites
    assert error_slack(1e-3, 1e-3, 7, 2 ** -8) == pytest.approx(Z * 1e-3 / math.sqrt(14))
    # many elements: a tenth of the yardstick (the baseline's error) in bf16 ...
    assert error_slack(1e-2, 1e-2, 10 ** 6, 2 ** -8) == pytest.approx(S_E_LOW * 1e-2)
    # ... twice it in fp32, where another summation order alone moves the error that much
    assert error_slack(1e-7, 1e-7, 10 ** 6, 2 ** -24) == pytest.approx(S_E_FP32 * 1e-7)
    # an exact kernel: 5% of the unit roundoff
    assert error_slack(0.0, 0.0, 10 ** 6, 2 ** -8) == pytest.approx(0.05 * 2 ** -8)


def test_improvement_beyond_slack_is_reported():
    old = _row(rel=2e-3, kernel_n=4096, kernel_n_compared=4096)
    new = _row(rel=5e-4, kernel_n=4096, kernel_n_compared=4096)
    new["baseline_rel_l2"] = old["baseline_rel_l2"]
    assert compare_row(old, new).kind == "improved"


def test_new_nonfinite_values_regress():
    ch = compare_row(_row(), _row(kernel_n_nan=1, kernel_nonfinite_mismatch=1))
    assert ch.kind == "regressed" and "non-finite" in ch.messages[0]


def test_nan_stat_never_passes():
    new = _row()
    new["kernel_rel_l2"] = math.nan
    assert compare_row(_row(), new).kind == "regressed"


def test_worst_block_regression():
    old = _row()
    new = _row(kernel_min_block_sqnr_db=40.0)  # 10 dB lower, everything else equal
    ch = compare_row(old, new)
    assert ch.kind == "regressed" and "worst block SQNR 50.12 -> 40.0" in ch.messages[0]


def test_ulp_and_truncation_rules_only_where_the_op_gates_them():
    old = _row(gate_ulp=True, gate_bias=True, kernel_n=4096, kernel_n_compared=4096)
    assert compare_row(old, dict(old, kernel_max_ulp=2)).kind == "same"  # +1 allowed
    ch = compare_row(old, dict(old, kernel_max_ulp=3))
    assert ch.kind == "regressed" and "max ULP 1 -> 3" in ch.messages[0]
    big = dict(old, kernel_max_ulp=8)  # a quarter of the golden's max ULP is allowed too
    assert compare_row(big, dict(big, kernel_max_ulp=10)).kind == "same"
    assert compare_row(big, dict(big, kernel_max_ulp=11)).kind == "regressed"
    ch = compare_row(old, dict(old, kernel_mag_bias_ulp=-0.5))  # truncation
    assert ch.kind == "regressed" and "toward larger magnitude" in ch.messages[0]
    ungated = _row(kernel_n=4096, kernel_n_compared=4096)
    assert compare_row(ungated, dict(ungated, kernel_max_ulp=40)).kind == "same"


def test_kernel_that_stops_running_regresses_and_back():
    old = _row()
    err = {k: v for k, v in old.items() if not k.startswith("kernel_")}
    err["status"] = "error"
    assert compare_row(old, err).kind == "regressed"
    assert compare_row(err, old).kind == "improved"


def _curve(series, band):
    return dict(_row(), kernel_n=None, series=list(series), series_band=list(band),
                op="mlp", kernel="nvfp4", output="loss")


def test_curve_rows_use_the_window_band():
    gold = _curve([0.01] * 100, [0.002] * 100)
    assert compare_row(gold, _curve([0.0105] * 100, [0.002] * 100)).kind == "same"
    # one wild step is not a regression; a sustained shift over a window is
    spike = [0.01] * 100
    spike[50] = 1.0
    assert compare_row(gold, _curve(spike, [0.002] * 100)).kind == "same"
    worse = compare_row(gold, _curve([0.01] * 60 + [0.02] * 40, [0.002] * 100))
    assert worse.kind == "regressed" and "steps 60-79" in worse.messages[0]
    better = compare_row(gold, _curve([0.0] * 100, [0.002] * 100))
    assert better.kind == "improved" and "below" in better.messages[0]
    nan = compare_row(gold, _curve([0.01] * 99 + [math.nan], [0.002] * 100))
    assert nan.kind == "regressed" and "non-finite" in nan.messages[0]


A, B = "AMD EPYC, AVX512, torch 2.13.0+cpu", "AMD EPYC, AVX2, torch 2.13.0+cpu"


def _gated(**kw):
    row = golden.to_row(_record(rel=1e-3, platforms=A, gate_ulp=True, gate_bias=True))
    row.update(kernel_n=4096, kernel_n_compared=4096)
    return dict(row, **kw)


@pytest.mark.parametrize("old, new, kind, messages", [
    (_gated(), _gated(kernel_rel_l2=2e-3, kernel_sqnr_db=53.98, kernel_min_block_sqnr_db=40.0,
                      kernel_max_ulp=3, kernel_mag_bias_ulp=-0.5, kernel_n_nan=2,
                      kernel_nonfinite_mismatch=1, status="failed"), "regressed", [
        "non-finite: 2 NaN/inf (1 unlike the reference), golden 0 (0)",
        "rel_l2 0.001 -> 0.002 (SQNR 60.0 -> 53.98 dB) (slack 0.0002)",
        "worst block SQNR 50.12 -> 40.0 dB (rel 0.00312 -> 0.01) (slack 0.00055)",
        "max ULP 1 -> 3 (slack 1)",
        "|mean ULP toward larger magnitude| 0.000 -> 0.500 (slack 0.100; truncation gives 0.5)",
        "absolute rules: passed -> failed"]),
    (_gated(), _gated(kernel_rel_l2=1e-4, kernel_sqnr_db=80.0, kernel_min_block_sqnr_db=70.0),
     "improved", [
        "rel_l2 0.001 -> 0.0001 (SQNR 60.0 -> 80.0 dB) (beyond slack 0.0002)",
        "worst block SQNR 50.12 -> 70.0 dB (rel 0.00312 -> 0.000316) (beyond slack 0.00055)"]),
    (_gated(), _gated(platforms=B, kernel_rel_l2=1.3e-3, kernel_min_block_sqnr_db=48.4,
                      kernel_max_ulp=3, kernel_mag_bias_ulp=0.2), "drift", [
        "rel_l2 0.001 -> 0.0013 (SQNR 60.0 -> 60.0 dB): within the cross-platform slack 0.0002",
        "worst block SQNR 50.12 -> 48.4 dB (rel 0.00312 -> 0.0038): within the cross-platform "
        "slack 0.00031",
        "max ULP 1 -> 3: within the cross-platform slack 1",
        "|mean ULP toward larger magnitude| 0.000 -> 0.200 (slack 0.100; truncation gives 0.5): "
        "within the cross-platform bound 0.25",
        f"golden recorded on {A}; here {B} (AVX512 -> AVX2)"]),
    (_gated(), _gated(status="error", kernel_n=None), "regressed",
     ["the kernel now fails to run (passed -> error)"]),
    (_gated(status="error", kernel_n=None), _gated(), "improved",
     ["the kernel runs again (error -> passed)"]),
    (_gated(kernel_n_nan=3, kernel_n_inf=1, kernel_nonfinite_mismatch=1), _gated(), "improved",
     ["non-finite: 4 -> 0"]),
], ids=["worse", "better", "drift", "fails-to-run", "runs-again", "fewer-nonfinite"])
def test_every_common_rule_words_its_finding_as_users_read_it(old, new, kind, messages):
    """The messages of each common rule, word for word (users and tests read them; they were
    written row by row before the rules were shared with numcheck compare)."""
    ch = compare_row(old, new)
    assert (ch.kind, ch.messages) == (kind, messages)
