"""Built-in fingerprint suite: every registered kernel of matmul, linear, sdpa, softmax,
log_softmax, rms_norm and layer_norm on this machine's device, fingerprinted (numcheck.forensics.kernel_fingerprint) for each dtype its probe holds, and
torch's FP8 GEMM (``torch._scaled_mm``, e4m3 operands: cuBLASLt on CUDA, its CPU kernel here),
against golden/<device_class>/fingerprint.parquet: a changed accumulator, rounding, summation
order, determinism or batch invariance fails the run on the golden's platform (drift on
another)."""
from __future__ import annotations

import pytest
import torch

from numcheck.forensics.kernel_fingerprint import suite_items, suite_record
from numcheck.frontends.plugin import suite_device


def scaled_mm_e4m3(a, b):
    """torch._scaled_mm of e4m3 operands with unit tensor-wise scales (b column-major, as it
    requires), bf16 output: the accumulation of torch's FP8 GEMM alone."""
    one = torch.ones((), device=a.device)
    return torch._scaled_mm(a, b.t().contiguous().t(), scale_a=one, scale_b=one,
                            out_dtype=torch.bfloat16)


EXTRA = {("matmul", "torch_scaled_mm", "e4m3"): scaled_mm_e4m3}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fp_item" in metafunc.fixturenames:
        items = [i for i in suite_items(suite_device(metafunc.config)) if i[2] != "e4m3"]
        items += [(*key, None) for key in EXTRA]
        metafunc.parametrize("fp_item", items, ids=[f"{o}/{k}/{d}" for o, k, d, _ in items])


def test_fingerprint(fp_item, numcheck):
    op, kernel, dtype, skip = fp_item
    numcheck.check_records([suite_record(op, kernel, dtype, numcheck.device, skip,
                                         EXTRA.get((op, kernel, dtype)))])
