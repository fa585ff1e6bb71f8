"""The table compare and the row compare agree: ``regression.compare_kinds`` (the common rules on
two joined tables, what ``numcheck compare`` runs) gives the verdict ``regression.compare_row``
(the same rules on one pair of rows, plus the family's own) gives row by row, on randomized
tables holding every kind of row: NaN/inf/None statistics, missing and duplicated keys, other
platforms (drift), ULP- and bias-gated rows, status changes, input digests, schema-1 files,
convergence curves (judged by their family's own golden rule). What differs between the two is
how the rules read their inputs (arrow columns, or a row's values) and how their findings
combine into a kind."""
from __future__ import annotations

import json
import math
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from numcheck.goldens import store as golden
from numcheck.goldens import regression
from numcheck.frontends.cli import main
from numcheck.goldens.regression import Change, compare_kinds, compare_row, compare_tables

A, B = "AMD EPYC, AVX512, torch 2.13.0+cpu", "AMD EPYC, AVX2, torch 2.13.0+cpu"
INF, NAN = math.inf, math.nan

# Values each column takes (None: null); stats near the slack's edges come from _edges.
POOL = {
    "status": [None, "passed", "passed", "passed", "failed", "error", "known", "skipped"],
    "input_digest": [None, "", "ab", "ab", "ab", "cd"],
    "u": [None, 0.0, NAN, 2.0 ** -8, 2.0 ** -8, 2.0 ** -11, 2.0 ** -12, 2.0 ** -24],
    "gate_ulp": [None, False, True, True],
    "gate_bias": [None, False, True, True],
    "platforms": [None, "", A, A, A, B, f"{A}; {B}", "unknown"],
    "kernel_n": [None, 0, 1, 7, 512, 512, 4096, 1 << 20],
    "kernel_n_compared": [None, 0, 1, 7, 500, 512, 4096],
    "kernel_n_nan": [None, 0, 0, 0, 1, 3],
    "kernel_n_inf": [None, 0, 0, 0, 2],
    "kernel_nonfinite_mismatch": [None, 0, 0, 0, 1],
    "kernel_rel_l2": [None, NAN, INF, 0.0, 1e-7, 3e-4, 1e-3, 1e-3, 4e-3, 0.02],
    "baseline_rel_l2": [None, NAN, INF, 0.0, 1e-7, 1e-3, 2e-3, 0.05],
    "kernel_min_block_sqnr_db": [None, NAN, INF, -INF, 0.0, -7000.0, 20.0, 45.51, 60.12,
                                 140.0],
    "baseline_min_block_sqnr_db": [None, NAN, INF, 0.0, 18.5, 40.0, 55.0],
    "kernel_n_blocks": [None, 0, 1, 4, 64],
    "kernel_max_ulp": [None, 0, 1, 3, 4, 5, 8, 13, 100],
    "kernel_mag_bias_ulp": [None, NAN, 0.0, -0.05, 0.12, -0.3, 0.5, 5.0],
    "family": [None, "", "ops", "ops", "quant", "custom"],
}
FACTORS = [0.5, 0.9, 0.99, 1.0, 1.0, 1.01, 1.05, 1.1, 1.2, 1.41, 2.0, NAN, INF]


def _key(i: int, rng: random.Random) -> dict:
    suite = rng.choice(["ops", "ops", "quant", "verify"])
    op = rng.choice(["roundtrip", "gemm", "fp8_qdq"] if suite == "quant" else ["rms_norm", "gelu"])
    return {"suite": suite, "op": op, "kernel": rng.choice(["torch", "k2"]), "case_id": f"c{i}",
            "output": rng.choice(["out", "out", "grad_x"]), "device_class": "cpu"}


def _old(key: dict, rng: random.Random) -> dict:
    row = dict(key, dtype="bf16", shape="4x8", dist="normal", seed=0, case_set="quick")
    row.update({c: rng.choice(v) for c, v in POOL.items()})
    row["kernel_sqnr_db"] = 60.0
    return row


