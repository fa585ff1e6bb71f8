"""`numcheck init` (numcheck.frontends.scaffold): a user's repository set up, then pytest runs in it."""
from __future__ import annotations

import difflib
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from numcheck.frontends.cli import main
from numcheck.frontends import scaffold
from numcheck.frontends.scaffold import EXAMPLE_TEST, KEYS, WORKFLOW, init_project, spec_for
from numcheck.version import __version__

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest requires tomli there
    import tomli as tomllib

GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not on PATH")

# A user's pyproject.toml: a pytest table with a comment, a multi-line array and testpaths,
# then another table led by a comment.
PYPROJECT = """\
[project]
name = "userpkg"
version = "0.0.1"

[tool.pytest.ini_options]
# the user's own comment
addopts = "-ra"
testpaths = [
    "checks",
]

# leads the next table
[tool.ruff]
line-length = 100
"""


def git(root: Path, *args: str) -> str:
    return subprocess.run([GIT, "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def scratch_repo(root: Path, pyproject: str | None = PYPROJECT) -> Path:
    git(root, "init", "-q")
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject)
    return root


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under root (.git included): content hash and modification time."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                       p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def init(root: Path, capsys, *extra: str) -> list[tuple[str, str]]:
    """`numcheck init --root ROOT` through the CLI: its (action, what) lines, hint left off."""
    assert main(["init", "--root", str(root), *extra]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("next: ")
    return [tuple(line.split(None, 1)) for line in lines[:-1]]


def run_pytest(root: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest in the scratch repository as its user runs it: none of this run's pytest
    environment (xdist worker, current test, PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_") and k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)


# --- init, then pytest in the repository -------------------------------------------------------

@needs_git
def test_init_then_pytest_passes_records_goldens_and_passes_strict(tmp_path, capsys):
    repo = scratch_repo(tmp_path)
    actions = dict(init(repo, capsys))
    assert actions["updated"].startswith("pyproject.toml [tool.pytest.ini_options]")
    assert actions["wrote"] == "checks/test_numcheck_example.py"  # under the user's testpaths
    assert actions["configured"].startswith('git config diff.numcheck.textconv "numcheck show"')
    golden = repo / "golden" / "cpu" / "numcheck_example.parquet"
    results = repo / "results" / "numcheck-results.parquet"

    run = run_pytest(repo)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout and "goldens check" in run.stdout
    assert results.is_file()  # the ini key numcheck_results is read
    assert not golden.exists()  # a plain run records nothing

    run = run_pytest(repo, "--numcheck-refresh")
    assert run.returncode == 0, run.stdout + run.stderr
    assert golden.is_file() and golden.with_suffix(".txt").is_file()

    run = run_pytest(repo, "--numcheck-strict")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "goldens strict" in run.stdout and re.search(r"golden: \d+ same\n", run.stdout)


@needs_git
def test_init_without_pyproject_writes_pytest_ini_and_the_example_runs(tmp_path, capsys):
    repo = scratch_repo(tmp_path, pyproject=None)
    assert ("wrote", "pytest.ini [pytest]: " + ", ".join(KEYS)) in init(repo, capsys)
    ini = (repo / "pytest.ini").read_text()
    assert ini.startswith("[pytest]\n")
    assert "numcheck_golden_dir = golden\n" in ini  # ini syntax: no quotes
    assert (repo / "tests" / "test_numcheck_example.py").read_text() == EXAMPLE_TEST
    assert "*.parquet diff=numcheck\n" in (repo / ".gitattributes").read_text()
    assert git(repo, "config", "--get", "diff.numcheck.textconv") == "numcheck show"

    run = run_pytest(repo, "--numcheck-refresh")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (repo / "golden" / "cpu" / "numcheck_example.parquet").is_file()


# --- idempotence, overwriting ------------------------------------------------------------------

@needs_git
def test_second_init_reports_unchanged_and_changes_no_byte(tmp_path, capsys):
    repo = scratch_repo(tmp_path)
    (repo / ".gitattributes").write_text("*.bin binary\n")
    init(repo, capsys)
    before = tree(repo)
    again = init(repo, capsys)
    assert len(again) == 5 and {action for action, _ in again} == {"unchanged"}, again
    assert tree(repo) == before  # no byte, not even a rewrite of the same bytes
    assert {action for action, _ in init(repo, capsys, "--force")} == {"unchanged"}
    assert tree(repo) == before


@needs_git
def test_differing_files_kept_without_force_replaced_with_it_shared_files_only_grow(
        tmp_path, capsys):
    repo = scratch_repo(tmp_path, pyproject='[tool.pytest.ini_options]\n'
                                            'numcheck_golden_dir = "goldens"\n')
    mine = {WORKFLOW: "name: mine\n",
            "tests/test_numcheck_example.py": "def test_mine():\n    pass\n"}
    for rel, text in mine.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    (repo / ".gitattributes").write_text("*.parquet -diff\n")
    git(repo, "config", "diff.numcheck.textconv", "cat")
    pyproject = (repo / "pyproject.toml").read_text()

    actions = init(repo, capsys)
    kept = [what for action, what in actions if action == "kept"]
    assert len(kept) == 3 and all("--force" in what for what in kept), actions
    for rel, text in mine.items():
        assert (repo / rel).read_text() == text
    assert git(repo, "config", "--get", "diff.numcheck.textconv") == "cat"

    actions = init(repo, capsys, "--force")
    assert [a for a, _ in actions].count("replaced") == 2, actions
    assert (repo / "tests" / "test_numcheck_example.py").read_text() == EXAMPLE_TEST
    workflow = (repo / WORKFLOW).read_text()
    assert "runs-on: [self-hosted, gpu]" in workflow
    assert "            goldens/\n" in workflow  # the artifact is the user's golden folder
    assert git(repo, "config", "--get", "diff.numcheck.textconv") == "numcheck show"
    # shared files only ever grow: the user's value stays, their lines stay first
    new = (repo / "pyproject.toml").read_text()
    assert new.startswith(pyproject) and new.count("numcheck_golden_dir") == 1
    assert tomllib.loads(new)["tool"]["pytest"]["ini_options"]["numcheck_golden_dir"] == "goldens"
    attributes = (repo / ".gitattributes").read_text()
    assert attributes.startswith("*.parquet -diff\n")
    assert attributes.endswith("*.parquet diff=numcheck\n")  # the later line wins in git


# --- the pytest configuration ------------------------------------------------------------------

@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_pyproject_keys_are_inserted_into_the_table_and_nothing_else_changes(tmp_path, eol):
    text = PYPROJECT.replace('addopts = "-ra"', 'addopts = "-ra"\nnumcheck_cases = "full"')
    text = text.replace("\n", eol)
    (tmp_path / "pyproject.toml").write_bytes(text.encode())
    init_project(tmp_path)
    new = (tmp_path / "pyproject.toml").read_bytes().decode()

    old_lines, new_lines = text.splitlines(True), new.splitlines(True)
    ops = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes()
    assert {op for op, *_ in ops} == {"equal", "insert"}, ops  # every old line kept, in order
    assert all(line.endswith(eol) for line in new_lines)
    assert eol == "\r\n" or "\r" not in new
    inserted = [line for op, _, _, j1, j2 in ops if op == "insert" for line in new_lines[j1:j2]]
    assert inserted[0].startswith("# numcheck") and len(inserted) == 3
    doc = tomllib.loads(new)
    table = doc["tool"]["pytest"]["ini_options"]
    assert table["numcheck_cases"] == "full" and new.count("numcheck_cases") == 1  # user's, once
    assert table["numcheck_golden_dir"] == "golden"
    assert table["numcheck_results"] == "results/numcheck-results.parquet"
    assert table["addopts"] == "-ra" and table["testpaths"] == ["checks"]
    assert doc["tool"]["ruff"] == {"line-length": 100}
    # the keys sit in the table, before the comment that leads the next one
    assert new.index("numcheck_results") < new.index("# leads the next table")


def pytest_reads(root: Path) -> tuple[Path, dict]:
    """The configuration file pytest finds in root, and its keys (pytest's own lookup; a private
    function, the cheap alternative to a pytest subprocess per case)."""
    from _pytest.config.findpaths import locate_config
    found = locate_config(root, [root])
    return found[1], found[2]


@pytest.mark.parametrize("files, edited, tests_dir", [
    ({"tox.ini": "[tox]\nenvlist = py311\n\n[pytest]\naddopts = -ra\ntestpaths = unit other\n",
      "pyproject.toml": '[project]\nname = "x"\n'}, "tox.ini", "unit"),
    ({"pytest.ini": "[pytest]\naddopts = -ra\n", "pyproject.toml": PYPROJECT}, "pytest.ini",
     "tests"),
    ({"setup.cfg": "[metadata]\nname = x\n\n[tool:pytest]\naddopts = -ra\n"}, "setup.cfg",
     "tests"),
    ({"pytest.toml": '[pytest]\naddopts = ["-ra"]\ntestpaths = ["./src/tests/"]\n'},
     "pytest.toml", "src/tests"),
    ({"pyproject.toml": '[tool.pytest]\naddopts = ["-ra"]\n'}, "pyproject.toml", "tests"),
    ({"pyproject.toml": '[project]\nname = "x"\n'}, "pyproject.toml", "tests"),
], ids=["tox.ini", "pytest.ini-over-pyproject", "setup.cfg", "pytest.toml", "tool.pytest",
        "pyproject-new-table"])
def test_keys_go_into_the_file_pytest_reads(tmp_path, files, edited, tests_dir):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    init_project(tmp_path)
    for name, text in files.items():
        new = (tmp_path / name).read_text()
        assert new.startswith(text) if name == edited else new == text, name
    inifile, cfg = pytest_reads(tmp_path)
    assert inifile.name == edited and set(KEYS) <= set(cfg), (inifile, sorted(cfg))
    assert (tmp_path / tests_dir / "test_numcheck_example.py").is_file()


def test_usage_errors_exit_2_and_write_nothing(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options\naddopts = '-ra'\n")
    before = tree(tmp_path)
    assert main(["init", "--root", str(tmp_path)]) == 2
    assert "pyproject.toml: cannot parse it" in capsys.readouterr().err
    assert tree(tmp_path) == before
    # a table given by dotted keys: a text edit could not place keys in it
    (tmp_path / "pyproject.toml").write_text('[tool]\npytest.ini_options.addopts = "-ra"\n')
    before = tree(tmp_path)
    assert main(["init", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "by hand" in err and 'numcheck_golden_dir = "golden"' in err
    assert tree(tmp_path) == before
    for root in (tmp_path / "missing", tmp_path / "pyproject.toml"):
        assert main(["init", "--root", str(root)]) == 2
        assert "not a folder" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_outside_a_git_repository_the_textconv_command_is_only_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    actions = dict(init_project(tmp_path))
    assert actions["skipped"].startswith('git config diff.numcheck.textconv "numcheck show"')
    assert (tmp_path / ".gitattributes").read_text().endswith("*.parquet diff=numcheck\n")


# --- the workflow ------------------------------------------------------------------------------

def jobs_of(text: str) -> dict[str, str]:
    """The workflow's jobs by name, each its block of lines (pyyaml is not a dependency: a
    structural reading of the 2-space-indented mapping under `jobs:`)."""
    lines = text.splitlines()
    top = [line.split(":")[0] for line in lines if re.match(r"[A-Za-z]", line)]
    assert top == ["name", "env", "on", "permissions", "jobs"], top
    jobs, name = {}, None
    for line in lines[lines.index("jobs:") + 1:]:
        m = re.match(r"  ([\w-]+):$", line)
        if m:
            name = m.group(1)
            jobs[name] = ""
        else:
            assert line.startswith("    ") or not line.strip(), line  # inside a job
            jobs[name] += line + "\n"
    return jobs


def test_workflow_has_a_cpu_job_and_a_self_hosted_gpu_job(tmp_path, monkeypatch):
    monkeypatch.setattr(scaffold, "_direct_url", lambda: None)  # as from an index
    actions = init_project(tmp_path)
    text = (tmp_path / WORKFLOW).read_text()
    assert "\t" not in text  # YAML indents with spaces only
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        assert indent % 2 == 0 and line.count("${{") == line.count("}}"), line
    jobs = jobs_of(text)
    assert set(jobs) == {"cpu", "gpu"}
    assert "runs-on: ubuntu-latest" in jobs["cpu"]
    assert "--index-url https://download.pytorch.org/whl/cpu" in jobs["cpu"]
    assert "runs-on: [self-hosted, gpu]" in jobs["gpu"]
    assert "--numcheck-device=cuda" in jobs["gpu"]
    # one marked place says where numcheck comes from; both jobs install that
    env = text[text.index("\nenv:\n") + 1:text.index("\non:\n") + 1]
    assert "# where your numcheck comes from: a version on your index, a wheel URL, or " \
           "git+https://...@tag" in env
    assert f'  NUMCHECK_SPEC: "numcheck=={__version__}"\n' in env
    assert text.count("$NUMCHECK_SPEC") == 2 and "numcheck==" not in text.replace(env, "")
    assert ("check", f"NUMCHECK_SPEC in {WORKFLOW}: numcheck=={__version__} (numcheck "
                     f"{__version__} must be on your CI's package index; else set it to a "
                     "version on your CI's index, a wheel URL, or git+https://...@tag)") in actions
    for job in jobs.values():
        assert "'--numcheck-strict'" in job and 'pip install "$NUMCHECK_SPEC"' in job
        assert "actions/upload-artifact" in job and "results/numcheck-results.parquet" in job
    try:
        import yaml
    except ImportError:
        return
    doc = yaml.safe_load(text)
    assert doc["env"] == {"NUMCHECK_SPEC": f"numcheck=={__version__}"}
    assert doc["jobs"]["gpu"]["runs-on"] == ["self-hosted", "gpu"]
    assert doc["jobs"]["cpu"]["runs-on"] == "ubuntu-latest"


@pytest.mark.parametrize("direct_url, spec", [
    (None, f"numcheck=={__version__}"),
    ("not json", f"numcheck=={__version__}"),
    ('{"url": "file:///home/me/numcheck", "dir_info": {"editable": true}}',
     f"numcheck=={__version__}"),
    ('{"url": "file:///tmp/numcheck-0.1.0-py3-none-any.whl", "archive_info": {}}',
     f"numcheck=={__version__}"),
    ('{"url": "https://example.org/numcheck-0.1.0-py3-none-any.whl", "archive_info": '
     '{"hashes": {"sha256": "00"}}}',
     "numcheck @ https://example.org/numcheck-0.1.0-py3-none-any.whl"),
    ('{"url": "https://github.com/me/numcheck", "vcs_info": {"vcs": "git", '
     '"requested_revision": "v0.1.0", "commit_id": "abc123"}}',
     "numcheck @ git+https://github.com/me/numcheck@v0.1.0"),
    ('{"url": "https://github.com/me/mono", "subdirectory": "numcheck", "vcs_info": '
     '{"vcs": "git", "commit_id": "abc123"}}',
     "numcheck @ git+https://github.com/me/mono@abc123#subdirectory=numcheck"),
], ids=["none", "garbage", "editable-checkout", "local-wheel", "wheel-url", "git-tag",
        "git-commit-subdirectory"])
def test_numcheck_spec_is_the_install_url_unless_local_else_the_version_pin(direct_url, spec):
    got, why = spec_for(direct_url)
    assert got == spec
    if direct_url and "file:" in direct_url:
        assert "local path" in why and "file:///" in why  # says why the pin, and what to set
    assert ("git+https://...@tag" in why) == got.startswith("numcheck==")


def test_workflow_installs_numcheck_from_where_this_one_came_from(tmp_path, monkeypatch, capsys):
    direct = ('{"url": "https://github.com/me/numcheck", "vcs_info": {"vcs": "git", '
              '"requested_revision": "v0.1.0", "commit_id": "abc123"}}')
    monkeypatch.setattr(scaffold, "_direct_url", lambda: direct)
    lines = init(tmp_path, capsys)
    spec = "numcheck @ git+https://github.com/me/numcheck@v0.1.0"
    assert lines[1][0] == "wrote" and lines[1][1] == WORKFLOW
    assert lines[2] == ("check", f"NUMCHECK_SPEC in {WORKFLOW}: {spec} (where this numcheck "
                                 "was installed from; check CI can reach it)")
    text = (tmp_path / WORKFLOW).read_text()
    assert f'  NUMCHECK_SPEC: "{spec}"\n' in text and text.count('"$NUMCHECK_SPEC"') == 2
    # the workflow is unchanged on a rerun: no hint then
    assert "check" not in dict(init(tmp_path, capsys))


# --- a package inside a larger repository (monorepo) ---------------------------------------------

@needs_git
def test_in_a_package_folder_the_keys_go_into_the_parents_configuration(tmp_path, capsys):
    """pytest run in pkg/ reads the repository's pytest.ini (pkg/pyproject.toml has no pytest
    table): init --root pkg edits that file, and creates none in pkg/ that would shadow its
    addopts and markers."""
    repo = scratch_repo(tmp_path, pyproject=None)
    ini = "[pytest]\naddopts = -ra --strict-markers\nmarkers =\n    gpu: needs a GPU\n" \
          "testpaths = pkg/checks other\n"
    (repo / "pytest.ini").write_text(ini)
    pkg = repo / "pkg"
    pkg.mkdir()
    package = '[project]\nname = "pkg"\nversion = "0.1"\n'
    (pkg / "pyproject.toml").write_text(package)
    assert pytest_reads(pkg)[0] == repo / "pytest.ini"

    lines = init(pkg, capsys)
    assert lines[0] == ("updated", "../pytest.ini [pytest] (pytest's configuration for runs "
                                   "in pkg): " + ", ".join(KEYS))
    assert (pkg / "pyproject.toml").read_text() == package
    assert not any((pkg / name).exists() for name in ("pytest.ini", "pytest.toml", "tox.ini",
                                                      "setup.cfg"))
    assert (repo / "pytest.ini").read_text().startswith(ini)
    inifile, cfg = pytest_reads(pkg)
    assert inifile == repo / "pytest.ini" and set(KEYS) <= set(cfg)
    assert cfg["addopts"].value == "-ra --strict-markers"  # still the user's
    # the parent's testpaths entry inside pkg/ holds the example
    assert (pkg / "checks" / "test_numcheck_example.py").is_file()
    before = tree(repo)
    assert {action for action, _ in init(pkg, capsys)} == {"unchanged"}
    assert tree(repo) == before


@needs_git
def test_a_configuration_above_the_git_repository_is_not_edited(tmp_path, capsys):
    outside = "[pytest]\naddopts = -ra\n"
    (tmp_path / "pytest.ini").write_text(outside)
    repo = tmp_path / "repo"
    repo.mkdir()
    scratch_repo(repo, pyproject=None)
    pkg = repo / "pkg"
    pkg.mkdir()
    assert ("wrote", "pytest.ini [pytest]: " + ", ".join(KEYS)) in init(pkg, capsys)
    assert (tmp_path / "pytest.ini").read_text() == outside
    assert pytest_reads(pkg)[0] == pkg / "pytest.ini"


@needs_git
def test_a_parent_pyproject_without_a_pytest_table_is_not_edited(tmp_path, capsys):
    """pytest falls back on the repository's pyproject.toml, which holds no configuration: a
    new pytest.ini in the package shadows nothing."""
    repo = scratch_repo(tmp_path, pyproject='[project]\nname = "x"\n')
    pkg = repo / "pkg"
    pkg.mkdir()
    assert pytest_reads(pkg)[0] == repo / "pyproject.toml"
    assert ("wrote", "pytest.ini [pytest]: " + ", ".join(KEYS)) in init(pkg, capsys)
    assert (repo / "pyproject.toml").read_text() == '[project]\nname = "x"\n'
    assert (pkg / "tests" / "test_numcheck_example.py").is_file()
