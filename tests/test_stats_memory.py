"""Peak extra memory of error_stats stays under 3x the output's size (measured, not assumed).

tracemalloc does not see torch's allocations, so the CPU check reads the peak RSS of a fresh
subprocess before and after; the CUDA check reads the caching allocator's peak.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import numcheck as nc

N = 1 << 25  # a 64 MiB bf16 output against a 256 MiB fp64 reference

_SCRIPT = textwrap.dedent(f"""
    import json, resource, torch, numcheck as nc
    torch.manual_seed(0)
    ref = torch.randn({N}, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    ref[::1000] *= 1.01  # some real ULP errors, so every statistic has work to do
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s = nc.error_stats(out, ref)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({{"extra_kib": after - before, "out_kib": out.nbytes // 1024,
                      "max_ulp": s.max_ulp}}))
""")


def test_cpu_peak_rss_bounded():
    res = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    m = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"peak extra RSS {m['extra_kib'] / 1024:.1f} MiB for a {m['out_kib'] / 1024:.0f} MiB output")
    assert m["max_ulp"] >= 1
    assert m["extra_kib"] < 3 * m["out_kib"]


@pytest.mark.cuda
def test_cuda_peak_allocation_bounded():
    ref = torch.randn(N, dtype=torch.float64, device="cuda")
    out = ref.to(torch.bfloat16)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    nc.error_stats(out, ref)
    extra = torch.cuda.max_memory_allocated() - base
    print(f"peak extra CUDA allocation {extra / 2**20:.1f} MiB for {out.nbytes / 2**20:.0f} MiB")
    assert extra < 3 * out.nbytes
