"""numcheck/telemetry/_fields_triton.py, the device pass of the telemetry's plain statistics (one
Triton launch per tensor on CUDA), checked without a GPU: its arithmetic under Triton's
interpreter against fields.tensor_stats (the torch route) on every dtype with NaN, Inf, zeros,
subnormals, odd sizes, several programs and non-contiguous views; its compile for sm_90; whole
watched runs through it against the compiled CPU pass (the same records, the same producer),
and the kernel launches a recorded step adds: one per tensor read, one concatenation, nothing
else. tests/test_telemetry_cuda.py runs it compiled on a GPU.

The interpreter runs ``tl.sum`` only where TRITON_INTERPRET was set before triton's import, so
the interpreted checks run in a subprocess. CPU tensors take the device pass there because the
scripts substitute it through numcheck.measure.backend, the one selector:
``backend.substitute("telemetry-cuda-on-cpu", K)`` (K: _fields_triton, interpreted) with
``backend.substitute("telemetry-cpu", None)`` (the compiled CPU pass off)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")


def _interpreted(script: str, *args: str, timeout: int = 900) -> None:
    """Run ``script`` in a Python with TRITON_INTERPRET=1 (argv: this folder, then ``args``);
    it must end by printing "ok"."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__), *args],
                         capture_output=True, text=True, timeout=timeout, env=env)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), \
        (res.stdout[-3000:], res.stderr[-3000:])


_ARITHMETIC = """
import math, sys
import torch
sys.path.insert(0, sys.argv[1])
import test_telemetry_fast as F
from numcheck.telemetry import fields

from numcheck.telemetry import _fields_triton as K
def merged(t):
    rows = K.plain_rows(t)
    assert rows.dtype == torch.float64 and rows.shape[1] == 8, rows.shape
    acc = list(fields.PLAIN_IDENTITY)
    fields.host_rows(acc, fields.PLAIN_INDEX, rows.numpy())
    return acc, rows.shape[0]

big = K._PER * 2 + 77   # three programs, the last one ragged
for dtype in F.DTYPES:
    gen = torch.Generator().manual_seed(3)
    for n in (*F.SIZES, big):
        x = F._values(n, dtype, gen)
        for t in (x, x[::2], x.reshape(-1, 1).expand(-1, 2).t()):   # and two non-contiguous
            if t.numel() == 0:
                continue
            got, programs = merged(t)
            want = [float(v) for v in fields.tensor_stats(t).values()]
            assert got[:7] == want[:7], (dtype, n, got, want)   # counts, amax, min: bitwise
            assert math.isclose(got[7], want[7], rel_tol=F._sum_tol(t.numel())) or \\
                got[7] == want[7], (dtype, n, got[7], want[7])
            assert programs == -(-t.numel() // K._PER), (t.numel(), programs)
# the shadows' sums against a float64 reference holding NaN, Inf and values far from out's
for dtype in F.DTYPES:
    gen = torch.Generator().manual_seed(4)
    for n in (1, 7, 1000, big):
        out = F._values(n, dtype, gen)
        ref = F._values(n, torch.float64, gen) if n > 1 else out.double()
        ref[: n // 3] = out[: n // 3].double() * (1 + 2.0**-20)   # some close, some not
        for o, r in ((out, ref), (out[::2], ref[::2])):
            rows = K.sqnr_rows(o, r)
            got = rows.sum(0).tolist()
            want = fields.sqnr_pair(o, r, "sh")
            for g, w in zip(got, (want["sh_sig_sq"].item(), want["sh_err_sq"].item())):
                assert g == w or (math.isnan(g) and math.isnan(w)) or \
                    math.isclose(g, w, rel_tol=F._sum_tol(o.numel())), (dtype, n, g, w)
# no finite element: amax 0, no smallest non-zero (inf), sum_sq 0, as the torch route
for dtype in F.DTYPES:
    t = torch.tensor([math.nan, -math.inf, 0.0], dtype=dtype)
    assert merged(t)[0] == [float(v) for v in fields.tensor_stats(t).values()]
print("ok")
"""


