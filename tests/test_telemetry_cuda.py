"""numcheck.telemetry on CUDA (every test carries the cuda marker: skipped, with the reason,
where no GPU is present; bench/gpu_run.sh runs them with the device check).

A CUDA tensor takes the device pass (numcheck/telemetry/_fields_triton.py: one Triton launch per
tensor, its rows read back once per step; the torch route of numcheck.telemetry.fields where
Triton is missing), and the compiled Triton kernel gives the torch route's statistics; the CPU
takes the compiled CPU pass. The same model trained on both gives the same rows, and the same
statistics up to what the GEMMs' accumulation order moves; the producer
check names the same producers on the device, with the sentinel too (its flags are device
tensors, read at the backward's end); and a watched step's forward and backward do not
synchronize with the host (the step's statistics are read at ``t.step()``).
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from numcheck import telemetry
from numcheck.convergence.models import build
from numcheck.convergence.train import STATE
from numcheck.measure import backend
from numcheck.measure.numerics import pinned
from numcheck.telemetry import fields
from tests._telemetry_models import Exp

CUDA = "telemetry-cuda"  # numcheck.measure.backend's kind of the device pass, for CUDA tensors

pytestmark = pytest.mark.cuda

KEY = ["step", "module", "op", "role", "pass", "recipe", "what_if"]


def _train(device: str, steps: int = 3, **watch):
    """mlp (seed 0) trained ``steps`` AdamW steps on ``device`` under watch(**watch): its
    records() frame, sorted by KEY."""
    with pinned(STATE):   # full fp32 on both (no TF32, no reduced-precision reductions)
        model, task, lr = build("mlp", 0)
        model = model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        with telemetry.watch(model, **watch) as t:
            for i in range(steps):
                batch = {k: v.to(device) for k, v in task.batch_at(0, i).items()}
                loss = model.loss(batch)
                opt.zero_grad()
                loss.backward()
                opt.step()
                t.step()
    return t.records().sort_values(KEY).reset_index(drop=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=str)
def test_device_pass_equals_the_torch_route_on_cuda(dtype):
    """The compiled kernel (one program, and several: a tensor past _stats_cuda._PER) against
    fields.tensor_stats on the same CUDA tensor: counts, amax and the smallest non-zero
    magnitude bitwise, sum_sq within two float64 summation orders' 2 n 2^-53."""
    from numcheck.telemetry import _fields_triton as K
    gen = torch.Generator().manual_seed(5)
    for n in (1, 1000, 3 * K._PER + 77):
        e = torch.empty(n, dtype=torch.float64).uniform_(-30, 30, generator=gen)
        x = (torch.randn(n, generator=gen, dtype=torch.float64) * torch.exp2(e)).to(dtype)
        if n > 10:
            x[3], x[5], x[7], x[9] = math.nan, math.inf, -math.inf, 0.0
            x[-1] = torch.finfo(dtype).smallest_normal / 4   # a subnormal, in the last program
        x = x.cuda()
        rows = K.plain_rows(x)
        assert rows.shape == (-(-n // K._PER), 8)
        got = list(fields.PLAIN_IDENTITY)
        fields.host_rows(got, fields.PLAIN_INDEX, rows.cpu().numpy())
        want = [float(v) for v in fields.tensor_stats(x).values()]
        assert got[:7] == want[:7], (n, got, want)
        assert math.isclose(got[7], want[7], rel_tol=2 * n * 2.0**-53), (n, got[7], want[7])


def test_cuda_rows_and_statistics_match_the_cpus():
    kw = dict(recipe="mxfp8", what_if=("nvfp4",), shadow=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cpu, gpu = _train("cpu", **kw), _train("cuda", **kw)
    # the device pass ran (a Triton or GPU it fails on warns, and takes the torch route)
    assert backend.load(CUDA) is not None, [str(w.message) for w in caught]
    assert cpu[KEY].equals(gpu[KEY])
    for col in ("calls", "n", "n_nan", "n_inf"):   # counts: exact
        assert (cpu[col] == gpu[col]).all(), col
    assert (gpu["n_nan"] + gpu["n_inf"] == 0).all()
    # values: the same up to the GEMMs' summation order (three AdamW steps of an fp32 MLP)
    torch.testing.assert_close(torch.tensor(gpu["amax"].to_numpy()),
                               torch.tensor(cpu["amax"].to_numpy()), rtol=1e-3, atol=0)
    quant = cpu["sqnr_db"].notna()
    assert quant.sum() > 10 and gpu["sqnr_db"].notna().equals(quant)
    assert (gpu["sqnr_db"][quant] - cpu["sqnr_db"][quant]).abs().max() < 0.5
    # the shadows: fp32 against float64 on both (cuBLAS and MKL sum in other orders)
    for col in ("shadow_sqnr_db", "e2e_sqnr_db"):
        shown = cpu[col].notna()
        assert shown.any() and gpu[col].notna().equals(shown)
        assert (gpu[col][shown] > 100).all(), col


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_model_over_two_gpus_is_read_on_each_tensors_device():
    """Layers on cuda:0 and cuda:1, cuda:0 current: each tensor's statistics come from a
    launch on its own device and stream (Triton launches on the current device's otherwise),
    equal to the same model's on the CPU."""
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8))

    def run(devs):
        m = make()
        for layer, d in zip(m, devs, strict=True):
            layer.to(d)
        with telemetry.watch(m) as t:
            for i in range(3):
                x = torch.randn(64, 16, generator=torch.Generator().manual_seed(i))
                h = x.to(devs[0])
                for layer, d in zip(m, devs, strict=True):
                    h = layer(h.to(d))
                h.square().sum().backward()
                t.step()
        return t.records().sort_values(KEY).reset_index(drop=True)

    torch.cuda.set_device(0)
    cpu, gpu = run(["cpu"] * 3), run(["cuda:0", "cuda:1", "cuda:1"])
    assert backend.load(CUDA) is not None
    assert cpu[KEY].equals(gpu[KEY])
    for col in ("calls", "n", "n_nan", "n_inf"):
        assert (cpu[col] == gpu[col]).all(), col
    torch.testing.assert_close(torch.tensor(gpu["amax"].to_numpy()),
                               torch.tensor(cpu["amax"].to_numpy()), rtol=1e-3, atol=0)


class _NaNIfLarge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        # on the device: no host read of x in the user's code either
        return torch.where(x.abs().amax() > 10, g * float("nan"), g)


class _BadBackward(nn.Module):
    def forward(self, x):
        return _NaNIfLarge.apply(x)


def _eye(scale: float) -> nn.Linear:
    lin = nn.Linear(8, 8)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(8) * scale)
        lin.bias.zero_()
    return lin


