"""The quant family's rules (numcheck/quant/quant_rules.py): tables complete, floors that can fail."""
from __future__ import annotations

import math

from numcheck.cases import inputs
from numcheck.verdicts import judge as verdict
from numcheck.quant import quant_rules as QR
from numcheck.quant import paths as QS
from numcheck.records import Status


def test_tables_cover_every_path_and_recipe():
    """The measured tables name every path x distribution and recipe x GEMM distribution."""
    assert set(QR.MEASURED_DB) == set(QS.PATHS)
    assert all(set(v) == set(inputs.DISTRIBUTIONS) for v in QR.MEASURED_DB.values())
    assert set(QR.GAP_DB) == set(QS.RECIPE_NAMES)
    assert all(set(v) == set(QR.GEMM_FULL_DISTS) for v in QR.GAP_DB.values())
    assert math.isfinite(QR.roundtrip_floor("fp8_e4m3_row", "constant_rows")[0])


def test_issue_floors_on_normal():
    """The issue's measured N(0,1) round-trip SQNRs (256 x 1024 there, 64 x 256 here) agree
    within 0.5 dB: e4m3 per-tensor 31.5, e5m2 25.6, MXFP8 30.6 floor / 31.5 rceil, MXFP4 18.8,
    NVFP4 20.4."""
    want = {"fp8_e4m3_tensor": 31.5, "fp8_e5m2_tensor": 25.6, "mx_e4m3_floor": 30.6,
            "mx_e4m3_rceil": 31.5, "mx_e2m1_floor": 18.8, "nvfp4": 20.4}
    for path, db in want.items():
        assert abs(QR.MEASURED_DB[path]["normal"][0] - db) <= 0.5, (path, db)


def test_roundtrip_floor_passes_the_path_and_fails_a_coarser_one():
    """Judged through the one verdict path: the e4m3 path passes its floor; the same record
    labelled as the int8 path (floor ~10 dB higher) fails it."""
    r = verdict.judge(QS.roundtrip_record("fp8_e4m3_tensor", "normal"))
    assert r.status == Status.PASSED, r.reason
    bad = verdict.judge(r.replace(kernel="int8", status=Status.PENDING, reason=""))
    assert bad.status == Status.FAILED and "floor" in bad.reason


def test_gemm_gap_ceiling_fails_a_nan_gap():
    r = verdict.judge(QS.gemm_record("fp8_tensor", "normal"))
    assert r.status == Status.PASSED, r.reason
    nan = r.replace(metrics={**r.metrics, "sqnr_gap_db": math.nan}, status=Status.PENDING)
    assert verdict.judge(nan).status == Status.FAILED


def test_a_failing_round_trip_or_gemm_carries_its_histogram(monkeypatch):
    """As failing op cases: the error histogram over the compared elements, on failure only.
    The e5m2 quantizer under the e4m3 path's name misses that path's floor; a GEMM fails a
    ceiling lowered below its measured gap."""
    from numcheck.quant.recipe import Quantizer

    assert QS.roundtrip_record("fp8_e4m3_row", "normal").ulp_hist is None
    e5m2 = QS.QuantPath("fp8_e4m3_row", Quantizer("fp8", fmt="e5m2", granularity="row"), "row")
    monkeypatch.setitem(QR.GAP_DB["fp8_tensor"], "normal", 0.0)
    for r in (QS.roundtrip_record(e5m2, "normal"), QS.gemm_record("fp8_tensor", "normal")):
        assert sum(r.ulp_hist) == r.kernel_stats.n_compared > 0
        assert len(r.ulp_hist) - 1 == r.kernel_stats.max_ulp.bit_length()  # top bucket
        assert verdict.judge(r).status == Status.FAILED


def test_a_path_without_measured_floors_fails_saying_what_to_add():
    """A new quantization path before its MEASURED_DB row (the format recipe's last step): its
    round trips are measured and fail by name, with the figures to write, never a KeyError."""
    from numcheck.quant.recipe import Quantizer

    new = QS.QuantPath("fp8_e4m3_row_new", Quantizer("fp8", fmt="e4m3", granularity="row"),
                       "row")
    r = verdict.judge(QS.roundtrip_record(new, "normal"))
    assert r.status == Status.FAILED
    assert "no measured floor for path 'fp8_e4m3_row_new'" in r.reason and "MEASURED_DB" in r.reason
    assert f"{r.kernel_stats.sqnr_db:.2f} dB" in r.reason
