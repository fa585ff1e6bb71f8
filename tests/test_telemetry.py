"""numcheck.telemetry: rows and columns on tiny_lm, per-block statistics against a direct
computation with numcheck's reference quantizers, merging per-rank frames, the first
non-finite producer (forward and backward) behind layers that only propagate it, disabled
telemetry, and hooks that leave with the watch."""
from __future__ import annotations

import warnings

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from numcheck import telemetry
from numcheck.errors import UsageError
from numcheck.convergence.models import build
from numcheck.quant import RECIPES
from numcheck.quant.fp8 import fp8_dequantize, fp8_quantize
from numcheck.quant.mx import mx_dequantize, mx_quantize
from numcheck.quant.nvfp4 import nvfp4_dequantize, nvfp4_quantize
from tests._telemetry_models import BareSqrt, Exp, InPlaceBoom

STAT_COLUMNS = ("amax", "min_nonzero", "dynamic_range_binades", "underflow_pct",
                "saturation_pct", "sqnr_db", "scale_min_binades", "scale_max_binades",
                "scale_std_binades", "block_clip_pct", "scale_sat_pct", "worst_block_sqnr_db",
                "shadow_sqnr_db", "e2e_sqnr_db", "nonfinite")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _train(model, task, lr, steps, t=None):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    losses = []
    for s in range(steps):
        loss = model.loss(task.batch_at(0, s))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if t is not None:
            t.step()
    return losses


# ---- tiny_lm ---------------------------------------------------------------------------------

def test_tiny_lm_rows_columns_what_if_and_shadows():
    steps = 3
    plain = _train(*build("tiny_lm", 0), steps)
    model, task, lr = build("tiny_lm", 0)
    with telemetry.watch(model, recipe="mxfp8", what_if=("nvfp4",), shadow=True) as t:
        watched = _train(model, task, lr, steps, t)
    assert watched == plain, "telemetry changed the run"
    df = t.records()
    assert set(STAT_COLUMNS) <= set(df.columns)
    assert not df.duplicated(["step", "module", "op", "role", "pass", "recipe"]).any()
    assert sorted(df.step.unique()) == list(range(steps))
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    norms = [n for n, m in model.named_modules() if type(m).__name__ == "RMSNorm"]
    assert len(linears) == 11 and len(norms) == 5
    main = df[~df.what_if]
    for step in range(steps):
        for name in linears:
            rows = main[(main.step == step) & (main.module == name)]
            assert set(rows.role) == set(telemetry.ROLES), (step, name)
            assert (rows.op == "linear").all() and (rows.n > 0).all()
            q = rows[rows.role.isin(["input", "weight", "grad_output"])]
            assert (q.recipe == "mxfp8").all() and q.sqnr_db.between(15, 45).all()
            assert q.scale_std_binades.notna().all() and q.worst_block_sqnr_db.notna().all()
            assert (q.worst_block_sqnr_db <= q.sqnr_db + 1e-9).all()
            out = rows[rows.role == "output"].iloc[0]
            assert out.recipe == "" and math.isnan(out.sqnr_db)
            assert out.shadow_sqnr_db > 100 and out.e2e_sqnr_db > 90  # fp32 vs fp64
        for name in norms:
            rows = main[(main.step == step) & (main.module == name)]
            assert {"input", "weight", "output", "grad_output", "grad_input",
                    "grad_weight"} == set(rows.role) and (rows.op == "norm").all()
            assert rows[rows.role == "output"].shadow_sqnr_db.iloc[0] > 100
    soft = main[(main.module == "blocks.0") & (main.op == "softmax")]
    assert set(soft.role) == {"input", "output", "grad_output", "grad_input"}
    assert (soft.amax[soft.role == "output"] <= 1).all()
    assert (soft["pass"] == soft.role.map(lambda r: "backward" if r.startswith("grad")
                                          else "forward")).all()
    assert (soft[soft.role.str.startswith("grad")].amax > 0).all()
    wi = df[df.what_if]
    assert set(wi.recipe) == {"nvfp4"} and set(wi.role) == {"input", "weight", "grad_output"}
    assert len(wi) == steps * len(linears) * 3
    # the same tensors: observed statistics agree, quantized ones differ (FP4 loses more)
    key = ["step", "module", "role"]
    both = wi.merge(main, on=key, suffixes=("_fp4", "_fp8"))
    assert (both.amax_fp4 == both.amax_fp8).all() and (both.n_fp4 == both.n_fp8).all()
    assert (both.sqnr_db_fp4 < both.sqnr_db_fp8).mean() > 0.9
    assert not t.first_nonfinite()  # the causal mask's -inf is consumed, not produced
    # the causal mask's -inf entries are left out of the softmax input rows (issue 32: they put
    # the row's amax at inf and its range at 142 binades), not out of the outputs' count
    masked = (df.op == "softmax") & (df.role == "input")
    probs = df[(df.op == "softmax") & (df.role == "output")].set_index(["step", "module"])
    logits = df[masked].set_index(["step", "module"])
    assert (logits.n_inf == 0).all() and (df.nonfinite == 0).all()
    assert (logits.n < probs.n).all() and (logits.n > probs.n / 2).all()  # causal: about half


