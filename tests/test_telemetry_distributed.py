"""Telemetry under torch.distributed (docs/telemetry.md, "Distributed"): 2 gloo ranks on the
CPU, DistributedDataParallel, against one process on the same global batch."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from numcheck import telemetry
import _distributed as D

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available in this build")


def _load(out, world):
    frames = [pd.read_parquet(out / f"rank{r}-of{world}.parquet") for r in range(world)]
    info = [json.loads((out / f"rank{r}-of{world}.json").read_text()) for r in range(world)]
    return frames, info


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    D.mlp_run(0, 1, 0, str(out))
    D.spawn(D.mlp_run, 2, str(out))
    return out


def test_ddp_rows_carry_the_model_s_names_and_merge_to_the_single_process_rows(clean):
    (single,), _ = _load(clean, 1)
    ranks, info = _load(clean, 2)
    assert sorted(ranks[0]["module"].unique()) == sorted(single["module"].unique())
    assert list(ranks[1]["rank"].unique()) == [1]
    merged = telemetry.merge(ranks)
    key = ["step", "module", "op", "role", "pass"]
    both = single.merge(merged, on=key, suffixes=("_1", "_2"))
    assert len(both) == len(single)
    act = both[both["role"].isin(["input", "output"])]
    # activations are split by rows: their merged statistics are the whole batch's; exactly
    # at step 0, then to fp32 rounding: DDP's all-reduce sums the gradients in another order
    # than one process's GEMM, so the weights part in their last bits after the first update
    assert (act["n_1"] == act["n_2"]).all()
    s0 = act[act["step"] == 0]
    assert (s0["amax_1"] == s0["amax_2"]).all()
    np.testing.assert_allclose(s0["sum_sq_2"], s0["sum_sq_1"], rtol=1e-12)
    np.testing.assert_allclose(act["sum_sq_2"], act["sum_sq_1"], rtol=1e-6)
    np.testing.assert_allclose(act["amax_2"], act["amax_1"], rtol=1e-6)
    # the weights are one tensor on every rank: merged from one rank's row
    assert set(ranks[0].loc[ranks[0]["role"] == "weight", "sharding"]) == {"replicated"}
    w = both[(both["role"] == "weight") & (both["step"] == 0)]
    assert (w["n_2"] == w["n_1"]).all() and (w["sum_sq_2"] == w["sum_sq_1"]).all()
    # what differs, and why (docs/telemetry.md): each rank's activation gradients come from
    # its own mean loss, 2x the global mean's; its weight gradients are its local summand
    # before the all-reduce ("partial")
    g = both[both["role"] == "grad_output"]
    np.testing.assert_allclose(g["amax_2"], 2 * g["amax_1"], rtol=1e-6)
    assert set(ranks[0].loc[ranks[0]["role"] == "grad_weight", "sharding"]) == {"partial"}
    assert set(ranks[0].loc[ranks[0]["role"] == "output", "sharding"]) == {"split"}
    assert all(i["replicas"] == [] and i["first"] is None for i in info)
    assert set(single["sharding"]) == {""}


def test_fsdp2_rows_are_this_rank_s_shards_and_merge_to_the_whole_tensors(clean, tmp_path):
    (single,), _ = _load(clean, 1)
    D.spawn(D.mlp_run, 2, str(tmp_path), None, 4, "fsdp2")
    ranks, info = _load(tmp_path, 2)
    mine = ranks[0].set_index(["step", "module", "role"])
    whole = single.set_index(["step", "module", "role"])
    # each rank records its shard of each weight and weight gradient (dim 0 split in two)
    assert mine.loc[(0, "fc2", "weight"), "n"] == whole.loc[(0, "fc2", "weight"), "n"] / 2
    assert mine.loc[(0, "fc2", "grad_weight"), "sharding"] == "sharded"
    merged = telemetry.merge(ranks).set_index(["step", "module", "role"])
    for role, rtol in (("weight", 1e-12), ("grad_weight", 1e-5), ("output", 1e-12)):
        for layer in ("fc1", "fc2", "fc3"):
            a, b = merged.loc[(0, layer, role)], whole.loc[(0, layer, role)]
            assert a["n"] == b["n"], (layer, role)
            # FSDP2 reduce-scatters the mean of the ranks' gradients: the global mean loss's
            np.testing.assert_allclose([a["amax"], a["sum_sq"]], [b["amax"], b["sum_sq"]],
                                       rtol=rtol, err_msg=f"{layer} {role}")
    assert all(i["first"] is None for i in info)


def test_a_one_ulp_replica_drift_is_named_with_its_parameter_step_and_ranks(tmp_path):
    D.spawn(D.mlp_run, 2, str(tmp_path), "drift")
    _, info = _load(tmp_path, 2)
    assert info[0]["replicas"] == info[1]["replicas"]          # the same table on every rank
    first = info[0]["replicas"][0]
    assert (first["step"], first["parameter"], first["ranks"]) == (1, "fc2.weight", [0, 1])
    assert 0 < first["max_abs_diff"] < 1e-7                     # one fp32 ulp of a weight
    assert {r["parameter"] for r in info[0]["replicas"]} == {"fc2.weight"}


def test_an_optimizer_state_drift_is_named_where_the_weights_do_not_show_it(tmp_path):
    D.spawn(D.mlp_run, 2, str(tmp_path), "state")
    _, info = _load(tmp_path, 2)
    rows = info[0]["replicas"]
    assert rows == info[1]["replicas"]
    # the nudged buffer from step 1 (until 0.9 x buffer rounds the ulp away: step 3 here);
    # the weights agree throughout: one ulp of the buffer times lr 1e-2 is far below a
    # weight's ulp, so every update rounds alike on both ranks
    assert (rows[0]["step"], rows[0]["parameter"], rows[0]["ranks"]) == \
        (1, "fc2.weight:momentum_buffer", [0, 1])
    assert {r["parameter"] for r in rows} == {"fc2.weight:momentum_buffer"}
    assert 0 < rows[0]["max_abs_diff"] < 1e-7


def test_a_watch_refuses_an_optimizer_without_state():
    from numcheck.convergence.models import build
    from numcheck.errors import UsageError
    model, _, _ = build("mlp", 0)
    with pytest.raises(UsageError, match="optimizer=list"):
        telemetry.watch(model, optimizer=[])


def test_a_nan_made_on_rank_1_is_named_with_its_rank_on_every_rank(tmp_path):
    D.spawn(D.mlp_run, 2, str(tmp_path), "overflow")
    _, info = _load(tmp_path, 2)
    for i in info:
        assert i["first"] == [2, "fc2", "linear", "output", "forward"]
        assert i["first_rank"] == 1 and i["received"] == [0]


def test_a_watch_leaves_parameter_storage_resizable():
    # torch.Tensor.numpy() marks a storage not resizable for good; FSDP2 frees each unsharded
    # parameter's storage after the forward (resize_(0)) and failed under a watch that read
    # its parameters that way (measure/host_memory.py)
    from numcheck.convergence.models import build
    model, task, _ = build("mlp", 0)
    with telemetry.watch(model, digests=True) as t:
        model.loss(task.batch_at(0, 0)).backward()
        t.step()
    assert len(t.records()) > 0
    for name, p in model.named_parameters():
        assert p.untyped_storage().resizable(), name
        assert p.grad.untyped_storage().resizable(), name


def test_the_live_merge_is_the_merge_of_the_ranks_files_on_every_rank(clean):
    ranks, _ = _load(clean, 2)
    live = [pd.read_parquet(clean / f"merged{r}-of2.parquet") for r in range(2)]
    pd.testing.assert_frame_equal(live[0], live[1])
    pd.testing.assert_frame_equal(live[0], telemetry.merge(ranks))
    # one process: merged() is its own rows, merged
    (single,), _ = _load(clean, 1)
    one = pd.read_parquet(clean / "merged0-of1.parquet")
    pd.testing.assert_frame_equal(one, telemetry.merge([single]))
    assert len(one) == len(single)


def test_merged_without_the_live_merge_is_a_usage_error():
    from numcheck.convergence.models import build
    from numcheck.errors import UsageError
    model, task, _ = build("mlp", 0)
    with telemetry.watch(model) as t:
        model.loss(task.batch_at(0, 0)).backward()
        t.step()
    with pytest.raises(UsageError, match="live_merge=True"):
        t.merged()


@pytest.fixture(scope="module")
def tensor_parallel(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    D.tp_run(0, 1, 0, str(out))
    D.spawn(D.tp_run, 2, str(out))
    single = pd.read_parquet(out / "tp0-of1.parquet")
    ranks = [pd.read_parquet(out / f"tp{r}-of2.parquet") for r in range(2)]
    checks = [json.loads((out / f"tp{r}-of2.json").read_text()) for r in range(2)]
    return single, ranks, checks


def test_tensor_parallel_rows_merge_to_the_single_process_rows(tensor_parallel):
    single, ranks, _ = tensor_parallel
    mine = ranks[0].set_index(["step", "module", "role"])
    # fc1 column-parallel, fc2 row-parallel: each rank holds half of their weights
    assert mine.loc[(0, "fc1", "weight"), "sharding"] == "sharded"
    assert mine.loc[(0, "fc2", "weight"), "n"] == \
        single.set_index(["step", "module", "role"]).loc[(0, "fc2", "weight"), "n"] / 2
    key = ["step", "module", "role", "pass"]
    both = single.merge(telemetry.merge(ranks), on=key, suffixes=("_1", "_2"))
    assert len(both) == len(single)
    # every row is of the whole tensor: a rank's part counted once, and a plain tensor that
    # every rank holds alike (fc2's all-reduced output, fc3 and its gradients) taken once
    assert (both["n_1"] == both["n_2"]).all()
    held = both.set_index(["module", "role"]).loc[[("fc2", "output"), ("fc3", "input"),
                                                   ("fc3", "grad_weight")], "sharding_2"]
    assert set(held) == {"replicated"}
    # what differs: the row-parallel fc2 sums its two ranks' partial outputs in another order
    # than one process's GEMM (fp32 rounding, then the weights part after the first update);
    # min_nonzero is left out: the smallest value of a sum is a near-cancellation, which that
    # rounding moves by percent
    for f in ("amax", "sum_sq"):
        np.testing.assert_allclose(both[f"{f}_2"], both[f"{f}_1"], rtol=1e-6, err_msg=f)
    s0 = both[(both["step"] == 0) & (both["module"] == "fc1") & (both["pass"] == "forward")]
    np.testing.assert_allclose(s0["sum_sq_2"], s0["sum_sq_1"], rtol=1e-12)


def test_a_hadamard_sign_mismatch_across_tensor_parallel_ranks_is_reported(tensor_parallel):
    _, _, checks = tensor_parallel
    for c in checks:   # both ranks report the same
        assert c["seeded"] == []
        assert len(c["rank_seeded"]) == 1
        assert "rht signs (h=16)" in c["rank_seeded"][0] and "[0, 1]" in c["rank_seeded"][0]


def test_stochastic_rounding_streams_shared_across_data_parallel_ranks_are_reported(
        tensor_parallel):
    _, _, checks = tensor_parallel
    for c in checks:
        assert c["sr_per_rank"] == []
        assert c["sr_same"] == ["sr stream: the same stream on ranks [0, 1], which must each "
                                "draw their own (seed it with the rank in this group)"]
