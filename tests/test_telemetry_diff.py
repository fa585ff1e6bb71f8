"""``nc.telemetry.diff`` and ``numcheck diff`` (issue 34): where two runs of the tiny models
part ways. A kernel change planted in one layer from a known step is named at that layer and
step, first, by statistics and by digest (a change below the band by digest alone); runs of one
program from other seeds stay within the band measured from repeats; the files cross
processes (the CLI reads what a watch wrote)."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

from numcheck import telemetry
from numcheck.convergence.models import build
from numcheck.errors import UsageError

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _run(name: str, seed: int = 0, steps: int = 4, fault=None, digests: bool = False):
    """A watched AdamW run; ``fault``: (module, first step, how) a planted kernel change of that
    module's output from that step on."""
    model, task, lr = build(name, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    at = {"step": 0}
    if fault is not None:
        module, first, how = fault
        dict(model.named_modules())[module].register_forward_hook(
            lambda m, args, out: how(out) if at["step"] >= first else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with telemetry.watch(model, digests=digests) as t:
            for step in range(steps):
                at["step"] = step
                model.loss(task.batch_at(seed, step)).backward()
                opt.step()
                opt.zero_grad()
                t.step()
    return t.records()


def _scaled(out):   # a kernel that gets its output 5% too large
    return out * 1.05


def _one_ulp(out):   # a kernel that rounds one element of its output the other way
    v = out.detach().reshape(-1)[7]
    step = torch.nextafter(v, torch.tensor(float("inf"), dtype=out.dtype)) - v  # exact
    bump = torch.zeros(out.numel(), dtype=out.dtype)
    bump[7] = step
    return out + bump.view(out.shape)   # v + one ULP is exactly the next float; x + 0 is x


def _tail_dropped(out):   # a kernel that misses the last quarter of its columns
    out = out.clone()
    out[..., 3 * out.shape[-1] // 4:] = 0
    return out


@pytest.mark.parametrize("name,module", [("tiny_lm", "blocks.1.w_up"),
                                         ("tiny_dit", "blocks.0.fc1")])
def test_a_planted_kernel_change_is_named_at_its_layer_and_step(name, module):
    a = _run(name)
    same = telemetry.diff(a, _run(name))
    assert not same and same.rows == len(a), same.summary()   # one program: bitwise equal
    got = telemetry.diff(a, _run(name, fault=(module, 2, _scaled)))
    first = got.first
    assert (first.step, first.module, first.op, first.role, first.pass_) == \
        (2, module, "linear", "output", "forward"), got.summary()
    assert first.stat in ("amax", "rms") and first.excess > 5, got.summary()
    assert all(d.step >= 2 for d in got.divergences)


@pytest.mark.parametrize("name,module", [("tiny_lm", "blocks.1.w_up"),
                                         ("tiny_dit", "blocks.0.fc1")])
def test_digests_name_a_change_no_statistic_sees(name, module):
    """One element one ULP off in one layer from step 2: within every band, so no statistic
    diverges, but the first row whose bits differ is that layer's output at step 2; every row
    before it compares equal, and a rerun's digests all agree."""
    a = _run(name, digests=True)
    # whole numbers below 2^53, exact in float64: 48 bits a call, a row's calls summed
    assert a["digest"].notna().all() and (a["digest"] == a["digest"].round()).all()
    assert (a["digest"] < 2.0 ** 48 * a["calls"]).all()
    same = telemetry.diff(a, _run(name, digests=True))
    assert not same and same.digests == same.rows == len(a), same.summary()
    got = telemetry.diff(a, _run(name, fault=(module, 2, _one_ulp), digests=True))
    assert got.first is None, got.summary()   # statistics: nothing beyond the band
    bits = got.first_digest
    assert (bits.step, bits.module, bits.op, bits.role, bits.pass_) == \
        (2, module, "linear", "output", "forward"), got.summary()
    assert all(d.step >= 2 for d in got.divergences) and got   # diverged: exit 1
    assert f"the first that differs at step 2 {module} (linear) output" in got.summary()
    # the 5% change: the same row first by statistics and by digest
    big = telemetry.diff(a, _run(name, fault=(module, 2, _scaled), digests=True))
    assert big.first.where() == big.first_digest.where() == \
        f"step 2 {module} (linear) output forward"
    from numcheck.telemetry.divergence_html import diff_html
    html = diff_html(got)   # the digest heatmap: the layer's output row from step 2 on
    assert "digests: 1 where" in html and "statistics: the largest" not in html
    assert f'data-module="{module}" data-op="linear" data-role="output"' in html
    assert html.count("the first (digest)") == 1
    # a run without digests: nothing to compare, statistics only
    plain = telemetry.diff(a, _run(name))
    assert plain.digests == 0 and plain.first_digest is None and not plain


def test_digests_that_vary_across_repeats_are_not_compared():
    """Repeats from other seeds: their digests differ, so B's (another seed) are not compared,
    and B stays within the band; a row whose bits no seed changes (a zero-initialized
    modulation weight at step 0) is still compared."""
    reps = [_run("tiny_dit", seed, steps=2, digests=True) for seed in range(3)]
    got = telemetry.diff(reps, _run("tiny_dit", 3, steps=2, digests=True))
    assert not got and got.unstable > 0 and got.digests > 0, got.summary()
    assert "not compared: their digests vary across A" in got.summary()


@pytest.mark.parametrize("name", ["tiny_lm", "tiny_dit"])
def test_other_seeds_stay_in_the_band_measured_from_repeats(name):
    """5 seeds as repeats of A, three more seeds as B: no divergence (measured 2026-12-05 for
    seeds 5-10 on both models: 0 each). A dropped tail in one layer of seed 5 is still named:
    its zero fraction goes 0 -> 0.25, beyond any seed's."""
    reps = [_run(name, seed) for seed in range(5)]
    for seed in (5, 6, 7):
        got = telemetry.diff(reps, _run(name, seed))
        assert not got and "measured from 5 runs" in got.band, got.summary()
    module = "blocks.1.w_up" if name == "tiny_lm" else "blocks.0.fc1"
    got = telemetry.diff(reps, _run(name, 5, fault=(module, 1, _tail_dropped)))
    assert (got.first.step, got.first.module, got.first.role, got.first.stat) == \
        (1, module, "output", "zero_frac"), got.summary()


def test_numcheck_diff_reads_files_another_process_wrote(tmp_path):
    paths = {}
    for tag, fault in (("a", None), ("a2", None), ("b", ("blocks.1.w_up", 3, _scaled))):
        paths[tag] = tmp_path / f"{tag}.parquet"
        _run("tiny_lm", fault=fault).to_parquet(paths[tag], index=False)

    def numcheck(*args):
        return subprocess.run([sys.executable, "-m", "numcheck", "diff", *map(str, args)],
                              capture_output=True, text=True)

    same = numcheck(paths["a"], paths["a2"])
    assert same.returncode == 0 and "no divergence" in same.stdout, same.stdout + same.stderr
    assert "digests of" not in same.stdout   # none recorded
    page = tmp_path / "diff.html"
    got = numcheck(paths["a"], paths["b"], "--first", "3", "--html", page)
    assert got.returncode == 1, got.stdout + got.stderr
    html = page.read_text()   # the first divergences and the excess heatmap, no digest one
    assert "statistics: the largest |B - A| / band" in html and "digests: 1 where" not in html
    assert html.count("the first (statistics)") == 1
    assert 'data-module="blocks.1.w_up" data-op="linear" data-role="output"' in html
    assert "the first at step 3 blocks.1.w_up (linear) output forward" in got.stdout
    assert got.stdout.count("\n  step ") == 3 and "more" in got.stdout
    # A1 A2 -- B: the band measured from the two runs of A (which agree bitwise: FLOOR)
    rep = numcheck(paths["a"], paths["a2"], "--", paths["b"])
    assert rep.returncode == 1 and "measured from 2 runs" in rep.stdout, rep.stdout
    bad = numcheck(paths["a"], tmp_path / "missing.parquet")
    assert bad.returncode == 2 and "missing.parquet" in bad.stderr and "no such file" in bad.stderr


_OTHER_MACHINE = """
import sys, warnings, torch
from numcheck import telemetry
from numcheck.convergence.models import build
torch.set_num_threads(1)
model, task, lr = build("tiny_lm", 0)
opt = torch.optim.AdamW(model.parameters(), lr=lr)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with telemetry.watch(model, digests=True) as t:
        for step in range(4):
            model.loss(task.batch_at(0, step)).backward()
            opt.step()
            opt.zero_grad()
            t.step()
t.records().to_parquet(sys.argv[1], index=False)
"""


def test_another_machines_file_parts_where_its_bits_do(tmp_path):
    """ATEN_CPU_CAPABILITY=default stands for a machine without AVX2: tiny_lm's float32
    normal_ init draws other weights there (docs/findings.md), so the first digest that
    differs is a weight at step 0, while the statistics stay within the default band (one
    exact zero more among 16384 gradient elements at step 3 is within the zero fraction's)."""
    import os
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this machine runs the default ISA tier itself: no other machine to be")
    path = tmp_path / "default.parquet"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    subprocess.run([sys.executable, "-c", _OTHER_MACHINE, str(path)], env=env, check=True,
                   capture_output=True)
    here = _run("tiny_lm", digests=True)
    got = telemetry.diff(here, path)
    bits = got.first_digest
    assert (bits.step, bits.role, bits.pass_) == (0, "weight", "forward"), got.summary()
    assert got.first is None, got.summary()


def test_bad_input_is_a_usage_error(tmp_path):
    import pandas as pd
    with pytest.raises(UsageError, match="run B has no column"):
        telemetry.diff(_run("mlp", steps=1), pd.DataFrame({"step": [0]}))
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(UsageError, match="junk.parquet.*is not a parquet file"):
        telemetry.diff(junk, junk)


def test_a_row_only_one_run_has_is_a_divergence():
    a = _run("mlp", steps=2)
    b = a[~((a.step == 1) & (a.role == "grad_weight"))].reset_index(drop=True)
    got = telemetry.diff(a, b)
    assert got.first.stat == "row" and got.first.step == 1 and got.first.role == "grad_weight"
    assert got.first.b != got.first.b   # NaN: run B has no such row