def test_every_n_steps_and_disabled_watch_record_nothing_in_between():
    model = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32))
    with telemetry.watch(model, recipe="mxfp8", every=2) as t:
        for _ in range(5):
            model(torch.randn(4, 32)).sum().backward()
            t.step()
    assert sorted(t.records().step.unique()) == [0, 2, 4]
    bad = nn.Sequential(nn.Linear(4, 4), Exp())
    with torch.no_grad():
        bad[0].weight.fill_(100.0)
    with telemetry.watch(bad, recipe="mxfp8", shadow=True, enabled=False) as t:
        assert not t.enabled
        bad(torch.ones(2, 4)).sum().backward()
        t.step()
    assert len(t.records()) == 0 and not t.first_nonfinite()
    with telemetry.watch(bad) as t:
        t.disable()
        bad(torch.ones(2, 4))
        t.step()
        t.enable()
        bad(torch.full((2, 4), 1e-3))
        t.step()
    assert set(t.records().step) == {1} and not t.first_nonfinite()


# ---- per-block statistics against a direct computation ---------------------------------------

def _direct(x64, deq, sat, log2_grid, at_end_grid, block):
    """Block statistics by a plain loop over the block grid (independent of the telemetry's
    reshapes): scale min/max/std over live blocks with a finite scale, clip and scale-end
    fractions over live blocks, the worst block's SQNR."""
    r, c = block
    rows, cols = x64.shape
    logs, clip, end, sq, live = [], 0, 0, [], 0
    for i in range(rows // r):
        for j in range(cols // c):
            xb = x64[i * r:(i + 1) * r, j * c:(j + 1) * c]
            if float(xb.abs().max()) == 0:
                continue
            live += 1
            qb = deq[i * r:(i + 1) * r, j * c:(j + 1) * c]
            ls = float(log2_grid[i, j])
            if math.isfinite(ls):
                logs.append(ls)
            clip += bool(sat[i * r:(i + 1) * r, j * c:(j + 1) * c].any())
            end += bool(at_end_grid[i, j])
            err = float(((qb - xb) ** 2).sum())
            sq.append(math.inf if err == 0 else 10 * math.log10(float((xb ** 2).sum()) / err))
    nz = x64 != 0
    return {"scale_min_binades": min(logs), "scale_max_binades": max(logs),
            "scale_std_binades": float(np.std(logs)), "block_clip_pct": 100 * clip / live,
            "scale_sat_pct": 100 * end / live, "worst_block_sqnr_db": min(sq),
            "underflow_pct": 100 * float((nz & (deq == 0)).sum()) / float(nz.sum()),
            "saturation_pct": 100 * float(sat.sum()) / x64.numel(),
            "sqnr_db": 10 * math.log10(float((x64 ** 2).sum()) / float(((deq - x64) ** 2).sum()))}


def _observed(recipe, x, weight):
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight)
    with telemetry.watch(lin, recipe=recipe) as t, torch.no_grad():
        lin(x)
        t.step()
    df = t.records()
    return {role: df[df.role == role].iloc[0] for role in ("input", "weight")}


def _planted(rows, cols, gen):
    """Normal values with a row of outliers, an all-zero stretch, a tiny stretch (fp32
    subnormals: MX scale at E8M0's floor, NVFP4 flush) and exact zeros."""
    x = torch.randn(rows, cols, generator=gen)
    x[1] *= 300.0
    x[2, :32] = 0.0
    x[3, :32] *= 1e-39
    x[4, ::7] = 0.0
    return x


def _check(row, want):
    for k, v in want.items():
        assert row[k] == pytest.approx(v, rel=1e-9, abs=1e-9), k


def test_mx_block_statistics_equal_the_reference_quantizer():
    gen = torch.Generator().manual_seed(1)
    x, w = _planted(16, 64, gen), torch.randn(8, 64, generator=gen) * 0.1
    got = _observed("mxfp8", x, w)
    fmt = RECIPES["mxfp8"].x.format
    for role, t in (("input", x), ("weight", w)):
        t64 = t.double()
        q = mx_quantize(t64, "e4m3", 32, "floor", -1)
        e = q.scale_exp.double()
        want = _direct(t64, mx_dequantize(q), fmt.saturation(t64, -1), e,
                       (e >= 127) | (e <= -127), (1, 32))
        _check(got[role], want)
    assert got["input"].scale_sat_pct > 0 and got["input"].block_clip_pct > 0


def test_nvfp4_block_statistics_equal_the_reference_quantizer_1d_and_2d():
    gen = torch.Generator().manual_seed(2)
    x, w = _planted(16, 64, gen), torch.randn(32, 64, generator=gen) * 0.1
    w[16:, 16:32] *= 1e-6  # one 16 x 16 tile far below the tensor's amax: flushed
    got = _observed("nvfp4_rht_sr", x, w)  # x: 1 x 16 blocks; w: 16 x 16 tiles
    r = RECIPES["nvfp4_rht_sr"]
    for role, t, two_d, blk in (("input", x, False, (1, 16)), ("weight", w, True, (16, 16))):
        t64 = t.double()
        q = nvfp4_quantize(t64, -1, two_d)
        s = q.block_scale * q.tensor_scale
        fmt = (r.w if two_d else r.x).format
        want = _direct(t64, nvfp4_dequantize(q), fmt.saturation(t64, -1), torch.log2(s),
                       s == 0, blk)
        _check(got[role], want)
    assert got["weight"].scale_sat_pct > 0 and got["input"].underflow_pct > 0


def test_block_fp8_statistics_equal_the_reference_quantizer():
    gen = torch.Generator().manual_seed(3)
    x, w = _planted(8, 256, gen), torch.randn(128, 256, generator=gen) * 0.05
    got = _observed("fp8_block", x, w)
    for role, t, gran, blk in (("input", x, "block128", (1, 128)),
                               ("weight", w, "block128x128", (128, 128))):
        t64 = t.double()
        q = fp8_quantize(t64, "e4m3", gran, -1)
        fmt = getattr(RECIPES["fp8_block"], "x" if role == "input" else "w").format
        sc = q.scale.double()
        want = _direct(t64, fp8_dequantize(q, torch.float64), fmt.saturation(t64, -1),
                       -torch.log2(sc), sc >= torch.finfo(torch.float32).max, blk)
        _check(got[role], want)


# ---- merging ranks ---------------------------------------------------------------------------

def test_merge_of_two_halves_equals_the_whole(tmp_path):
    gen = torch.Generator().manual_seed(4)
    x = _planted(16, 64, gen)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32))

    def run(inp, rank):
        with telemetry.watch(model, recipe="mxfp8", rank=rank) as t, torch.no_grad():
            model(inp)
            t.step()
        return t

    whole = run(x, 0).records()
    paths = []
    for rank, half in enumerate((x[:8], x[8:])):
        paths.append(tmp_path / f"rank{rank}.parquet")
        run(half, rank).to_parquet(paths[-1])
    merged = telemetry.merge(paths)
    assert (merged["rank"] == -1).all()
    keep = ~whole.role.isin(["weight"])  # a replicated weight counts once per rank
    w = whole[keep].set_index(["module", "op", "role"]).sort_index()
    m = merged[merged.role != "weight"].set_index(["module", "op", "role"]).sort_index()
    assert list(w.index) == list(m.index) and len(w) == 4
    for col in ("n", "n_zero", "amax", "min_nonzero", "q_n", "q_underflow", "q_saturated",
                "blk_n", "blk_scaled_n", "blk_log2_min", "blk_log2_max", "blk_clip",
                "blk_scale_sat", "blk_sqnr_min_db"):
        assert (w[col].to_numpy() == m[col].to_numpy()).all(), col
    for col in ("sum_sq", "q_sig_sq", "q_err_sq", "sqnr_db", "scale_std_binades",
                "saturation_pct", "block_clip_pct", "dynamic_range_binades"):
        np.testing.assert_allclose(m[col].to_numpy(), w[col].to_numpy(), rtol=1e-12,
                                   err_msg=col)
    assert (m.calls == 2).all()
    weight = merged[merged.role == "weight"]
    assert (weight.n == 2 * whole[whole.role == "weight"].n.to_numpy()).all()


