"""Kernel launches numcheck.telemetry adds to a recorded training step on a device, counted
without one: the device route forced on CPU tensors (the compiled CPU passes off; the device
pass's Triton kernels run by Triton's interpreter and counted as launches: NVFP4's as two), and
every aten op that launches a kernel counted (views, detach and allocations left out, and the
interpreter's own tensor copies). On a GPU a tiny model's step is bound by its launches, so
these counts say what the statistics cost there before any GPU times it
(bench/bench_telemetry_overhead.py --device cuda does, in bench/gpu_run.sh).

    TRITON_INTERPRET=1 python bench/telemetry_launches.py [--models mlp tiny_lm tiny_dit]
        [--route pass|torch]

``--route torch``: without the device pass (Triton missing): the torch route of
numcheck.telemetry.fields. Prints, per model, the plain step's launches and what each setting
adds (the fourth step of each run: warm-up steps first).

The routes are picked through numcheck.measure.backend, the one selector:
``substitute("telemetry-cpu", None)`` (the compiled CPU pass off) and, with ``--route pass``,
``substitute("telemetry-cuda-on-cpu", ...)`` (the interpreted device pass, its launches
counted).
"""
from __future__ import annotations

import argparse
import contextlib
import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from numcheck import telemetry
from numcheck.convergence.models import build
from numcheck.measure import backend
from numcheck.quant.nvfp4 import NVFP4Format

# ops that launch no kernel: metadata, allocation
_NO_KERNEL = {
    "aten.view.default", "aten.detach.default", "aten.t.default", "aten.view.dtype",
    "aten.empty.memory_format", "aten.unsqueeze.default", "aten.expand.default",
    "aten._unsafe_view.default", "aten.transpose.int", "aten.slice.Tensor", "aten.select.int",
    "aten.alias.default", "aten.reshape.default", "aten.as_strided.default",
    "aten.permute.default", "aten.squeeze.dim", "aten.split.Tensor", "aten.unbind.int",
    "aten.empty_like.default", "aten.new_empty.default",
    "profiler._record_function_enter_new.default",
    "profiler._record_function_exit._RecordFunction"}
_ALL = dict(recipe="mxfp8", what_if=("mxfp4", "nvfp4"), shadow=True)
SETTINGS = {"stats": {}, "mxfp8": dict(recipe="mxfp8"),
            "+what-if": dict(recipe="mxfp8", what_if=("mxfp4", "nvfp4")), "everything": _ALL}


def _quant_launches(t: torch.Tensor, fmt) -> int:
    return 2 if type(fmt) is NVFP4Format else 1   # NVFP4: the tensor's amax first


class _Launches(TorchDispatchMode):
    """Counts kernel-launching aten ops, and the device pass's launches (``kernel``)."""

    def __init__(self) -> None:
        super().__init__()
        self.n, self.inside = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside and str(func) not in _NO_KERNEL:
            self.n += 1
        return func(*args, **(kwargs or {}))

    def kernel(self, fn, launches):
        """fn counted as ``launches`` launches (a number, or a function of fn's arguments)."""
        def counted(*a):
            self.n += launches(*a) if callable(launches) else launches
            self.inside += 1   # the interpreter's tensor copies are not the GPU's
            try:
                return fn(*a)
            finally:
                self.inside -= 1
        return counted


def _step_launches(name: str, setting: dict | None, kernels, steps: int = 4) -> int:
    model, task, lr = build(name, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    t = telemetry.watch(model, **setting) if setting is not None else None
    count = 0
    for i in range(steps):
        mode = _Launches()
        if kernels is not None:
            # quant_rows: mx_rows (one launch) or nvfp4_rows (two), called inside the module
            for fn, k in (("plain_rows", 1), ("quant_rows", _quant_launches), ("sqnr_rows", 1)):
                setattr(kernels, fn, mode.kernel(getattr(kernels.__orig__, fn), k))
        batch = task.batch_at(0, i)   # making the batch is not the step's
        with mode:
            loss = model.loss(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if t is not None:
                t.step()
        count = mode.n
    if t is not None:
        t.close()
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "tiny_lm", "tiny_dit"])
    ap.add_argument("--route", choices=("pass", "torch"), default="pass")
    args = ap.parse_args()
    torch.set_num_threads(1)
    routes = contextlib.ExitStack()
    routes.enter_context(backend.substitute("telemetry-cpu", None))  # CPU tensors: device route
    kernels = None
    if args.route == "pass":
        if os.environ.get("TRITON_INTERPRET") != "1":
            ap.error("--route pass runs the Triton kernels interpreted: set TRITON_INTERPRET=1")
        from numcheck.telemetry import _fields_triton as _stats_cuda
        kernels = type("Counted", (), {"__orig__": _stats_cuda})()
        for k in dir(_stats_cuda):
            if not k.startswith("__"):
                setattr(kernels, k, getattr(_stats_cuda, k))
        routes.enter_context(backend.substitute("telemetry-cuda-on-cpu", kernels))
    with routes:
        _table(args.models, args.route, kernels)


def _table(models: list[str], route: str, kernels) -> None:
    print(f"route: {route}; launches a recorded step adds to the plain step's")
    print(f"{'model':10} {'plain':>6} " + " ".join(f"{k:>11}" for k in SETTINGS))
    for name in models:
        plain = _step_launches(name, None, kernels)
        added = [_step_launches(name, s, kernels) - plain for s in SETTINGS.values()]
        print(f"{name:10} {plain:6d} " + " ".join(f"{a:11d}" for a in added))


if __name__ == "__main__":
    main()