def _edges(o: float | None, yard: float, n: int, u: float) -> list[float]:
    """Values at (and one float past) the edges compare_row draws for an error metric."""
    if o is None or not math.isfinite(o):
        return []
    s, c = regression.error_slack(o, yard, n, u), regression.cross_slack(yard, u)
    edges = [o + s, o + s + c, o - s]
    return edges + [math.nextafter(e, INF) for e in edges] + [math.nextafter(o - s, -INF)]


def _db(rel: float) -> float:
    return INF if rel == 0 else NAN if not rel > 0 else -20 * math.log10(rel)


def _near_edges(old: dict, new: dict, rng: random.Random) -> None:
    """Move new's statistics to the edges of old's slack (rel_l2, worst block, max ULP, bias)."""
    u = old.get("u") or 0.0
    n = int(old.get("kernel_n_compared") or old.get("kernel_n") or 1)
    o = old.get("kernel_rel_l2")
    edges = _edges(o, max(o or 0.0, old.get("baseline_rel_l2") or 0.0), n, u)
    if edges and rng.random() < 0.4:
        new["kernel_rel_l2"] = rng.choice(edges)
    o_db, b_db = old.get("kernel_min_block_sqnr_db"), old.get("baseline_min_block_sqnr_db")
    if o_db is not None and -1000 < o_db < INF and rng.random() < 0.4:
        o_b = 10.0 ** (-o_db / 20.0)
        b_yard = max(o_b, 10.0 ** (-b_db / 20.0) if b_db is not None and math.isfinite(b_db)
                     else 0.0)
        nb = max(1, n // max(1, int(old.get("kernel_n_blocks") or 1)))
        edges = _edges(o_b, b_yard, nb, u)  # stored in dB: near the edges, not on them
        new["kernel_min_block_sqnr_db"] = _db(rng.choice(edges) * rng.choice([1 - 1e-6, 1 + 1e-6]))
    if old.get("kernel_max_ulp") is not None and rng.random() < 0.3:
        o_u = old["kernel_max_ulp"]
        edge = o_u + max(regression.ULP_SLACK_MIN, math.ceil(regression.ULP_SLACK_FRAC * o_u))
        new["kernel_max_ulp"] = edge + rng.choice([-1, 0, 1, 2])
    if old.get("kernel_mag_bias_ulp") is not None and rng.random() < 0.3:
        edge = abs(old["kernel_mag_bias_ulp"]) + max(regression.BIAS_SLACK, 4 / math.sqrt(n))
        new["kernel_mag_bias_ulp"] = rng.choice(
            [edge, -edge, math.nextafter(edge, INF), regression.CROSS_BIAS,
             math.nextafter(regression.CROSS_BIAS, INF)])


def _new(old: dict, rng: random.Random) -> dict:
    new = dict(old)
    for c, values in POOL.items():
        if rng.random() < 0.3:
            new[c] = rng.choice(values)
        elif rng.random() < 0.3 and isinstance(old.get(c), float):
            new[c] = old[c] * rng.choice(FACTORS)
        elif rng.random() < 0.2 and isinstance(old.get(c), int) and not isinstance(old[c], bool):
            new[c] = old[c] + rng.choice([1, 2, 3, 25])
    _near_edges(old, new, rng)
    if rng.random() < 0.3:  # another platform than the golden's: drift or regression
        new["platforms"] = rng.choice([A, B, f"{B}; {A}"])
    return new


def _curves(key: dict, rng: random.Random) -> tuple[dict, dict]:
    """A convergence row pair: the family's own golden rule (a curve leaving its band)."""
    key = dict(key, suite="convergence", op="mlp", output="loss")
    old = dict(key, status="passed", platforms=A, input_digest="ab",
               series=[0.01 * math.sin(i) for i in range(60)], series_band=[0.005] * 60)
    shift = rng.choice([0.0, 0.001, 0.02, -0.02, NAN])
    new = dict(old, series=[v + shift for v in old["series"]])
    return old, new


def _pairs(n: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    old, new = [], []
    for i in range(n):
        key = _key(i, rng)
        if i % 40 == 0:
            o, nw = _curves(key, rng)
        else:
            o = _old(key, rng)
            nw = _new(o, rng)
        if i % 97 == 0:  # no element counted: the bias gate still counts one (n = 1)
            o.update(kernel_n=0, kernel_n_compared=None, gate_bias=True, kernel_mag_bias_ulp=0.0)
            nw.update(kernel_n=0, kernel_mag_bias_ulp=rng.choice([3.9, 4.0, 4.1]))
        where = rng.random()
        if where > 0.04:  # else: a key only new has
            old.append(o)
        if where < 0.96:  # else: a key only old has
            new.append(nw)
        if where < 0.01:  # a key twice: the last row counts
            old.append(dict(o, kernel_rel_l2=2e-3))
            new.append(dict(nw, kernel_rel_l2=5e-3, status="passed"))
    return old, new


def _write(path, rows: list[dict], schema: pa.Schema = golden.RESULTS_SCHEMA, version: int = 2,
           provenance: dict | None = None) -> None:
    meta = {b"numcheck.schema_version": str(version).encode(),
            b"numcheck.provenance": json.dumps(provenance or {}).encode()}
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.with_metadata(meta)), path)


