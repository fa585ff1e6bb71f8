"""ErrorStats speed: a bf16 output of 2^25 elements against its fp64 reference.

Prints, from one run on one machine, the time of nc.error_stats, of torch.testing.assert_close
on the same pair, and of a plain copy of the same bytes (out and ref), and the two ratios:
error_stats / assert_close (target <= 1) and copy / error_stats (the fraction of copy
bandwidth reached; one fused pass would approach 1). Medians of --repeat runs after a warm-up.

    python bench/bench_error_stats.py [--log2n 25] [--repeat 5] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import numcheck as nc


def _timed(fn, repeat: int, device: str) -> float:
    fn()
    times = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    # bf16's default tolerances from torch.testing, applied to the fp64 pair (check_dtype off).
    torch.testing.assert_close(out, ref, check_dtype=False, rtol=1.6e-2, atol=1e-5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2n", type=int, default=25)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(1 << a.log2n, generator=g, dtype=torch.float64).to(a.device)
    out = ref.to(torch.bfloat16)
    out_copy, ref_copy = torch.empty_like(out), torch.empty_like(ref)

    t_stats = _timed(lambda: nc.error_stats(out, ref), a.repeat, a.device)
    t_close = _timed(lambda: _assert_close(out, ref), a.repeat, a.device)
    t_copy = _timed(lambda: (out_copy.copy_(out), ref_copy.copy_(ref)), a.repeat, a.device)
    nbytes = out.nbytes + ref.nbytes
    print(f"device={a.device} threads={torch.get_num_threads()} n=2^{a.log2n} "
          f"bytes(out+ref)={nbytes / 2**20:.0f} MiB torch={torch.__version__}")
    print(f"error_stats   {t_stats * 1e3:8.1f} ms  ({nbytes / t_stats / 1e9:6.1f} GB/s read)")
    print(f"assert_close  {t_close * 1e3:8.1f} ms")
    print(f"copy          {t_copy * 1e3:8.1f} ms  ({2 * nbytes / t_copy / 1e9:6.1f} GB/s read+write)")
    print(f"ratio error_stats/assert_close = {t_stats / t_close:.2f}  (target <= 1)")
    print(f"ratio copy/error_stats         = {t_copy / t_stats:.2f}  (fraction of copy bandwidth)")


if __name__ == "__main__":
    main()
