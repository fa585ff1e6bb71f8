"""Portable goldens (docs/goldens.md, "Platforms"): a golden row carries the envelope of the
platforms it was recorded on; another platform's result within the calibrated cross-platform
slack is drift (reported, not failing), beyond it a regression; on a recorded platform the
same-platform slack holds (a lost half bit regresses). A refresh on another platform merges
into the envelope and says so."""
from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq

from numcheck.goldens import store as golden
from numcheck.goldens import regression
from numcheck.records import Golden, failing
from numcheck.goldens.session import GoldenSession

from _support import golden_record

A = "AMD EPYC, AVX512, torch 2.13.0+cpu"
B = "AMD EPYC, AVX2, torch 2.13.0+cpu"


def _row(rel=1.0e-3, platforms=A, dtype="bf16", u=2.0 ** -8, **kw):
    r = golden_record(rel=rel, platforms=platforms, dtype=dtype, u=u, **kw)
    # n large enough that the sampling-spread term stays below the E term
    row = golden.to_row(r)
    row.update(kernel_n=1 << 20, kernel_n_compared=1 << 20, kernel_n_blocks=1)
    return row


def _grown(old: dict, factor: float, platforms: str) -> dict:
    new = dict(old, platforms=platforms)
    new["kernel_rel_l2"] = old["kernel_rel_l2"] * factor
    new["kernel_sqnr_db"] = -20 * math.log10(new["kernel_rel_l2"])
    return new


def test_platform_of_names_what_moves_rounding():
    cpu = {"device_class": "cpu", "device_name": "AMD EPYC", "torch_cpu_isa": "avx2",
           "torch": "2.13.0+cpu"}
    assert golden.platform_of(cpu) == "AMD EPYC, AVX2, torch 2.13.0+cpu"
    # files written before torch_cpu_isa existed: the ISA summary's first word
    old = {"device_class": "cpu", "device_name": "AMD EPYC", "cpu_isa": "AVX512-BF16",
           "torch": "2.13.0+cpu"}
    assert golden.platform_of(old) == A
    gpu = {"device_class": "cuda-sm90", "device_name": "NVIDIA H200", "cuda": "12.8",
           "cublas": "12.8.4", "cudnn": "91002", "torch": "2.13.0"}
    assert golden.platform_of(gpu) == ("NVIDIA H200, cuda 12.8, cublas 12.8.4, cudnn 91002, "
                                       "torch 2.13.0")
    assert golden.platform_of({}) == "unknown"
    assert golden.platform_difference(A, B) == "AVX512 -> AVX2"


def test_same_platform_keeps_half_a_bit_of_sensitivity():
    old = _row()
    new = _grown(old, 2 ** 0.5, A)  # half a bit lost, on the platform of the golden
    assert regression.compare_row(old, new).kind == "regressed"


def test_another_platform_drifts_within_the_cross_slack_and_regresses_beyond():
    for dtype, u in (("bf16", 2.0 ** -8), ("fp32", 2.0 ** -24)):
        old = _row(dtype=dtype, u=u)
        yard = max(old["kernel_rel_l2"], old["baseline_rel_l2"])
        same = regression.error_slack(old["kernel_rel_l2"], yard, 1 << 20, u)
        cross = regression.cross_slack(yard, u)
        inside = old["kernel_rel_l2"] + same + 0.5 * cross
        factor = inside / old["kernel_rel_l2"]
        assert regression.compare_row(old, _grown(old, factor, A)).kind == "regressed"
        ch = regression.compare_row(old, _grown(old, factor, B))
        assert ch.kind == "drift", ch.messages
        assert any("AVX512 -> AVX2" in m for m in ch.messages)
        beyond = (old["kernel_rel_l2"] + same + 1.5 * cross) / old["kernel_rel_l2"]
        assert regression.compare_row(old, _grown(old, beyond, B)).kind == "regressed"


def test_a_lost_half_bit_in_bf16_regresses_on_any_platform():
    """The cross-platform slack of bf16/fp16 results stays below half a bit (x 1.41 of E)."""
    old = _row()
    assert regression.compare_row(old, _grown(old, 2 ** 0.5, B)).kind == "regressed"


def test_drift_never_fails_a_record():
    r = golden_record(golden="drift")
    assert r.golden == Golden.DRIFT
    assert not failing(r, "strict") and not failing(r, "check")


def test_absolute_failures_are_never_drift():
    old = _row()
    new = _grown(old, 1.05, B)
    new["status"] = "failed"
    assert regression.compare_row(old, new).kind == "regressed"