def test_device_pass_equals_the_torch_route_under_the_interpreter():
    _interpreted(_ARITHMETIC)


_MX = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
import test_telemetry_quant_cpu as Q
from numcheck.quant.mx import MXFormat
from numcheck.quant.nvfp4 import NVFP4Format
from numcheck.telemetry import fields

from numcheck.telemetry import _fields_triton as K
fmts = {n: f for n, f in Q.FORMATS.items() if type(f) in (MXFormat, NVFP4Format)}
fmts["mx_e4m3_k24"] = MXFormat("e4m3", 24)   # a block that is no power of two
fmts["nvfp4_2d"] = NVFP4Format(two_d=True)
assert len(fmts) >= 12, list(fmts)
shapes = Q.SHAPES if sys.argv[2] == "all" else ((3, 45), (1, 1), (2, 5, 40), (33, 128))
# every other small case with a program per block (their rows merged; interpreted programs
# are slow, so not on the largest shape)
programs = ((K._PER_BLOCKS, K._TILE_LANES), (1, 16))
# a float64 tile whose e4m3 block scale is 96: libm's log2 of its decode scale is one ulp off
# torch's (the reference's)
ulp = torch.zeros(1, 32, dtype=torch.float64)
ulp[0, 0], ulp[0, 16] = 24.503285793136904, 5.25
cases = [(dist, shape, dtype) for dtype in Q.DTYPES for dist in Q.DISTS for shape in shapes]
for name, fmt in fmts.items():
    for i, (dist, shape, dtype) in enumerate([*cases, ("ulp", None, None)]):
        K._PER_BLOCKS, K._TILE_LANES = programs[i % 2 if shape != (33, 128) else 0]
        t = ulp if dist == "ulp" else Q._values(dist, shape, dtype, 7)
        ref = {k: v.item() for k, v in fields.quant_stats(t, Q._Q(fmt)).items()}
        rows, fix = K.quant_rows(t, fmt)
        got = fields.host_identity()
        fields.host_rows(got, K.QUANT_INDEX, (fix or (lambda r: r))(rows.numpy()))
        got = {k: got[fields.INDEX[k]] for k in K.QUANT_FIELDS}
        Q._assert_matches({**got, "q_n": float(t.numel())}, ref,
                          f"{name} {dtype} {dist} {shape}")
print("ok")
"""
def test_mx_statistics_equal_the_reference_under_the_interpreter():
    """The MX and NVFP4 kernels (_stats_cuda.mx_rows, nvfp4_rows) against fields.quant_stats
    (numcheck's reference quantizers in float64): every MX format the recipes reach and the
    others of the family (rceil, e5m2, blocks of 16 and 24), NVFP4 1 x 16 and 16 x 16, every
    dtype, tests/test_telemetry_quant_cpu.py's distributions (NaN and Inf blocks, zero blocks,
    near overflow, subnormals, ties) and its bounds: counts and scales bitwise, float sums
    within their order's bound."""
    _interpreted(_MX, "some")


@pytest.mark.slow
def test_mx_statistics_equal_the_reference_on_every_shape():
    _interpreted(_MX, "all", timeout=1800)


