"""Calibration of the telemetry goldens' slacks (numcheck.telemetry.telemetry_rules): how far the
per-layer floors move across ATen CPU capabilities, and how far planted degradations move them.

    # one run per tier, each in its own process and inductor cache:
    ATEN_CPU_CAPABILITY=avx2 TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) \\
        python bench/calibrate_telemetry_slack.py dump /tmp/tele-avx2.parquet
    ... (=default, and natively)
    python bench/calibrate_telemetry_slack.py spread /tmp/tele-*.parquet
    python bench/calibrate_telemetry_slack.py planted

``dump`` runs the built-in telemetry suite's models (suites/test_telemetry.py: the full set's
what-if recipes, 4 steps, seed 0, one thread) and writes the floors (numcheck.telemetry.floors)
unrounded. ``spread`` prints, per gated statistic, the largest |difference| between any two
dumps over every record, next to the slack. ``planted`` runs the models once with MXFP8 as
observed and the same recipe with a planted fault (numcheck.ops.variants.planted_mx_recipe: one
mantissa bit lost; the block scales one binade too high, too low) and prints the smallest move of each statistic the fault causes.
"""
from __future__ import annotations

import itertools
import sys

from numcheck.convergence.train import STATE
from numcheck.measure.numerics import pinned
from numcheck.telemetry import inspect as ins
from numcheck.telemetry.floors import floors
from numcheck.telemetry.telemetry_rules import STATS, slack
from numcheck.ops.variants import planted_mx_recipe

MODELS = ("tiny_lm", "tiny_dit", "mlp")
WHAT_IF = ("nvfp4", "fp8_tensor", "mxfp6", "mxfp4", "fp8_block", "int8")
KEY = ["model", "module", "op", "role", "pass", "recipe", "what_if"]


def run(recipe, what_if=WHAT_IF):
    import pandas as pd
    out = []
    for m in MODELS:
        with pinned(STATE):
            t = ins.run(m, recipe=recipe, what_if=what_if, shadow=True, steps=4, seed=0)
        f = floors(t)
        f.insert(0, "model", m)
        out.append(f.drop(columns=["_defined", "step_n"]))
    return pd.concat(out, ignore_index=True)


def main(argv: list[str]) -> None:
    import pandas as pd
    if argv[0] == "dump":
        run("mxfp8").to_parquet(argv[1])
        return
    if argv[0] == "spread":
        frames = [pd.read_parquet(p) for p in argv[1:]]
        for s in STATS:
            worst, where = 0.0, None
            for a, b in itertools.combinations(frames, 2):
                j = a.merge(b, on=KEY, suffixes=("_a", "_b"))
                d = (j[f"{s.key}_a"] - j[f"{s.key}_b"]).abs()
                if d.notna().any() and d.max() > worst:
                    worst, where = float(d.max()), j.loc[d.idxmax(), KEY].tolist()
            print(f"{s.key:28} spread {worst:.4g} {s.unit}  (slack {s.slack}) at {where}")
        return
    if argv[0] == "planted":
        good = run("mxfp8", what_if=())
        for name, fault in (("lost mantissa bit", "lost_bit"),
                            ("scale one binade up", "scale_up"),
                            ("scale one binade down", "scale_down")):
            bad = run(planted_mx_recipe(fault), what_if=())
            j = good.merge(bad, on=KEY, suffixes=("_a", "_b"))
            print(name)
            for s in STATS[:2] + STATS[4:6]:
                d = j[f"{s.key}_b"] - j[f"{s.key}_a"]
                if d.notna().any():
                    tol = [slack(s, {"n": n}) for n in j["n_a"]]
                    caught = (d < -pd.Series(tol)) if s.kind == "floor" else (d > pd.Series(tol))
                    print(f"  {s.key:28} move min {d.min():+.3g} max {d.max():+.3g}; "
                          f"beyond the slack in {int(caught.sum())}/{int(d.notna().sum())}")
        return
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
