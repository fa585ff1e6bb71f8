"""numcheck.telemetry's CPU route (numcheck/telemetry/_fields_numba.py, host accumulation in
accumulator.py) against the torch route it replaces on CPU (fields.tensor_stats / sqnr_pair: the
reference, and the device route where Triton is missing): per-tensor fields on every dtype
with NaN, Inf, zeros, subnormals, odd and empty sizes, non-contiguous views; whole watched
runs giving the same records and the same first non-finite producer; the merge rules of host
values and of rows read back from a device;
the fallback when the compiled pass fails, or when numba is missing; NUMCHECK_BACKEND=torch
(backend.force("torch")) sending CPU tensors through the torch route; the watch's
TorchFunctionMode seeing only the model's own ops.

Routes are picked through numcheck.measure.backend alone (kind "telemetry-cpu": the compiled
CPU pass; ``backend.substitute(CPU, None)``: the torch route, as without numba)."""
from __future__ import annotations

import importlib
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from numcheck import telemetry
from numcheck.convergence.models import build
from numcheck.measure import backend
from numcheck.quant.mx import MXFormat
from numcheck.telemetry import fields

from numcheck.telemetry import _fields_numba as _stats_cpu
P = importlib.import_module("numcheck.telemetry.passes")  # asks numcheck.measure.backend
H = importlib.import_module("numcheck.telemetry.hooks")  # the watch's TorchFunctionMode

CPU = "telemetry-cpu"  # numcheck.measure.backend's kind of the compiled CPU pass
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 31, 1000, 2048, 4097, 6151)
# float fields that are sums of squares, summed in another order by the compiled pass
SUM_FIELDS = ("sum_sq", "sh_sig_sq", "sh_err_sq", "e2e_sig_sq", "e2e_err_sq")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _compiled_pass():
    """The compiled CPU pass, as the selector gives it to telemetry now (numba present)."""
    fast = P._fast()
    assert fast is not None, "the compiled CPU pass is off"
    return fast


def _pass_with(**functions) -> SimpleNamespace:
    """The compiled CPU pass with some of its functions replaced: a substitute for CPU."""
    fast = _compiled_pass()
    return SimpleNamespace(**{**{k: getattr(fast, k) for k in ("handles", "raw", "finite", "sqnr")},
                              **functions})


def _sum_tol(n: int) -> float:
    # two float64 sums of the same n non-negative terms in different orders: each within
    # (n - 1) 2^-53 of the exact sum (relative), so within 2 n 2^-53 of each other
    return 2 * max(n, 1) * 2.0**-53


