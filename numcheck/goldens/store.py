"""Parquet goldens: one schema for every suite, atomic writes, and the regression rules.

Layout: ``<golden_dir>/<device_class>/<suite>.parquet`` (device_class ``cpu`` or ``cuda-smXY``),
each with a sorted text summary ``<suite>.txt`` beside it for web diffs that ignore textconv.
A row is keyed by (suite, op, kernel, case_id, output, device_class): ``output`` names which
result of the case the row holds (``out``, ``grad_x``; ``loss`` for convergence curves).

Rows hold the rounded kernel_* and baseline_* ErrorStats columns, the verdict inputs (the unit
roundoff the verdict used and which rules apply to the op), the input digest, and for curves
``series`` / ``series_band``. File metadata holds the schema version and the provenance
(numcheck, torch, CUDA/cuBLAS, device, ISA, date). Stats are stored rounded (0.01 dB, 4
significant digits) so that a rerun on the same machine rewrites nothing: ``write`` compares
rows, not bytes or dates, and leaves an unchanged file alone.

Reading checks the file: not parquet, truncated, foreign (no numcheck schema) or written by a
newer numcheck -> ``GoldenError`` (exit 2) naming the file and the remedy; nothing is ever
overwritten silently.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from numcheck.errors import UsageError
from numcheck.records import GOLDEN_FIELDS, RESULT_FIELDS, STAT_SIDES, STAT_FIELDS, Record
from numcheck.verdicts import families

# 2: rows carry ``platforms`` (the envelope's platforms); schema-1 files get theirs from the
# file's provenance when read.
SCHEMA_VERSION = 2
KEY = ("suite", "op", "kernel", "case_id", "output", "device_class")
_INT_STATS = {"n", "n_compared", "n_nan", "n_inf", "nonfinite_mismatch", "max_ulp", "p99_ulp",
              "worst_block", "n_blocks"}
_DB_STATS = {"sqnr_db", "min_block_sqnr_db"}
_ULP_STATS = {"mean_ulp", "bias_ulp", "mag_bias_ulp"}
# Arrow types of the Record fields that are not strings.
_TYPES = {"seed": pa.int64(), "u": pa.float64(), "gate_ulp": pa.bool_(), "gate_bias": pa.bool_(),
          "bound_ratio": pa.float64(), "baseline_bound_ratio": pa.float64(),
          "series": pa.list_(pa.float64()), "series_band": pa.list_(pa.float64()),
          "cond": pa.float64(), "reduction_len": pa.float64()}
# metrics: family-specific scalars as sorted JSON; findings: JSON list of messages


def _columns(fields: tuple[str, ...]) -> list[tuple[str, pa.DataType]]:
    """Parquet columns of Record fields: the stats fields expand into one column per
    ErrorStats field."""
    cols: list[tuple[str, pa.DataType]] = []
    for name in fields:
        if name in STAT_SIDES:
            side = STAT_SIDES[name]
            cols += [(f"{side}_{s}", pa.string() if s == "fmt" else pa.int64()
                      if s in _INT_STATS else pa.float64()) for s in STAT_FIELDS]
        else:
            cols.append((name, _TYPES.get(name, pa.string())))
    return cols


SCHEMA = pa.schema(_columns(GOLDEN_FIELDS))
COLUMNS = tuple(SCHEMA.names)
# Results files carry the golden columns plus the rest of each record (diagnostics, verdicts).
RESULTS_SCHEMA = pa.schema(_columns(GOLDEN_FIELDS + RESULT_FIELDS))


class GoldenError(UsageError):
    """A golden or results file that cannot be used as it is (exit 2): names file and remedy."""


def _round_sig(x: float, digits: int = 4) -> float:
    if x is None or not math.isfinite(x) or x == 0:
        return x
    return float(f"{x:.{digits - 1}e}")


def _clean(name: str, v: Any) -> Any:
    """One stat, rounded as stored: 0.01 dB, 0.001 ULP, 4 significant digits otherwise."""
    if v is None:
        return None
    stat = name.split("_", 1)[1] if name.startswith(("kernel_", "baseline_")) else name
    if stat in _INT_STATS:
        return int(v)
    v = float(v)
    if not math.isfinite(v):
        return v
    if stat in _DB_STATS:
        return round(v, 2)
    if stat in _ULP_STATS:
        return round(v, 3)
    return _round_sig(v)


def to_row(record: Record, columns: tuple[str, ...] = COLUMNS) -> dict[str, Any]:
    """A record as a golden row (``columns``; stats rounded as stored)."""
    flat = record.as_row()
    row: dict[str, Any] = {}
    for name in columns:
        v = flat.get(name)
        if name.startswith(("kernel_", "baseline_")) and not name.endswith("_fmt") or \
                name in ("bound_ratio", "baseline_bound_ratio"):
            v = _clean(name, v)
        elif name in ("u", "cond", "reduction_len"):  # exact as they are
            v = None if v is None else float(v)
        elif name in ("series", "series_band"):  # 6 digits: far below any band, stable reruns
            v = None if v is None else [_round_sig(float(x), 6) for x in v]
        elif name == "metrics":
            v = None if not v else json.dumps(
                {k: _clean(k, x) if isinstance(x, (int, float)) and not isinstance(x, bool)
                 else x for k, x in sorted(v.items())}, sort_keys=True, allow_nan=True)
        elif name == "findings":
            v = json.dumps(list(v)) if v else None
        elif name == "per_step":
            v = json.dumps(v, allow_nan=True) if v else None
        elif name == "seed":
            v = None if v is None else int(v)
        elif name in ("gate_ulp", "gate_bias"):
            v = bool(v)
        elif v is not None:
            v = str(v)
        row[name] = v
    return row


def key_of(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEY)


def _sort_key(row: dict) -> tuple:
    return tuple("" if row.get(k) is None else str(row[k]) for k in KEY)


# --- files --------------------------------------------------------------------------------------

def path_for(golden_dir: str | Path, device_class: str, suite: str) -> Path:
    return Path(golden_dir) / device_class / f"{suite}.parquet"


@dataclass
class GoldenFile:
    path: Path
    rows: dict[tuple, dict] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)
    exists: bool = False


def _remedy(path: Path) -> str:
    return (f"restore it from version control (git checkout -- {path}) or delete it and "
            f"rerun with --numcheck-refresh to record it again")


def read_table(path: str | Path, *, results: bool = False) -> tuple[pa.Table, dict] | None:
    """A golden (or results) file as one arrow table and its provenance; None when there is no
    such file. The table holds the golden columns (every column with ``results``); a schema-1
    file's rows get their ``platforms`` from its provenance. GoldenError for a bad file."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        # ParquetFile, not pq.read_table: the latter goes through pyarrow.dataset, whose import
        # alone costs more than reading a 100k-row golden
        with pq.ParquetFile(path) as f:
            table = f.read()
    except Exception as e:  # ArrowInvalid, OSError: truncated, corrupt or not parquet at all
        raise GoldenError(f"{path}: not a readable parquet file ({type(e).__name__}: {e}); "
                          f"{_remedy(path)}") from e
    meta = table.schema.metadata or {}
    version = meta.get(b"numcheck.schema_version")
    if version is None:
        raise GoldenError(f"{path}: not a numcheck golden (no numcheck.schema_version in its "
                          f"metadata); move it out of the golden folder or {_remedy(path)}")
    if int(version) > SCHEMA_VERSION:
        raise GoldenError(f"{path}: written with golden schema {int(version)} by a newer "
                          f"numcheck; this numcheck reads schema {SCHEMA_VERSION}: upgrade "
                          f"numcheck (pip install -U numcheck)")
    prov = json.loads(meta.get(b"numcheck.provenance", b"{}"))
    cols_here = set(table.column_names)
    if "platforms" not in cols_here:  # schema 1: every row was recorded where the file was
        table = table.append_column("platforms", pa.array([platform_of(prov)] * table.num_rows,
                                                          pa.string()))
        cols_here.add("platforms")
    missing = [c for c in COLUMNS if c not in cols_here]
    if missing:
        raise GoldenError(f"{path}: missing golden columns {missing[:5]}; {_remedy(path)}")
    return (table if results else table.select(list(COLUMNS))), prov