def test_schema_1_files_get_their_platform_from_the_provenance(tmp_path):
    path = tmp_path / "cpu" / "s.parquet"
    row = _row()
    row.pop("platforms")
    prov = {"device_class": "cpu", "device_name": "AMD EPYC", "cpu_isa": "AVX512-BF16",
            "torch": "2.13.0+cpu"}
    schema = pa.schema([f for f in golden.SCHEMA if f.name != "platforms"],
                       metadata={b"numcheck.schema_version": b"1",
                                 b"numcheck.provenance": json.dumps(prov).encode()})
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([row], schema=schema), path)
    gf = golden.read(path)
    assert [r["platforms"] for r in gf.rows.values()] == [A]


def test_refresh_on_another_platform_merges_into_the_envelope(tmp_path):
    prov_a = {"device_class": "cpu", "device_name": "AMD EPYC", "torch_cpu_isa": "AVX512",
              "torch": "2.13.0+cpu"}
    prov_b = dict(prov_a, torch_cpu_isa="AVX2")
    first = golden_record(rel=1.0e-3, suite="s", platforms=A)
    GoldenSession(tmp_path, "refresh").finish([first], prov_a)
    worse = golden_record(rel=1.2e-3, suite="s", platforms=B)
    rep = GoldenSession(tmp_path, "refresh").finish([worse], prov_b)
    assert any("merged into the envelope" in m for c in rep.changes for m in c.messages)
    row = next(iter(golden.read(golden.path_for(tmp_path, "cpu", "s")).rows.values()))
    assert golden.platforms_of(row) == [A, B]
    assert row["kernel_rel_l2"] == golden.to_row(worse)["kernel_rel_l2"]  # the worse edge
    # the better platform's next refresh keeps the envelope's worse edge
    again = golden_record(rel=1.0e-3, suite="s", platforms=A)
    GoldenSession(tmp_path, "refresh").finish([again], prov_a)
    row = next(iter(golden.read(golden.path_for(tmp_path, "cpu", "s")).rows.values()))
    assert row["kernel_rel_l2"] == golden.to_row(worse)["kernel_rel_l2"]
    # a run on a new platform is told where the goldens came from
    prov_c = dict(prov_a, torch_cpu_isa="DEFAULT")
    rep = GoldenSession(tmp_path, "check").finish([golden_record(suite="s", platforms="x")],
                                                  prov_c)
    assert any("-> DEFAULT" in n for n in rep.isa_notes), rep.isa_notes


def test_merge_takes_the_worse_edge_of_every_statistic():
    a = _row(rel=1.0e-3)
    b = _row(rel=2.0e-3, platforms=B)
    b["kernel_min_block_sqnr_db"], b["kernel_worst_block"] = 60.0, 3
    b["kernel_mag_bias_ulp"] = -0.2
    m = golden.merge_envelope(a, b)
    assert m["kernel_rel_l2"] == 2.0e-3 and m["kernel_sqnr_db"] == b["kernel_sqnr_db"]
    assert m["kernel_min_block_sqnr_db"] == a["kernel_min_block_sqnr_db"]  # 50.12 < 60
    assert m["kernel_worst_block"] == a["kernel_worst_block"]
    assert m["kernel_mag_bias_ulp"] == -0.2
    assert golden.platforms_of(m) == [A, B]


def test_a_row_exact_on_its_platform_may_round_on_another():
    """Constant rows through layer_norm: exact (error 0) under DEFAULT, 0.56 u under AVX2
    (measured). Another platform may round it, by up to one u; the same platform may not."""
    old = _row(rel=1e-30, dtype="fp16", u=2.0 ** -11)
    for side in ("kernel", "baseline"):
        old[f"{side}_rel_l2"], old[f"{side}_sqnr_db"] = 0.0, math.inf
        old[f"{side}_min_block_sqnr_db"] = math.inf
    new = dict(old, kernel_rel_l2=0.56 * 2.0 ** -11, kernel_sqnr_db=71.2,
               kernel_min_block_sqnr_db=67.4)
    assert regression.compare_row(old, dict(new, platforms=B)).kind == "drift"
    assert regression.compare_row(old, dict(new, platforms=A)).kind == "regressed"
    much = dict(new, platforms=B, kernel_rel_l2=1.5 * 2.0 ** -11)
    assert regression.compare_row(old, much).kind == "regressed"


def test_bias_may_move_to_the_truncation_gate_on_another_platform_only():
    old = _row(gate_bias=True, kernel_mag_bias_ulp=0.0)
    new = dict(old, kernel_mag_bias_ulp=-0.22)
    assert regression.compare_row(old, dict(new, platforms=B)).kind == "drift"
    assert regression.compare_row(old, dict(new, platforms=A)).kind == "regressed"
    truncating = dict(new, platforms=B, kernel_mag_bias_ulp=-0.5)
    assert regression.compare_row(old, truncating).kind == "regressed"