def _values(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Normal values over the dtype's whole range, with its subnormals, +-0, NaN, +-Inf and
    (float64) squares that overflow, at seeded positions."""
    fi = torch.finfo(dtype)
    # exponents from below the smallest subnormal (those round to zero) up to the top binade
    lo, hi = math.log2(fi.smallest_normal) + math.log2(fi.eps) - 2, math.log2(fi.max)
    e = torch.empty(n, dtype=torch.float64).uniform_(lo, hi, generator=gen)
    x = torch.randn(n, generator=gen, dtype=torch.float64).sign() * torch.exp2(e)
    x = x.to(dtype)  # below the smallest subnormal: zeros; between: subnormals
    k = torch.randint(0, 12, (n,), generator=gen)
    x[k == 0] = 0.0
    x[k == 1] = -0.0
    x[k == 2] = fi.smallest_normal / 4  # a subnormal of the dtype
    if n > 6:
        x[k == 3] = math.nan
        x[k == 4] = math.inf
        x[k == 5] = -math.inf
    return x


def _torch_plain(t: torch.Tensor) -> list[float]:
    d = fields.tensor_stats(t)
    return [float(d[k]) for k in fields.PLAIN]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_pass_equals_torch_route_on_every_dtype(dtype):
    gen = torch.Generator().manual_seed(1)
    cases = []
    for n in SIZES:
        x = _values(n, dtype, gen)
        cases += [x, x.clone().normal_(generator=gen) if dtype is not torch.bfloat16 else
                  torch.randn(n, generator=gen).to(dtype)]   # all finite: the select-free loop
        if n > 8:
            cases += [x[::3], x.reshape(1, -1).expand(2, -1).t()]   # non-contiguous views
    cases += [torch.tensor(3.0, dtype=dtype), torch.tensor(math.nan, dtype=dtype),
              torch.zeros(17, dtype=dtype), torch.full((5,), math.inf, dtype=dtype),
              torch.full((9,), -math.inf, dtype=dtype)]
    if dtype is torch.float64:
        cases.append(torch.tensor([1e200, 3.0, 1e-310]))   # x^2 overflows; a subnormal
    # the finite-first scan's edges: the largest finite magnitude (its bits one below +inf's),
    # the smallest subnormal alone among zeros of both signs, a lone -0.0
    fi = torch.finfo(dtype)
    cases += [torch.tensor([0.0, -fi.max, fi.max, -0.0], dtype=dtype),
              torch.tensor([-0.0, 0.0, fi.smallest_normal * fi.eps, -0.0], dtype=dtype),
              torch.tensor([-0.0], dtype=dtype)]
    for x in cases:
        assert _stats_cpu.handles(x)
        got, want = _stats_cpu.raw(x), _torch_plain(x)
        # counts, amax and min_nonzero bitwise
        assert all(_same(g, w) for g, w in zip(got[:7], want[:7], strict=True)), (x, got, want)
        assert math.isclose(got[7], want[7], rel_tol=_sum_tol(x.numel())), (got[7], want[7])
        ints = _stats_cpu.raw(x, sums=False)
        assert ints[:7] == got[:7] and math.isnan(ints[7])
        assert _stats_cpu.finite(x) == bool(torch.isfinite(x).all())   # the sentinel's read
        if x.numel() > 1 and torch.isfinite(x).all():   # one non-finite anywhere, the last too
            for bad in (math.nan, math.inf, -math.inf):
                y = x.clone()
                y.view(-1)[-1] = bad
                assert not _stats_cpu.finite(y)


@pytest.mark.parametrize("n", [1, 7, 2047, 2048, 2049, 6151])
def test_float32_sum_sq_keeps_the_four_lane_order_across_stretches(n):
    """The float32 pass sums stretch by stretch (_scan_sumsq32): its sum_sq is the documented
    order bitwise (element i into lane i mod 4, (s0 + s1) + (s2 + s3)), written out here in
    plain float64, at sizes around the 2048-element stretch and in a tail."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    lanes = [0.0, 0.0, 0.0, 0.0]
    for i, a in enumerate(x.double().tolist()):
        lanes[i % 4] += a * a
    assert _stats_cpu.raw(x)[7] == (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


def test_compiled_pass_takes_grad_tensors_parameters_and_refuses_the_rest():
    p = nn.Parameter(torch.randn(4, 4))
    y = p * 2   # requires grad, not a leaf
    for t in (p, y):
        got, want = _stats_cpu.raw(t), _torch_plain(t)
        assert got[:7] == want[:7] and math.isclose(got[7], want[7], rel_tol=_sum_tol(16))
    assert not _stats_cpu.handles(torch.zeros(3, dtype=torch.int64))
    assert not _stats_cpu.handles(torch.zeros(3, dtype=torch.float8_e4m3fn))
    assert not _stats_cpu.handles(torch.zeros(3).as_subclass(_Sub))
    assert not _stats_cpu.handles(torch.eye(3).to_sparse())
    assert not _stats_cpu.handles(torch._neg_view(torch.ones(3)))


class _Sub(torch.Tensor):
    pass


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_sqnr_equals_sqnr_pair(dtype):
    gen = torch.Generator().manual_seed(2)
    for n in SIZES:
        ref = torch.randn(n, generator=gen, dtype=torch.float64)
        out = (ref * (1 + 1e-3 * torch.randn(n, generator=gen, dtype=torch.float64))).to(dtype)
        if n > 6:
            ref[1], ref[2], out[3], out[4] = math.nan, math.inf, math.nan, -math.inf
        got = _stats_cpu.sqnr(out, ref)
        want = fields.sqnr_pair(out, ref, "sh")
        for g, k in zip(got, ("sh_sig_sq", "sh_err_sq"), strict=True):
            w = float(want[k])
            assert (math.isnan(g) and math.isnan(w)) or \
                math.isclose(g, w, rel_tol=_sum_tol(n)), (n, k, g, w)
    assert _stats_cpu.sqnr(torch.zeros(2, 3), torch.zeros(3, dtype=torch.float64)) is None


def test_rows_read_back_merge_as_host_values_do():
    """Fields a device gave as rows (fields.host_rows: several rows reduced by numpy, then
    merged) accumulate to what the same values give one by one (fields.host_update, Python
    floats and 0-d tensors), NaN propagating through max and min either way."""
    obs = [{"q_n": 4.0, "blk_sqnr_min_db": 7.5, "blk_log2_max": -3.0, "q_err_sq": 0.25},
           {"q_n": torch.tensor(2, dtype=torch.int64), "blk_sqnr_min_db": math.nan,
            "blk_log2_max": torch.tensor(-1.0, dtype=torch.float64), "q_err_sq": 1e308},
           {"q_n": 1.0, "blk_sqnr_min_db": 3.0, "blk_log2_max": 2.0, "q_err_sq": 1e308}]
    host = fields.host_identity()
    for d in obs:
        fields.host_update(host, d)
    idx = tuple(fields.INDEX[k] for k in obs[0])
    rows = np.array([[float(d[k]) for k in obs[0]] for d in obs])
    got = fields.host_identity()
    fields.host_rows(got, idx, rows)   # several rows: numpy reduces them first
    assert all(_same(a, b) for a, b in zip(host, got, strict=True))
    assert math.isnan(host[fields.INDEX["blk_sqnr_min_db"]])
    assert host[fields.INDEX["q_err_sq"]] == math.inf
    both = fields.host_combine(host, host)
    assert both[fields.INDEX["q_n"]] == 14.0 and both[fields.INDEX["blk_log2_max"]] == 2.0
    one = fields.host_identity()
    fields.host_rows(one, idx, rows[:1])
    fields.host_rows(one, idx, rows[1:])   # in two reads: the same merge
    assert all(_same(a, b) for a, b in zip(host, one, strict=True))


def _records(build_args, steps, setting, train=True):
    model, task, lr = build(*build_args)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    with telemetry.watch(model, **setting) as t:
        for s in range(steps):
            loss = model.loss(task.batch_at(0, s))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if train:
                opt.step()
            losses.append(float(loss.detach()))
            t.step()
    return t.records(), losses


# quantization fields summed over elements or blocks: a CPU quantizer pass wired into
# fields.quant_stats (numcheck/telemetry/_quant_numba.py) may sum them in its own order too
QUANT_SUMS = ("q_sig_sq", "q_err_sq", "blk_log2_sum", "blk_log2_sumsq", "blk_sqnr_min_db")
# derived from those sums (ratios and logs of them)
DERIVED_SUMS = ("sqnr_db", "shadow_sqnr_db", "e2e_sqnr_db", "worst_block_sqnr_db")


def _assert_same_records(fast, slow):
    assert list(fast.columns) == list(slow.columns)
    key = list(fields.KEY)
    assert fast[key].equals(slow[key]), "rows or their order differ"
    rel = _sum_tol(int(fast["n"].max()))
    for c in fields.NAMES + fields.DERIVED:
        a, b = fast[c].to_numpy(), slow[c].to_numpy()
        if c in SUM_FIELDS:
            np.testing.assert_allclose(a, b, rtol=rel, atol=0, equal_nan=True, err_msg=c)
        elif c in QUANT_SUMS or c in DERIVED_SUMS:
            # other summation orders: the sums' relative error, amplified by a ratio, a log
            # or a difference of two sums (scale_std's E[x^2] - E[x]^2) by at most 1e4
            np.testing.assert_allclose(a, b, rtol=1e4 * rel, atol=1e4 * rel, equal_nan=True,
                                       err_msg=c)
        elif c == "scale_std_binades":
            # sqrt(E[x^2] - E[x]^2): where the scales are near constant the difference cancels,
            # and a relative error rel of the sums moves the std by up to sqrt(4 rel E[x^2])
            ex2 = (slow["blk_log2_sumsq"] / slow["blk_scaled_n"]).to_numpy()
            atol = np.sqrt(4 * rel * np.nan_to_num(ex2))
            bad = ~np.isclose(a, b, rtol=1e4 * rel, atol=0, equal_nan=True) & ~(abs(a - b) <= atol)
            assert not bad.any(), (c, a[bad], b[bad], atol[bad])
        else:   # counts, maxima and minima: bitwise
            np.testing.assert_array_equal(a, b, err_msg=c)


@pytest.mark.parametrize("name", ["tiny_lm", "tiny_dit"])
def test_watched_run_records_equal_the_torch_routes(name):
    setting = dict(recipe="mxfp8", what_if=("nvfp4",), shadow=True)
    with backend.substitute(CPU, None):   # the torch route on CPU, as without numba
        slow, slow_losses = _records((name, 0), 2, setting)
    _compiled_pass()   # the block ended: the compiled pass back on
    fast, fast_losses = _records((name, 0), 2, setting)
    assert fast_losses == slow_losses
    _assert_same_records(fast, slow)


@pytest.mark.parametrize("name", ["mlp", "tiny_lm"])
def test_a_recorded_step_reads_each_parameter_once(name, monkeypatch):
    """A container's producer check reads its children's weights before their own forward
    does: it reads a recorded row's weight with the full pass then, not the integer pass
    first and the full one again (one pass per parameter and step; at width 1024 such
    re-reads were a fifth of the elements a step read)."""
    obs = importlib.import_module("numcheck.telemetry.observation")
    model, task, lr = build(name, 0)
    params = {id(p) for p in model.parameters()}
    reads: list[int] = []
    real = obs.read

    def counted(t, full):
        reads.append(id(t))
        return real(t, full)

    monkeypatch.setattr(obs, "read", counted)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    with telemetry.watch(model) as t:
        for i in range(2):
            reads.clear()
            loss = model.loss(task.batch_at(0, i))
            opt.zero_grad()
            loss.backward()
            opt.step()
            t.step()
            per_param = [reads.count(k) for k in params]
            assert max(per_param) == 1 and min(per_param) == 1, per_param


class _Boom(nn.Module):
    k = 1.0

    def forward(self, x):
        return torch.exp(x * self.k)


def _bf16_model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 24), nn.LayerNorm(24), nn.Linear(24, 8), _Boom())
    return m.to(torch.bfloat16)


