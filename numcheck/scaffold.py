"""``numcheck init``: set numcheck up in a user's repository.

What it writes, relative to the repository's root:

* the ini keys (``KEYS``) into the configuration file pytest reads there, found in pytest's own
  order (pytest.toml, pytest.ini, pyproject.toml, tox.ini, setup.cfg); without one, a new
  ``[tool.pytest.ini_options]`` table in pyproject.toml, else a new pytest.ini;
* ``.github/workflows/numcheck.yml``: a CPU job on GitHub's runners and a GPU job on a
  self-hosted runner labelled ``gpu``, both ``pytest --numcheck-strict``;
* the ``.gitattributes`` line ``*.parquet diff=numcheck`` and, in a git repository, the
  per-clone ``git config diff.numcheck.textconv "numcheck show"`` (docs/goldens.md);
* a first test, ``tests/test_numcheck_example.py`` (under the first ``testpaths`` entry if set).

A rerun changes no byte. numcheck's own files (the workflow, the example test) are overwritten
only with ``force``; shared files (the pytest configuration, .gitattributes) only ever get lines
added, force or not: a key the user already set keeps its value. Everything is planned, every
configuration file parsed, before the first write, so a usage error leaves the repository as
it was. Files are read and written as bytes so that CRLF files keep their line ends.
"""
from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

from .errors import UsageError
from .version import __version__

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself requires tomli there
    import tomli as tomllib

Action = tuple[str, str]

KEYS = {"numcheck_golden_dir": "golden",
        "numcheck_results": "results/numcheck-results.parquet",
        "numcheck_cases": "quick"}
TEXTCONV = "numcheck show"
EXAMPLE = "test_numcheck_example.py"
WORKFLOW = ".github/workflows/numcheck.yml"
_ATTRIBUTE = "*.parquet diff=numcheck"
_KEYS_COMMENT = "# numcheck: golden folder, results file, case set (quick|full); see pytest --help"

# The files pytest reads its configuration from, in its own order of precedence
# (_pytest.config.findpaths, pytest 9): the first that holds pytest configuration is the one pytest
# reads, so it is the one to edit. (file, table, TOML?); pytest.toml and pytest.ini count even
# without their table. In pyproject.toml a native [tool.pytest] table wins over ini_options.
_CONFIGS = [("pytest.toml", "pytest", True), (".pytest.toml", "pytest", True),
            ("pytest.ini", "pytest", False), (".pytest.ini", "pytest", False),
            ("pyproject.toml", "tool.pytest.ini_options", True),
            ("tox.ini", "pytest", False), ("setup.cfg", "tool:pytest", False)]


