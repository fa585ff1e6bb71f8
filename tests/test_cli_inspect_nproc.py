"""`numcheck inspect --nproc N` (issue 33): the model trained on N gloo ranks under
DistributedDataParallel (torch.multiprocessing spawn), each on its share of every global batch,
watched; the ranks' files merged into the one-process outputs, the rank that made the first
NaN/Inf and the ranks it reached printed (docs/telemetry.md, "Distributed")."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from numcheck.frontends import cli
from numcheck.telemetry import inspect as ins

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available in this build")

PLANTED = '''
import torch
import torch.distributed as dist
from torch import nn

from numcheck.convergence.models import build


class Plant(nn.Module):
    """The identity, but on rank 1 its second call (step 1) makes a NaN of its finite input,
    or raises (``fail``)."""

    def __init__(self, fail=False):
        super().__init__()
        self.calls, self.fail = 0, fail

    def forward(self, x):
        self.calls += 1
        if dist.get_rank() != 1 or self.calls != 2:
            return x
        if self.fail:
            raise RuntimeError("planted failure on rank 1")
        return x * float("nan")


class Net(nn.Module):
    def __init__(self, mlp, fail=False):
        super().__init__()
        self.mlp, self.plant = mlp, Plant(fail)

    def loss(self, b):
        return torch.nn.functional.mse_loss(self.plant(self.mlp(b["x"])), b["y"])


class Five:
    """A task whose global batch has 5 rows."""

    def batch_at(self, seed, step):
        g = torch.Generator().manual_seed(step)
        return {"x": torch.randn(5, 32, generator=g), "y": torch.randn(5, 32, generator=g)}


def nan_on_rank_1(seed):
    model, task, lr = build("mlp", seed)
    return Net(model), task, lr


def fails_on_rank_1(seed):
    model, task, lr = build("mlp", seed)
    return Net(model, fail=True), task, lr


def five_rows(seed):
    model, _, lr = build("mlp", seed)
    return model, Five(), lr
'''


@pytest.fixture
def planted(tmp_path, monkeypatch):
    # the spawned ranks import it too: they start with this process's sys.path
    (tmp_path / "planted_ranks.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_two_ranks_merge_to_the_one_process_run(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["inspect", "--model", "mlp", "--nproc", "2", "--steps", "3",
                     "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "first non-finite producer: none (all_finite" in text and "made on rank" not in text
    assert "replicas differ" not in text
    merged = pd.read_parquet(out / "telemetry.parquet")
    assert set(merged["rank"]) == {-1} and set(merged["step"]) == {0, 1, 2}
    assert {pd.read_parquet(out / f"rank{r}.parquet")["rank"].unique()[0] for r in (0, 1)} \
        == {0, 1}
    assert (out / "telemetry.png").stat().st_size > 0 and (out / "telemetry.html").exists()
    single = ins.run("mlp", steps=3).records()
    key = ["step", "module", "op", "role", "pass", "recipe", "what_if"]
    both = single.merge(merged, on=key, suffixes=("_1", "_2"))
    assert len(both) == len(single) == len(merged)
    s0 = both[both["step"] == 0]
    # the weights are one tensor on every rank (replicated: merged from rank 0's row): the
    # one-process weights at step 0, bit for bit; later steps part in the last bits (the
    # all-reduce sums the gradients in another order than one process's GEMM)
    w = s0[s0["role"] == "weight"]
    for col in ("n", "amax", "sum_sq", "min_nonzero"):
        assert (w[f"{col}_1"] == w[f"{col}_2"]).all(), col
    # activations are split by rows: merged, the whole batch's
    act = s0[s0["role"].isin(["input", "output"])]
    assert (act["n_1"] == act["n_2"]).all() and (act["amax_1"] == act["amax_2"]).all()
    np.testing.assert_allclose(act["sum_sq_2"], act["sum_sq_1"], rtol=1e-12)
    # what differs, and why: each rank's activation gradients come from its own mean loss,
    # world x the global mean's; its weight-gradient rows are its partial sums
    g = s0[s0["role"] == "grad_output"]
    np.testing.assert_allclose(g["amax_2"], 2 * g["amax_1"], rtol=1e-6)
    assert set(merged.loc[merged["role"] == "grad_weight", "sharding"]) == {"partial"}


def test_a_nan_made_on_rank_1_is_named_with_its_rank_and_the_rank_it_reached(tmp_path, capsys,
                                                                            planted):
    out = tmp_path / "out"
    assert cli.main(["inspect", "--model", "planted_ranks:nan_on_rank_1", "--nproc", "2",
                     "--steps", "4", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "first non-finite producer: step 1, plant (module), output in the forward pass" \
        in text
    # rank 0 received it through step 1's gradient all-reduce: its weights are NaN at step 2,
    # the one step the ranks run past the non-finite loss
    assert "made on rank 1 of 2; received by rank 0" in text
    merged = pd.read_parquet(out / "telemetry.parquet")
    assert set(merged["step"]) == {0, 1, 2}
    page = (out / "telemetry.html").read_text()
    assert "made on rank 1 of 2" in page


def test_a_failing_rank_fails_the_run_with_its_error(tmp_path, planted):
    with pytest.raises(ins.RankFailed, match="rank 1 failed: RuntimeError: planted failure"):
        cli.main(["inspect", "--model", "planted_ranks:fails_on_rank_1", "--nproc", "2",
                  "--steps", "3", "--out", str(tmp_path / "out")])


def test_a_batch_that_does_not_split_is_a_usage_error(tmp_path, capsys, planted):
    assert cli.main(["inspect", "--model", "planted_ranks:five_rows", "--nproc", "2",
                     "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--nproc 2: the global batch" in err and "has 5 rows" in err


def test_nproc_usage_errors(tmp_path, capsys):
    assert cli.main(["inspect", "--nproc", "2", "--merge", "x.parquet",
                     "--out", str(tmp_path)]) == 2
    assert "--nproc" in capsys.readouterr().err
    assert cli.main(["inspect", "--model", "mlp", "--nproc", "0", "--out", str(tmp_path)]) == 2
    assert "--nproc 0: give a positive number of ranks" in capsys.readouterr().err


def test_inspect_under_torchrun_runs_as_its_ranks_and_rank_0_reports(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    got = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "-m", "numcheck", "inspect", "--model", "mlp",
                          "--steps", "2", "--out", str(out)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.count("first non-finite producer: none") == 1   # rank 0's report alone
    merged = pd.read_parquet(out / "telemetry.parquet")
    assert set(merged["rank"]) == {-1} and set(merged["step"]) == {0, 1}
    assert (out / "rank1.parquet").exists()


def test_collect_agrees_where_the_run_ended_between_agreements_and_names_replicas(tmp_path):
    import json

    # at --every 3 the watches agree on steps 0 and 3 only: a NaN made on rank 1 at step 1
    # and a run stopped at step 2 leave rank 1 naming its producer and rank 0 having seen the
    # NaN it received (step 2, "propagated"); the rank files say so, the parent agrees
    records = ins.run("mlp", steps=1).records()
    for rank in (0, 1):
        records.assign(rank=rank).to_parquet(tmp_path / f"rank{rank}.parquet", index=False)
    drift = {"step": 0, "parameter": "fc2.weight", "ranks": [0, 1], "max_abs_diff": 6e-8}
    own = {"where": [1, "plant", "module", "output", "forward"], "inputs": {"n": 4},
           "rank": 1, "received": []}
    seen = {"reason": "propagated", "step": 2, "detail": "in the inputs of fc1"}
    for rank, first in ((0, seen), (1, own)):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "first": first, "replicas": [drift]}))
    frame, where, line = ins.collect(tmp_path, 2)
    assert where == (1, "plant", "module", "output", "forward")
    assert where.rank == 1 and where.received == (0,)
    assert line.splitlines()[1:] == [
        "made on rank 1 of 2; received by rank 0",
        "replicas differ across ranks: fc2.weight after step 0 (ranks 0, 1: max |diff| 6e-08)"]
    assert set(frame["rank"]) == {-1} and len(frame) == len(records)