def test_device_pass_compiles_for_sm90():
    """Without a GPU: Triton compiles the kernels (plain statistics; shadow sums; MX with
    floor and rceil scales, a block of 32 and one of 24; NVFP4's amax pass and its 1 x 16 and
    16 x 16 tiles) to a cubin for sm_90 (front end, MLIR passes, ptxas) for every dtype they
    read, with nothing spilled to local memory."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from numcheck.telemetry import _fields_triton as K
    ptr = {2: "*i16", 4: "*i32", 8: "*i64"}
    for dtype in K._BITS:
        sig = dict(zip(K._plain.arg_names, [ptr[dtype.itemsize], "*fp64", "i64", "i64"]))
        const = K.constants(dtype)
        sig.update(dict.fromkeys(const, "constexpr"))
        kernel = triton.compile(ASTSource(K._plain, sig, const),
                                target=GPUTarget("cuda", 90, 32),
                                options={"enable_fp_fusion": False})
        assert "cubin" in kernel.asm and "st.local" not in kernel.asm["ptx"], dtype
        blocks = [dict(TR=1, TC=k, TCP=32, TILES=32, NV=False, RCEIL=rceil)   # MX
                  for k, rceil in ((32, False), (32, True), (24, False))]
        blocks += [dict(TR=tr, TC=16, TCP=16, TILES=1024 // (16 * tr), NV=True, RCEIL=False)
                   for tr in (1, 16)]   # NVFP4, 1 x 16 and 16 x 16
        fmt = dict(EMIN=-6, EMAX=8, MBITS=3, FMAX=448.0, THR=464.0, E4_EMIN=-6, E4_EMAX=8,
                   E4_MBITS=3, E4_MAX=448.0, RANGE=2688.0, ELEM_MAX=6.0)
        for kern, args, variants in (
                (K._sqnr, ["*fp64", "*fp64", "i64", "i64"], [{}]),
                (K._amax_bits, ["*i64", "i64", "i64"], [{}]),
                (K._blocks, ["*i64", "i64", "*fp64", *["i64"] * 6],
                 [{**v, **fmt, "CELLS": K._PROGRAMS} for v in blocks])):
            for more in variants:
                sig = dict(zip(kern.arg_names, [ptr[dtype.itemsize], *args]))
                const = {**K.constants(dtype), **more}
                sig.update(dict.fromkeys(const, "constexpr"))
                kernel = triton.compile(ASTSource(kern, sig, const),
                                        target=GPUTarget("cuda", 90, 32),
                                        options={"enable_fp_fusion": False})
                assert "cubin" in kernel.asm and "st.local" not in kernel.asm["ptx"], \
                    (dtype, kern, more)


_WATCHED = """
import collections, contextlib, sys
import torch
from torch.utils._python_dispatch import TorchDispatchMode
sys.path.insert(0, sys.argv[1])
import test_telemetry_fast as F
from numcheck import telemetry
from numcheck.measure import backend
from numcheck.telemetry import _fields_triton as K
torch.set_num_threads(1)

def device_route():   # CPU tensors through the device pass (K, interpreted), the CPU pass off
    routes = contextlib.ExitStack()
    routes.enter_context(backend.substitute("telemetry-cpu", None))
    routes.enter_context(backend.substitute("telemetry-cuda-on-cpu", K))
    return routes

def run(bf16, **kw):
    m = F._bf16_model()
    m = m if bf16 else m.float()
    with telemetry.watch(m, **kw) as t:
        for k in range(3):
            x = torch.randn(5, 16, generator=torch.Generator().manual_seed(k))
            m[3].k = 1.0 if k < 2 else 300.0   # exp overflows on the last step
            m(x.to(next(m.parameters()).dtype)).float().sum().backward()
            t.step()
    return t.records(), t.first_nonfinite()

def nan_input():
    # a NaN fed in on step 0 (what consumes it produces nothing: its input is not finite; the
    # LayerNorm's weight gradient, g * xhat, consumed the NaN too), then an Inf written into
    # the first layer's weight (the container computes with it: not its producer either)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    with telemetry.watch(m) as t:
        x = torch.randn(3, 8)
        x[0, 0] = float("nan")
        m(x).sum().backward()
        t.step()
        with torch.no_grad():
            m[0].weight[0, 0] = float("inf")
        m(torch.randn(3, 8)).sum().backward()
        t.step()
    return t.records(), t.first_nonfinite()

runs = {"bf16 mxfp8": (lambda: run(True, recipe="mxfp8"), "3"),
        "fp32 mxfp8 nvfp4 shadow": (lambda: run(False, recipe="mxfp8", what_if=("nvfp4",),
                                                shadow=True), "3"),
        "nan input": (nan_input, None)}