def init_project(root: str | Path, *, force: bool = False) -> list[Action]:
    """Set numcheck up in the repository at ``root``; one (action, what) per item: ``wrote``,
    ``updated`` (keys added to an existing file), ``replaced`` (force), ``kept`` (differs; left
    as is), ``unchanged``, ``configured`` / ``skipped`` (the git textconv driver).
    UsageError when ``root`` is not a folder or a configuration file cannot be parsed."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder (numcheck init --root: the repository's root)")
    cfg_action, cfg_write, settings = _plan_config(root)
    value = {k: str(settings.get(k, v)) for k, v in KEYS.items()}  # a user's own value stays
    plans = [(cfg_action, cfg_write),
             _plan_owned(root, WORKFLOW, _workflow(value["numcheck_golden_dir"],
                                                   value["numcheck_results"]), force),
             _plan_gitattributes(root)]
    example = f"{_test_dir(settings.get('testpaths'))}/{EXAMPLE}"
    plans.append(_plan_owned(root, example, EXAMPLE_TEST, force))
    for _, write in plans:
        if write is not None:
            path, text = write
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode("utf-8"))
    actions = [a for a, _ in plans]
    # the git setting is reported beside .gitattributes, whose line it serves
    return actions[:3] + [_git_textconv(root, force)] + actions[3:]


def render(actions: list[Action]) -> str:
    """What ``numcheck init`` prints: one line per action and the next step."""
    lines = [f"{action:>10} {what}" for action, what in actions]
    lines.append("next: run `pytest --numcheck-refresh` once to record the goldens, review "
                 "and commit them with the files above; CI runs `pytest --numcheck-strict`")
    return "\n".join(lines)


# --- files ---------------------------------------------------------------------------------------

def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text ({e})") from e


def _plan_owned(root: Path, rel: str, text: str, force: bool):
    """A file numcheck owns entirely: written when absent, replaced only with force."""
    path = root / rel
    if not path.exists():
        return ("wrote", rel), (path, text)
    if not path.is_file():
        raise UsageError(f"{path}: exists and is not a file")
    if path.read_bytes() == text.encode("utf-8"):
        return ("unchanged", rel), None
    if force:
        return ("replaced", rel), (path, text)
    return ("kept", f"{rel} (differs from numcheck's; --force overwrites it)"), None


def _append(text: str, lines: list[str]) -> str:
    """``text`` with ``lines`` added at its end, in its own line ends."""
    eol = "\r\n" if "\r\n" in text else "\n"
    if text and not text.endswith("\n"):
        text += eol
    return text + "".join(line + eol for line in lines)


def _plan_gitattributes(root: Path):
    path, rel = root / ".gitattributes", ".gitattributes"
    text = _read(path) if path.exists() else ""
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["*.parquet"] and "diff=numcheck" in fields[1:]:
            return ("unchanged", f"{rel} ({_ATTRIBUTE})"), None
    new = _append(text, ["# numcheck goldens diff as sorted text with the textconv driver: "
                         f'git config diff.numcheck.textconv "{TEXTCONV}"', _ATTRIBUTE])
    return ("updated" if text else "wrote", f"{rel} ({_ATTRIBUTE})"), (path, new)


def _git_textconv(root: Path, force: bool) -> Action:
    """git config is per clone, so it cannot be committed: set it in this clone, and say it."""
    command = f'git config diff.numcheck.textconv "{TEXTCONV}"'
    git = shutil.which("git")
    if git is None:
        return "skipped", f"{command} (git not found; run it once in each clone)"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True)

    if run("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        return "skipped", f"{command} (not a git repository; run it once in each clone)"
    current = run("config", "--get", "diff.numcheck.textconv").stdout.strip()  # any scope
    if current == TEXTCONV:
        return "unchanged", command
    if current and not force:
        return "kept", f"{command} (this clone has {current!r}; --force sets it)"
    done = run("config", "--local", "diff.numcheck.textconv", TEXTCONV)
    if done.returncode:
        return "skipped", f"{command} (git config failed: {done.stderr.strip()})"
    return "configured", f"{command} (this clone; run it once in every other clone)"


# --- the pytest configuration ------------------------------------------------------------------

def _parse(path: Path, text: str, toml: bool) -> dict:
    """The file as nested dicts (TOML), or {section: {key: value}} (ini, parsed by iniconfig as
    pytest parses it). UsageError naming the file when it cannot be parsed."""
    import iniconfig

    try:
        if toml:
            return tomllib.loads(text)
        return {s.name: dict(s.items()) for s in iniconfig.IniConfig(str(path), data=text)}
    except (tomllib.TOMLDecodeError, iniconfig.ParseError) as e:
        raise UsageError(f"{path}: cannot parse it ({e}); fix it and rerun numcheck init") from e


def _path(table: str, toml: bool) -> list[str]:
    return table.split(".") if toml else [table]


def _get(doc: dict, table: str, toml: bool) -> dict | None:
    for name in _path(table, toml):
        doc = doc.get(name) if isinstance(doc, dict) else None
    return doc if isinstance(doc, dict) else None


def _find_config(root: Path) -> tuple[Path, str, bool, dict]:
    """The file pytest reads (it may not exist yet), its table and parsed content."""
    for name, table, toml in _CONFIGS:
        path = root / name
        if not path.is_file():
            continue
        doc = _parse(path, _read(path), toml)
        if name == "pyproject.toml":
            pytest_table = _get(doc, "tool.pytest", True) or {}
            if set(pytest_table) - {"ini_options"}:
                return path, "tool.pytest", True, doc
            if "ini_options" not in pytest_table:
                continue  # no pytest configuration: pytest looks on (tox.ini, setup.cfg)
        elif name in ("tox.ini", "setup.cfg") and _get(doc, table, toml) is None:
            continue
        return path, table, toml, doc
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        return pyproject, "tool.pytest.ini_options", True, _parse(pyproject, _read(pyproject), True)
    return root / "pytest.ini", "pytest", False, {}


def _region(lines: list[str], table: str, toml: bool) -> tuple[int, int] | None:
    """Indices of the table's header line and of the line after its last line."""
    if toml:
        name = r"\s*\.\s*".join(re.escape(p) for p in table.split("."))
        header, other = re.compile(rf"\s*\[\s*{name}\s*\]\s*(#.*)?$"), re.compile(r"\s*\[")
    else:  # ini: headers start the line; indented lines continue a value
        header, other = re.compile(rf"\[{re.escape(table)}\]\s*([#;].*)?$"), re.compile(r"\[")
    bare = [line.rstrip("\r\n") for line in lines]
    start = next((i for i, line in enumerate(bare) if header.match(line)), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(bare)) if other.match(bare[i])), len(bare))
    return start, end


