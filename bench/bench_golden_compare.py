"""Wall time of comparing two goldens of N rows (default 100,000): `numcheck compare OLD NEW`.

Builds OLD from rows shaped like the shipped ops golden (every stat column filled), NEW from
the same rows with small noise and 1% regressions, writes both with numcheck's own writer, then
times the command end to end (process start, imports, reading, comparing, printing; target
<= 1 s) and in process what it runs: read both, compare (``regression.compare_tables``: the
verdicts on whole columns, compare_row for the changed rows' messages). Prints one line per
measurement. Where start-up dominates: ``python -X importtime -m numcheck compare OLD NEW``.

    .venv/bin/python bench/bench_golden_compare.py [N]
"""
from __future__ import annotations

import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from numcheck.goldens import store as golden
from numcheck.records import Record
from numcheck.goldens.regression import compare_tables


def _row(i: int, rel: float) -> dict:
    r = {"suite": "bench", "op": f"op{i % 13}", "kernel": "torch", "case_id": f"case-{i:07d}",
         "output": "out", "device_class": "cpu", "case_set": "quick", "dtype": "bf16",
         "shape": "4x128", "dist": "normal", "seed": 0, "params": "", "status": "passed",
         "input_digest": f"{i:016x}", "u": 2.0 ** -8, "gate_ulp": i % 2 == 0,
         "gate_bias": i % 2 == 0, "kernel_fmt": "bf16", "baseline_fmt": "bf16"}
    for side, k in (("kernel", 1.0), ("baseline", 1.7)):
        e = rel * k
        r.update({f"{side}_n": 512, f"{side}_n_compared": 512, f"{side}_n_nan": 0,
                  f"{side}_n_inf": 0, f"{side}_nonfinite_mismatch": 0, f"{side}_max_abs": e * 4,
                  f"{side}_mean_abs": e, f"{side}_rel_l2": e, f"{side}_sqnr_db": -20 * math.log10(e),
                  f"{side}_cosine": 1.0, f"{side}_bias": 0.0, f"{side}_max_ulp": 1,
                  f"{side}_mean_ulp": 0.2, f"{side}_p99_ulp": 1, f"{side}_bias_ulp": 0.0,
                  f"{side}_mag_bias_ulp": 0.0, f"{side}_min_block_sqnr_db": -20 * math.log10(e) - 3,
                  f"{side}_worst_block": 0, f"{side}_n_blocks": 4})
    return golden.to_row(Record.from_row(r))


def main(n: int) -> None:
    rng = random.Random(0)
    old = [_row(i, 1.6e-3 * (1 + 0.2 * rng.random())) for i in range(n)]
    new = [_row(i, float(o["kernel_rel_l2"]) * (1.6 if i % 100 == 0 else 1.0)) for i, o in
           enumerate(old)]
    with tempfile.TemporaryDirectory() as d:
        po, pn = Path(d) / "old.parquet", Path(d) / "new.parquet"
        golden.write(golden.GoldenFile(po), {golden.key_of(r): r for r in old}, {})
        golden.write(golden.GoldenFile(pn), {golden.key_of(r): r for r in new}, {})
        print(f"rows {n}: old {po.stat().st_size / 2**20:.1f} MiB, new "
              f"{pn.stat().st_size / 2**20:.1f} MiB")
        t0 = time.perf_counter()
        (a, _), (b, _) = golden.read_table(po, results=True), golden.read_table(pn, results=True)
        t1 = time.perf_counter()
        changes, unchanged = compare_tables(a, b)
        t2 = time.perf_counter()
        print(f"in process: read both {t1 - t0:.2f} s, compare {t2 - t1:.2f} s, "
              f"{sum(c.regressed for c in changes)} regressed, {unchanged} same")
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "numcheck", "compare", str(po), str(pn)],
                             capture_output=True, text=True, check=False)
        t1 = time.perf_counter()
        print(f"numcheck compare (whole command): {t1 - t0:.2f} s, exit {res.returncode}, "
              f"first line: {res.stdout.splitlines()[0]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