for name, (fn, producer) in runs.items():
    assert backend.load("telemetry-cuda-on-cpu") is None   # outside device_route(): no pass
    host, host_nf = fn()                # the compiled CPU pass
    saved = K._PER, K._LANES, K._PER_BLOCKS, K._TILE_LANES
    K._PER = K._LANES = K._TILE_LANES = 16   # several programs (rows) per tensor, a program
    K._PER_BLOCKS = 1                        # per quantization block: their merge
    with device_route():                # CPU tensors through the device pass
        dev, dev_nf = fn()
    K._PER, K._LANES, K._PER_BLOCKS, K._TILE_LANES = saved
    F._assert_same_records(dev, host)
    if producer is None:   # named nobody: the NaN came with the data
        assert not host_nf and (host_nf.reason, host_nf.step) == ("propagated", 0), host_nf
        assert dev_nf == host_nf, (name, dev_nf, host_nf)
        continue
    assert host_nf and host_nf[1] == producer, (name, host_nf)
    assert dev_nf == host_nf and dev_nf.inputs == host_nf.inputs, (name, dev_nf, host_nf)

# the kernel launches a recorded step adds to the model's own: one per tensor read (the
# device pass), then one concatenation of the step's rows (read back once); nothing else
META = {"aten.view.default", "aten.detach.default", "aten.t.default", "aten.view.dtype",
        "aten.empty.memory_format", "aten.unsqueeze.default", "aten.expand.default",
        "aten._unsafe_view.default", "aten.transpose.int", "aten.reshape.default",
        "aten.slice.Tensor", "aten.alias.default"}   # no kernel: metadata and allocation

class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.off = collections.Counter(), 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.off and str(func) not in META:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

launches = []   # the tensors the device pass read (kept alive: ids stay unique)
plain_rows = K.plain_rows
def counted(t):
    launches.append(t)
    mode.off += 1   # the interpreter's own tensor copies are not the GPU's
    try:
        return plain_rows(t)
    finally:
        mode.off -= 1
K.plain_rows = counted

def step_ops(watched):
    global mode
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.SiLU(),
                            torch.nn.Linear(32, 4))
    t = telemetry.watch(m) if watched else None
    x = torch.randn(8, 16)
    for _ in range(2):   # the second step is counted
        mode = Ops()
        launches.clear()
        with mode:
            m(x).square().sum().backward()
            if t is not None:
                t.step()
    if t is not None:
        t.close()
        return mode.ops, list(launches)
    return mode.ops, []

with device_route():
    plain, _ = step_ops(False)
    watched, read = step_ops(True)
assert watched - plain == collections.Counter({"aten.cat.default": 1}), watched - plain
assert plain - watched == collections.Counter(), plain - watched
# each tensor read once in the step (the memo: one module's output is the next one's input)
assert len(read) > 10 and len({id(t) for t in read}) == len(read), len(read)
print(len(read), "launches")
print("ok")
"""


def test_watched_runs_through_the_device_pass_equal_the_cpu_pass():
    """Records and the first producer (bf16 with a recipe; float32 with a recipe, an NVFP4
    what-if and the shadows; a NaN input, then an Inf weight) through the device pass equal
    the compiled CPU pass's; a recorded step adds one kernel launch per tensor read and one
    concatenation to the model's own ops."""
    _interpreted(_WATCHED)


def test_a_failing_device_pass_warns_once_and_takes_the_torch_route():
    """A kernel that raises (a GPU or Triton it does not build on): one warning, the torch
    route's statistics, and no further attempt."""
    import warnings

    import torch

    from numcheck import telemetry
    from numcheck.measure import backend
    from numcheck.telemetry import fields

    class Broken:
        handles = staticmethod(lambda t: True)

        @staticmethod
        def plain_rows(t):
            raise RuntimeError("no sm_90 here")
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    x = torch.randn(3, 8)
    with backend.substitute("telemetry-cpu", None), \
            backend.substitute("telemetry-cuda-on-cpu", Broken):   # CPU tensors take it
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with telemetry.watch(m) as t:
                m(x).sum().backward()
                t.step()
        msgs = [str(w.message) for w in caught if "device pass failed" in str(w.message)]
        assert len(msgs) == 1 and "no sm_90 here" in msgs[0]
        assert backend.load("telemetry-cuda-on-cpu") is None   # off, no further attempt
    out = t.records().query("module == '1' and role == 'output'").iloc[0]
    want = {k: float(v) for k, v in fields.tensor_stats(m(x)).items()}
    assert {k: out[k] for k in fields.PLAIN[:7]} == {k: want[k] for k in fields.PLAIN[:7]}


