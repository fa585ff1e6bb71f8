"""The parquet golden store: schema, rounding, atomic and change-only writes, bad files."""
from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from numcheck.goldens import store as golden
from numcheck.records import from_json, to_json
from numcheck.frontends.cli import main
from numcheck.goldens.store import GoldenError

from _support import golden_record as _record


def _rows(*records):
    rows = [golden.to_row(r) for r in records]
    return {golden.key_of(r): r for r in rows}


def test_rows_are_rounded_as_documented():
    row = golden.to_row(_record())
    assert row["kernel_rel_l2"] == 1.235e-3  # 4 significant digits
    assert row["kernel_min_block_sqnr_db"] == 50.12  # 0.01 dB
    assert row["kernel_mean_ulp"] == 0.25 and row["kernel_max_ulp"] == 1
    assert row["u"] == 2.0 ** -8  # verdict input stored exactly
    assert set(row) == set(golden.COLUMNS)


def test_write_read_round_trip_and_metadata(tmp_path):
    path = golden.path_for(tmp_path, "cpu", "s")
    gf = golden.read(path)
    assert not gf.exists and gf.rows == {}
    rows = _rows(_record("c2"), _record("c1"))
    assert golden.write(gf, rows, {"torch": "x", "cpu_isa": "AVX2"})
    back = golden.read(path)
    assert back.provenance == {"torch": "x", "cpu_isa": "AVX2"}
    assert list(back.rows) == sorted(rows)  # stored sorted by key
    for k in rows:
        assert golden.rows_equal(back.rows[k], rows[k])
    meta = pq.read_schema(path).metadata
    assert int(meta[b"numcheck.schema_version"]) == golden.SCHEMA_VERSION
    # the text summary beside it, one sorted line per row
    text = path.with_suffix(".txt").read_text().splitlines()
    assert [t.split()[0] for t in text] == ["rms_norm/torch/c1/out", "rms_norm/torch/c2/out"]


def test_unchanged_content_is_not_rewritten(tmp_path):
    path = golden.path_for(tmp_path, "cpu", "s")
    gf = golden.read(path)
    golden.write(gf, _rows(_record()), {"date": "d1"})
    before = path.stat().st_mtime_ns, path.read_bytes()
    # same rows from a rerun (noise below the stored rounding), a new date: nothing written
    assert not golden.write(golden.read(path), _rows(_record(rel=1.2346e-3)), {"date": "d2"})
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before
    assert golden.write(golden.read(path), _rows(_record(rel=2e-3)), {"date": "d2"})


def test_readable_by_pandas_as_it_is(tmp_path):
    pd = pytest.importorskip("pandas")
    path = golden.path_for(tmp_path, "cpu", "s")
    golden.write(golden.read(path), _rows(_record("a"), _record("b")), {})
    df = pd.read_parquet(path)
    assert list(df["case_id"]) == ["a", "b"] and df["kernel_sqnr_db"].dtype == "float64"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_file_names_the_path_and_the_remedy(tmp_path, damage):
    path = golden.path_for(tmp_path, "cpu", "s")
    golden.write(golden.read(path), _rows(_record()), {})
    data = path.read_bytes()
    path.write_bytes({"garbage": b"not parquet at all", "truncated": data[: len(data) // 2],
                      "empty": b""}[damage])
    damaged = path.read_bytes()
    with pytest.raises(GoldenError, match=r"not a readable parquet file.*git checkout") as e:
        golden.read(path)
    assert str(path) in str(e.value)
    assert path.read_bytes() == damaged  # never overwritten


def test_foreign_parquet_and_newer_schema(tmp_path):
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), foreign)
    with pytest.raises(GoldenError, match="not a numcheck golden"):
        golden.read(foreign)
    newer = tmp_path / "newer.parquet"
    table = golden._table(_rows(_record()).values(), {}, golden.SCHEMA)
    meta = dict(table.schema.metadata)
    meta[b"numcheck.schema_version"] = str(golden.SCHEMA_VERSION + 1).encode()
    pq.write_table(table.replace_schema_metadata(meta), newer)
    with pytest.raises(GoldenError, match="newer numcheck.*upgrade"):
        golden.read(newer)
    missing = tmp_path / "missing_cols.parquet"
    pq.write_table(table.drop(["kernel_rel_l2"]), missing)
    with pytest.raises(GoldenError, match="missing golden columns"):
        golden.read(missing)


def test_cli_show_compare_report(tmp_path, capsys):
    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    golden.write(golden.GoldenFile(old), _rows(_record("a"), _record("b"), _record("gone")), {})
    # b lost about a bit (error x 2), a is unchanged, c is new, "gone" was removed
    golden.write(golden.GoldenFile(new), _rows(_record("a"), _record("b", rel=2.5e-3),
                                               _record("c")), {})
    assert main(["show", str(old)]) == 0
    out = capsys.readouterr().out
    assert "rms_norm/torch/a/out" in out and f"schema {golden.SCHEMA_VERSION}" in out
    assert main(["compare", str(old), str(new)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 regressed, 1 removed, 1 new, 1 same"
    assert "regressed" in out[1] and "/b/" in out[1]  # regressions first
    assert any("rel_l2 0.001235 -> 0.0025" in line for line in out)
    assert main(["compare", str(old), str(old)]) == 0
    results = tmp_path / "results.parquet"
    rec = _record("b", rel=2.5e-3, golden="regressed", golden_reason="rel_l2 up",
                  repro="numcheck verify --op rms_norm ...")
    golden.write_results(results, [rec, _record("a", golden="same")], {"device_class": "cpu"})
    assert main(["report", str(results)]) == 0
    md = capsys.readouterr().out
    assert "golden regressed: rel_l2 up" in md and "repro: `numcheck verify" in md
    assert "| rms_norm | torch | `b` |" in md  # worst case of the op listed
    (tmp_path / "bad.parquet").write_bytes(b"x")
    assert main(["compare", str(old), str(tmp_path / "bad.parquet")]) == 2
    assert "bad.parquet" in capsys.readouterr().err


def test_record_json_round_trip_keeps_nonfinite_stats():
    rec = _record(kernel_sqnr_db=math.inf, bound_ratio=math.nan)
    back = from_json(to_json([rec]))[0]
    assert back.kernel_stats.sqnr_db == math.inf and math.isnan(back.bound_ratio)