def _plan_config(root: Path):
    path, table, toml, doc = _find_config(root)
    existing = _get(doc, table, toml)
    have = existing or {}
    missing = {k: v for k, v in KEYS.items() if k not in have}
    rel = f"{path.name} [{table}]"
    if not missing:
        return ("unchanged", f"{rel}: {', '.join(KEYS)}"), None, have
    new_lines = [_KEYS_COMMENT] + [f"{k} = {_quote(v) if toml else v}" for k, v in missing.items()]
    text = _read(path) if path.exists() else ""
    lines = text.splitlines(keepends=True)
    eol = "\r\n" if "\r\n" in text else "\n"
    where = _region(lines, table, toml)
    if existing is None:  # no table yet: a new one at the end, after a blank line
        new = _append(text, ([""] if text.strip() else []) + [f"[{table}]"] + new_lines)
    elif where is None:  # the table exists in a form edited as text here would break
        raise UsageError(_by_hand(path, table, new_lines, "its table is not a plain [header]"))
    else:
        start, end = where
        # after the table's last key, before blank lines and comments that lead the next table
        at = max([i for i in range(start, end)
                  if lines[i].strip() and not lines[i].lstrip().startswith(("#", ";"))]) + 1
        if not lines[at - 1].endswith("\n"):  # the file's last line
            lines[at - 1] += eol
        new = "".join(lines[:at] + [line + eol for line in new_lines] + lines[at:])
    # The edit is text, so check it: the file must parse to what it held plus the keys.
    want = copy.deepcopy(doc)
    node = want
    for name in _path(table, toml):
        node = node.setdefault(name, {})
    node.update(missing)
    if _parse(path, new, toml) != want:
        raise UsageError(_by_hand(path, table, new_lines, "adding them as text would change it"))
    action = "updated" if path.exists() else "wrote"
    return (action, f"{rel}: {', '.join(missing)}"), (path, new), {**have, **missing}


def _quote(value: str) -> str:
    """A TOML basic string (the values here are plain paths and words)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _by_hand(path: Path, table: str, lines: list[str], why: str) -> str:
    return (f"{path}: cannot add numcheck's keys safely ({why}); add these lines to its "
            f"[{table}] by hand and rerun numcheck init:\n" + "\n".join(lines))


def _test_dir(testpaths) -> str:
    """The first plain folder of pytest's testpaths (a list, or a whitespace-separated string
    in ini files), else tests."""
    entries = testpaths.split() if isinstance(testpaths, str) else list(testpaths or [])
    for entry in entries:
        entry = str(entry).strip().rstrip("/")
        if entry.startswith("./"):
            entry = entry[2:]
        if entry and entry not in (".", "..") and not re.search(r"[*?\[]", entry) \
                and not Path(entry).is_absolute() and not entry.endswith(".py"):
            return entry
    return "tests"


# --- templates -----------------------------------------------------------------------------------

def _workflow(golden_dir: str, results: str) -> str:
    return (_WORKFLOW.replace("@VERSION@", __version__).replace("@GOLDEN_DIR@", golden_dir)
            .replace("@RESULTS@", results))


# @GOLDEN_DIR@ / @RESULTS@: the ini keys' values at init time; placeholders, not str.format,
# because GitHub's ${{ }} expressions are full of braces.
_WORKFLOW = """\
# numcheck: this repository's kernels against FP64 references and the committed goldens.
# Written by `numcheck init` (numcheck @VERSION@); edit it freely: numcheck init keeps a changed
# file unless run with --force.
#
# Goldens are per device class (@GOLDEN_DIR@/cpu, @GOLDEN_DIR@/cuda-smXY) and both jobs run
# strict: a case without a golden fails. Record them with `pytest --numcheck-refresh` on a machine
# of that class and commit them, or run this workflow by hand with "refresh" ticked (Actions >
# numcheck > Run workflow) and commit the goldens from the job's artifact.
name: numcheck
on:
  push:
  pull_request:
  workflow_dispatch:
    inputs:
      refresh:
        description: "record goldens (--numcheck-refresh) instead of checking against them"
        type: boolean
        default: false