# ---- the first non-finite producer -----------------------------------------------------------


class _NaNGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


class _BadBackward(nn.Module):
    def forward(self, x):
        return _NaNGrad.apply(x)


def test_forward_overflow_producer_is_named_not_its_propagators():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Exp(), nn.Linear(8, 8), nn.LayerNorm(8))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(8) * 100.0)
        model[0].bias.zero_()
    with telemetry.watch(model, recipe="mxfp8") as t:
        model(torch.full((4, 8), 1e-3)).sum().backward()  # step 0: finite everywhere
        t.step()
        nan_in = torch.full((4, 8), 1e-3)
        nan_in[0, 0] = math.nan
        model(nan_in)                      # step 1: NaN data: every layer only propagates it
        t.step()
        assert not t.first_nonfinite()
        model(torch.full((4, 8), 2.0)).sum().backward()   # step 2: exp(200) = inf
        t.step()
        model(torch.full((4, 8), 3.0))                     # later steps do not move it
        t.step()
    nf = t.first_nonfinite()
    assert nf == (2, "1", "module", "output", "forward")
    assert nf.inputs["amax"] == pytest.approx(200.0) and nf.inputs["n_inf"] == 0
    assert nf.inputs["n_nan"] == 0
    df = t.records()
    out = df[(df.step == 2) & (df.role == "output")].set_index("module")
    assert out.loc["2", "nonfinite"] > 0 and out.loc["3", "nonfinite"] > 0  # propagated
    assert out.loc["0", "nonfinite"] == 0


