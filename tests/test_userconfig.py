"""numcheck.frontends.userconfig: the pytest configuration file pytest reads, and its numcheck_* keys.

Where cheap, every lookup is checked against pytest's own (``locate_config``, a private function:
the alternative is a pytest subprocess per case). tmp_path lies outside any project, so nothing
above it takes part.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from numcheck.errors import UsageError
from numcheck.frontends.userconfig import find_config, load_config, numcheck_keys


_PYTEST = tuple(int(x) for x in pytest.__version__.split(".")[:2])


def pytests_choice(start: Path) -> Path | None:
    """The inifile pytest 9 uses for a run in ``start`` without arguments."""
    from _pytest.config.findpaths import locate_config
    return locate_config(start, [])[1]


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


PYPROJECT_INI = '[project]\nname = "x"\n\n[tool.pytest.ini_options]\naddopts = "-ra"\n'
PYPROJECT_BARE = '[project]\nname = "x"\n'


# --- which file --------------------------------------------------------------------------------

@pytest.mark.parametrize("files, chosen", [
    ({"pytest.toml": "", ".pytest.toml": "", "pytest.ini": "[pytest]\n"}, "pytest.toml"),
    ({".pytest.toml": "", "pytest.ini": "[pytest]\n"}, ".pytest.toml"),
    ({"pytest.ini": "", "pyproject.toml": PYPROJECT_INI}, "pytest.ini"),  # empty: still it
    ({".pytest.ini": "[other]\nx = 1\n", "tox.ini": "[pytest]\n"}, ".pytest.ini"),
    ({"pyproject.toml": PYPROJECT_INI, "tox.ini": "[pytest]\n"}, "pyproject.toml"),
    ({"pyproject.toml": '[tool.pytest]\naddopts = ["-ra"]\n', "setup.cfg": "[tool:pytest]\n"},
     "pyproject.toml"),
    ({"pyproject.toml": PYPROJECT_BARE, "tox.ini": "[pytest]\n"}, "tox.ini"),
    ({"pyproject.toml": "[tool.pytest]\n", "setup.cfg": "[tool:pytest]\n"}, "setup.cfg"),
    ({"tox.ini": "[tox]\nenvlist = py311\n", "setup.cfg": "[tool:pytest]\n"}, "setup.cfg"),
    ({"tox.ini": "[tox]\n", "setup.cfg": "[metadata]\nname = x\n"}, None),
    ({"pyproject.toml": PYPROJECT_BARE, "setup.cfg": "[metadata]\n"}, "pyproject.toml"),
], ids=["pytest.toml-first", ".pytest.toml", "empty-pytest.ini", ".pytest.ini-without-section",
        "pyproject-over-tox", "tool.pytest-over-setup.cfg", "bare-pyproject-skipped",
        "empty-tool.pytest-skipped", "tox-without-section-skipped", "none",
        "bare-pyproject-fallback"])
def test_precedence_between_the_files_of_one_folder_is_pytests(tmp_path, files, chosen):
    write(tmp_path, files)
    expected = tmp_path / chosen if chosen else None
    assert find_config(tmp_path) == expected
    assert pytests_choice(tmp_path) == expected


def test_the_search_goes_upwards_and_the_nearest_folder_wins(tmp_path):
    start = tmp_path / "a" / "b" / "c"
    start.mkdir(parents=True)
    assert find_config(start) is None and pytests_choice(start) is None
    write(tmp_path, {"pytest.toml": "[pytest]\n"})
    assert find_config(start) == tmp_path / "pytest.toml" == pytests_choice(start)
    # a nearer folder wins though its file comes later in pytest's order
    write(tmp_path, {"a/setup.cfg": "[tool:pytest]\naddopts = -ra\n"})
    assert find_config(start) == tmp_path / "a" / "setup.cfg" == pytests_choice(start)
    assert find_config(str(start)) == tmp_path / "a" / "setup.cfg"  # str, too
    # a file as start: its folder
    write(tmp_path, {"a/b/c/test_x.py": ""})
    assert find_config(start / "test_x.py") == tmp_path / "a" / "setup.cfg"


def test_a_pyproject_without_a_pytest_table_is_passed_over_and_only_a_fallback(tmp_path):
    start = tmp_path / "pkg" / "sub"
    write(tmp_path, {"pkg/pyproject.toml": PYPROJECT_BARE, "pkg/sub/pyproject.toml":
                     PYPROJECT_BARE, "tox.ini": "[pytest]\naddopts = -ra\n"})
    assert find_config(start) == tmp_path / "tox.ini" == pytests_choice(start)
    (tmp_path / "tox.ini").unlink()
    # nothing holds configuration: pytest takes the first pyproject.toml it passed
    assert find_config(start) == start / "pyproject.toml" == pytests_choice(start)
    assert numcheck_keys(start / "pyproject.toml") == {}


def test_stop_ends_the_search(tmp_path):
    start = tmp_path / "repo" / "pkg"
    write(tmp_path, {"pytest.ini": "[pytest]\n", "repo/pkg/pyproject.toml": PYPROJECT_BARE})
    assert find_config(start) == tmp_path / "pytest.ini"
    assert find_config(start, stop=tmp_path / "repo") == start / "pyproject.toml"  # fallback
    (start / "pyproject.toml").unlink()
    assert find_config(start, stop=tmp_path / "repo") is None
    assert find_config(start, stop=start) is None
    assert find_config(start, stop=tmp_path / "elsewhere") == tmp_path / "pytest.ini"


# --- numcheck's keys ---------------------------------------------------------------------------

WANT = {"numcheck_golden_dir": "gold en", "numcheck_cases": "full", "numcheck_strict": "true"}


@pytest.mark.parametrize("name, text, want", [
    ("pytest.toml", '[pytest]\naddopts = ["-ra"]\nnumcheck_golden_dir = "gold en"\n'
     'numcheck_cases = "full"\nnumcheck_strict = true\n', WANT),
    (".pytest.toml", '[pytest]\nnumcheck_prune = false\nnumcheck_shard = 2\n'
     'numcheck_list = ["a", "b c"]\nnumcheck_when = 2024-05-01\n',
     {"numcheck_prune": "false", "numcheck_shard": "2", "numcheck_list": "a 'b c'",
      "numcheck_when": "2024-05-01"}),
    ("pyproject.toml", '[tool.pytest.ini_options]\naddopts = "-ra"\n'
     'numcheck_golden_dir = "gold en"\nnumcheck_cases = "full"\nnumcheck_strict = true\n', WANT),
    ("pyproject.toml", '[tool.pytest]\nnumcheck_golden_dir = "gold en"\nnumcheck_cases = "full"'
     '\nnumcheck_strict = true\n\n[tool.ruff]\nnumcheck_cases = "no"\n', WANT),
    ("pytest.ini", "[pytest]\naddopts = -ra\nnumcheck_golden_dir = gold en\n"
     "numcheck_cases = full\nnumcheck_strict = true\n", WANT),
    (".pytest.ini", "[pytest]\nnumcheck_golden_dir = gold en\nnumcheck_cases = full\n"
     "numcheck_strict = true\n", WANT),
    ("tox.ini", "[tox]\nnumcheck_cases = no\n\n[pytest]\nnumcheck_golden_dir = gold en\n"
     "numcheck_cases = full\nnumcheck_strict = true\n", WANT),
    ("setup.cfg", "[metadata]\nname = x\n\n[tool:pytest]\nnumcheck_golden_dir = gold en\n"
     "numcheck_cases = full\nnumcheck_strict = true\nnumcheck_multi =\n    a\n    b\n",
     {**WANT, "numcheck_multi": "a\nb"}),
], ids=["pytest.toml", ".pytest.toml-types", "ini_options", "tool.pytest", "pytest.ini",
        ".pytest.ini", "tox.ini", "setup.cfg"])
def test_numcheck_keys_of_each_syntax(tmp_path, name, text, want):
    write(tmp_path, {name: text})
    assert find_config(tmp_path) == tmp_path / name == pytests_choice(tmp_path)
    assert numcheck_keys(tmp_path / name) == want
    if name.endswith((".ini", ".cfg")):  # ini files: pytest's own strings
        from _pytest.config.findpaths import locate_config
        cfg = locate_config(tmp_path, [])[2]
        assert {k: v.value for k, v in cfg.items() if k.startswith("numcheck_")} == want


def test_no_pytest_section_no_keys(tmp_path):
    write(tmp_path, {"pytest.ini": "", "pyproject.toml": PYPROJECT_BARE,
                     "setup.cfg": "[metadata]\nnumcheck_cases = full\n"})
    for name in ("pytest.ini", "pyproject.toml", "setup.cfg"):
        assert numcheck_keys(tmp_path / name) == {}


def test_load_config_names_the_table_to_edit(tmp_path):
    write(tmp_path, {"pyproject.toml": PYPROJECT_BARE, "pytest.toml": "",
                     "setup.cfg": "[metadata]\n", "a/pyproject.toml": PYPROJECT_INI,
                     "b/pyproject.toml": "[tool.pytest]\nminversion = '9'\n"})
    got = {rel: (c.table, c.toml, c.section, c.is_pytest_config)
           for rel in ("pyproject.toml", "pytest.toml", "setup.cfg", "a/pyproject.toml",
                       "b/pyproject.toml") for c in [load_config(tmp_path / rel)]}
    assert got == {"pyproject.toml": ("tool.pytest.ini_options", True, None, False),
                   "pytest.toml": ("pytest", True, None, True),
                   "setup.cfg": ("tool:pytest", False, None, False),
                   "a/pyproject.toml": ("tool.pytest.ini_options", True, {"addopts": "-ra"}, True),
                   "b/pyproject.toml": ("tool.pytest", True, {"minversion": "9"}, True)}
    # text stands in for the file's content (numcheck init checks its edits so)
    assert load_config(tmp_path / "pytest.toml", "[pytest]\nx = 1\n").section == {"x": 1}


# --- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, says", [
    ("pyproject.toml", "[tool.pytest.ini_options\naddopts = '-ra'\n", "cannot parse it"),
    ("pytest.toml", 'addopts = "-ra"\n', "only under a [pytest] table"),
    ("pytest.ini", "addopts = -ra\n[pytest]\n", "cannot parse it"),
    ("tox.ini", "[pytest]\n  continued\n", "cannot parse it"),
    ("setup.cfg", "[pytest]\naddopts = -ra\n", "[tool:pytest]"),
    ("pyproject.toml", '[tool.pytest]\naddopts = ["-ra"]\n[tool.pytest.ini_options]\n'
     'addopts = "-ra"\n', "both"),
], ids=["toml-syntax", "pytest.toml-loose-keys", "ini-no-section", "ini-continuation",
        "setup.cfg-[pytest]", "tool.pytest-and-ini_options"])
def test_a_file_pytest_cannot_use_is_a_usage_error_naming_it(tmp_path, name, text, says):
    start = tmp_path / "pkg"
    start.mkdir()
    path = tmp_path / name
    path.write_text(text)
    for call in (lambda: numcheck_keys(path), lambda: find_config(start)):
        with pytest.raises(UsageError) as e:
            call()
        assert str(e.value).startswith(f"{path}: ") and says in str(e.value)
    if name == "pytest.toml" and _PYTEST < (9, 2):
        # pytest 9.1 takes a pytest.toml's keys outside [pytest] as no setting at all, silently
        # (9.2 stops on them): numcheck refuses them on every pytest, the user meant them
        assert pytests_choice(start) == path
        return
    with pytest.raises(BaseException):  # pytest stops on it too
        pytests_choice(start)


def test_unreadable_files_and_values_without_an_o_form_are_usage_errors(tmp_path):
    (tmp_path / "pytest.ini").write_bytes(b"[pytest]\nnumcheck_cases = \xff\n")
    with pytest.raises(UsageError, match=r"pytest\.ini: not UTF-8"):
        numcheck_keys(tmp_path / "pytest.ini")
    (tmp_path / "pytest.toml").write_text("[pytest.numcheck_x]\ny = 1\n")
    with pytest.raises(UsageError, match=r"pytest\.toml: numcheck_x = .*no table"):
        numcheck_keys(tmp_path / "pytest.toml")
    with pytest.raises(UsageError, match="cannot read it"):
        numcheck_keys(tmp_path / "missing.ini")
