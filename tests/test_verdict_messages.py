"""What a verdict says must add up and must not read as its opposite (issue 31, "Messages"):
non-finite counts name what they count, and a baseline that is itself non-finite is said to
be, instead of printing as a perfect yardstick."""
from __future__ import annotations

import math

import torch

import numcheck as nc
from numcheck.verdicts.policy import Policy, judge

_REF = torch.tensor([1.0, math.inf, 2.0, 1.0, 3.0], dtype=torch.float64)


def test_nonfinite_counts_say_what_they_count():
    out = torch.tensor([math.nan, math.inf, math.inf, 1.0, 3.0])  # 2 mismatches, 1 inf right
    v = judge(Policy(), nc.error_stats(out, _REF), None)
    assert not v.passed
    (msg,) = [m for m in v.failures if "non-finite" in m]
    assert "2 element(s) non-finite" in msg and "holds 1 NaN and 2 inf in all" in msg, msg


def test_a_nonfinite_baseline_is_named_not_read_as_perfect():
    good = nc.error_stats(torch.tensor([1.0, math.inf, 2.0, 1.0, 3.0]), _REF)
    broken = nc.error_stats(torch.tensor([math.nan, math.inf, 2.0, 1.0, 3.0]), _REF)
    v = judge(Policy(), good, broken)
    assert v.passed, v.failures
    assert any("baseline is non-finite" in n and "baseline rule not applied" in n
               for n in v.notes), v.notes
    bad = nc.error_stats(torch.tensor([1.5, math.inf, 2.0, 1.0, 3.0]), _REF)
    v = judge(Policy(), bad, broken)  # the kernel is still judged by the absolute rules
    assert not any("x baseline" in m for m in v.failures)
