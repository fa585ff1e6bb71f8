"""``numcheck init``: set numcheck up in a user's repository.

What it writes, relative to the repository's root:

* the ini keys (``KEYS``) into the configuration file pytest reads for runs there
  (numcheck.frontends.userconfig.find_config: pytest's own lookup, upwards up to the git work tree's top,
  so that in a monorepo package it is the repository's file, not a new one that would shadow
  it); without one, a new ``[tool.pytest.ini_options]`` table in root's pyproject.toml, else a
  new pytest.ini;
* ``.github/workflows/numcheck.yml``: a CPU job on GitHub's runners and a GPU job on a
  self-hosted runner labelled ``gpu``, both ``pytest --numcheck-strict``, both installing
  numcheck from the workflow's ``NUMCHECK_SPEC`` (numcheck_spec: where this numcheck was
  installed from when that is a URL, else ``numcheck==<version>``; init says which);
* the ``.gitattributes`` line ``*.parquet diff=numcheck`` and, in a git repository, the
  per-clone ``git config diff.numcheck.textconv "numcheck show"`` (docs/goldens.md);
* a first test, ``tests/test_numcheck_example.py`` (under the first ``testpaths`` entry in
  root if set).

A rerun changes no byte. numcheck's own files (the workflow, the example test) are overwritten
only with ``force``; shared files (the pytest configuration, .gitattributes) only ever get lines
added, force or not: a key the user already set keeps its value. Everything is planned, every
configuration file parsed, before the first write, so a usage error leaves the repository as
it was. Files are read and written as bytes so that CRLF files keep their line ends.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from numcheck.errors import UsageError
from numcheck.frontends.userconfig import Config, find_config, load_config
from numcheck.version import __version__

Action = tuple[str, str]

KEYS = {"numcheck_golden_dir": "golden",
        "numcheck_results": "results/numcheck-results.parquet",
        "numcheck_cases": "quick"}
TEXTCONV = "numcheck show"
EXAMPLE = "test_numcheck_example.py"
WORKFLOW = ".github/workflows/numcheck.yml"
_ATTRIBUTE = "*.parquet diff=numcheck"
_KEYS_COMMENT = "# numcheck: golden folder, results file, case set (quick|full); see pytest --help"


def init_project(root: str | Path, *, force: bool = False) -> list[Action]:
    """Set numcheck up in the repository at ``root``; one (action, what) per item: ``wrote``,
    ``updated`` (keys added to an existing file), ``replaced`` (force), ``kept`` (differs; left
    as is), ``unchanged``, ``configured`` / ``skipped`` (the git textconv driver), and ``check``
    (after a written workflow: its NUMCHECK_SPEC, to review).
    UsageError when ``root`` is not a folder or a configuration file cannot be parsed."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder (numcheck init --root: the repository's root)")
    root = root.resolve()  # the folders above it are searched, and compared with git's top
    cfg_action, cfg_write, settings, cfg_dir = _plan_config(root)
    value = {k: str(settings.get(k, v)) for k, v in KEYS.items()}  # a user's own value stays
    spec, why = numcheck_spec()
    plans = [(cfg_action, cfg_write),
             _plan_owned(root, WORKFLOW, _workflow(value["numcheck_golden_dir"],
                                                   value["numcheck_results"], spec), force),
             _plan_gitattributes(root)]
    example = f"{_test_dir(settings.get('testpaths'), cfg_dir, root)}/{EXAMPLE}"
    plans.append(_plan_owned(root, example, EXAMPLE_TEST, force))
    for _, write in plans:
        if write is not None:
            path, text = write
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode("utf-8"))
    actions = [a for a, _ in plans]
    if plans[1][1] is not None:  # the workflow was written: say where it installs numcheck from
        actions.insert(2, ("check", f"NUMCHECK_SPEC in {WORKFLOW}: {spec} ({why})"))
    # the git setting is reported beside .gitattributes, whose line it serves
    at = len(actions) - 1
    return actions[:at] + [_git_textconv(root, force)] + actions[at:]


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

def _git_top(root: Path) -> Path | None:
    """The top of the git work tree around ``root``; None outside one or without git."""
    git = shutil.which("git")
    if git is None:
        return None
    done = subprocess.run([git, "-C", str(root), "rev-parse", "--show-toplevel"],
                          capture_output=True, text=True)
    top = done.stdout.strip()
    return Path(top).resolve() if done.returncode == 0 and top else None


def _config_of(root: Path) -> Config:
    """The file to edit (it may not exist yet): the one pytest reads for runs in ``root``, found
    upwards up to the git work tree's top (the filesystem's root outside git), so that a
    monorepo package's keys go into the configuration its runs already use rather than into a
    new file there that would shadow it. Without one: root's pyproject.toml (a new table), else
    a new pytest.ini in root."""
    found = find_config(root, stop=_git_top(root))
    if found is not None:
        config = load_config(found)
        # a pyproject.toml without a pytest table counts only in root: pytest's fallback, not
        # configuration that a new file would shadow
        if config.is_pytest_config or found.parent == root:
            return config
    return Config(root / "pytest.ini", False, "pytest", {}, None)


