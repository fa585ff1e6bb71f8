"""How a check's wall time grows with tensor size: nc.verify of one case per size, 2^16 .. 2^26
elements, for an elementwise op (gelu), a row reduction (rms_norm, rows of 1024) and a GEMM
(matmul, square-ish so that the output has the element count; its FP64 reference grows as n^1.5).

Prints per size: the whole verify (inputs, kernel, FP64 reference, baseline, error_stats,
verdict), error_stats alone on the same output, and the time per element, so that a jump
(a cache boundary, a quadratic step) shows. One process, one intra-op thread per run as in the
suites (numcheck pins kernels to the pinned thread count), medians of --repeat runs after a warm-up.

    .venv/bin/python bench/bench_scaling.py [--max-log2n 26] [--ops gelu,rms_norm,matmul]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

import numcheck as nc
from numcheck.frontends import process as _process
from numcheck.cases.grid import Case
from numcheck.catalog import get_op, kernels


def _shape(op: str, n: int) -> tuple[int, ...]:
    if op == "rms_norm":
        return (n // 1024, 1024)
    if op == "matmul":  # (m, k, n) with m * n output elements; k = 256
        m = 1 << (int(math.log2(n)) // 2)
        return (m, 256, n // m)
    return (n,)


def _timed(fn, repeat: int) -> float:
    fn()  # warm-up: first-call dispatch, allocator growth
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-log2n", type=int, default=16)
    p.add_argument("--max-log2n", type=int, default=26)
    p.add_argument("--ops", default="gelu,rms_norm,matmul")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    _process.tune()  # as `numcheck run` does
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, bf16 cases")
    print("| op | log2 n | shape | verify s | error_stats s | verify ns/element |")
    print("|---|---|---|---|---|---|")
    for op in a.ops.split(","):
        kernel = kernels(op)["torch"]  # the eager kernel every op registers
        for k in range(a.min_log2n, a.max_log2n + 1, 2):
            n = 1 << k
            case = Case(op, "bf16", _shape(op, n), "normal", 0, get_op(op).grid("quick")[0].params)
            t_verify = _timed(lambda: nc.verify(op, kernel, adhoc=[case], device="cpu"), a.repeat)
            out = torch.randn(n, dtype=torch.float64)
            t_stats = _timed(lambda: nc.error_stats(out.to(torch.bfloat16), out), a.repeat)
            print(f"| {op} | {k} | {'x'.join(map(str, case.shape))} | {t_verify:.3f} | "
                  f"{t_stats:.3f} | {t_verify / n * 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
