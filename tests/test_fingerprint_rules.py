"""The fingerprint family's records, golden rule and report table (numcheck.forensics.fingerprint_rules):
a changed property regresses on the golden's platform and drifts on another; a refresh on
another platform replaces the row; goldens and ``numcheck compare`` read them without torch's
fingerprint code."""
from __future__ import annotations

import pyarrow as pa

from numcheck.goldens import store as golden
from numcheck.goldens import regression
from numcheck.verdicts import families
from numcheck.verdicts import judge as verdict
from numcheck.forensics.kernel_fingerprint import Fingerprint, as_record
from numcheck.records import Golden, failing
from numcheck.verdicts.families import family_of_row
from numcheck.goldens.session import GoldenSession, _merges

A = "AMD EPYC, AVX512, torch 2.13.0+cpu"
B = "AMD EPYC, AVX2, torch 2.13.0+cpu"


def _fp(**changes) -> Fingerprint:
    props = dict(acc_bits=23, promote_every=None, acc_rounding="rne", order="sequential",
                 deterministic=True, batch_invariant=True)
    props.update(changes)
    return Fingerprint("matmul", "mine", "bf16", "cpu", evidence={"order": "why"}, **props)


def _row(platforms=A, **changes) -> dict:
    rec = verdict.judge(as_record(_fp(**changes)))
    rec.platforms = platforms
    return golden.to_row(rec)


def test_record_is_a_golden_row_of_its_own_family():
    rec = verdict.judge(as_record(_fp()))
    assert rec.status == "passed" and families.of(rec).measured(rec) and rec.family == "fingerprint"
    row = golden.to_row(rec)
    assert family_of_row({k: v for k, v in row.items() if k != "family"}) == "fingerprint"
    assert '"order": "sequential"' in row["metrics"] and '"deterministic": true' in row["metrics"]
    assert "acc_bits=23 " in golden.summary_text([row])


def test_unchanged_is_same_and_each_change_regresses_with_its_name():
    assert regression.compare_row(_row(), _row()).kind == "same"
    for change, text in [({"acc_bits": 13}, "acc_bits 23 -> 13"),
                         ({"batch_invariant": False}, "batch_invariant True -> False"),
                         ({"order": "pairwise"}, "order sequential -> pairwise"),
                         ({"promote_every": 128}, "promote_every None -> 128"),
                         ({"acc_rounding": "rz"}, "acc_rounding rne -> rz"),
                         ({"deterministic": False}, "deterministic True -> False")]:
        ch = regression.compare_row(_row(), _row(**change))
        assert ch.kind == "regressed" and any(text in m for m in ch.messages), ch.messages


def test_another_platform_drifts_and_does_not_fail():
    ch = regression.compare_row(_row(), _row(platforms=B, acc_bits=13))
    assert ch.kind == "drift" and "acc_bits 23 -> 13" in ch.messages[0]
    assert "AVX512 -> AVX2" in ch.messages[-1]
    rec = as_record(_fp(acc_bits=13))
    rec.golden = Golden.DRIFT
    verdict.judge(rec)
    assert not failing(rec, "strict")


def test_whole_table_compare_agrees_with_rows():
    old = pa.Table.from_pylist([_row()], schema=golden.SCHEMA)
    new = pa.Table.from_pylist([_row(acc_bits=13)], schema=golden.SCHEMA)
    changes, unchanged = regression.compare_tables(old, new)
    assert [c.kind for c in changes] == ["regressed"] and unchanged == 0
    assert regression.compare_tables(old, old)[0] == []


def test_refresh_on_another_platform_replaces_a_different_fingerprint(tmp_path):
    old, new = _row(), _row(platforms=B, acc_bits=13)
    assert not _merges(old, new)  # replaced: an envelope of two fingerprints means nothing
    assert _merges(old, _row(platforms=B))  # the same fingerprint: the platforms merge
    gs = GoldenSession(tmp_path, "refresh")
    rec = verdict.judge(as_record(_fp()))
    gs.judge([rec])
    rep = gs.finish([rec], {"device_class": "cpu", "device_name": "AMD EPYC",
                            "torch_cpu_isa": "avx512", "torch": "2.13.0+cpu"})
    assert rep.written and (tmp_path / "cpu" / "fingerprint.parquet").exists()


def test_report_table():
    recs = [verdict.judge(as_record(_fp())), verdict.judge(as_record(_fp(acc_bits=13)))]
    text = families.sections(recs)
    assert "Kernel fingerprints" in text
    assert "| cpu | matmul | mine | bf16 | 13 | None | rne | sequential | True | True |" in text
