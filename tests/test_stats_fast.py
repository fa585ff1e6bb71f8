"""error_stats against a plain float64 computation on adversarial data, on every route.

The oracle is written here from primitives: numpy, math.fsum, round-to-nearest-even as
np.rint on the format's grid (frexp/ldexp: exact scalings), ordinals from the formats' bit
patterns (numpy/ml_dtypes casts of values already on the grid, which are exact), blocks by
their index arithmetic. Neither numcheck's rounding nor its chunking is used. The data mix
NaN and inf in out and ref, references at and beyond the overflow threshold, subnormal
outputs, 1e-38..1e38 in one tensor, exact and signed zeros, zero blocks, ties (references
halfway between two values, and near-halfway ones that rounding to fp32 first would make
exact ties), out and ref of opposite signs, ragged sizes, 2-D tiles and many chunks.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch

import numcheck as nc
from numcheck.measure import backend, stats
from numcheck.measure import blocks as geometry

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]
_NP = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16, torch.float32: np.float32,
       torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
INT_FIELDS = ("n", "n_compared", "n_nan", "n_inf", "nonfinite_mismatch", "max_ulp", "p99_ulp",
              "n_blocks")


def _rne(x: np.ndarray, f) -> np.ndarray:
    """x rounded to nearest-even on f's grid, with the format's own overflow (inf, or NaN where
    f has no inf)."""
    a = np.abs(x)
    a0 = np.where(np.isfinite(a), a, 0.0)
    e = np.maximum(np.frexp(a0)[1] - 1, f.emin)  # binade; subnormals share emin's quantum
    q = np.ldexp(1.0, e - f.mbits)
    mag = np.rint(a0 / q) * q  # a0 / q is exact; rint rounds half to even
    over = np.inf if f.has_inf else np.nan
    mag = np.where((mag > f.max) | np.isinf(a), over, mag)
    return np.where(np.isnan(x), np.nan, np.copysign(mag, x))


def _ordinal(v: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Signed ordinal of finite values of dtype's format: the magnitude of their bit pattern."""
    bits = v.astype(_NP[dtype]).view(_UINT[dtype.itemsize]).astype(np.int64)
    top = 8 * dtype.itemsize - 1
    mag = bits & ((1 << top) - 1)
    return np.where(bits >> top, -mag, mag)