def _reference(old_path, new_path) -> dict[tuple, Change]:
    """compare_row on every row (the row compare), as numcheck compare ran before compare_kinds."""
    old, new = golden.read(old_path, results=True), golden.read(new_path, results=True)
    changes = [compare_row(old.rows.get(k), row, row.get("family")) for k, row in new.rows.items()]
    changes += [Change(k, "removed", ["row not in NEW"], row, None)
                for k, row in old.rows.items() if k not in new.rows]
    return {c.key: c for c in changes}


def _check(old_path, new_path) -> dict[str, int]:
    """compare_kinds and compare_tables against _reference; the count of each kind."""
    want = _reference(old_path, new_path)
    old, new = (golden.read_table(p, results=True)[0] for p in (old_path, new_path))
    o, n, kinds = compare_kinds(old, new)
    old_rows, new_rows = old.to_pylist(), new.to_pylist()
    assert len(kinds) == len(want)
    for i, kind in enumerate(kinds):
        row = new_rows[n[i]] if n[i] >= 0 else old_rows[o[i]]
        ref = want[golden.key_of(row)]
        if kind is None:  # a family with golden rules of its own: compare_row judges the row
            assert row.get("series") is not None, row
        else:
            assert kind == ref.kind, (kind, ref.kind, ref.messages, ref.old, ref.new)
        assert (o[i] < 0) == (ref.old is None) and (n[i] < 0) == (ref.new is None)
        # the rows golden.read keeps for the key (repr: NaN inside curves equals itself)
        assert ref.old is None or repr(old_rows[o[i]]) == repr(ref.old)
        assert ref.new is None or repr(new_rows[n[i]]) == repr(ref.new)
    # the command's path: every row listed with --all, the changed rows otherwise
    listed, unchanged = compare_tables(old, new, same=True)
    assert unchanged == 0
    assert {c.key: (c.kind, c.messages) for c in listed} == \
        {k: (c.kind, c.messages) for k, c in want.items()}
    changed, unchanged = compare_tables(old, new)
    assert unchanged == sum(c.kind == "same" for c in want.values())
    assert sorted(c.key for c in changed) == sorted(k for k, c in want.items() if c.kind != "same")
    counts: dict[str, int] = {}
    for c in want.values():
        counts[c.kind] = counts.get(c.kind, 0) + 1
    return counts


def test_every_kind_of_row_gets_compare_rows_verdict(tmp_path):
    old, new = _pairs(3000)
    _write(tmp_path / "old.parquet", old)
    _write(tmp_path / "new.parquet", new)
    counts = _check(tmp_path / "old.parquet", tmp_path / "new.parquet")
    # the rows cover every verdict, each many times
    for kind in ("new", "removed", "inputs_changed", "regressed", "drift", "improved", "same"):
        assert counts.get(kind, 0) >= 20, counts


def test_golden_files_without_a_family_column(tmp_path):
    old, new = _pairs(600, seed=1)
    _write(tmp_path / "old.parquet", old, golden.SCHEMA)
    _write(tmp_path / "new.parquet", new, golden.SCHEMA)
    _check(tmp_path / "old.parquet", tmp_path / "new.parquet")


