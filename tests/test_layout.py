"""The floor plan (docs/DESIGN.md, "The code as built"): the folder listing shows the flow.

Checked here, each able to fail (the walkers are tried on planted examples first): at most
MAX_TOP_LEVEL modules beside the packages, no module over MAX_LINES lines, no two modules with
the same file name, every registered family a ``Family``, and no comparison with a family's
name outside the family's own package (a family's behaviour is asked of its ``Family`` object,
numcheck.verdicts.families; the import graph itself is tests/test_imports.py's).
"""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import numcheck
from numcheck.verdicts import families
from numcheck.verdicts.family import Family

PKG = Path(numcheck.__file__).parent
# The targets ("at most ~15 top-level modules; no module over ~700 lines").
MAX_TOP_LEVEL = 15
MAX_LINES = 700
# Where a family's name may be compared: its own package, and the registry. "ops" and "quant"
# are suite names too (registry.SUITES, catalog), so only the comparisons with a record's or a
# row's family are checked for them.


def _homes() -> dict[str, tuple[str, ...]]:
    """Where each registered family may name itself: the package of the module that defines its
    Family (a new family is covered as soon as it is registered); the default family's is its
    rules module and the op files."""
    homes = {}
    for name in families.FAMILIES:
        parts = type(families.get(name)).__module__.split(".")[1:]
        homes[name] = ("/".join(parts) + ".py", "ops/") if name == families.DEFAULT \
            else (parts[0] + "/",)
    return homes


HOMES = _homes()
SUITE_NAMES = {"ops", "quant"}
# The registry, and the package's public names (nc.fingerprint, nc.telemetry: words, not families)
EXEMPT = {"verdicts/families.py", "__init__.py"}


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "_builtin" not in p.parts)


def _family_refs(node: ast.AST) -> bool:
    """Does an expression read a family (``x.family``, ``family``, ``family_of_row(...)``)?"""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr == "family":
            return True
        if isinstance(n, ast.Name) and n.id == "family":
            return True
        if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) \
                == "family_of_row":
            return True
    return False


def family_branches(source: str, rel: str) -> list[str]:
    """Comparisons with a family's name in ``source`` (module path ``rel``) outside its home."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        parts = [node.left, *node.comparators]
        names = {c.value for p in parts for c in ast.walk(p)
                 if isinstance(c, ast.Constant) and c.value in HOMES}
        for name in names:
            if rel.startswith(HOMES[name]) or rel in EXEMPT:
                continue
            if name in SUITE_NAMES and not any(_family_refs(p) for p in parts):
                continue
            found.append(f"numcheck/{rel}:{node.lineno} compares with family {name!r}")
    return found


def test_the_checks_can_fail():
    assert family_branches('if r.family == "ops": pass', "goldens/session.py")
    assert family_branches('x = row.get("output") in ("fingerprint", "telemetry")', "report/x.py")
    assert not family_branches('if suite == "quant": pass', "catalog.py")
    assert not family_branches('if r.family == "telemetry": pass', "telemetry/floors.py")


def test_top_level_is_short():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} top-level modules: {top}"


def test_no_module_is_long():
    long = {str(p.relative_to(PKG)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_module_file_names_are_unique():
    names = Counter(p.name for p in _modules() if p.name != "__init__.py")
    twice = {n: [str(p.relative_to(PKG)) for p in _modules() if p.name == n]
             for n, c in names.items() if c > 1}
    assert not twice, f"modules sharing a file name: {twice}"


def test_no_family_name_branches_outside_family_packages():
    found = [f for p in _modules()
             for f in family_branches(p.read_text(), p.relative_to(PKG).as_posix())]
    assert not found, "\n".join(found)


def test_every_registered_family_is_a_family():
    for name in families.FAMILIES:
        fam = families.get(name)
        assert isinstance(fam, Family) and fam.name == name, name
    # every registered family but the default one says which rows are its own
    assert all(type(families.get(n)).holds is not Family.holds
               for n in families.FAMILIES if n != families.DEFAULT)
