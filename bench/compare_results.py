"""Column-by-column comparison of two numcheck results files (the README's main command run
before and after a refactor): same keys, and per column the rows that differ."""
import math
import sys

import pyarrow.parquet as pq

KEY = ("suite", "op", "kernel", "case_id", "output")


def rows(path):
    t = pq.read_table(path).to_pylist()
    return {tuple(r[k] for k in KEY): r for r in t}, pq.read_table(path).column_names


def same(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


a, ca = rows(sys.argv[1])
b, cb = rows(sys.argv[2])
print(f"rows: before {len(a)}, after {len(b)}; keys only before {len(a.keys() - b.keys())}, "
      f"only after {len(b.keys() - a.keys())}")
print(f"columns only before: {sorted(set(ca) - set(cb))}; only after: {sorted(set(cb) - set(ca))}")
common = sorted(a.keys() & b.keys())
for col in ca:
    if col not in cb:
        continue
    diff = [k for k in common if not same(a[k][col], b[k][col])]
    if diff:
        k = diff[0]
        print(f"{col}: {len(diff)} rows differ, e.g. {'/'.join(map(str, k))}: "
              f"{str(a[k][col])[:150]!r} -> {str(b[k][col])[:150]!r}")
    else:
        print(f"{col}: identical")
