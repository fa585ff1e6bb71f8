"""Shard and merge (issue 16): `numcheck run --shard I/N` runs a share of the cases, `numcheck
merge` joins the shards' results; merged records and golden verdicts equal an unsharded run's."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from numcheck.frontends import cli
from numcheck.goldens import shards
from numcheck.errors import UsageError
from numcheck.goldens.store import read_results, write_results
from numcheck.records import Status
from tests._support import golden_record

pytest_plugins = ["pytester"]

SELECT = ["--suite", "ops", "-k", "rms_norm and torch and not compiled", "-n", "0"]


def test_parse_and_select_partition_the_items():
    assert shards.parse("2/4") == (2, 4)
    for bad in ("0/2", "3/2", "1", "a/b", ""):
        with pytest.raises(UsageError, match="give I/N"):
            shards.parse(bad)
    items = list(range(23))
    parts = [shards.select(items, (i, 4))[0] for i in range(1, 5)]
    assert sorted(sum(parts, [])) == items
    assert all(len(p) in (5, 6) for p in parts)  # balanced to one item
    kept, dropped = shards.select(items, (2, 4))
    assert sorted(kept + dropped) == items and not set(kept) & set(dropped)


def _numcheck(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "numcheck", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


def _rows(path: Path) -> dict:
    records, _ = read_results(path)
    return {(r.op, r.kernel, r.case_id, r.output):
            (r.status, r.golden, r.golden_reason, r.kernel_stats, r.baseline_stats, r.reason)
            for r in records}


def test_shards_merged_equal_the_unsharded_run(tmp_path):
    whole = _numcheck(tmp_path, "run", "--strict", *SELECT, "--results", "whole.parquet")
    assert whole.returncode == 0, whole.stdout[-3000:]
    for i in (1, 2):
        got = _numcheck(tmp_path, "run", "--strict", *SELECT, "--shard", f"{i}/2",
                        "--results", f"shard{i}.parquet")
        assert got.returncode == 0, got.stdout[-3000:]
        assert "deselected" in got.stdout
    merged = _numcheck(tmp_path, "merge", "shard2.parquet", "shard1.parquet",
                       "--results", "merged.parquet")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "merged 2 shards" in merged.stdout
    a, b = _rows(tmp_path / "whole.parquet"), _rows(tmp_path / "merged.parquet")
    assert len(a) > 20 and a == b
    p1, p2 = (read_results(tmp_path / f"shard{i}.parquet")[1] for i in (1, 2))
    assert p1["collection"] == p2["collection"] and p1["collection"].startswith(f"{len(a) // 3}")
    s1, s2 = _rows(tmp_path / "shard1.parquet"), _rows(tmp_path / "shard2.parquet")
    assert s1 and s2 and not set(s1) & set(s2)
    assert (tmp_path / "report.md").exists() and (tmp_path / "report.html").exists()


def _shard_file(path: Path, shard: str, records, **prov) -> str:
    write_results(path, records, {"shard": shard, "case_set": "quick", "golden_mode": "check",
                                  "numcheck": "0.1.0", "device_class": "cpu", **prov})
    return str(path)


def test_merge_refuses_missing_repeated_foreign_and_overlapping_shards(tmp_path, capsys):
    a = _shard_file(tmp_path / "a.parquet", "1/3", [golden_record("c1")])
    b = _shard_file(tmp_path / "b.parquet", "2/3", [golden_record("c2")])
    assert cli.main(["merge", a, b, "--results", str(tmp_path / "m.parquet")]) == 2
    assert "shard(s) 3/3 missing" in capsys.readouterr().err
    assert cli.main(["merge", a, a]) == 2
    assert "both shard 1/3" in capsys.readouterr().err
    c = _shard_file(tmp_path / "c.parquet", "3/3", [golden_record("c3")], case_set="full")
    assert cli.main(["merge", a, b, c]) == 2
    assert "case_set 'full'" in capsys.readouterr().err
    d = _shard_file(tmp_path / "d.parquet", "3/3", [golden_record("c1")])
    assert cli.main(["merge", a, b, d]) == 2
    assert "the shards overlap" in capsys.readouterr().err
    other = _shard_file(tmp_path / "o.parquet", "3/3", [golden_record("c3")],
                        collection="9 tests 0123456789abcdef")
    assert cli.main(["merge", a, b, other]) == 2  # another selection or environment
    assert "collection '9 tests 0123456789abcdef'" in capsys.readouterr().err
    whole = tmp_path / "w.parquet"
    write_results(whole, [golden_record("c1")], {"case_set": "quick"})
    assert cli.main(["merge", str(whole)]) == 2
    assert "not a shard's results" in capsys.readouterr().err


def test_merge_applies_rule_11_over_all_shards(tmp_path, capsys):
    skipped = [golden_record(f"s{i}", status="skipped") for i in range(2)]
    ran = golden_record("r1")
    ran.op = "softmax"
    a = _shard_file(tmp_path / "a.parquet", "1/2", [skipped[0], ran])
    b = _shard_file(tmp_path / "b.parquet", "2/2", [skipped[1]])
    out = str(tmp_path / "m.parquet")
    assert cli.main(["merge", a, b, "--results", out]) == 1  # rms_norm ran nothing anywhere
    assert "op rms_norm executed no case" in capsys.readouterr().out
    c = _shard_file(tmp_path / "c.parquet", "2/2", [skipped[1], golden_record("r2")])
    assert cli.main(["merge", a, c, "--results", out]) == 0
    merged, prov = read_results(out)
    assert {r.status for r in merged} == {Status.PASSED, Status.SKIPPED}
    assert prov["merged_shards"] == "2" and "shard" not in prov


def test_a_shard_defers_rule_11_and_refuses_refresh(pytester):
    pytester.makepyfile(test_user='''
import pytest, torch
import numcheck as nc

@nc.kernel("rms_norm", name="fp32_only", dtypes=("fp32",))
def rms(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)

@pytest.mark.parametrize("case", ["fp32-4x128-normal-s0-contiguous-same",
                                  "bf16-4x128-outlier_channels-s0-contiguous-same"])
def test_rms(numcheck, case):
    numcheck.verify("rms_norm", rms, case_ids=[case], fail=False)
''')
    alone = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "bf16")
    assert alone.ret == 1  # the op executed nothing: rule 11 fails a whole run...
    assert "op rms_norm executed no case" in alone.stdout.str()
    # sorted node ids: shard 1/2 holds the bf16 case alone
    part = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--numcheck-shard=1/2")
    assert part.ret == 0, part.stdout.str()  # ...but a shard leaves it to numcheck merge
    assert "numcheck merge checks it over all shards" in part.stdout.str()
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--numcheck-shard=1/2",
                                        "--numcheck-refresh")
    assert res.ret == 4
    assert "refresh unsharded" in res.stderr.str()
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "fp32",
                                        "--numcheck-refresh", "--numcheck-prune")
    assert res.ret == 4 and "prune with the whole case set" in res.stderr.str()
