"""A run's golden bookkeeping: judge records against the goldens, then refresh or report.

Two halves, so that pytest-xdist workers never read-modify-write a shared file:

* ``GoldenSession.judge(records)`` runs wherever a case ran (an xdist worker): it only reads
  golden files (cached per file) and stamps each record with its golden verdict
  (``golden``: same | improved | regressed | new | missing | inputs_changed, ``golden_reason``).
* ``GoldenSession.finish(records)`` runs once, in the process that saw every record (the
  controller): it merges what ran into the golden files (refresh modes only), writes each file
  atomically and only when its rows changed, and reports changes, refusals and unused rows.

Modes: ``check`` (compare; a case without golden is "new" and passes), ``strict`` (CI: a case
without golden fails as "missing"; nothing is written), ``refresh`` (rewrite the rows of the
cases that ran), ``refresh-new`` (add rows for cases without one, keep the others).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from numcheck.goldens import store as golden
from numcheck.errors import UsageError
from numcheck.records import MODES, Golden, Record, Status, failing
from numcheck.verdicts import families
from numcheck.goldens.regression import Change, compare_row


def goldenable(record: Record) -> bool:
    """Records that carry a golden row: a suite name and something measured."""
    return bool(record.suite) and families.of(record).measured(record) and \
        record.status in (Status.PASSED, Status.FAILED, Status.KNOWN)


@dataclass
class FinishReport:
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)  # refreshed rows that differ
    refused: list[str] = field(default_factory=list)
    unused: dict[Path, list[tuple]] = field(default_factory=dict)
    pruned: int = 0
    isa_notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        quiet = {id(c) for c in self.changes
                 if c.kind == "merged" and c.metrics_line() == "no metric changed"}
        out = [f"{c.kind:>14} {'/'.join(map(str, c.key[1:5]))}: {c.metrics_line()}"
               for c in self.changes if id(c) not in quiet]
        if quiet:  # a new platform seen, every statistic inside the envelope already
            out.append(f"{'merged':>14} {len(quiet)} more row(s) into their envelope with no "
                       f"metric changed (their platforms now include this machine's)")
        out += [f"       refused {r}" for r in self.refused]
        for p, keys in self.unused.items():
            out.append(f"{len(keys)} golden row(s) in {p} belong to no case of this run's case "
                       f"set (cases that no longer exist?); remove them with --numcheck-prune")
            out += [f"        unused {'/'.join(map(str, k[1:5]))}" for k in keys[:5]]
        if self.pruned:
            out.append(f"pruned {self.pruned} unused golden row(s)")
        out += [f"wrote {p}" for p in self.written]
        out += self.isa_notes
        return out


class GoldenSession:
    def __init__(self, golden_dir: str | Path, mode: str = "check", *,
                 allow_nonfinite: bool = False, prune: bool = False,
                 case_set: str = "quick", base_dir: str | Path | None = None,
                 partial: bool = False) -> None:
        if mode not in MODES:
            raise UsageError(f"golden mode {mode!r}: use one of {', '.join(MODES)}")
        self.dir = Path(golden_dir)
        # read-only goldens beneath ``dir`` (an installed package's shipped ones), row by row: a
        # case without a row in ``dir`` is judged against the base's row; a refresh writes to
        # ``dir`` only the rows that differ from the base's
        self.base = Path(base_dir) if base_dir is not None else None
        self._shipped: dict[Path, golden.GoldenFile] = {}
        self.partial = partial  # -k, -m, a shard: rows no case of the run ran are not "unused"
        # a bad golden file is told in full once per process; later cases cite it in a line
        self.error_reported = False
        self.mode = mode
        self.allow_nonfinite = allow_nonfinite
        self.prune = prune
        self.case_set = case_set
        self._files: dict[Path, golden.GoldenFile] = {}
        self._platforms: dict[str, str] = {}

    def platform(self, device: str) -> str:
        """This machine's platform id for ``device`` (numcheck.goldens.store.platform_of)."""
        if device not in self._platforms:
            from numcheck.measure import environment  # imports torch: only where records are produced
            self._platforms[device] = golden.platform_of(environment.provenance(device))
        return self._platforms[device]

    def _row(self, r: Record) -> dict:
        r.case_set = r.case_set or self.case_set
        if not r.platforms:
            r.platforms = self.platform(r.device or "cpu")
        return golden.to_row(r)

    def file(self, device_class: str, suite: str) -> golden.GoldenFile:
        path = golden.path_for(self.dir, device_class, suite)
        if path not in self._files:
            self._files[path] = golden.read(path)  # GoldenError (exit 2) on a bad file
            if self.base is not None:
                self._shipped[path] = golden.read(golden.path_for(self.base, device_class, suite))
        return self._files[path]

    def _old(self, path: Path, key: tuple) -> dict | None:
        """The golden row of ``key``: the user's, else the shipped one (``file`` read both)."""
        row = self._files[path].rows.get(key)
        if row is None and path in self._shipped:
            row = self._shipped[path].rows.get(key)
        return row

    def _where(self, path: Path) -> str:
        shipped = self._shipped.get(path)
        return f"{path} or {shipped.path}" if shipped is not None and shipped.exists else str(path)

    def judge(self, records: list[Record]) -> list[Change]:
        """Stamp each goldenable record with its golden verdict; returns the changes."""
        changes = []
        for r in records:
            if not goldenable(r):
                continue
            row = self._row(r)
            gf = self.file(row["device_class"], row["suite"])
            ch = compare_row(self._old(gf.path, golden.key_of(row)), row, r.family)
            if ch.kind == "new" and self.mode == "strict":
                ch.kind = "missing"
                ch.messages = [f"no golden row in {self._where(gf.path)} (strict: missing "
                               f"goldens fail; record them with --numcheck-refresh-new-only "
                               f"and commit)"]
            r.golden, r.golden_reason = Golden(ch.kind), "; ".join(ch.messages)
            if failing(r, self.mode) and r.status in (Status.PASSED, Status.KNOWN):
                # a binding golden verdict fails the record: its status says so, everywhere
                # (Record, tables, summaries); the golden verdict says why (issue 31)
                r.status = Status.FAILED
            changes.append(ch)
        return changes

    def finish(self, records: list[Record], provenance: dict[str, str]) -> FinishReport:
        """Merge what ran into the goldens (refresh modes, prune) and report."""
        rep = FinishReport()
        by_file: dict[Path, dict[tuple, dict]] = defaultdict(dict)
        ran_pairs: dict[Path, set] = defaultdict(set)
        family_of: dict[tuple, str] = {}
        for r in records:
            if not r.suite or r.status == Status.SKIPPED:
                continue
            row = self._row(r)
            path = golden.path_for(self.dir, row["device_class"], row["suite"])
            ran_pairs[path].add((row["op"], row["kernel"]))
            if goldenable(r):
                by_file[path][golden.key_of(row)] = row
                family_of[golden.key_of(row)] = r.family
        for path in sorted(set(by_file) | set(ran_pairs)):
            dc, suite = path.parent.name, path.stem
            gf = self.file(dc, suite)
            ran = by_file.get(path, {})
            unused = sorted(k for k, row in gf.rows.items()
                            if k not in ran and (row["op"], row["kernel"]) in ran_pairs[path]
                            and row.get("case_set") in (None, self.case_set))
            if unused and not self.partial:
                rep.unused[path] = unused
            here = golden.platform_of(provenance)
            shipped = self._shipped.get(path)
            seen = sorted({p for g in (gf, shipped) if g is not None
                           for row in g.rows.values() for p in golden.platforms_of(row)})
            if seen and here not in seen:
                rep.isa_notes.append(
                    f"{path}: goldens recorded on {' | '.join(seen)}; this machine is {here} "
                    f"({golden.platform_difference(seen[0], here)}): differences within the "
                    f"cross-platform slack are reported as drift, not failures")
            if self.mode == "strict":
                continue
            rows = dict(gf.rows)
            touched = False
            if self.mode in ("refresh", "refresh-new"):
                for k, row in ran.items():
                    old = self._old(path, k)
                    if self.mode == "refresh-new" and old is not None:
                        continue
                    bad = _new_nonfinite(row, old)
                    if bad and not self.allow_nonfinite:
                        rep.refused.append(f"{'/'.join(map(str, k[1:5]))}: {bad}; the golden "
                                           f"keeps its old row (allow with "
                                           f"--numcheck-refresh-allow-nonfinite)")
                        continue
                    ch = compare_row(old, row, family_of.get(k))
                    if _merges(old, row):  # another platform: widen the envelope
                        row = golden.merge_envelope(old, row)
                        ch.messages.append(f"merged into the envelope of "
                                           f"{golden.platforms_of(old)}")
                        ch.kind = "merged" if ch.kind in ("same", "drift", "improved") \
                            else ch.kind
                    touched = True
                    if old is None or not golden.rows_equal(old, row):
                        rep.changes.append(ch)
                    elif k not in gf.rows:
                        continue  # the shipped row holds: the user's file needs no copy
                    rows[k] = row
            if self.prune and unused:
                for k in unused:
                    rows.pop(k, None)
                rep.pruned += len(unused)
                rep.unused.pop(path, None)
                touched = True
            if touched:
                if (gf.exists or rows) and golden.write(gf, rows, provenance):
                    rep.written.append(path)
                else:
                    rep.unchanged.append(path)
                    if shipped is not None and shipped.exists and not gf.exists:
                        # say where the goldens are, as nothing was written
                        rep.isa_notes.append(f"{path}: not written, the rows that ran equal "
                                             f"the shipped goldens in {shipped.path}")
        return rep


