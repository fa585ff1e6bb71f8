"""Layout equivalence (numcheck.convergence.layouts): a recipe trained on one process and on 2
gloo ranks under DDP and FSDP2 from the same seed and global batches; the gate passes the real
recipes and fails layout-dependent faults (tests/_distributed.py: ShardAmax, RankSeededSigns)."""
from __future__ import annotations

import functools

import pytest
import torch

from numcheck.convergence import layouts
from numcheck.errors import UsageError
import _distributed as D

pytestmark = [pytest.mark.skipif(not torch.distributed.is_available(),
                                 reason="torch.distributed is not available in this build"),
              pytest.mark.xdist_group("ranks")]


@pytest.fixture
def mlp_run():
    return _mlp_run()


@functools.cache
def _mlp_run():
    # cached in the module, not by a module-scoped fixture, which a worker tears down and sets
    # up again when another module's test comes between (its group mixes modules) or when
    # its queue runs dry: this run (~60-85 s) was once computed twice in one CI run.
    # One seed: the planted faults' gaps are largest on seed 0 of the calibration
    # (docs/convergence.md, "Layouts"); 3 seeds x 100 steps is the suite's
    return layouts.layout_equivalence(
        "mlp", {"fp32": None, "fp8_tensor": None, "nvfp4_rht_sr": None,
                "fp8_tensor_shard_amax": D.ShardAmax("fp8_tensor"),
                "nvfp4_rht_sr_rank_signs": D.RankSeededSigns()},
        seeds=(0,), steps=100)


def test_real_recipes_pass_and_ddp_and_fsdp2_agree_bitwise(mlp_run):
    for name in ("fp32", "fp8_tensor", "nvfp4_rht_sr"):
        r = mlp_run.results[name]
        assert r.status == "passed", mlp_run.table()
        assert r.bitwise == {"ddp=fsdp2": True}
        assert set(r.loss) == {"single", "ddp", "fsdp2"}
        assert r.loss["ddp"].shape == (1, 100)
    # fp32: the layouts differ from one process only in the order of a mean and a sum
    assert mlp_run.results["fp32"].gap_max["ddp"] < 1e-5


def test_a_per_shard_amax_fails_the_gap_rule(mlp_run):
    r = mlp_run.results["fp8_tensor_shard_amax"]
    assert r.status == "failed"
    assert any("ddp: seed #0" in m and "from one process" in m for m in r.reasons), r.reasons
    assert r.gap_max["ddp"] > layouts.LAYOUT_TOL["fp8"]


def test_rank_seeded_hadamard_signs_fail_the_random_state_check(mlp_run):
    r = mlp_run.results["nvfp4_rht_sr_rank_signs"]
    assert r.status == "failed"
    assert r.reasons and all("rht signs" in m and "[0, 1]" in m for m in r.reasons)
    # under pure data parallelism the loss cannot show it (each rank's weight-gradient GEMM
    # is a whole GEMM, with its own signs): the curves alone pass
    assert r.gap_max["ddp"] <= layouts.LAYOUT_TOL["fp4"]


@pytest.mark.parametrize("kwargs, match", [
    ({"layouts": ("tp",)}, "layouts are ddp, fsdp2"),
    ({"world": 1}, "at least 2 ranks"),
    ({"steps": 10}, "steps=10"),
    ({"recipes": ("no_such_recipe",)}, "no_such_recipe"),
])
def test_bad_arguments_are_usage_errors(kwargs, match):
    with pytest.raises(UsageError, match=match):
        layouts.layout_equivalence("mlp", **kwargs)


def test_a_batch_that_does_not_split_is_a_usage_error():
    with pytest.raises(UsageError, match="5 rows"):
        from numcheck.telemetry.launch import share_batch
        share_batch({"x": torch.zeros(5, 2)}, 0, 2, "layout 'ddp'")