def read(path: str | Path, *, results: bool = False) -> GoldenFile:
    """Load a golden (or results) file as rows by key; a missing file is an empty GoldenFile."""
    got = read_table(path, results=results)
    if got is None:
        return GoldenFile(Path(path))
    table, prov = got
    cols = table.to_pydict()  # column-wise conversion: several times faster than to_pylist
    names = list(cols)
    rows = {}
    for values in zip(*cols.values()):
        row = dict(zip(names, values))
        rows[key_of(row)] = row
    return GoldenFile(Path(path), rows, prov, True)


# --- platforms and envelopes ---------------------------------------------------------------------

PLATFORM_SEP = "; "


def platform_of(provenance: dict[str, str]) -> str:
    """The platform a result was measured on, from its provenance: what may move a kernel's
    rounding within one device class. CPU: the CPU's name, the ATen vector path (ISA tier:
    DEFAULT, AVX2, AVX512, ...) and torch; CUDA: the GPU, CUDA, cuBLAS, cuDNN and torch.
    E.g. ``AMD EPYC, AVX2, torch 2.13.0+cpu``. Empty provenance: ``unknown``."""
    if not provenance:
        return "unknown"
    torch_v = f"torch {provenance.get('torch', '?')}"
    if provenance.get("device_class", "cpu") == "cpu":
        # torch_cpu_isa (written since 0.1) / torch_cpu_capability (older files); the oldest
        # files have only the CPU's ISA summary, whose first word is the tier ATen picks.
        tier = provenance.get("torch_cpu_isa") or provenance.get("torch_cpu_capability") or \
            (provenance.get("cpu_isa") or "?").split("-")[0]
        return ", ".join((provenance.get("device_name") or "cpu", tier.upper(), torch_v))
    parts = [provenance.get("device_name") or provenance.get("device_class", "?")]
    for k in ("cuda", "cublas", "cudnn"):
        if provenance.get(k) not in (None, "n/a"):
            parts.append(f"{k} {provenance[k]}")
    return ", ".join(parts + [torch_v])


