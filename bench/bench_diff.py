"""`numcheck diff` on two 1M-row telemetry files, the whole command (issue 34: <= 2 s).

Builds run A (a watched tiny_lm, 4 steps, digests on) and run B (the same with one element of
one layer one ULP off from step 2), then repeats their rows over later steps to 1M rows each,
and times `numcheck diff A B` as a user runs it (a fresh process: imports, reading, alignment,
comparison, printing), best and median of --repeat runs. Prints seconds, not a verdict: these
machines are noisy.

    python bench/bench_diff.py [--rows 1000000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch


def _records(fault: bool):
    from numcheck import telemetry
    from numcheck.convergence.models import build

    model, task, lr = build("tiny_lm", 0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    at = {"step": 0}

    def one_ulp(m, args, out):
        if fault and at["step"] >= 2:
            bump = torch.zeros_like(out).view(-1)
            v = out.detach().reshape(-1)[7]
            bump[7] = torch.nextafter(v, torch.tensor(float("inf"))) - v
            return out + bump.view(out.shape)
        return None

    dict(model.named_modules())["blocks.1.w_up"].register_forward_hook(one_ulp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with telemetry.watch(model, digests=True) as t:
            for step in range(4):
                at["step"] = step
                model.loss(task.batch_at(0, step)).backward()
                opt.step()
                opt.zero_grad()
                t.step()
    return t.records()


def _grown(df, rows: int):
    import pandas as pd
    copies = rows // len(df) + 1
    return pd.concat([df.assign(step=df.step + 4 * i) for i in range(copies)],
                     ignore_index=True).iloc[:rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for tag, fault in (("a", False), ("b", True)):
            path = Path(tmp) / f"{tag}.parquet"
            _grown(_records(fault), args.rows).to_parquet(path, index=False)
            paths.append(str(path))
        cmd = [sys.executable, "-m", "numcheck", "diff", "--first", "3", *paths]
        times, out = [], ""
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            out = res.stdout
        print(out.splitlines()[0][:200])
        print(f"numcheck diff, {args.rows} rows each: best {min(times):.2f} s, median "
              f"{statistics.median(times):.2f} s over {args.repeat} runs (exit {res.returncode})")
        print("target: <= 2 s the whole command (issue 34)")


if __name__ == "__main__":
    main()