def _block_index(shape, blocks) -> np.ndarray:
    flat = np.arange(math.prod(shape))
    if blocks is None:
        return flat // geometry.DEFAULT_BLOCK
    if isinstance(blocks, int):
        c = shape[-1]
        return flat // c * -(-c // blocks) + flat % c // blocks
    (tr, tc), (r, c) = blocks, shape[-2:]
    row, col = flat // c % r, flat % c
    return (flat // (r * c) * -(-r // tr) * -(-c // tc)) + row // tr * -(-c // tc) + col // tc


def _oracle(out: torch.Tensor, ref: torch.Tensor, blocks) -> dict:
    """The statistics, as numcheck.measure.stats' module doc defines them, computed plainly."""
    f = nc.formats.get(out.dtype)
    o, r = out.double().numpy().ravel(), ref.numpy().ravel()
    rr = _rne(r, f)

    def cls(v):
        return np.where(np.isnan(v), 1, np.where(v == np.inf, 2, np.where(v == -np.inf, 3, 0)))

    oc, rc = cls(o), cls(rr)
    fin = (oc == 0) & (rc == 0)
    of, rf = o[fin], r[fin]
    err = of - rf
    d = _ordinal(of, out.dtype) - _ordinal(rr[fin], out.dtype)
    u = np.abs(d)
    n = int(fin.sum())
    s, e2 = math.fsum(rf * rf), math.fsum(err * err)
    o2, dot, abs_ref, s_err = math.fsum(of * of), math.fsum(of * rf), math.fsum(np.abs(rf)), \
        math.fsum(err)
    blk = _block_index(out.shape, blocks)
    nb = int(blk.max()) + 1 if blk.size else 0
    cnt = np.bincount(blk[fin], minlength=nb).astype(float)
    bs = np.array([math.fsum(x) for x in _split(rf * rf, blk[fin], nb)])
    be = np.array([math.fsum(x) for x in _split(err * err, blk[fin], nb)])
    live = cnt > 0
    per_s, per_e = bs[live] / cnt[live], be[live] / cnt[live]
    block_sq = np.full(nb, np.inf)
    if live.any():
        floor = stats.BLOCK_ENERGY_EPS * np.sort(per_s)[(per_s.size - 1) // 2]  # lower median
        with np.errstate(divide="ignore"):
            block_sq[live] = np.where(per_e > 0, 10 * np.log10(np.maximum(per_s, floor) / per_e),
                                      np.inf)
    return {
        "n": o.size, "n_compared": n, "n_nan": int((oc == 1).sum()),
        "n_inf": int((oc >= 2).sum()), "nonfinite_mismatch": int((oc != rc).sum()),
        "max_abs": float(np.abs(err).max()) if n else 0.0,
        "mean_abs": math.fsum(np.abs(err)) / n if n else 0.0,
        "sqnr_db": (math.inf if e2 == 0 else -math.inf if s == 0 else 10 * math.log10(s / e2)),
        "rel_l2": (math.sqrt(e2 / s) if s else 0.0 if e2 == 0 else math.inf),
        "cosine": (1.0 if o2 == 0 and s == 0 else 0.0 if o2 == 0 or s == 0 else
                   dot / math.sqrt(o2 * s)),
        "bias": (s_err / abs_ref if abs_ref else math.copysign(math.inf, s_err) if s_err else 0.0),
        "max_ulp": int(u.max()) if n else 0, "mean_ulp": int(u.sum()) / n if n else 0.0,
        "p99_ulp": int(np.percentile(u, 99, method="inverted_cdf")) if n else 0,
        "bias_ulp": int(d.sum()) / n if n else 0.0,
        "mag_bias_ulp": int((d * np.sign(rf)).sum()) / n if n else 0.0,
        "min_block_sqnr_db": float(block_sq.min()) if nb else math.inf,
        "block_sqnr": block_sq, "n_blocks": nb,
        "scale": {"bias": math.fsum(np.abs(err)) / abs_ref if abs_ref else 0.0},
    }


def _split(values: np.ndarray, index: np.ndarray, nb: int) -> list[np.ndarray]:
    order = np.argsort(index, kind="stable")
    return np.split(values[order], np.searchsorted(index[order], np.arange(1, nb)))


def _assert_matches(s, want: dict) -> None:
    got = s.as_dict()
    for k in INT_FIELDS:
        assert got[k] == want[k], k
    for k in ("mean_ulp", "bias_ulp", "mag_bias_ulp", "max_abs"):
        assert got[k] == want[k], k  # exact integer sums over n; the same float64 subtraction
    # Float statistics: within 1e-9 relative (or of the sum of magnitudes where a sum cancels):
    # numcheck sums in float64 in chunks and vector lanes, math.fsum exactly; the gap is a few
    # hundred ulps of float64 at these sizes, far below anything a verdict or golden (0.01 dB)
    # reads, while a wrong element (one ULP of bf16 in 10^5 elements) moves them by >= 1e-7.
    for k in ("mean_abs", "rel_l2", "cosine"):
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k
    assert got["bias"] == pytest.approx(want["bias"], rel=1e-9, abs=1e-9 * want["scale"]["bias"])
    for k in ("sqnr_db", "min_block_sqnr_db"):
        assert got[k] == pytest.approx(want[k], abs=1e-7), k  # dB: 1e-9 relative is 4e-9 dB
    if want["n_blocks"] and math.isfinite(want["min_block_sqnr_db"]):
        assert want["block_sqnr"][got["worst_block"]] == pytest.approx(
            want["min_block_sqnr_db"], abs=1e-7)


def _adversarial(dtype: torch.dtype, shape, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, ref) of ``shape`` mixing every hard case of the module doc, element by element. The
    first half is finite and below overflow, so that its chunks take the fast route with its
    hard cases (ties, signs, zeros, subnormals); NaN, inf and overflow join in the second."""
    f = nc.formats.get(dtype)
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    kind = torch.randint(0, 8, (n,), generator=g)
    kind[: n // 2] %= 6  # no overflow, NaN or inf in the first half
    x = torch.randn(n, generator=g, dtype=torch.float64).clamp(-4, 4)
    e = torch.randint(f.emin - f.mbits - 4, f.emax - 2, (n,), generator=g).double()
    q = torch.exp2(torch.randint(f.emin, f.emax, (n,), generator=g).double() - f.mbits)
    k = torch.randint(1 << f.mbits, 2 << f.mbits, (n,), generator=g).double()
    ref = torch.where(kind == 1, x * torch.exp2(e), x)  # every binade: subnormal to near max
    ref = torch.where(kind == 2, torch.where(x > 0, 0.0, -0.0), ref)
    ref = torch.where(kind == 3, x * f.min_normal, ref)  # subnormal outputs
    ref = torch.where(kind == 4, torch.copysign((k + 0.5) * q, x), ref)  # exact ties
    near = torch.copysign((k + 0.5) * q * (1 + torch.sign(x) * 2.0 ** -40), -x)
    ref = torch.where(kind == 5, near, ref)  # ties once rounded to fp32
    ref = torch.where(kind == 6, x * f.max, ref)  # near and beyond the overflow threshold
    special = torch.tensor([math.nan, math.inf, -math.inf, f.overflow_threshold])
    ref = torch.where(kind == 7, special[torch.randint(0, 4, (n,), generator=g)], ref)
    out = nc.round_to(ref, f, saturate=False).to(dtype)
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32}[dtype.itemsize]
    bits = out.view(ints).to(torch.int64)
    sign = bits & (1 << (8 * dtype.itemsize - 1))
    top = int(torch.tensor(f.max).to(dtype).view(ints))  # the largest finite magnitude
    how = torch.randint(0, 10, (n,), generator=g)
    how[: n // 2] %= 6  # no NaN output in the first half
    step = torch.where(how < 4, torch.randint(-3, 4, (n,), generator=g), 0)  # a few ULPs off
    mag = bits ^ sign
    mag = torch.where(mag > top, mag, (mag + step).clamp(0, top))  # inf and NaN codes stay
    out.view(ints).copy_((sign | mag).to(ints))
    o64 = out.double()  # (fp8 has few ops) every value below is one of dtype's: exact casts
    o64 = torch.where(how == 4, -o64, o64)  # opposite signs
    o64 = torch.where(how == 5, 0.0, o64)
    o64 = torch.where(how == 6, math.nan, o64)
    out = o64.to(dtype).reshape(shape)
    ref = ref.reshape(shape)
    zero = min(3 * geometry.DEFAULT_BLOCK, n // 8)  # zero blocks (whole ones in large tensors)
    ref.view(-1)[:zero] = 0.0
    out.view(-1)[: zero // 3] = 0.0
    return out, ref


CASES = [((5, 301, 67), None), ((5, 301, 67), 32), ((5, 301, 67), 67), ((5, 301, 67), (16, 8)),
         ((3, 129, 130), (7, 5)), ((40_001,), None)]


@pytest.fixture
def small_chunks(monkeypatch):
    """Many chunks, ragged ones included: 2^12 elements a chunk (its tiles kept whole)."""
    monkeypatch.setattr(geometry, "CHUNK", 1 << 12)


@pytest.fixture
def torch_route():
    """The torch route: the compiled passes off (backend's switch, as NUMCHECK_BACKEND=torch)."""
    with backend.force("torch"):
        assert stats._cpu_loop() is None
        yield


@pytest.fixture(params=["loop", "torch"])
def cpu_route(request) -> str:
    """The CPU route: the compiled loop (numcheck.measure._stats_numba, numba) or the torch route (its
    fallback where numba is missing)."""
    if request.param == "loop":
        pytest.importorskip("numba")
        assert stats._cpu_loop() is not None
        yield request.param
    else:
        with backend.force("torch"):
            yield request.param


def test_every_route_matches_plain_float64_compiled_loop(small_chunks):
    """The compiled loop on every dtype and block layout, many chunks."""
    pytest.importorskip("numba")
    for dtype in DTYPES:
        for shape, blocks in CASES:
            out, ref = _adversarial(dtype, shape, seed=hash((str(dtype), shape)) % 1000)
            f = nc.formats.get(dtype)
            res = stats._compiled_cpu(out, ref, f, blocks)
            assert res is not None, (dtype, shape)
            _assert_matches(stats._finish(out, ref, f, blocks, *res), _oracle(out, ref, blocks))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, blocks", CASES, ids=str)
def test_every_route_matches_plain_float64(dtype, shape, blocks, small_chunks, monkeypatch,
                                           torch_route):
    """The torch route (fast and general chunks), then the general route alone."""
    out, ref = _adversarial(dtype, shape, seed=hash((str(dtype), shape)) % 1000)
    want = _oracle(out, ref, blocks)
    routes = []
    fast, general = stats._fast_chunk, stats._general_chunk
    monkeypatch.setattr(stats, "_fast_chunk", lambda *a: routes.append(fast(*a)) or routes[-1])
    monkeypatch.setattr(stats, "_general_chunk", lambda *a: routes.append(None) or general(*a))
    _assert_matches(nc.error_stats(out, ref, blocks=blocks), want)  # fast route where it can
    assert any(routes) and None in routes  # both routes ran
    monkeypatch.setattr(stats, "_fast_route", lambda *a: None)  # the general route everywhere
    _assert_matches(nc.error_stats(out, ref, blocks=blocks), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fast_routes_on_clean_data_across_natural_chunks(dtype, cpu_route):
    """Finite, in-range data over several full-size chunks and a ragged one, against the
    oracle: the compiled loop, and the torch route's fast chunks (only their set-aside ties and
    sign flips go general)."""
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(3 * geometry.CHUNK + 12345, generator=g, dtype=torch.float64)
    ref *= torch.exp2(torch.randint(-4, 4, ref.shape, generator=g).double())  # below e4m3's max
    out = ref * (1 + 0.02 * torch.randn(ref.shape, generator=g, dtype=torch.float64))
    out[::1001] *= -1
    out = out.to(dtype)
    _assert_matches(nc.error_stats(out, ref), _oracle(out, ref, None))


def test_results_do_not_depend_on_the_thread_count(cpu_route):
    """Each chunk runs on one intra-op thread, whichever thread runs it: 1 and 2 threads give
    bit-identical statistics (torch's own split of a sum would not)."""
    out, ref = _adversarial(torch.bfloat16, (4 * geometry.CHUNK + 7,), seed=3)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = nc.error_stats(out, ref, blocks=64).as_dict()
        torch.set_num_threads(2)
        two = nc.error_stats(out, ref, blocks=64).as_dict()
    finally:
        torch.set_num_threads(n)
    assert one == two


def _radix_case(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 outputs 5% off on 30% of the elements: p99 near 2^19 ULP."""
    g = torch.Generator().manual_seed(5)
    ref = torch.randn(n, generator=g, dtype=torch.float64)
    return (ref * torch.where(torch.rand(ref.shape, generator=g) < 0.3, 1.05, 1.0)).float(), ref


def test_p99_beyond_the_histogram_takes_the_radix_passes(small_chunks, cpu_route):
    """ULP distances of 2^16 and more: p99 in the histogram's clamped last bin."""
    out, ref = _radix_case(20_000)
    want = _oracle(out, ref, None)
    assert want["p99_ulp"] > 1 << 16
    _assert_matches(nc.error_stats(out, ref), want)


# The Triton kernel run by Triton's interpreter on CPU tensors, in a fresh process (the variable
# must be set before triton is imported): numpy per program, ~1 s per 2000 elements, so small.
_INTERPRETED = """
import importlib.util, sys, torch, numcheck as nc
from numcheck.measure import stats
spec = importlib.util.spec_from_file_location("t", sys.argv[1])
t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)
cases = [(torch.bfloat16, (2, 20, 67), 32), (torch.float16, (3, 21, 29), (7, 5)),
         (torch.float32, (2500,), None), (torch.float8_e4m3fn, (30, 67), 67)]
for dtype, shape, blocks in cases:
    out, ref = t._adversarial(dtype, shape, seed=11)
    f = nc.formats.get(dtype)
    t._assert_matches(stats._finish(out, ref, f, blocks, *stats._fused(out, ref, f, blocks)),
                      t._oracle(out, ref, blocks))
out, ref = t._radix_case(1500)  # p99 beyond the kernel's 511-ULP histogram
f = nc.formats.get(out.dtype)
t._assert_matches(stats._finish(out, ref, f, None, *stats._fused(out, ref, f, None)),
                  t._oracle(out, ref, None))
print("ok")
"""


def test_triton_kernel_under_the_interpreter():
    """The fused CUDA kernel's arithmetic, on CPU: Triton's interpreter against the oracle."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", _INTERPRETED, __file__], capture_output=True,
                         text=True, timeout=600, env=env)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_triton_kernel_compiles_for_sm90():
    """Without a GPU: Triton compiles the fused kernel to a cubin for sm_90 (its front end, MLIR
    passes and ptxas) for every output dtype, and nothing spills to local memory."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from numcheck.measure import _stats_triton as _stats_cuda
    ptr = {1: "*i8", 2: "*i16", 4: "*i32"}
    for dtype in DTYPES:
        sig = dict(zip(_stats_cuda._kernel.arg_names, [
            ptr[dtype.itemsize], "*fp64", "*fp64", "*fp64", "*i64", "*i64", *["i32"] * 8]))
        const = _stats_cuda.constants(dtype, nc.formats.get(dtype), stats._FUSED_BINS - 1, 1024)
        sig.update(dict.fromkeys(const, "constexpr"))
        kernel = triton.compile(ASTSource(_stats_cuda._kernel, sig, const),
                                target=GPUTarget("cuda", 90, 32),
                                options={"enable_fp_fusion": False})
        assert "cubin" in kernel.asm and "st.local" not in kernel.asm["ptx"], dtype


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, blocks", CASES, ids=str)
def test_cuda_fused_kernel_equals_the_chunked_fallback(dtype, shape, blocks):
    """The fused Triton kernel against the chunked path, both on the GPU, and the oracle: the
    device check's proof that the fast CUDA route is the same statistics."""
    out, ref = _adversarial(dtype, shape, seed=7)
    want = _oracle(out, ref, blocks)
    o, r = out.cuda(), ref.cuda()
    f = nc.formats.get(dtype)
    fused = stats._fused(o, r, f, blocks)
    assert fused is not None, "the fused CUDA kernel did not run (see the warning)"
    _assert_matches(stats._finish(o, r, f, blocks, *fused), want)
    _assert_matches(stats._finish(o, r, f, blocks, *stats._chunked(o, r, f, blocks)), want)


def test_a_loop_that_fails_falls_back_to_the_torch_route():
    """numba present but failing (a CPU or version it cannot compile for): warned once, the same
    statistics from the torch route, and later calls go straight there."""
    pytest.importorskip("numba")
    out, ref = _adversarial(torch.bfloat16, (3, 129, 130), seed=2)
    want = _oracle(out, ref, None)

    class Broken:
        supports = staticmethod(lambda dtype, f: True)
        constants = staticmethod(lambda dtype, f: ())

        @staticmethod
        def chunk(*args):
            raise RuntimeError("no LLVM target")

    with backend.substitute(stats.CPU_PASS, Broken):
        with pytest.warns(RuntimeWarning, match="compiled CPU loop failed"):
            _assert_matches(nc.error_stats(out, ref), want)
        assert stats._cpu_loop() is None
    assert stats._cpu_loop() is not None  # the planted pass gone: the real loop again