def test_backward_nan_producer_is_named_not_its_propagators():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    with telemetry.watch(plain) as t:  # a NaN gradient from the loss: propagated, not produced
        (plain(torch.randn(4, 8, requires_grad=True)) * math.nan).sum().backward()
        t.step()
    assert not t.first_nonfinite()
    assert (t.records().query("role == 'grad_input'").nonfinite > 0).all()
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), _BadBackward(), nn.Linear(8, 4))
    x = torch.randn(4, 8, requires_grad=True)
    with telemetry.watch(model, recipe="nvfp4", shadow=True) as t:
        model(x).sum().backward()
        t.step()
    nf = t.first_nonfinite()
    assert nf == (0, "2", "module", "grad_input", "backward")
    # what its backward consumed, all finite: its grad_output (4 x 8) and its forward input
    # (4 x 8; a backward reads what the forward saved)
    assert nf.inputs["n_nan"] == 0 and nf.inputs["n"] == 32 + 32
    df = t.records()
    g = df[df["pass"] == "backward"].set_index(["module", "role"])
    assert g.loc[("3", "grad_input"), "nonfinite"] == 0
    assert g.loc[("1", "grad_input"), "nonfinite"] > 0     # LayerNorm propagates
    assert g.loc[("0", "grad_weight"), "nonfinite"] > 0    # and the first Linear