permissions:
  contents: read
jobs:
  cpu:
    runs-on: ubuntu-latest
    timeout-minutes: 60
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with: {python-version: "3.11"}
      # torch's CPU wheel from PyTorch's index: PyPI's default torch is a multi-GB CUDA build.
      # The extra index keeps a torch pinned in requirements.txt on the CPU build too.
      - name: install
        env:
          PIP_EXTRA_INDEX_URL: https://download.pytorch.org/whl/cpu
        run: |
          python -m pip install torch --index-url https://download.pytorch.org/whl/cpu
          if [ -f requirements.txt ]; then python -m pip install -r requirements.txt; fi
          if [ -f setup.py ] || grep -q '^\\[project\\]' pyproject.toml 2>/dev/null; then python -m pip install -e .; fi
          python -m pip install "numcheck==@VERSION@"
      - name: pytest
        run: python -m pytest ${{ inputs.refresh && '--numcheck-refresh' || '--numcheck-strict' }} --numcheck-device=cpu
      - name: report
        if: always() && hashFiles('@RESULTS@') != ''
        run: numcheck report @RESULTS@ >> "$GITHUB_STEP_SUMMARY"
      - if: always()
        uses: actions/upload-artifact@v4
        with:
          name: numcheck-cpu
          path: |
            @RESULTS@
            @GOLDEN_DIR@/
  gpu:
    # A self-hosted runner labelled `gpu`: a CUDA GPU, its driver, and a CUDA build of torch in
    # its python3. Delete this job if you have none.
    runs-on: [self-hosted, gpu]
    timeout-minutes: 60
    steps:
      - uses: actions/checkout@v4
      # Keep the runner's CUDA torch: the venv sees python3's packages and installs no torch
      # (numcheck asks for torch>=2.4, which it satisfies).
      - name: install
        run: |
          python3 -m venv --system-site-packages .venv
          .venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'this runner has no CUDA build of torch or no GPU'"
          if [ -f requirements.txt ]; then .venv/bin/python -m pip install -r requirements.txt; fi
          if [ -f setup.py ] || grep -q '^\\[project\\]' pyproject.toml 2>/dev/null; then .venv/bin/python -m pip install -e .; fi
          .venv/bin/python -m pip install "numcheck==@VERSION@"
      - name: pytest
        run: .venv/bin/python -m pytest ${{ inputs.refresh && '--numcheck-refresh' || '--numcheck-strict' }} --numcheck-device=cuda
      - name: report
        if: always() && hashFiles('@RESULTS@') != ''
        run: .venv/bin/numcheck report @RESULTS@ >> "$GITHUB_STEP_SUMMARY"
      - if: always()
        uses: actions/upload-artifact@v4
        with:
          name: numcheck-cuda
          path: |
            @RESULTS@
            @GOLDEN_DIR@/
"""

EXAMPLE_TEST = '''\
"""numcheck's first check in this repository, written by `numcheck init`.

Replace my_rms_norm with your own kernel (import it from your package), or copy the test once
per kernel and op. Then record the goldens once and commit them:

    pytest --numcheck-refresh     # writes <golden dir>/<device class>/numcheck_example.parquet

From then on every run compares each case's error statistics with them: a kernel change that
costs a fraction of a bit fails. CI runs `pytest --numcheck-strict` (a case without a golden
fails). Ops and their signatures: numcheck's docs/DESIGN.md, "Op signatures".
"""
import torch


def my_rms_norm(x, weight, eps):
    # The op's signature, rms_norm(x, weight, eps), over the last dim; fp32 math, x's dtype out.
    xf = x.float()
    inv_rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * inv_rms * weight.float()).to(x.dtype)


def test_my_rms_norm(numcheck):
    # The op's case set (dtypes x shapes x input distributions x layouts), forward and backward,
    # against an FP64 reference and a naive same-precision baseline; fails the test on a
    # numerical failure or a regression against the golden.
    numcheck.verify("rms_norm", my_rms_norm)
'''
