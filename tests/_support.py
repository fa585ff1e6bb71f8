"""Helpers shared by the op-family tests (imported as a plain module: tests/ is on sys.path)."""
from __future__ import annotations

import math
import warnings

import torch

from numcheck.records import Record
from numcheck.run import verify


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