# ---- hooks leave with the watch --------------------------------------------------------------

def _hook_count(model):
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        n += len(m._backward_pre_hooks)
    n += sum(len(p._backward_hooks or {}) for p in model.parameters())
    return n


def test_hooks_detach_on_exit():
    model, task, lr = build("mlp", 0)
    before = _hook_count(model)
    idle = telemetry.watch(model, recipe="mxfp8", enabled=False)
    assert _hook_count(model) == before  # attached but disabled: no hook on the model
    idle.enable()
    assert _hook_count(model) > before
    idle.disable()
    assert _hook_count(model) == before
    idle.close()
    with telemetry.watch(model, recipe="fp8_tensor", shadow=True) as t:
        assert _hook_count(model) > before
        _train(model, task, lr, 1, t)
    assert _hook_count(model) == before
    n = len(t.records())
    _train(model, task, lr, 1)
    assert len(t.records()) == n  # nothing recorded after the watch
    assert not torch.overrides.has_torch_function_variadic(torch.ones(1))
    assert torch.ones(2).softmax(0).sum() == 1  # no mode left on the stack to intercept it


# ---- defects found in review -----------------------------------------------------------------

class _SelfAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.drop = nn.Linear(8, 8), nn.Dropout(0.5)
        self.attn = nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        h = self.drop(self.inp(x))
        return self.out(self.attn(h, h, h, need_weights=False)[0])


def test_shadow_leaves_the_runs_dropout_alone_and_follows_eval():
    def run(shadow, steps=2):
        torch.manual_seed(0)
        model = _SelfAttn()
        x = torch.randn(2, 5, 8)
        outs, grads = [], []
        with telemetry.watch(model, shadow=shadow) as t:
            for _ in range(steps):
                y = model(x)
                y.sum().backward()
                t.step()
                outs.append(y.detach())
                grads.append(model.inp.weight.grad.clone())
            model.eval()  # after watch made its float64 copies
            with torch.no_grad():
                model(x)
            t.step()
        return outs, grads, t.records()

    plain_out, plain_grad, _ = run(False)
    out, grad, df = run(True)
    for a, b in zip(plain_out + plain_grad, out + grad, strict=True):
        assert torch.equal(a, b), "shadow=True changed the run's dropout draws"
    ev = df[(df.step == 2) & (df.role == "output")].set_index("module")
    assert (ev.loc[["inp", "attn", "out"], "e2e_sqnr_db"] > 90).all()
    assert ev.loc["attn", "shadow_sqnr_db"] > 90  # the per-layer copy is in eval mode too


class _Twice(nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = self.a if shared else nn.Linear(4, 4, bias=False)
        for lin in (self.a, self.b):
            nn.init.constant_(lin.weight, 1e30)

    def forward(self, x):
        return self.b(self.a(x))


@pytest.mark.parametrize("shared", [False, True])
def test_module_called_twice_names_its_second_calls_backward_overflow(shared):
    model = _Twice(shared)
    with telemetry.watch(model) as t:
        (model(torch.full((1, 4), 1e-38)) * 1e10).sum().backward()  # W^T g = 4e40: inf
        t.step()
    assert t.first_nonfinite() == (0, "a" if shared else "b", "linear", "grad_input",
                                   "backward")


def test_in_place_producer_is_named_not_its_container():
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), InPlaceBoom()), nn.Linear(4, 1))
    with torch.no_grad():
        model[0][0].weight.fill_(1.0)
        model[0][0].bias.zero_()
    with torch.no_grad(), telemetry.watch(model) as t:
        model(torch.full((2, 4), 100.0))
        t.step()
    nf = t.first_nonfinite()
    assert nf == (0, "0.1", "module", "output", "forward")
    assert nf.inputs["n_inf"] == 0 and nf.inputs["amax"] == pytest.approx(400.0)