def test_bf16_model_and_its_producer_equal_the_torch_routes():
    def run():
        m = _bf16_model()
        with telemetry.watch(m, recipe="mxfp8") as t:
            for k in range(3):
                x = torch.randn(5, 16, generator=torch.Generator().manual_seed(k))
                m[3].k = 1.0 if k < 2 else 300.0   # exp overflows bf16 on the last step
                m(x.to(torch.bfloat16)).float().sum().backward()
                t.step()
        return t.records(), t.first_nonfinite()
    with backend.substitute(CPU, None):
        slow, slow_nf = run()
    _compiled_pass()
    fast, fast_nf = run()
    _assert_same_records(fast, slow)
    assert fast_nf is not None and fast_nf == slow_nf and fast_nf[1] == "3"
    assert fast_nf.inputs == slow_nf.inputs and fast_nf.inputs["n_inf"] == 0


def test_rows_fed_by_both_routes_equal_the_torch_routes():
    """Every other tensor through the torch route (as a model with CPU and CUDA tensors has
    them): host and device rows, flags and producer vectors combine to the same records and
    the same producer."""
    def run():
        m = _bf16_model().float()
        with telemetry.watch(m, recipe="mxfp8", shadow=True) as t:
            for k in range(3):
                x = torch.randn(5, 16, generator=torch.Generator().manual_seed(k))
                m[3].k = 1.0 if k < 2 else 300.0
                m(x).sum().backward()
                t.step()
        return t.records(), t.first_nonfinite()
    with backend.substitute(CPU, None):
        slow, slow_nf = run()
    fast = _compiled_pass()
    calls = [0, 0]   # [tensors sent to the torch route, to the compiled pass]

    def alternate(t):
        host = fast.handles(t) and sum(calls) % 2 == 1
        calls[host] += 1
        return host

    def sqnr(out, ref64):   # the shadows' sums alternate too
        return fast.sqnr(out, ref64) if alternate(out) else None
    with backend.substitute(CPU, _pass_with(handles=alternate, sqnr=sqnr)):
        mixed, mixed_nf = run()
    assert min(calls) > 30, calls   # both routes fed the rows (each tensor read once a step)
    _assert_same_records(mixed, slow)
    assert slow_nf is not None and slow_nf[1] == "3"
    assert mixed_nf == slow_nf and mixed_nf.inputs == slow_nf.inputs


