"""Helpers shared by the op-family tests (imported as a plain module: tests/ is on sys.path)."""
from __future__ import annotations

import importlib.metadata
import json
import math
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch

from numcheck.measure import environment

from numcheck.records import Record
from numcheck.verification import verify


def gen(*shape, seed=0) -> torch.Tensor:
    """Standard normal float64 values from a fixed seed."""
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def quiet_verify(op, fn, **kw):
    """nc.verify on the CPU with torch's dtype-mismatch warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return verify(op, fn, device="cpu", **kw)


def golden_record(case="c1", rel=1.234567e-3, **kw) -> Record:
    """A run record with every golden column, the stats derived from ``rel``; ``kw`` sets
    columns of the flat form (``kernel_n_nan=3``, ``golden="same"``)."""
    r = {"suite": "s", "op": "rms_norm", "kernel": "torch", "case_id": case, "output": "out",
         "device_class": "cpu", "case_set": "quick", "dtype": "bf16", "shape": "4x8",
         "dist": "normal", "seed": 0, "params": "", "status": "passed", "input_digest": "ab",
         "u": 2.0 ** -8, "gate_ulp": False, "gate_bias": False, "bound_ratio": math.nan,
         "baseline_bound_ratio": math.nan, "kernel_fmt": "bf16", "baseline_fmt": "bf16"}
    for side, scale in (("kernel", 1.0), ("baseline", 2.0)):
        r.update({f"{side}_n": 32, f"{side}_n_compared": 32, f"{side}_n_nan": 0,
                  f"{side}_n_inf": 0, f"{side}_nonfinite_mismatch": 0, f"{side}_max_abs": 0.01,
                  f"{side}_mean_abs": 0.001, f"{side}_rel_l2": rel * scale,
                  f"{side}_sqnr_db": -20 * math.log10(rel * scale), f"{side}_cosine": 1.0,
                  f"{side}_bias": 0.0, f"{side}_max_ulp": 1, f"{side}_mean_ulp": 0.25,
                  f"{side}_p99_ulp": 1, f"{side}_bias_ulp": 0.01, f"{side}_mag_bias_ulp": 0.0,
                  f"{side}_min_block_sqnr_db": 50.123456, f"{side}_worst_block": 0,
                  f"{side}_n_blocks": 4})
    r.update(kw)
    return Record.from_row(r)


# ---- third-party findings: where each was measured ---------------------------------------------

class FindingChanged(UserWarning):
    """A pinned third-party behaviour did not show on versions it was not measured on."""


def installed(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (None when absent)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Finding:
    """A third-party library's or the CPU's behaviour that a test pins, and where it was measured.

    ``versions``: distribution -> the version prefixes it was measured on ("2.13" matches
    2.13.0+cpu); ``platform``: in words, with ``on`` the predicate over
    ``numcheck.measure.environment.cpu_isa()`` (None: any CPU). ``expect(ok, what)`` asserts the pinned
    behaviour where it was measured (versions and platform). On another platform it claims nothing
    (the test asserts the platform-independent part itself). On other versions a difference is
    reported as a ``FindingChanged`` warning (fixed or changed upstream), not a red build; the
    scheduled newest-dependencies job sets NUMCHECK_FINDINGS=strict to make it fail (ci/README.md).
    """
    name: str
    versions: dict[str, tuple[str, ...]]
    platform: str = "any CPU"
    on: Callable[[dict], bool] | None = field(default=None, compare=False)

    def versions_match(self) -> bool:
        for dist, prefixes in self.versions.items():
            v = installed(dist)
            if v is None or not any(v == p or v.startswith(p + ".") or v.startswith(p + "+")
                                    for p in prefixes):
                return False
        return True

    def platform_matches(self) -> bool:
        return self.on is None or bool(self.on(environment.cpu_isa()))

    def measured_here(self) -> bool:
        return self.versions_match() and self.platform_matches()

    def where(self) -> str:
        vs = ", ".join(f"{d} {'/'.join(p)}" for d, p in self.versions.items())
        return f"{vs} on {self.platform}"

    @staticmethod
    def here() -> str:
        isa = environment.cpu_isa()
        return (f"torch {torch.__version__}, ml_dtypes {installed('ml-dtypes')}, torchao "
                f"{installed('torchao')} on {isa['vendor'] or 'unknown vendor'} {isa['summary']} "
                f"(ATen capability {isa['torch_capability']})")

    def expect(self, ok: bool, what: str) -> bool:
        """Assert ``ok`` (the behaviour as measured) where it was measured; see the class doc."""
        if ok or not self.platform_matches():
            return ok
        msg = (f"finding {self.name!r}: {what} -- measured with {self.where()}; not so with "
               f"{self.here()}")
        if self.versions_match() or os.environ.get("NUMCHECK_FINDINGS") == "strict":
            pytest.fail(msg + ("" if self.versions_match() else
                               " (changed upstream: make the test version-aware, ci/README.md)"))
        warnings.warn(FindingChanged(msg + " (changed upstream?)"), stacklevel=2)
        return ok


def amd(isa: dict) -> bool:
    return isa["vendor"] == "AuthenticAMD"


def intel_amx(isa: dict) -> bool:
    return isa["vendor"] == "GenuineIntel" and bool(isa["amx_tile"])


def run_interpreted(script: str, timeout: float = 300, interpret: bool = True) -> dict:
    """The JSON line ``script`` prints, run with TRITON_INTERPRET=1 in a fresh interpreter
    (the variable must be set before triton is imported and must not leak into the test
    process); skipped without triton or on another version than the one measured (3.9).
    interpret=False: compiled (a GPU run), the variable removed."""
    triton = pytest.importorskip("triton")
    if interpret and not triton.__version__.startswith("3.9."):
        pytest.skip(f"measured on triton 3.9.0; this is {triton.__version__}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=timeout,
                         env={**env, "TRITON_INTERPRET": "1"} if interpret else env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---- planted fp8 faults in one linear layer (telemetry.compare's tests) ---------------------

class WrongScale:
    """A QuantRecipe whose weight comes back dequantized with a scale 25% off (a kernel that
    applies the wrong scale): the real recipe otherwise."""

    def __init__(self, recipe) -> None:
        self._recipe = recipe

    def __getattr__(self, name):
        return getattr(self._recipe, name)

    def qdq(self, role, t, dim, generator=None):
        q = self._recipe.qdq(role, t, dim, generator)
        return q * 1.25 if role == "w" else q


class WrongWgradScale(WrongScale):
    """The gradient quantized for the weight-gradient GEMM only (along M, dim 0: see
    numcheck.convergence.linear) comes back 25% off; forward and dgrad are the recipe's."""

    def qdq(self, role, t, dim, generator=None):
        q = self._recipe.qdq(role, t, dim, generator)
        return q * 1.25 if role == "grad" and dim == 0 else q


def fp8_with_a_fault(module: str, fault=WrongScale):
    """A configuration for telemetry.compare (model -> model): every nn.Linear fp8_tensor,
    the one named ``module`` with ``fault`` around the recipe."""
    from numcheck.convergence.linear import QuantLinear, QuantState, apply_recipe
    from numcheck.quant.recipe import RECIPES

    def configure(model):
        state = QuantState(0, "cpu")
        apply_recipe(model, RECIPES["fp8_tensor"], state)
        parent, _, leaf = module.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, leaf, QuantLinear(getattr(owner, leaf), fault(RECIPES["fp8_tensor"]),
                                         state))
        return model
    return configure