MODELS = {
    "forward overflow": (lambda: nn.Sequential(_eye(100.0), Exp(), nn.Linear(8, 8)), 2.0,
                         (4, "1", "module", "output", "forward")),
    "backward NaN": (lambda: nn.Sequential(_eye(1.0), _BadBackward(), nn.LayerNorm(8),
                                           nn.Linear(8, 4)), 50.0,
                     (4, "1", "module", "grad_input", "backward")),
}


@pytest.mark.parametrize("case", list(MODELS))
@pytest.mark.parametrize("every", [1, 3])
def test_the_producer_is_named_on_cuda(case, every):
    make, big, want = MODELS[case]
    torch.manual_seed(0)
    model = make().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with warnings.catch_warnings(record=True) as caught, \
            telemetry.watch(model, every=every) as t:
        warnings.simplefilter("always")
        for step in range(6):
            x = torch.full((4, 8), big if step == 4 else 1e-3, device="cuda")
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            t.step()
    assert t.first_nonfinite() == want
    assert not [w for w in caught if "named no producer" in str(w.message)]


def test_a_watched_forward_and_backward_do_not_synchronize():
    """torch.cuda's sync debug mode warns at each host synchronization: none inside a
    recorded step's forward and backward (statistics only), and the step's read at t.step()."""
    with pinned(STATE):
        model, task, lr = build("mlp", 0)
        model = model.cuda()
        batches = [{k: v.cuda() for k, v in task.batch_at(0, i).items()} for i in range(3)]
        with telemetry.watch(model) as t:
            for i, batch in enumerate(batches):
                before = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        model.loss(batch).backward()
                finally:
                    torch.cuda.set_sync_debug_mode(before)
                syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
                if i > 0:   # the first step compiles and loads the device pass's kernel
                    assert not syncs, syncs[:3]
                t.step()
    assert len(t.records()) > 0