def test_a_failing_compiled_pass_warns_once_and_takes_the_torch_route():
    def broken(t, sums=True):
        raise RuntimeError("no compiler here")
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    with backend.substitute(CPU, _pass_with(raw=broken)):   # a pass that fails as it runs
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with telemetry.watch(model) as t:
                model(torch.randn(3, 8)).sum().backward()
                t.step()
        msgs = [str(w.message) for w in caught if "compiled CPU pass failed" in str(w.message)]
        assert len(msgs) == 1 and "no compiler here" in msgs[0]
        assert backend.load(CPU) is None and P._fast() is None   # off from then on
    df = t.records()
    assert len(df) > 0 and (df.n > 0).all()
    _compiled_pass()   # the planted pass's block ended


def test_without_numba_the_torch_route_runs_with_one_warning(monkeypatch):
    def no_numba(name):
        raise ImportError("No module named 'numba'")
    backend.reset(CPU)   # imported again at the next choice: numba missing
    monkeypatch.setattr(P.importlib, "import_module", no_numba)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with telemetry.watch(model) as t:
                model(torch.randn(3, 8)).sum().backward()
                t.step()
        msgs = [w for w in caught if "no numba" in str(w.message)]
        assert len(msgs) == 1 and msgs[0].category is RuntimeWarning, msgs
        assert P._fast() is None and len(t.records()) > 0
    finally:
        monkeypatch.undo()
        backend.reset(CPU)   # numba back: the next choice imports the pass again
    _compiled_pass()


