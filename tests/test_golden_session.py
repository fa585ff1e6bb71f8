"""GoldenSession: what refresh writes, refuses, reports as unused, and prunes."""
from __future__ import annotations

import pytest

from numcheck.goldens import store as golden
from numcheck.goldens.session import GoldenSession

from _support import golden_record as _record


def _session(tmp_path, mode, **kw):
    return GoldenSession(tmp_path, mode, **kw)


def _golden_rows(tmp_path):
    return golden.read(golden.path_for(tmp_path, "cpu", "s")).rows


def test_strict_writes_nothing_and_check_writes_nothing(tmp_path):
    for mode in ("strict", "check"):
        s = _session(tmp_path, mode)
        recs = [_record("a")]
        s.judge(recs)
        assert recs[0].golden == ("missing" if mode == "strict" else "new")
        rep = s.finish(recs, {})
        assert not rep.written and not (tmp_path / "cpu").exists()


def test_refresh_new_only_keeps_existing_rows(tmp_path):
    _session(tmp_path, "refresh").finish([_record("a")], {})
    rep = _session(tmp_path, "refresh-new").finish([_record("a", rel=9e-3), _record("b")], {})
    rows = _golden_rows(tmp_path)
    assert [k[3] for k in rows] == ["a", "b"] and len(rep.changes) == 1
    assert rows[("s", "rms_norm", "torch", "a", "out", "cpu")]["kernel_rel_l2"] == 1.235e-3


def test_refresh_refuses_a_new_nonfinite_value_unless_allowed(tmp_path):
    _session(tmp_path, "refresh").finish([_record("a")], {})
    nan = _record("a", kernel_n_nan=3, kernel_nonfinite_mismatch=3)
    rep = _session(tmp_path, "refresh").finish([nan], {})
    assert rep.refused and "3 element(s) non-finite" in rep.refused[0] and not rep.written
    assert _golden_rows(tmp_path)[("s", "rms_norm", "torch", "a", "out", "cpu")][
        "kernel_nonfinite_mismatch"] == 0
    rep = _session(tmp_path, "refresh", allow_nonfinite=True).finish([nan], {})
    assert rep.written and not rep.refused


def test_unused_rows_are_reported_and_removed_only_by_prune(tmp_path):
    _session(tmp_path, "refresh").finish([_record("a"), _record("gone")], {})
    # "gone" no longer exists in the grid: the run produced only "a"
    rep = _session(tmp_path, "refresh").finish([_record("a")], {})
    unused = list(rep.unused.values())[0]
    assert [k[3] for k in unused] == ["gone"]
    assert any("remove them with --numcheck-prune" in line for line in rep.lines())
    assert len(_golden_rows(tmp_path)) == 2  # reported, kept
    # rows of an (op, kernel) that did not run at all are not "unused" (a -k selection)
    other = _record("x", op="softmax")
    assert not _session(tmp_path, "check").finish([other], {}).unused
    rep = _session(tmp_path, "refresh", prune=True).finish([_record("a")], {})
    assert rep.pruned == 1 and [k[3] for k in _golden_rows(tmp_path)] == ["a"]


def test_refresh_reports_old_and_new_metrics(tmp_path):
    _session(tmp_path, "refresh").finish([_record("a")], {})
    rep = _session(tmp_path, "refresh").finish([_record("a", rel=2e-3)], {})
    line = rep.lines()[0]
    assert "rms_norm/torch/a/out" in line and "rel_l2 0.001235 -> 0.002" in line


def test_unknown_mode_is_a_usage_error(tmp_path):
    from numcheck.errors import UsageError
    with pytest.raises(UsageError, match="golden mode"):
        GoldenSession(tmp_path, "update")


def test_a_binding_golden_verdict_fails_the_record_and_says_so(tmp_path):
    """issue 31: a record whose golden regressed showed status "passed" while it was in
    Verification.failures, so a harness counting statuses undercounted. A verdict the mode makes
    binding now sets status failed; one it does not (refresh, a new row in check) leaves it."""
    _session(tmp_path, "refresh").finish([_record("a")], {})
    for mode, rec, golden_verdict, status in [
            ("check", _record("a", rel=5e-3), "regressed", "failed"),
            ("refresh", _record("a", rel=5e-3), "regressed", "passed"),
            ("strict", _record("b"), "missing", "failed"),
            ("check", _record("b"), "new", "passed")]:
        _session(tmp_path, mode).judge([rec])
        assert (rec.golden, rec.status) == (golden_verdict, status), (mode, rec.golden_reason)