def _path(table: str, toml: bool) -> list[str]:
    return table.split(".") if toml else [table]


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
    """(action, write, settings, folder): ``settings`` the pytest section's keys after the edit,
    ``folder`` the configuration file's (pytest's rootdir, which its testpaths are under)."""
    config = _config_of(root)
    path, table, toml, doc = config.path, config.table, config.toml, config.doc
    existing = config.section
    have = existing or {}
    missing = {k: v for k, v in KEYS.items() if k not in have}
    rel = f"{os.path.relpath(path, root)} [{table}]"
    if path.parent != root:
        rel += f" (pytest's configuration for runs in {root.name or root})"
    if not missing:
        return ("unchanged", f"{rel}: {', '.join(KEYS)}"), None, have, path.parent
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
    if load_config(path, new).doc != want:
        raise UsageError(_by_hand(path, table, new_lines, "adding them as text would change it"))
    action = "updated" if path.exists() else "wrote"
    return (action, f"{rel}: {', '.join(missing)}"), (path, new), {**have, **missing}, path.parent


def _quote(value: str) -> str:
    """A TOML basic string (the values here are plain paths and words)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _by_hand(path: Path, table: str, lines: list[str], why: str) -> str:
    return (f"{path}: cannot add numcheck's keys safely ({why}); add these lines to its "
            f"[{table}] by hand and rerun numcheck init:\n" + "\n".join(lines))


def _test_dir(testpaths, base: Path, root: Path) -> str:
    """The first plain folder of pytest's testpaths (a list, or a whitespace-separated string
    in ini files; relative to ``base``, the configuration file's folder) that lies in ``root``,
    as a path relative to root; else tests."""
    entries = testpaths.split() if isinstance(testpaths, str) else list(testpaths or [])
    for entry in entries:
        entry = str(entry).strip().rstrip("/")
        if entry.startswith("./"):
            entry = entry[2:]
        if not entry or entry in (".", "..") or re.search(r"[*?\[]", entry) \
                or Path(entry).is_absolute() or entry.endswith(".py"):
            continue
        if base == root:
            return entry
        where = Path(os.path.normpath(base / entry))
        if root in where.parents:  # a parent's configuration: its testpaths inside root only
            return where.relative_to(root).as_posix()
    return "tests"


# --- templates -----------------------------------------------------------------------------------

def _workflow(golden_dir: str, results: str, spec: str) -> str:
    return (_WORKFLOW.replace("@VERSION@", __version__).replace("@GOLDEN_DIR@", golden_dir)
            .replace("@RESULTS@", results).replace("@SPEC@", json.dumps(spec)))


_SPEC_HINT = "set it to a version on your CI's index, a wheel URL, or git+https://...@tag"


def numcheck_spec() -> tuple[str, str]:
    """(spec, why): what the workflow's jobs ``pip install`` for numcheck, and why that: see
    spec_for, for this installation of numcheck."""
    return spec_for(_direct_url())


def spec_for(direct_url: str | None) -> tuple[str, str]:
    """(spec, why) for a numcheck installed with ``direct_url`` (the text of PEP 610's
    direct_url.json, which pip records; None: none). Installed from a URL that is not a local
    file: that URL (``numcheck @ URL``, ``numcheck @ git+URL@revision``); else the pin
    ``numcheck==<this version>``, which only an index that hosts numcheck serves."""
    pin = f"numcheck=={__version__}"
    try:
        info = json.loads(direct_url) if direct_url else None
    except ValueError:
        info = None
    url = info.get("url") if isinstance(info, dict) else None
    if not isinstance(url, str) or not url:
        return pin, f"numcheck {__version__} must be on your CI's package index; else {_SPEC_HINT}"
    if url.startswith("file:"):
        return pin, (f"this numcheck was installed from a local path, {url}, which CI cannot "
                     f"reach: {_SPEC_HINT}")
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs"):
        revision = vcs.get("requested_revision") or vcs.get("commit_id")
        url = f"{vcs['vcs']}+{url}" + (f"@{revision}" if revision else "")
    if info.get("subdirectory"):
        url += f"#subdirectory={info['subdirectory']}"
    return f"numcheck @ {url}", "where this numcheck was installed from; check CI can reach it"


def _direct_url() -> str | None:
    """This numcheck's direct_url.json (PEP 610), None without one or an installation."""
    from importlib import metadata

    try:
        return metadata.distribution("numcheck").read_text("direct_url.json")
    except (metadata.PackageNotFoundError, OSError):
        return None


# @GOLDEN_DIR@ / @RESULTS@: the ini keys' values at init time, @SPEC@ numcheck_spec()'s as a
# YAML (JSON) string; placeholders, not str.format, because GitHub's ${{ }} expressions are full
# of braces.
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
env:
  # where your numcheck comes from: a version on your index, a wheel URL, or git+https://...@tag
  # (both jobs `pip install` it; numcheck init chose this one, see its output)
  NUMCHECK_SPEC: @SPEC@
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
          python -m pip install "$NUMCHECK_SPEC"
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
          .venv/bin/python -m pip install "$NUMCHECK_SPEC"
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