class _ParamFed(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.randn(4, 8))
        self.lin = nn.Linear(8, 1)

    def forward(self):
        return self.lin(self.p)


def test_hooks_on_a_leaf_input_do_not_pile_up_and_leave_with_the_watch():
    model = _ParamFed()
    with telemetry.watch(model) as t:
        for _ in range(3):
            model().sum().backward()
            t.step()
        # the leaf-input hooks are removed at each step's end; the one left is the
        # parameter's own gradient check (every parameter has one while the watch is on)
        assert len(model.p._backward_hooks) == 1
        model().sum().backward()
        t.disable()
        assert not model.p._backward_hooks
        t.enable()
        model()  # a forward without its backward: close() takes its hook off
    df = t.records()
    gin = df[(df.module == "lin") & (df.role == "grad_input")]
    assert list(gin.calls) == [1.0, 1.0, 1.0, 1.0]
    assert not model.p._backward_hooks


class _KwLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(input=x)


def test_shadow_of_a_linear_called_with_keywords():
    model = _KwLinear()
    with telemetry.watch(model, shadow=True) as t:
        model(torch.randn(2, 4))
        t.step()
    df = t.records()
    out = df[(df.module == "lin") & (df.role == "output")].iloc[0]
    assert out.shadow_sqnr_db > 100 and out.e2e_sqnr_db > 100


def test_underflow_pct_over_finite_nonzero_and_nonfinite_blocks_counted():
    gen = torch.Generator().manual_seed(5)
    x = _planted(8, 64, gen)
    x[5, 0] = math.nan      # block (5, 0)
    x[6, 40] = math.nan     # block (6, 1)
    x[7, 3] = math.inf      # block (7, 0): a NaN scale too
    x[0, 1:3] = 1e-12       # far below block 0's amax: quantized to zero
    row = _observed("mxfp8", x, torch.randn(4, 64, generator=gen))["input"]
    finite_nonzero = int((torch.isfinite(x) & (x != 0)).sum())
    assert row.n_nan == 2 and row.n_inf == 1 and row.q_underflow > 0
    assert row.underflow_pct == pytest.approx(100.0 * row.q_underflow / finite_nonzero)
    assert row.blk_nan == 3 and row.blk_n == 8 * 2 - 1 - 3  # x[2, :32] is an all-zero block


def test_a_bare_ops_backward_overflow_is_not_blamed_on_a_module_sharing_its_input():
    model = BareSqrt()
    with torch.no_grad():
        model.l1.bias.fill_(-100.0)  # h == 0 exactly
    with telemetry.watch(model) as t:
        model(torch.randn(2, 4)).backward()
        t.step()
    why = t.first_nonfinite()  # l2's own share of h's gradient is finite
    assert not why and why.reason == "unattributed", why
    gin = t.records().query("module == 'l2' and role == 'grad_input'").iloc[0]
    assert gin.nonfinite > 0  # the row still shows the tensor's total gradient


class _SdpaAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()


def test_sdpa_forward_and_backward_rows_under_the_calling_module():
    model = _SdpaAttn()
    with telemetry.watch(model) as t:
        model(torch.randn(2, 5, 16)).backward()
        t.step()
    df = t.records()
    rows = df[df.op == "sdpa"]
    assert set(rows.module) == {"<model>"}
    assert set(rows.role) == {"input", "output", "grad_output", "grad_input"}
    gin = rows[rows.role == "grad_input"].iloc[0]
    assert gin.calls == 3 and gin["pass"] == "backward"   # q, k and v
    assert (rows.nonfinite == 0).all() and not t.first_nonfinite()


