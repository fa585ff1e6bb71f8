"""The user's pytest configuration file: which one pytest reads, and numcheck's keys in it.

One place for the lookup that ``numcheck init`` (which edits the file) and ``numcheck run`` /
``refresh`` (which pass its ``numcheck_*`` keys to pytest) both need. It follows pytest 9's own
(``_pytest.config.findpaths.locate_config``), parsing each candidate as pytest parses it (tomllib,
or tomli before Python 3.11, for TOML; iniconfig, pytest's own dependency, for ini and cfg) rather
than looking for substrings. Torch-free and cheap: the CLI imports it before any suite.

From the start folder upwards, each folder's files in pytest's order; the first that holds pytest
configuration is the one pytest reads:

=================================  ============================================================
``pytest.toml``, ``.pytest.toml``  always (even empty); table ``[pytest]``
``pytest.ini``, ``.pytest.ini``    always (even empty); section ``[pytest]``
``pyproject.toml``                 with ``[tool.pytest]`` (TOML types) or
                                   ``[tool.pytest.ini_options]`` (ini strings)
``tox.ini``                        with a ``[pytest]`` section
``setup.cfg``                      with a ``[tool:pytest]`` section
=================================  ============================================================

When no folder has one, pytest falls back on the first ``pyproject.toml`` it passed (its rootdir,
no configuration), and so does :func:`find_config`. Files pytest refuses (``[tool.pytest]``
beside ``[tool.pytest.ini_options]``, options outside ``[pytest]`` in pytest.toml, ``[pytest]`` in
setup.cfg) and files that cannot be parsed are a :class:`~numcheck.errors.UsageError` naming the
file, as pytest would stop on them too.
"""
from __future__ import annotations

import datetime
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from numcheck.errors import UsageError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself requires tomli there
    import tomli as tomllib

# pytest 9's names, in its order of precedence within one folder (CONFIG_LOADERS_BY_NAME)
CONFIG_NAMES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml",
                "tox.ini", "setup.cfg")
_ALWAYS = CONFIG_NAMES[:4]  # these are pytest's configuration even without their section


@dataclass(frozen=True)
class Config:
    """One configuration file, parsed.

    ``table``: the name of its pytest section as written in a header: ``pytest`` (pytest.toml,
    pytest.ini, tox.ini), ``tool:pytest`` (setup.cfg), ``tool.pytest`` or
    ``tool.pytest.ini_options`` (pyproject.toml); the one to add when ``section`` is None.
    ``doc``: the whole file: TOML as nested dicts, ini as ``{section: {key: str}}``.
    ``section``: that section's keys and values (TOML types in TOML mode), None without one."""

    path: Path
    toml: bool
    table: str
    doc: dict
    section: dict | None

    @property
    def is_pytest_config(self) -> bool:
        """Whether pytest takes this file as its configuration in the upward search."""
        return self.section is not None or self.path.name in _ALWAYS