def _merges(old: dict | None, new: dict) -> bool:
    """Does a refresh merge ``new`` into ``old``'s envelope instead of replacing it? When the
    golden holds another platform's values for the same inputs (curves: always replaced, their
    band is the convergence rule's own envelope)."""
    if old is None or not families.of_row(new).merges(old, new):
        return False
    if old.get("input_digest") != new.get("input_digest"):
        return False
    return bool(set(golden.platforms_of(old)) - set(golden.platforms_of(new)))


def _new_nonfinite(row: dict, old: dict | None) -> str:
    """Why a row must not be baked into a golden: a NaN/inf the reference does not have, or
    what the row's family says (telemetry: a NaN statistic or new non-finite elements)."""
    own = families.of_row(row).unbakeable(row, old)
    if own is not None:
        return own
    mm = row.get("kernel_nonfinite_mismatch") or 0
    if mm and (old is None or mm > (old.get("kernel_nonfinite_mismatch") or 0)):
        return f"{mm} element(s) non-finite where the FP64 reference is not (or the reverse)"
    for col in ("kernel_rel_l2", "kernel_sqnr_db"):
        v = row.get(col)
        if isinstance(v, float) and math.isnan(v):
            return f"{col} is NaN"
    if row.get("series") is not None and any(not math.isfinite(x) for x in row["series"]):
        return "the curve holds NaN/inf"
    return ""