def platforms_of(row: dict) -> list[str]:
    return [p for p in (row.get("platforms") or "").split(PLATFORM_SEP) if p]


def platform_difference(recorded: str, here: str) -> str:
    """What differs between two platform ids, e.g. ``AVX512 -> AVX2``."""
    a, b = recorded.split(", "), here.split(", ")
    if len(a) != len(b):
        return f"{recorded} -> {here}"
    return ", ".join(f"{x} -> {y}" for x, y in zip(a, b) if x != y) or "same platform"


# The envelope's worst edge per ErrorStats field: larger is worse, smaller is worse (SQNR), or
# larger magnitude is worse (signed biases). Fields not listed (sizes, formats) come from the
# newest row.
_WORSE_HIGH = {"rel_l2", "max_abs", "mean_abs", "max_ulp", "p99_ulp", "mean_ulp", "n_nan",
               "n_inf", "nonfinite_mismatch"}
_WORSE_LOW = {"sqnr_db", "min_block_sqnr_db", "cosine"}
_WORSE_ABS = {"bias", "bias_ulp", "mag_bias_ulp"}
_STATUS_RANK = {"passed": 0, "known": 1, "failed": 2, "error": 3}


def _worse(stat: str, a: Any, b: Any) -> Any:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return a
    if stat in _WORSE_HIGH:
        return max(a, b)
    if stat in _WORSE_LOW:
        return min(a, b)
    return a if abs(a) >= abs(b) else b


def merge_envelope(old: dict, new: dict) -> dict:
    """``new`` merged into ``old``'s envelope (a refresh on another platform): every error
    statistic the worse of both, the platforms the union, the worse status; the rest of the row
    (case, verdict inputs) from ``new``. The worst block's index follows its SQNR."""
    row = dict(new)
    for side in ("kernel", "baseline"):
        for stat in _WORSE_HIGH | _WORSE_LOW | _WORSE_ABS:
            col = f"{side}_{stat}"
            if col in row:
                row[col] = _worse(stat, old.get(col), new.get(col))
        col = f"{side}_min_block_sqnr_db"
        if row.get(col) == old.get(col) and row.get(col) != new.get(col):
            row[f"{side}_worst_block"] = old.get(f"{side}_worst_block")
    for col in ("bound_ratio", "baseline_bound_ratio"):
        row[col] = _worse("rel_l2", old.get(col), new.get(col))
    row = families.of_row(new).merge_envelope(old, new, row)
    if _STATUS_RANK.get(old.get("status"), 0) > _STATUS_RANK.get(new.get("status"), 0):
        row["status"] = old.get("status")
    seen = platforms_of(old)
    row["platforms"] = PLATFORM_SEP.join(seen + [p for p in platforms_of(new) if p not in seen])
    return row


# Test-only hook: NUMCHECK_TEST_KILL_AT=<point> makes this process SIGKILL itself at that point
# of a write (tests/test_golden_store.py proves a refresh killed mid-write leaves the old golden).
_KILL_ENV = "NUMCHECK_TEST_KILL_AT"


def _test_kill(point: str) -> None:
    if os.environ.get(_KILL_ENV) == point:
        import signal
        os.kill(os.getpid(), signal.SIGKILL)


def _table(rows: Iterable[dict], provenance: dict, schema: pa.Schema) -> pa.Table:
    ordered = sorted(rows, key=_sort_key)
    meta = {b"numcheck.schema_version": str(SCHEMA_VERSION).encode(),
            b"numcheck.provenance": json.dumps(provenance, sort_keys=True).encode()}
    return pa.Table.from_pylist(ordered, schema=schema.with_metadata(meta))


