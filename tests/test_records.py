"""The one record type and the one failing function (numcheck.records), used everywhere a
verdict is read: verify, the plugin, the CLI, the golden session and the report."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from numcheck.records import (GOLDEN_FIELDS, MODES, Golden, Record, Status, failing, from_json,
                              to_json)
from numcheck.measure.stats import ErrorStats

# Every (status, golden verdict) in every mode, once: does the record fail the run?
# Absolute verdicts bind in every mode; golden verdicts as the mode makes them binding.
FAILS_BY_STATUS = {Status.PASSED: False, Status.KNOWN: False, Status.SKIPPED: False,
                   Status.FAILED: True, Status.ERROR: True, Status.PENDING: True}
FAILS_BY_GOLDEN = {  # mode -> golden verdicts that fail
    "check": {Golden.REGRESSED, Golden.MISSING, Golden.BAD_GOLDEN},
    "strict": {Golden.REGRESSED, Golden.MISSING, Golden.INPUTS_CHANGED, Golden.BAD_GOLDEN},
    "refresh": {Golden.BAD_GOLDEN},
    "refresh-new": {Golden.BAD_GOLDEN},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("golden", [None, *Golden])
def test_failing_table(mode, status, golden):
    r = Record(op="x", status=status, golden=golden)
    want = FAILS_BY_STATUS[status] or (golden is not None and golden in FAILS_BY_GOLDEN[mode])
    assert failing(r, mode) is want


def test_enums_equal_and_hash_like_their_strings():
    """Records read back from parquet/JSON compare with plain strings, and Counter keys of
    either kind meet (the plugin's summary counts by status)."""
    assert Status.FAILED == "failed" and {"failed": 1}[Status.FAILED] == 1
    assert Golden.INPUTS_CHANGED == "inputs_changed" and hash(Golden.SAME) == hash("same")
    assert str(Status.KNOWN) == "known"


def _stats(**kw) -> ErrorStats:
    base = dict(fmt="bf16", n=4, n_compared=4, n_nan=0, n_inf=0, nonfinite_mismatch=0,
                max_abs=0.5, mean_abs=0.1, rel_l2=1e-3, sqnr_db=60.0, cosine=1.0, bias=0.0,
                max_ulp=1, mean_ulp=0.5, p99_ulp=1, bias_ulp=0.0, mag_bias_ulp=0.0,
                min_block_sqnr_db=math.inf, worst_block=0, n_blocks=1)
    return ErrorStats(**{**base, **kw})


def test_flat_row_round_trip():
    r = Record(suite="ops", op="rms_norm", kernel="torch", case_id="c", status=Status.KNOWN,
               golden=Golden.IMPROVED, kernel_stats=_stats(), baseline_stats=_stats(rel_l2=2e-3),
               metrics={"clip_frac": 0.25}, findings=("a", "b"), bound_ratio=math.nan)
    row = r.as_row()
    assert row["status"] == "known" and row["kernel_rel_l2"] == 1e-3
    assert row["baseline_rel_l2"] == 2e-3 and row["kernel_fmt"] == "bf16"
    back = Record.from_row(row)
    assert back.status is Status.KNOWN and back.golden is Golden.IMPROVED
    assert back.kernel_stats == r.kernel_stats and back.findings == ("a", "b")
    again = from_json(to_json([r]))[0]
    assert again.baseline_stats == r.baseline_stats and math.isnan(again.bound_ratio)
    assert Record.from_row({"op": "x"}).kernel_stats is None


def test_golden_schema_derives_from_the_record():
    """Golden columns are the record's golden fields, stats expanded: the same columns as the
    shipped goldens (schema version 1)."""
    from numcheck.goldens import store as golden

    assert GOLDEN_FIELDS[:6] == golden.KEY
    assert "kernel_rel_l2" in golden.COLUMNS and "kernel_stats" not in golden.COLUMNS
    shipped = golden.read(golden.path_for(Path(__file__).parent.parent / "golden", "cpu", "ops"))
    assert set(next(iter(shipped.rows.values()))) == set(golden.COLUMNS)