def test_pending_observations_merge_every_row_of_every_part():
    """The producer check's device observations (observation.Pending: row blocks read at step()):
    a NaN or Inf counted in any row of any part makes them non-finite; their statistics merge
    every row with the host part by fields.FIELDS' rules."""
    import importlib

    import numpy as np
    import torch

    from numcheck.telemetry import fields
    OBS = importlib.import_module("numcheck.telemetry.observation")
    a, b = torch.empty(2, 8, dtype=torch.float64), torch.empty(1, 8, dtype=torch.float64)
    #                 calls n   nan inf zero amax min_nz sum_sq
    rows_a = np.array([[1, 100, 0, 0, 3, 2.0, 0.5, 10.0],
                       [0, 50, 0, 0, 0, 8.0, 0.25, 5.0]])
    rows_b = np.array([[1, 7, 0, 0, 0, 1.0, 1.0, 1.0]])
    host = [1.0, 4.0, 0.0, 0.0, 1.0, 3.0, 0.125, 2.0]
    obs = OBS.merge_obs(OBS.merge_obs(host, OBS.Pending(None, (a,))), OBS.Pending(None, (b,)))
    got = {id(a): rows_a, id(b): rows_b}
    assert OBS.finite(obs, got)
    assert OBS.plain_of(obs, got) == [3.0, 161.0, 0.0, 0.0, 4.0, 8.0, 0.125, 18.0]
    for col in (2, 3):   # a NaN, or an Inf, in the second row of the first part only
        bad = rows_a.copy()
        bad[1, col] = 1
        assert not OBS.finite(obs, {id(a): bad, id(b): rows_b}), col
    inf = [1.0, 4.0, 0.0, 2.0, 0.0, 1.0, 1.0, 1.0]   # a host part holding two Infs
    assert not OBS.finite(OBS.merge_obs(inf, obs), got)
    assert not OBS.finite(OBS.merge_obs(obs, inf), got)
    # merging copies, never writes into an observation (the step's memo shares them)
    assert host == [1.0, 4.0, 0.0, 0.0, 1.0, 3.0, 0.125, 2.0]
    assert inf == [1.0, 4.0, 0.0, 2.0, 0.0, 1.0, 1.0, 1.0]
    assert fields.PLAIN_INDEX == tuple(fields.INDEX[k] for k in fields.PLAIN)


def test_cpu_tensors_never_reach_the_cuda_kernel():
    """The compiled kernel reads CUDA tensors only: a CPU tensor (numba missing or failed, in a
    process that loaded the kernel for a GPU) takes the torch route, and the device pass stays
    on for the CUDA tensors."""
    import importlib

    import torch

    from numcheck.measure import backend
    P = importlib.import_module("numcheck.telemetry.passes")

    class Loaded:   # the CUDA module, as watch holds it once a CUDA tensor loaded it
        handles = staticmethod(lambda t: True)

        @staticmethod
        def plain_rows(t):
            raise AssertionError("a CPU tensor reached the CUDA kernel")
    # no substitute for "telemetry-cuda-on-cpu": only a test's serves CPU tensors
    with backend.substitute("telemetry-cuda", Loaded), backend.substitute("telemetry-cpu", None):
        assert P._kernel(torch.ones(3)) is None
        rows = P.dev_rows(torch.tensor([1.0, -2.0, 0.0]))
        assert rows.tolist() == [[1.0, 3.0, 0.0, 0.0, 1.0, 2.0, 1.0, 5.0]]
        assert backend.load("telemetry-cuda") is Loaded
