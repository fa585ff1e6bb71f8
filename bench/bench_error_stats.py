"""ErrorStats speed: a bf16 output of 2^25 elements against its fp64 reference.

Prints, from one run on one machine, the time of nc.error_stats, of torch.testing.assert_close
on the same pair, and of a plain copy of the same bytes (out and ref), and the two ratios:
error_stats / assert_close (target <= 0.5 on CPU, <= 2 on CUDA) and copy / error_stats (the
fraction of copy bandwidth reached; target >= 0.25 on CPU). Medians of --repeat runs after a
warm-up. It also times the chunked torch route (the fallback where Triton on CUDA, numba on
CPU, is missing) and checks the fused pass's statistics against it on the same pair: the line
`fused == chunked: ok`, or the fields that differ and exit status 1.

    python bench/bench_error_stats.py [--log2n 25] [--repeat 5] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

import numcheck as nc
from numcheck.measure import stats


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


def _chunked(out: torch.Tensor, ref: torch.Tensor) -> nc.ErrorStats:
    f = nc.formats.get(out.dtype)
    return stats._finish(out, ref, f, None, *stats._chunked(out, ref, f, None))


def _differences(a: nc.ErrorStats, b: nc.ErrorStats) -> list[str]:
    """Fields that differ: integers exactly, floats beyond 1e-9 relative (float64 sums in
    another order: a few hundred ulps at this size; 1e-9 dB absolute for the dB fields)."""
    bad = []
    for k, x in a.as_dict().items():
        y = b.as_dict()[k]
        if isinstance(x, float) and not (x == y or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)):
            bad.append(f"{k}: {x!r} vs {y!r}")
        elif not isinstance(x, float) and x != y:
            bad.append(f"{k}: {x!r} vs {y!r}")
    return bad


def main() -> int:
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
          f"bytes(out+ref)={nbytes / 2**20:.0f} MiB torch={torch.__version__} "
          f"cpu_capability={torch.backends.cpu.get_cpu_capability()}")
    print(f"error_stats   {t_stats * 1e3:8.1f} ms  ({nbytes / t_stats / 1e9:6.1f} GB/s read)")
    print(f"assert_close  {t_close * 1e3:8.1f} ms")
    print(f"copy          {t_copy * 1e3:8.1f} ms  "
          f"({2 * nbytes / t_copy / 1e9:6.1f} GB/s read+write)")
    print(f"ratio error_stats/assert_close = {t_stats / t_close:.2f}  "
          f"(target <= {2 if a.device == 'cuda' else 0.5})")
    print(f"ratio copy/error_stats         = {t_copy / t_stats:.2f}  (fraction of copy bandwidth)")
    # the torch route: the fallback where Triton (CUDA) or numba (CPU) is missing
    t_chunked = _timed(lambda: _chunked(out, ref), a.repeat, a.device)
    print(f"chunked path  {t_chunked * 1e3:8.1f} ms  (the fallback without "
          f"{'Triton' if a.device == 'cuda' else 'numba'})")
    bad = _differences(nc.error_stats(out, ref), _chunked(out, ref))
    print("fused == chunked: " + ("ok" if not bad else "DIFFERS " + "; ".join(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