def rows_equal(a: dict, b: dict) -> bool:
    """Rows equal as stored (NaN equals NaN: a NaN stat is a value, not a change)."""
    for c in a.keys() | b.keys():
        x, y = a.get(c), b.get(c)
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y:
            return False
    return True


def atomic_write(path: Path, table: pa.Table, text: str | None = None) -> None:
    """Write aside, fsync, rename (and the text summary the same way, after the parquet)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            _test_kill("parquet-written")
            os.fsync(f.fileno())
        _test_kill("before-rename")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    if text is not None:
        ttmp = path.with_name(f".{path.stem}.txt.{os.getpid()}.tmp")
        ttmp.write_text(text)
        os.replace(ttmp, path.with_suffix(".txt"))
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write(gf: GoldenFile, rows: dict[tuple, dict], provenance: dict) -> bool:
    """Replace the file's rows by ``rows``; returns False (and writes nothing) when the rows
    are the same as stored."""
    if gf.exists and gf.rows.keys() == rows.keys() and \
            all(rows_equal(gf.rows[k], rows[k]) for k in rows):
        return False
    atomic_write(gf.path, _table(rows.values(), provenance, SCHEMA), summary_text(rows.values()))
    gf.rows, gf.provenance, gf.exists = dict(rows), dict(provenance), True
    return True


def write_results(path: str | Path, records: list[Record], provenance: dict) -> Path:
    """All records of a run (golden columns + diagnostics and verdicts) to parquet."""
    path = Path(path)
    rows = [to_row(r, tuple(RESULTS_SCHEMA.names)) for r in records]
    atomic_write(path, _table(rows, provenance, RESULTS_SCHEMA))
    return path


def read_results(path: str | Path) -> tuple[list[Record], dict[str, str]]:
    """The records of a results file and its provenance (GoldenError on a bad file)."""
    gf = read(path, results=True)
    if not gf.exists:
        raise GoldenError(f"{path}: no such results file; run numcheck run (or pytest with "
                          f"--numcheck-results {path}) first")
    return [Record.from_row(_decoded({**r, "family": families.family_of_row(r)}))
            for r in gf.rows.values()], gf.provenance


def _decoded(row: dict) -> dict:
    if isinstance(row.get("findings"), str):
        row = {**row, "findings": json.loads(row["findings"])}
    return row


# --- text ---------------------------------------------------------------------------------------

_TEXT_STATS = ("status", "kernel_rel_l2", "kernel_sqnr_db", "kernel_min_block_sqnr_db",
               "kernel_max_ulp", "kernel_mag_bias_ulp", "baseline_rel_l2", "input_digest")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return f"[{len(v)} values, last {v[-1]:.4g}]" if v else "[]"
    return str(v)


def _metric(v: Any) -> str:
    """A metric as the summary shows it: integral floats (bit counts) as integers."""
    if isinstance(v, float) and math.isfinite(v):
        return str(int(v)) if v.is_integer() else f"{v:.4g}"
    return str(v)


def summary_text(rows: Iterable[dict]) -> str:
    """One sorted line per row: key, then the metrics a reviewer reads (git-diff friendly)."""
    lines = []
    for row in sorted(rows, key=_sort_key):
        key = "/".join(str(row.get(k)) for k in KEY[1:5])
        vals = " ".join(f"{s.replace('kernel_', 'k.').replace('baseline_', 'b.')}={_fmt(row.get(s))}"
                        for s in _TEXT_STATS if row.get(s) is not None)
        if row.get("series"):
            vals += f" series={_fmt(row['series'])}"
        if row.get("metrics") and families.of_row(row).metrics_in_summary:
            m = row["metrics"]
            vals += " " + " ".join(f"{k}={_metric(v)}" for k, v in
                                   sorted((json.loads(m) if isinstance(m, str) else m).items()))
        lines.append(f"{key} {vals}")
    return "\n".join(lines) + "\n"


def show(path: str | Path) -> str:
    """The readable text of a golden or results file (``numcheck show``, git textconv)."""
    gf = read(path, results=True)
    head = [f"# {gf.path}: {len(gf.rows)} rows, schema {SCHEMA_VERSION}",
            "# provenance: " + ", ".join(f"{k}={v}" for k, v in sorted(gf.provenance.items())
                                          if k in ("numcheck", "torch", "cuda", "device_class",
                                                   "device_name", "cpu_isa", "date"))]
    return "\n".join(head) + "\n" + summary_text(gf.rows.values())