def test_schema_1_rows_take_their_platform_from_the_file(tmp_path):
    """A schema-1 golden (no platforms column): its rows were recorded where the file was; a
    new row from another platform within the cross-platform slack drifts."""
    old, new = _pairs(600, seed=2)
    schema1 = pa.schema([f for f in golden.SCHEMA if f.name != "platforms"])
    prov = {"device_class": "cpu", "device_name": "AMD EPYC", "torch_cpu_isa": "avx512",
            "torch": "2.13.0+cpu"}
    _write(tmp_path / "old.parquet", [{k: v for k, v in r.items() if k != "platforms"}
                                      for r in old], schema1, version=1, provenance=prov)
    _write(tmp_path / "new.parquet", new)
    counts = _check(tmp_path / "old.parquet", tmp_path / "new.parquet")
    assert counts["drift"] > 0


def test_a_golden_against_its_refresh(tmp_path):
    """The same keys in the same (sorted) rows on both sides, as golden.write leaves them: the
    join takes them row by row; a key twice (adjacent) still counts once, its last row."""
    old, new = ({golden.key_of(r): r for r in rows} for rows in _pairs(1500, seed=5))
    keys = sorted(old.keys() & new.keys())
    old, new = [old[k] for k in keys], [new[k] for k in keys]
    _write(tmp_path / "old.parquet", old)
    _write(tmp_path / "new.parquet", new)
    tables = [golden.read_table(tmp_path / f, results=True)[0] for f in ("old.parquet",
                                                                        "new.parquet")]
    assert regression._same_keys_once(*tables)
    counts = _check(tmp_path / "old.parquet", tmp_path / "new.parquet")
    assert {"regressed", "drift", "improved", "same"} <= set(counts)
    twice = [[r, dict(r, kernel_rel_l2=9e-3)] if i % 50 == 0 else [r] for rows in (old, new)
             for i, r in enumerate(rows)]
    _write(tmp_path / "old.parquet", [r for rs in twice[:len(old)] for r in rs])
    _write(tmp_path / "new.parquet", [r for rs in twice[len(old):] for r in rs])
    tables = [golden.read_table(tmp_path / f, results=True)[0] for f in ("old.parquet",
                                                                        "new.parquet")]
    assert not regression._same_keys_once(*tables)
    _check(tmp_path / "old.parquet", tmp_path / "new.parquet")


def test_empty_and_identical_tables(tmp_path):
    old, _ = _pairs(50, seed=3)
    _write(tmp_path / "old.parquet", old)
    _write(tmp_path / "empty.parquet", [])
    # every key on both sides (NaN statistics are still no better than themselves)
    assert not {"new", "removed", "inputs_changed"} & set(
        _check(tmp_path / "old.parquet", tmp_path / "old.parquet"))
    assert set(_check(tmp_path / "empty.parquet", tmp_path / "old.parquet")) == {"new"}
    assert set(_check(tmp_path / "old.parquet", tmp_path / "empty.parquet")) == {"removed"}
    assert _check(tmp_path / "empty.parquet", tmp_path / "empty.parquet") == {}


@pytest.mark.parametrize("argv, code", [([], 1), (["--all"], 1)])
def test_compare_command_prints_the_reference_verdicts(tmp_path, capsys, argv, code):
    old, new = _pairs(400, seed=4)
    _write(tmp_path / "old.parquet", old)
    _write(tmp_path / "new.parquet", new)
    want = _reference(tmp_path / "old.parquet", tmp_path / "new.parquet")
    assert main(["compare", str(tmp_path / "old.parquet"), str(tmp_path / "new.parquet"),
                 *argv]) == code
    out = capsys.readouterr().out.splitlines()
    counts: dict[str, int] = {}
    for c in want.values():
        counts[c.kind] = counts.get(c.kind, 0) + 1
    assert sorted(out[0].split(", ")) == sorted(f"{v} {k}" for k, v in counts.items())
    listed = [line.split()[0] for line in out[1:] if line[:16].strip()]
    assert len(listed) == sum(v for k, v in counts.items() if argv or k != "same")
