"""Where the built-in suites and the shipped goldens are: inside the installed package, or in
the source checkout this package was imported from.

A wheel carries them as ``numcheck/_builtin/suites`` and ``numcheck/_builtin/golden``
(pyproject.toml maps the checkout's top-level ``suites/`` and ``golden/`` there, DESIGN.md's
layout). An editable install or a checkout on ``sys.path`` has no ``_builtin`` folder and uses
the checkout's own folders, so a refresh there rewrites the goldens under version control.
The shipped goldens of an installed package are read-only: ``numcheck run`` reads them beneath
the user's golden folder, and a refresh writes to the user's folder (``numcheck.goldens.session``).
"""
from __future__ import annotations

from pathlib import Path

from numcheck.errors import UsageError

_PACKAGE = Path(__file__).resolve().parent.parent  # numcheck/, this module being numcheck/frontends/builtin.py


def _find(kind: str) -> Path | None:
    installed = _PACKAGE / "_builtin" / kind
    if installed.is_dir():
        return installed
    checkout = _PACKAGE.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / kind).is_dir():
        return checkout / kind
    return None


def suites_dir() -> Path:
    """The folder of the built-in suite modules (``test_<suite>.py``)."""
    found = _find("suites")
    if found is None:
        raise UsageError(f"built-in suites not found in {_PACKAGE / '_builtin'}: this numcheck "
                         f"install is incomplete; reinstall it (pip install --force-reinstall "
                         f"numcheck)")
    return found


def golden_dir() -> Path | None:
    """The shipped goldens (``<device_class>/<suite>.parquet``); None when not shipped."""
    return _find("golden")


def is_checkout() -> bool:
    """Is numcheck running from a source checkout (editable install), not a wheel?"""
    return not (_PACKAGE / "_builtin").is_dir() and _find("suites") is not None


def suite_names() -> list[str]:
    """The built-in suites' names (``suites/test_<name>.py``), [] where none are installed."""
    found = _find("suites")
    return [] if found is None else [p.stem[len("test_"):] for p in sorted(found.glob("test_*.py"))]


def suite_files(names: list[str] | None = None) -> list[Path]:
    """The built-in suites' modules, all or the ``names`` given; UsageError for unknown ones."""
    known = {p.stem[len("test_"):]: p for p in sorted(suites_dir().glob("test_*.py"))}
    if not names:
        return list(known.values())
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(f"--suite {', '.join(bad)}: unknown; built-in suites: "
                         f"{', '.join(known)}")
    return [known[n] for n in names]


def runs_builtin_suites(args: list[str]) -> bool:
    """Do pytest's command-line ``args`` name the built-in suites (their folder or modules)?"""
    found = _find("suites")
    if found is None:
        return False
    root = found.resolve()
    for a in args:
        p = Path(a.split("::", 1)[0]).resolve()
        if p == root or p.is_relative_to(root):
            return True
    return False
