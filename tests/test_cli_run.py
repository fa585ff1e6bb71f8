"""`numcheck run`: the built-in suites through pytest, results parquet, report, exit codes."""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq

from numcheck.frontends.cli import main

REPO = Path(__file__).resolve().parent.parent
ONE_CASE = ["--suite", "quant", "-k", "roundtrip and fp8_e4m3_tensor-normal", "-n", "0"]


def test_run_strict_on_shipped_goldens_writes_results_and_report(tmp_path, capsys):
    results = tmp_path / "r" / "results.parquet"
    code = main(["run", *ONE_CASE, "--strict", "--results", str(results)])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = pq.read_table(results).to_pylist()
    assert [(r["op"], r["golden"]) for r in rows] == [("roundtrip", "same")]
    report = (tmp_path / "r" / "report.md").read_text()
    assert "## numcheck report" in report and "Round-trip SQNR" in report
    assert "| fp8_e4m3_tensor |" in out  # the SQNR table is printed too


def test_bad_golden_exits_2_and_results_are_still_written(tmp_path, capsys):
    gdir = tmp_path / "golden"
    shutil.copytree(REPO / "golden" / "cpu", gdir / "cpu")
    bad = gdir / "cpu" / "quant.parquet"
    bad.write_bytes(b"garbage")
    results = tmp_path / "results.parquet"
    code = main(["run", *ONE_CASE, "--golden-dir", str(gdir), "--results", str(results)])
    out = capsys.readouterr().out
    assert code == 2, out
    assert results.exists() and bad.read_bytes() == b"garbage"


def test_missing_golden_in_strict_mode_fails(tmp_path, capsys):
    code = main(["run", *ONE_CASE, "--strict", "--golden-dir", str(tmp_path / "empty"),
                 "--results", str(tmp_path / "r.parquet")])
    assert code == 1
    assert not (tmp_path / "empty").exists()  # strict writes no golden


def test_unknown_suite_is_a_usage_error(capsys):
    assert main(["run", "--suite", "nope"]) == 2
    assert "--suite nope: unknown; built-in suites: " in capsys.readouterr().err