def load_config(path: str | Path, text: str | None = None) -> Config:
    """Parse ``path`` (or ``text`` as if it were that file's content) as pytest does, by its
    name; another name (a ``-c`` file) by its suffix: ``.toml`` as pyproject.toml or with a
    ``[pytest]`` table, ``.cfg`` as setup.cfg, anything else as an ini file with ``[pytest]``. UsageError naming the file when it cannot be read or parsed, or
    holds a pytest configuration pytest itself refuses."""
    import iniconfig

    path = Path(path)
    if text is None:
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as e:
            raise UsageError(f"{path}: cannot read it ({e})") from e
        except UnicodeDecodeError as e:
            raise UsageError(f"{path}: not UTF-8 text ({e})") from e
    toml = path.suffix == ".toml"
    try:
        if toml:
            doc = tomllib.loads(text)
        else:
            doc = {s.name: dict(s.items()) for s in iniconfig.IniConfig(str(path), data=text)}
    except (tomllib.TOMLDecodeError, iniconfig.ParseError) as e:
        raise UsageError(f"{path}: cannot parse it ({e}); fix it and rerun") from e

    if path.name in ("pytest.toml", ".pytest.toml"):
        section = doc.get("pytest")
        loose = [k for k, v in doc.items() if not isinstance(v, dict)]
        if section is None and loose:
            raise UsageError(f"{path}: pytest reads options only under a [pytest] table "
                             f"(found outside any table: {', '.join(loose)})")
        return Config(path, True, "pytest", doc, _table(path, "pytest", section))
    if toml:
        tool = doc.get("tool")
        tool_pytest = tool.get("pytest") if isinstance(tool, dict) else None
        tool_pytest = _table(path, "tool.pytest", tool_pytest) or {}
        native = {k: v for k, v in tool_pytest.items() if k != "ini_options"}
        ini_options = _table(path, "tool.pytest.ini_options", tool_pytest.get("ini_options"))
        if native and ini_options is not None:
            raise UsageError(f"{path}: pytest refuses both [tool.pytest] and "
                             "[tool.pytest.ini_options] in one file; keep one of them")
        if native:
            return Config(path, True, "tool.pytest", doc, native)
        if ini_options is None and path.name != "pyproject.toml" and "pytest" in doc:
            # another name, passed by -c: pytest 9 also reads a [pytest] table there
            return Config(path, True, "pytest", doc, _table(path, "pytest", doc["pytest"]))
        return Config(path, True, "tool.pytest.ini_options", doc, ini_options)
    if path.name == "setup.cfg" or path.suffix == ".cfg":
        if "tool:pytest" not in doc and "pytest" in doc:
            raise UsageError(f"{path}: pytest no longer reads a [pytest] section in setup.cfg; "
                             "rename it [tool:pytest]")
        return Config(path, False, "tool:pytest", doc, doc.get("tool:pytest"))
    return Config(path, False, "pytest", doc, doc.get("pytest"))


def _table(path: Path, name: str, value):
    if value is not None and not isinstance(value, dict):
        raise UsageError(f"{path}: {name} is not a table")
    return value


def find_config(start: str | Path, *, stop: str | Path | None = None) -> Path | None:
    """The configuration file pytest 9 reads for a run started in the folder ``start`` with no
    path arguments (its ``inifile``; its folder is pytest's rootdir): ``start``'s files in
    pytest's order, then its parents', the first that holds pytest configuration (the module's
    table); else the first ``pyproject.toml`` passed, as pytest; else None.

    ``stop``: the last folder searched (a repository's top, say), when it is ``start`` or one of
    its parents; None, or a folder elsewhere: up to the filesystem's root. Paths are taken as
    absolute without resolving symbolic links, as pytest takes them. UsageError as
    :func:`load_config` for a candidate that cannot be parsed."""
    start = Path(os.path.abspath(start))
    if start.is_file():
        start = start.parent
    folders = [start, *start.parents]
    if stop is not None:
        stop = Path(os.path.abspath(stop))
        if stop in folders:
            folders = folders[:folders.index(stop) + 1]
    first_pyproject = None
    for folder in folders:
        for name in CONFIG_NAMES:
            path = folder / name
            if not path.is_file():
                continue
            if name == "pyproject.toml" and first_pyproject is None:
                first_pyproject = path
            if load_config(path).is_pytest_config:
                return path
    return first_pyproject


def numcheck_keys(path: str | Path) -> dict[str, str]:
    """The ``numcheck_*`` keys of the pytest section of the configuration file ``path``, each
    value as the string ``pytest -o name=value`` takes for it; {} when the file has no such
    section (a pyproject.toml without a pytest table).

    ini files' values are pytest's strings already (a continued value keeps its newlines). TOML
    values: strings as they are; booleans ``true`` / ``false`` (pytest's bool keys read either);
    integers, floats as ``str()``; dates and times in ISO format; arrays as their items joined
    by spaces, shell-quoted where an item needs it (what pytest's ``args``-type keys split back
    into the same list). A table value has no ``-o`` form: UsageError naming the file and key,
    as for a file that cannot be parsed."""
    config = load_config(path)
    return {key: _as_option(config.path, key, value)
            for key, value in (config.section or {}).items() if key.startswith("numcheck_")}


def _as_option(path: Path, key: str, value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value):
        return shlex.join(_as_option(path, key, v) for v in value)
    raise UsageError(f"{path}: {key} = {value!r}: pytest -o takes no table or nested array; "
                     "give it a string")