def test_numcheck_backend_torch_sends_cpu_tensors_through_the_torch_route():
    """NUMCHECK_BACKEND=torch (in process: backend.force("torch")) on telemetry: no compiled
    pass is chosen for a CPU tensor (plain fields, shadow sums, finiteness flags, quantization
    fields), and the torch route's figures equal the compiled pass's (counts, amax and min
    bitwise, sums within two summation orders' 2 n 2^-53); a watched run gives the same
    records and the same producer."""
    gen = torch.Generator().manual_seed(6)
    xs = [_values(n, dtype, gen) for dtype in DTYPES for n in (7, 1000)]
    xs += [torch.randn(33, generator=gen).to(dtype) for dtype in DTYPES]   # finite ones too
    ref = torch.randn(1000, generator=gen, dtype=torch.float64)
    out = (ref * (1 + 1e-3 * torch.randn(1000, generator=gen, dtype=torch.float64))).float()
    _compiled_pass()
    compiled = [P.read(x, True) for x in xs]
    assert all(isinstance(c, list) for c in compiled)   # host floats: the compiled pass
    c_sqnr = P.sqnr_pair(out, ref, "sh")
    c_flags = [P.all_finite([x]) for x in xs]
    assert all(isinstance(f, bool) for f in c_flags)
    quant = importlib.import_module("numcheck.telemetry._quant_numba")
    blocks, mx = torch.randn(4, 64, generator=gen), MXFormat("e4m3", 32)
    assert quant.available() and isinstance(quant.quant_fields_many(blocks, [mx])[0], dict)
    with backend.force("torch"):
        assert backend.mode() == "torch" and not quant.available()
        assert P._fast() is None and all(P._kernel(x) is None for x in xs)
        slow = [P.read(x, True) for x in xs]
        s_sqnr = P.sqnr_pair(out, ref, "sh")
        s_flags = [P.all_finite([x]) for x in xs]
        assert quant.quant_fields_many(blocks, [mx]) == [None]   # then fields.quant_stats
    for x, c, s in zip(xs, compiled, slow, strict=True):
        assert isinstance(s, torch.Tensor) and s.shape == (1, 8)   # fields.tensor_stats' row
        s = s[0].tolist()
        assert all(_same(a, b) for a, b in zip(c[:7], s[:7], strict=True)), (x.dtype, c, s)
        assert math.isclose(c[7], s[7], rel_tol=_sum_tol(x.numel())) or _same(c[7], s[7])
    assert isinstance(s_sqnr[0]["sh_sig_sq"], torch.Tensor)   # fields.sqnr_pair's tensors
    for k in ("sh_sig_sq", "sh_err_sq"):
        assert math.isclose(c_sqnr[0][k], float(s_sqnr[0][k]), rel_tol=_sum_tol(1000)), k
    assert all(isinstance(f, torch.Tensor) for f in s_flags)   # the torch route's flags
    assert [bool(f) for f in s_flags] == c_flags and not all(c_flags) and any(c_flags)
    # a watched run with a recipe and the shadows: the same records and producer either way
    def run():
        m = _bf16_model().float()
        with telemetry.watch(m, recipe="mxfp8", what_if=("nvfp4",), shadow=True) as t:
            for k in range(3):
                x = torch.randn(5, 16, generator=torch.Generator().manual_seed(k))
                m[3].k = 1.0 if k < 2 else 300.0   # exp overflows on the last step
                m(x).sum().backward()
                t.step()
        return t.records(), t.first_nonfinite()
    fast, fast_nf = run()
    with backend.force("torch"):
        slow_run, slow_nf = run()
    assert backend.mode() == "auto" and quant.available()   # the block ended
    _assert_same_records(fast, slow_run)
    assert fast_nf is not None and fast_nf[1] == "3"
    assert fast_nf == slow_nf and fast_nf.inputs == slow_nf.inputs


