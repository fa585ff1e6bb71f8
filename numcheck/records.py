"""The record: one measured result of a run (one output of one case of one kernel), and whether
it fails.

Every producer (op cases, quantization round trips and GEMMs, convergence curves) makes
``Record``s; ``numcheck.verdicts.judge`` sets their ``status``; the golden session sets ``golden``;
results files, goldens, the report, the plugin and ``verify`` read them. Whether a record fails a
run is decided in one place, ``failing(record, mode)``.

The parquet schemas derive from this dataclass: fields marked ``golden`` are golden columns (in
field order; ``kernel_stats`` / ``baseline_stats`` expand into ``kernel_*`` / ``baseline_*``
columns, one per ``ErrorStats`` field); results files add the other fields. ``as_row()`` is that
flat form and ``Record.from_row`` reads it back.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from numcheck.measure.errorstats import ErrorStats

STAT_FIELDS = tuple(f.name for f in dataclasses.fields(ErrorStats))
STAT_SIDES = {"kernel_stats": "kernel", "baseline_stats": "baseline"}


class Status(str, Enum):
    """What the absolute rules (and the kernel itself) say about a record."""

    PENDING = "pending"  # measured, not judged yet
    PASSED = "passed"
    FAILED = "failed"  # a rule failed
    ERROR = "error"  # the kernel (or the op's own code) raised or returned a wrong tensor
    SKIPPED = "skipped"  # outside the kernel's constraints; reason says why
    KNOWN = "known"  # failed where the kernel declares a documented weakness (xfail)

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:  # equal to its string, so hashed like it (Counter keys, sets)
        return hash(self.value)


class Golden(str, Enum):
    """The golden verdict of a record (None: not compared with a golden)."""

    SAME = "same"
    IMPROVED = "improved"
    REGRESSED = "regressed"
    # beyond the golden's envelope by more than one platform's slack, within the slack for a
    # platform the golden was not recorded on: reported, never failing
    DRIFT = "drift"
    NEW = "new"  # no golden row (check mode: passes)
    MISSING = "missing"  # no golden row in strict mode
    INPUTS_CHANGED = "inputs_changed"  # the case's inputs differ from the golden's
    REFRESHED = "refreshed"  # rewritten by this run's refresh
    BAD_GOLDEN = "bad_golden"  # the golden file cannot be read (exit 2)

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:  # equal to its string, so hashed like it (Counter keys, sets)
        return hash(self.value)


MODES = ("check", "strict", "refresh", "refresh-new")
# Golden verdicts that fail a record, per golden mode (in refresh modes nothing golden-related
# fails: what ran becomes the golden).
_FAILING_GOLDEN = {
    "check": {Golden.REGRESSED, Golden.MISSING, Golden.BAD_GOLDEN},
    "strict": {Golden.REGRESSED, Golden.MISSING, Golden.INPUTS_CHANGED, Golden.BAD_GOLDEN},
    "refresh": {Golden.BAD_GOLDEN},
    "refresh-new": {Golden.BAD_GOLDEN},
}


def failing(record: "Record", mode: str = "check") -> bool:
    """Does this record fail the run in golden ``mode``? A failed or errored record always does;
    a known weakness, a skip and a pass never do by themselves; the golden verdict adds what the
    mode makes binding (a regression; in strict mode also a missing golden or changed inputs)."""
    if record.status in (Status.FAILED, Status.ERROR, Status.PENDING):
        return True
    return record.golden is not None and record.golden in _FAILING_GOLDEN[mode]


def _golden(**kw) -> Any:
    return field(metadata={"golden": True}, **kw)


@dataclass
class Record:
    # -- the golden key (suite, op, kernel, case_id, output, device_class) and the case
    suite: str = _golden(default="")  # "ops", "quant", "convergence", "verify", a test module
    op: str = _golden(default="")
    kernel: str = _golden(default="")  # the kernel's (or quantization path's, recipe's) name
    case_id: str = _golden(default="")
    output: str = _golden(default="out")  # "out", "grad_<arg>", "loss"
    device_class: str = _golden(default="cpu")
    case_set: str | None = _golden(default=None)
    dtype: str = _golden(default="")
    shape: str = _golden(default="")  # "4x128"
    dist: str = _golden(default="")
    seed: int | None = _golden(default=None)
    params: str = _golden(default="")  # "causal=True,layout=contiguous"
    status: Status = _golden(default=Status.PENDING)
    input_digest: str | None = _golden(default=None)
    # -- verdict inputs: the unit roundoff the verdict used and which rules bind the op
    u: float | None = _golden(default=None)
    gate_ulp: bool = _golden(default=False)
    gate_bias: bool = _golden(default=False)
    # max |out - ref| / (u scale), rule 5: NaN where the op has no scale, None where no
    # element-wise error was measured (curves)
    bound_ratio: float | None = _golden(default=None)
    baseline_bound_ratio: float | None = _golden(default=None)
    # -- measurements
    kernel_stats: ErrorStats | None = _golden(default=None)
    baseline_stats: ErrorStats | None = _golden(default=None)
    series: list[float] | None = _golden(default=None)  # convergence: paired loss difference
    series_band: list[float] | None = _golden(default=None)
    metrics: dict[str, float] | None = _golden(default=None)  # family-specific scalars
    # The platforms (numcheck.goldens.store.platform_of) a golden row's values were seen on; its
    # statistics are the worst of them (the envelope). A record: the platform it ran on.
    platforms: str = _golden(default="")
    # -- the rest of the verdict's inputs (results only)
    # whose rules judge it: "ops" (also users' ops), "quant", "convergence", "fingerprint",
    # "telemetry"
    family: str = "ops"
    cond: float = 1.0  # ||scale|| / ||ref|| (rule 5 floors on cancelling results)
    reduction_len: float = 0.0
    # error over the condition-aware bound (numcheck.verdicts.conditioning); None: not measured (it is
    # measured where the baseline or componentwise rule fails)
    cond_ratio: float | None = None
    # the kernel's block errors over the baseline rule's allowance, rank by rank, the worst
    # (numcheck.measure.paired); None: not measured (the kernel's worst block within the floor)
    block_ratio: float | None = None
    findings: tuple[str, ...] = ()  # rule messages computed where the data lives (curves)
    known: str = ""  # the kernel's documented weakness that covers this case, if any
    # -- verdicts and diagnostics
    reason: str = ""
    notes: str = ""  # rules a stable kernel exceeded within its condition-aware bound
    golden: Golden | None = None
    golden_reason: str = ""
    device: str = ""
    repro: str = ""
    worst_elements: str = ""
    # Records that fail a rule (numcheck.run): elements per |out - rounded ref| in ULPs of
    # kernel_stats.fmt over the compared elements (sum = kernel_stats.n_compared); bucket 0:
    # exact, bucket k: [2^(k-1), 2^k) ULP. None: not measured. A JSON string in results parquet.
    ulp_hist: list[int] | None = None
    # Telemetry records (numcheck.telemetry.floors): each gated statistic per step, as
    # {"step": [steps], key: [values]} (None: undefined that step), for the report's layer x
    # step heatmaps; the golden keeps the floors only. JSON in results parquet.
    per_step: dict[str, list[float]] | None = None
    numerics: str = ""
    saved_inputs: str = ""
    traceback: str = ""

    @property
    def label(self) -> str:
        return f"{self.op}/{self.kernel}/{self.case_id} {self.output}"

    def metric(self, name: str, default: Any = None) -> Any:
        return (self.metrics or {}).get(name, default)

    def as_row(self) -> dict[str, Any]:
        """The flat form (stats as kernel_* / baseline_* columns, enums as strings): what
        parquet, JSON and the pytest reports carry."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in STAT_SIDES:
                side = STAT_SIDES[f.name]
                for s in STAT_FIELDS:
                    out[f"{side}_{s}"] = None if v is None else getattr(v, s)
            elif isinstance(v, Enum):
                out[f.name] = v.value
            elif isinstance(v, tuple):
                out[f.name] = list(v)
            else:
                out[f.name] = v
        return out

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Record":
        """A record from its flat form (a results or golden row, a JSON report); unknown
        columns are ignored, missing ones take their defaults (a row without ``family``: give
        it, numcheck.verdicts.families.family_of_row)."""
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in STAT_SIDES:
                side = STAT_SIDES[f.name]
                if row.get(f"{side}_n") is not None:
                    kw[f.name] = ErrorStats(**{s: row.get(f"{side}_{s}") for s in STAT_FIELDS})
                continue
            if f.name not in row or row[f.name] is None:
                continue
            v = row[f.name]
            if f.name == "status":
                v = Status(v)
            elif f.name == "golden":
                v = Golden(v)
            elif f.name == "findings":
                v = tuple(v)
            elif f.name in ("metrics", "ulp_hist", "per_step") and isinstance(v, str):
                v = json.loads(v)
            kw[f.name] = v
        return cls(**kw)

    def replace(self, **changes) -> "Record":
        return dataclasses.replace(self, **changes)


GOLDEN_FIELDS = tuple(f.name for f in dataclasses.fields(Record) if f.metadata.get("golden"))
RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(Record)
                      if not f.metadata.get("golden"))


def to_json(records: list[Record]) -> str:
    return json.dumps([r.as_row() for r in records], default=str)


def from_json(text: str) -> list[Record]:
    return [Record.from_row(d) for d in json.loads(text)]
