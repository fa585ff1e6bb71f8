"""The families of records, registered here and nowhere else (numcheck.verdicts.family).

A new family is a package that implements ``Family`` and one line below. Each is imported on
first use: a reader of goldens or results (numcheck compare, report) loads the families its rows
hold and their ``holds`` tests, never torch. Constant module names: the import-graph test sees
these edges.
"""
from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from numcheck.records import Record
    from numcheck.verdicts.family import Family

# Registration order is the order of the reports' sections and of the ``holds`` questions;
# "ops" is the default family (users' ops have none of their own).
FAMILIES: dict[str, Callable[[], Family]] = {
    "ops": lambda: importlib.import_module("numcheck.verdicts.policy").OP_RULES,
    "quant": lambda: importlib.import_module("numcheck.quant.quant_rules").QUANT_RULES,
    "convergence": lambda: importlib.import_module(
        "numcheck.convergence.convergence_rules").CONVERGENCE_RULES,
    "fingerprint": lambda: importlib.import_module(
        "numcheck.forensics.fingerprint_rules").FINGERPRINT_RULES,
    "telemetry": lambda: importlib.import_module(
        "numcheck.telemetry.telemetry_family").TELEMETRY_RULES,
}
DEFAULT = "ops"


@functools.cache  # asked once per record or golden row
def get(family: str) -> Family:
    """The family's ``Family`` (the default family's for a name without one: users' ops)."""
    return FAMILIES.get(family, FAMILIES[DEFAULT])()


def family_of_row(row: dict) -> str:
    """The family of a golden or results row: its ``family`` column, or for rows without one
    (golden files, results written before the column existed) the first family that holds it
    (the default family's rows are the rest)."""
    if row.get("family"):
        return row["family"]
    for name in FAMILIES:
        if name != DEFAULT and get(name).holds(row):
            return name
    return DEFAULT


def of_row(row: dict) -> Family:
    return get(family_of_row(row))


def of(record: Record) -> Family:
    return get(record.family)


def sections(records: list[Record], plot_path=None) -> str:
    """The markdown sections of the families that have records, in registration order."""
    parts = []
    for name in FAMILIES:
        rs = [r for r in records if r.family == name]
        if rs:
            parts.append(get(name).section(rs, plot_path))
    return "\n".join(p for p in parts if p)
