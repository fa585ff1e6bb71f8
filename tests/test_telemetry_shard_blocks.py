"""Block statistics of sharded tensors (docs/telemetry.md, "Distributed"): where a shard
boundary cuts a quantization block (fields.cut_blocks: blk_cut, blocks_cut, merge's warning).
The arithmetic against a brute force over uneven chunks; then 2 gloo ranks on the CPU
(tests/_distributed_shards.py), tensor-parallel RowwiseParallel and FSDP2, against one process
on the whole tensors."""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from numcheck import telemetry
from numcheck.telemetry import fields
import _distributed as D
import _distributed_shards as S


# ---- the arithmetic, no process group ---------------------------------------------------------

def _brute_cut(shape: tuple, dim: int, world: int, rank: int, block) -> float:
    """blk_cut of rank's torch.chunk shard along ``dim``, counted on the tensors themselves:
    each element labelled with its block in the whole tensor's (rows, cols) view, the shard's
    view laid in blocks as quant_stats lays them; a shard block is whole where it holds one
    label and all of that block's elements."""
    r, c = block if isinstance(block, tuple) else (1, block)
    v = fields.pad_to_blocks(torch.zeros(shape, dtype=torch.float64).reshape(-1, shape[-1]),
                             block)
    ids = (torch.arange(v.shape[0])[:, None] // r) * (v.shape[1] // c) + \
        torch.arange(v.shape[1])[None, :] // c
    label = ids[:math.prod(shape[:-1]), :shape[-1]].reshape(shape)
    chunks = label.chunk(world, dim)
    if rank >= len(chunks):   # torch.chunk gives fewer chunks: the last ranks' are empty
        return 0.0
    mine = fields.as_2d(chunks[rank]).to(torch.int64)
    tiles = fields.blocks(fields.pad_to_blocks(mine + 1, block) - 1, block)  # pads as -1
    whole = 0
    for tile in tiles:
        got = tile[tile >= 0]
        whole += len(got.unique()) == 1 and len(got) == int((label == got[0]).sum())
    return float(len(tiles) - whole)


def _extent(shape: tuple, dim: int, world: int, rank: int) -> tuple:
    """(offset, length, size) per dim of rank's torch.chunk shard along ``dim``."""
    lengths = [len(c) for c in torch.arange(shape[dim]).chunk(world)]
    lengths += [0] * (world - len(lengths))
    return tuple((sum(lengths[:rank]), lengths[rank], n) if d == dim else (0, n, n)
                 for d, n in enumerate(shape))


@pytest.mark.parametrize("shape,dim,block", [
    ((3, 80), 1, 32), ((3, 80), 1, 16), ((3, 100), 1, 32),   # K sharded: blocks along it
    ((81, 40), 0, 32),                                       # rows sharded, 1-D blocks: none
    ((81, 40), 0, (16, 16)), ((256, 130), 0, (128, 128)),    # rows sharded, 2-D tiles
    ((40, 81), 1, (16, 16)),
    ((2, 6, 20), 1, (4, 8)),   # a middle dim: the shard's rows are two runs of the view's
    ((5, 33), 0, (2, 16)),     # 4 ranks, torch.chunk's 2, 2, 1: the last rank's is empty
])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_cut_blocks_counts_what_a_brute_force_counts_over_uneven_chunks(shape, dim, block,
                                                                        world):
    for rank in range(world):
        ext = _extent(shape, dim, world, rank)
        assert fields.cut_blocks(ext, block) == _brute_cut(shape, dim, world, rank, block), \
            (rank, ext)


def test_cut_blocks_whole_shards_and_unknown_offsets():
    # 128 split in 64s: whole blocks of 32; a non-block axis cuts nothing
    assert fields.cut_blocks(((0, 16, 16), (64, 64, 128)), 32) == 0
    assert fields.cut_blocks(((40, 41, 81), (0, 256, 256)), 32) == 0
    # a _StridedShard's offset (None) matters only along an axis with blocks
    assert fields.cut_blocks(((None, 40, 80), (0, 256, 256)), 32) == 0
    assert math.isnan(fields.cut_blocks(((None, 40, 80), (0, 256, 256)), (16, 16)))


def test_rows_of_one_process_count_no_cut_blocks():
    m = torch.nn.Sequential(torch.nn.Linear(80, 16))
    with telemetry.watch(m, what_if=("mxfp8",)) as t:
        m(torch.randn(4, 80)).sum().backward()
        t.step()
    df = t.records()
    q = df["q_n"] > 0
    assert q.any() and (df.loc[q, "blocks_cut"] == 0).all()
    assert df.loc[~q, "blocks_cut"].isna().all() and (df["blk_cut"] == 0).all()


# ---- 2 gloo ranks ------------------------------------------------------------------------------

needs_dist = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not available in this build")
KEY = ["step", "module", "role", "recipe"]
# per-block and element statistics that equal the whole tensor's bit for bit where the blocks
# do (the same blocks, the same float64 arithmetic per block) ...
EXACT = ("n", "q_n", "q_underflow", "q_saturated", "blk_n", "blk_scaled_n", "blk_log2_min",
         "blk_log2_max", "blk_clip", "blk_scale_sat", "blk_sqnr_min_db", "blk_nan")
# ... and sums over elements or blocks, added in another order across the shards
SUMS = ("q_sig_sq", "q_err_sq", "blk_log2_sum", "blk_log2_sumsq")


def _run(tmp_path_factory, layout: str):
    """(one process's records, each rank's) of the layout."""
    out = tmp_path_factory.mktemp(layout)
    S.shard_run(0, 1, 0, str(out), layout)
    D.spawn(S.shard_run, 2, str(out), layout)
    single = pd.read_parquet(out / f"{layout}0-of1.parquet")
    return single, [pd.read_parquet(out / f"{layout}{r}-of2.parquet") for r in range(2)]


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    return _run(tmp_path_factory, "tp")


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    return _run(tmp_path_factory, "fsdp2")


def _merged(ranks):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        merged = telemetry.merge(ranks)
    return merged.set_index(KEY), [str(w.message) for w in got]


@needs_dist
@pytest.mark.parametrize("layout,rows", [
    # RowwiseParallel: fc1's K of 128 in shards of 64, whole blocks of 32
    ("tp", [("fc1", "weight", "mxfp8"), ("fc1", "input", "mxfp8")]),
    # FSDP2: fc1's 256 rows in shards of 128, whole 128x128 tiles; fc2's rows in 41 and 40,
    # along no block axis of mxfp8
    ("fsdp2", [("fc1", "weight", "fp8_block"), ("fc2", "weight", "mxfp8")]),
])
def test_blocks_inside_shards_merge_to_the_whole_tensor_s_block_statistics(layout, rows,
                                                                           request):
    single, ranks = request.getfixturevalue(layout)
    merged, _ = _merged(ranks)
    whole = single.set_index(KEY)
    for module, role, recipe in rows:
        key = (0, module, role, recipe)
        a, b = merged.loc[key], whole.loc[key]
        assert set(r.set_index(KEY).loc[key, "sharding"] for r in ranks) == {"sharded"}
        assert a["blocks_cut"] == 0 and b["blocks_cut"] == 0, key
        assert a["blk_n"] > 0, key
        for f in EXACT:
            assert a[f] == b[f], (key, f)
        np.testing.assert_allclose([a[f] for f in SUMS], [b[f] for f in SUMS], rtol=1e-12,
                                   err_msg=str(key))


@needs_dist
def test_a_shard_boundary_that_cuts_blocks_is_counted_and_merge_warns(tp, fsdp2):
    single, ranks = tp
    mine = [r.set_index(KEY) for r in ranks]
    w = (0, "fc2", "weight", "mxfp8")
    # fc2's weight (16, 80), K in shards of 40: rank 0's second block (32..40) is a piece;
    # rank 1's start at 40, so both its blocks straddle the whole tensor's
    assert [m.loc[w, "blk_cut"] for m in mine] == [16 * 1, 16 * 2]
    merged, said = _merged(ranks)
    assert merged.loc[w, "blocks_cut"] == 16 * 3
    assert merged.loc[(0, "fc2", "input", "mxfp8"), "blocks_cut"] == S.BATCH * 3
    # the merged block statistics are the shards' blocks': 2 + 2 a row, not the whole's 3
    assert merged.loc[w, "blk_n"] == 16 * 4 and single.set_index(KEY).loc[w, "blk_n"] == 16 * 3
    assert merged.loc[(0, "fc1", "weight", "mxfp8"), "blocks_cut"] == 0
    assert len(said) == 1 and "fc2 weight (mxfp8: blocks of 32)" in said[0] and \
        "fc2 input (mxfp8: blocks of 32)" in said[0] and "fc1 weight (mxfp8" not in said[0]

    _, ranks = fsdp2
    merged, said = _merged(ranks)
    # fc2's weight (81, 256), rows in 41 and 40 against 128x128 tiles: each rank's two tiles
    assert merged.loc[(0, "fc2", "weight", "fp8_block"), "blocks_cut"] == 4
    assert merged.loc[(0, "fc2", "weight", "mxfp8"), "blocks_cut"] == 0
    assert len(said) == 1 and "fc2 weight (fp8_block: 128x128 tiles)" in said[0]


@needs_dist
def test_files_without_blk_cut_merge_as_before(tp):
    _, ranks = tp
    old = [r.drop(columns=["blk_cut", "blocks_cut"]) for r in ranks]
    merged, said = _merged(old)
    q = merged["q_n"] > 0
    assert said == [] and (merged.loc[q, "blocks_cut"] == 0).all()


@needs_dist
def test_a_strided_shard_is_sharded_with_an_unknown_offset(tmp_path):
    D.spawn(S.strided_run, 2, str(tmp_path))
    got = [json.loads((tmp_path / f"strided{r}.json").read_text()) for r in range(2)]
    # _StridedShard(0) over 2 ranks, (4, 8) of an (8, 8) tensor each: dim 0 interleaved
    assert [g["extent"] for g in got] == [[[None, 4, 8], [0, 8, 8]]] * 2
    assert [g["sharding"] for g in got] == ["sharded"] * 2