@pytest.mark.parametrize("kw", [dict(recipe="mxfp8", what_if=("mxfp8",)),
                                dict(what_if=("nvfp4", "nvfp4"))])
def test_a_recipe_named_twice_is_refused(kw):
    with pytest.raises(UsageError, match="given twice"):
        telemetry.watch(nn.Linear(4, 4), **kw)


@pytest.mark.parametrize("make", [
    lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).to("meta"),
    lambda: nn.Sequential(nn.LazyLinear(4), nn.Linear(4, 2))])
def test_a_model_without_values_is_refused_naming_the_tensor(make):
    with pytest.raises(UsageError, match=r"0\.weight is on the meta device or not "
                                         r"initialized.*materialized"):
        telemetry.watch(make())


def test_the_layer_shadow_draws_the_live_forwards_dropout_mask():
    # nn.MultiheadAttention in training mode drops attention weights: a shadow drawing its own
    # mask measured the difference of two masks (7 dB on a TransformerEncoder), not the layer
    torch.manual_seed(0)
    model = nn.MultiheadAttention(32, 4, dropout=0.5, batch_first=True)
    x = torch.randn(2, 8, 32)
    with telemetry.watch(model, shadow=True) as t:
        model(x, x, x, need_weights=False)[0].sum().backward()
        t.step()
    out = t.records().query("role == 'output'").iloc[0]
    assert out.op == "attention" and out.shadow_sqnr_db > 100   # fp32 against float64
    # and the live run drew what it draws unwatched
    torch.manual_seed(0)
    plain = nn.MultiheadAttention(32, 4, dropout=0.5, batch_first=True)
    torch.manual_seed(1)
    a = plain(x, x, x, need_weights=False)[0]
    torch.manual_seed(1)
    with telemetry.watch(plain, shadow=True) as t:
        b = plain(x, x, x, need_weights=False)[0]
        t.step()
    assert torch.equal(a, b)


class _DataWrite(nn.Module):
    def forward(self, x):
        x.data.mul_(1e37)   # behind the version counter
        return x


def test_an_output_written_through_data_is_read_again_not_taken_from_the_step_memo():
    model = nn.Sequential(nn.Linear(4, 4), _DataWrite(), nn.Linear(4, 1))
    with torch.no_grad():
        model[0].weight.fill_(10.0)
        model[0].bias.zero_()
    with torch.no_grad(), telemetry.watch(model) as t:
        model(torch.ones(2, 4))   # 40 * 1e37 = inf in fp32
        t.step()
    nf = t.first_nonfinite()
    assert nf == (0, "1", "module", "output", "forward")
    assert nf.inputs["amax"] == pytest.approx(40.0)   # what it read before the write


@pytest.mark.parametrize("inside", [False, True], ids=["boundary", "inside"])
def test_a_torch_compiled_submodule_is_watched(inside):
    # From its boundary (default), or with hooks inside that Dynamo would trace and fail on
    # ("already tracked for mutation"): they run eagerly (tests/test_telemetry_compiled.py)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    model[1] = torch.compile(model[1], backend="eager")   # Dynamo alone: no inductor build
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # what watching a compiled module does
        with telemetry.watch(model, recipe="mxfp8", every=2, inside_compiled=inside) as t:
            for step in range(4):
                x = torch.randn(4, 8) * (1e30 if step == 3 else 1.0)   # eager LayerNorm: inf
                model(x).sum().backward()
                t.step()
    rows = t.records()
    # named as the module the user wrote (torch.compile's "_orig_mod" is not in the names)
    assert {"norm", "linear"} <= set(rows.op) and "1" in set(rows.module)
    assert not any("_orig_mod" in n for n in rows.module)
    want = ("1", "norm") if inside else ("1 (compiled)", "compiled")
    assert t.first_nonfinite() == (3, *want, "output", "forward")