class _Count(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.funcs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


def test_the_watch_mode_sees_the_models_ops_not_telemetrys(monkeypatch):
    model, task, _ = build("tiny_lm", 0)
    tokens = task.batch_at(0, 0)["tokens"]
    with _Count() as plain:
        model(tokens)
    seen = []
    inner = H._OpMode.__torch_function__

    def counting(self, func, types, args=(), kwargs=None):
        seen.append(func)
        return inner(self, func, types, args, kwargs)
    monkeypatch.setattr(H._OpMode, "__torch_function__", counting)
    with telemetry.watch(model, recipe="mxfp8", shadow=True):
        model(tokens)
    # exactly the forward's own ops, none of the statistics', quantizers' or shadows'
    assert sorted(map(repr, seen)) == sorted(map(repr, plain.funcs))


def _load_fresh(name: str):
    """A fresh copy of numcheck.telemetry.<name> (the installed one stays as it is)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        f"numcheck.telemetry.{name}_fresh", importlib.import_module(
            f"numcheck.telemetry.{name}").__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_compiled_passes_import_where_numba_cannot_cache(monkeypatch):
    """numcheck installed read-only (site-packages) with no writable user cache directory:
    numba finds no cache location and ``njit(cache=True)`` raises at decoration; the compiled
    passes must still import (and compile, uncached), not fail the watched run's hooks."""
    import numba.core.caching as caching

    def denied(self):
        raise PermissionError(13, "Permission denied", self.get_cache_path())
    monkeypatch.setattr(caching._CacheLocator, "ensure_cache_path", denied)
    sc = _load_fresh("_fields_numba")
    x = torch.tensor([1.0, -0.0, math.inf, 3.0])
    assert sc.raw(x)[:7] == _torch_plain(x)[:7]
    qc = _load_fresh("_quant_numba")
    from numcheck.quant.intq import IntFormat
    assert qc.quant_fields(torch.ones(2, 4), IntFormat(8))["q_n"] == 8.0
