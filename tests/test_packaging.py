"""numcheck from a wheel: the built-in suites and shipped goldens are inside it, `numcheck run`
works from an empty folder against them, and a refresh never writes into the package (issue
16). Also the golden session's read-only base folder that makes this work."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from numcheck import golden
from numcheck.records import Golden, Record, Status
from numcheck.session import GoldenSession
from numcheck.stats import error_stats

REPO = Path(__file__).resolve().parent.parent
# pip builds the wheel in the checkout's build/: one worker builds it (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("wheel")


def _packages_on_disk() -> set[str]:
    return {".".join(p.parent.relative_to(REPO).parts)
            for p in (REPO / "numcheck").rglob("__init__.py")}


def test_pyproject_lists_every_package():
    import tomllib  # py >= 3.11 here; the wheel build itself needs no tomllib

    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    mapped = set(conf["package-dir"])
    assert listed - mapped == _packages_on_disk(), \
        "a numcheck subpackage is missing from [tool.setuptools] packages (or listed in vain)"
    assert conf["package-dir"] == {"numcheck._builtin.suites": "suites",
                                   "numcheck._builtin.golden": "golden"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(out)], check=True,
                   capture_output=True, text=True)
    (whl,) = out.glob("numcheck-*.whl")
    return whl


def test_wheel_holds_the_suites_and_the_goldens(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    suites = {f"numcheck/_builtin/suites/{p.name}" for p in (REPO / "suites").glob("test_*.py")}
    goldens = {f"numcheck/_builtin/golden/{p.relative_to(REPO / 'golden')}"
               for p in (REPO / "golden").glob("*/*.parquet")}
    assert suites and goldens
    assert suites <= names, suites - names
    assert goldens <= names, goldens - names
    assert not [n for n in names if n.startswith(("tests/", "suites/", "golden/"))]
    assert not [n for n in names if n.startswith("numcheck/_builtin/") and n.endswith(".txt")]


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*.parquet"))}


def test_numcheck_run_from_an_empty_folder(wheel, tmp_path):
    """Installed (not editable) into a fresh venv, run from a folder with nothing in it: the
    built-in suites run against the shipped goldens; refresh writes nothing into the package
    and says where the goldens are; a golden dir inside the package is refused."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # the dependencies from this environment's site-packages (its .pth files, the editable
    # numcheck among them, are not processed from a folder named in a .pth: the wheel wins)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "zz_numcheck_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True)
    shipped = site / "numcheck" / "_builtin" / "golden"
    before = _digests(shipped)
    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    sel = ["--suite", "ops", "-k", "rms_norm and torch and fp32-4x128", "-n", "0"]

    def numcheck(*args):
        return subprocess.run([str(venv / "bin" / "numcheck"), *args], cwd=work, env=env,
                              capture_output=True, text=True)

    run = numcheck("run", "--strict", *sel)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert str(site / "numcheck" / "_builtin" / "suites" / "test_ops.py") in run.stdout
    n = re.search(r"(\d+) records, (\d+) passed", run.stdout)
    assert n and n[1] == n[2] and int(n[1]) > 0, run.stdout[-2000:]
    assert f"golden: {n[1]} same\n" in run.stdout, run.stdout[-2000:]  # the shipped goldens
    assert (work / "results" / "numcheck-results.parquet").exists()
    assert (work / "results" / "report.html").exists()

    ref = numcheck("refresh", *sel)
    assert ref.returncode == 0, ref.stdout[-3000:]
    assert f"not written, its rows equal the shipped goldens in {shipped}" in ref.stdout
    assert _digests(shipped) == before

    bad = numcheck("run", *sel, "--golden-dir", str(shipped))
    assert bad.returncode == 2
    assert "inside the installed numcheck package" in bad.stdout + bad.stderr


# --- the session's read-only base folder -------------------------------------------------------

def _record(sqnr_scale: float, case: str = "c1") -> Record:
    import torch
    ref = torch.linspace(-2, 2, 64, dtype=torch.float64)
    out = (ref * (1 + sqnr_scale)).to(torch.bfloat16)
    return Record(suite="ops", op="rms_norm", kernel="k", case_id=case, output="out",
                  dtype="bf16", status=Status.PASSED, platforms="P",
                  kernel_stats=error_stats(out, ref), baseline_stats=error_stats(out, ref))


def _shipped(tmp_path: Path, records: list[Record]) -> Path:
    base = tmp_path / "shipped"
    s = GoldenSession(base, "refresh")
    s.judge(records)
    s.finish(records, {"numcheck": "test"})
    return base


def test_base_goldens_judge_a_suite_the_user_folder_lacks(tmp_path):
    base = _shipped(tmp_path, [_record(0.0)])
    s = GoldenSession(tmp_path / "user", "strict", base_dir=base)
    rec, new = _record(0.0), _record(0.0, case="c2")
    s.judge([rec, new])
    assert rec.golden == Golden.SAME
    assert new.golden == Golden.MISSING
    assert str(golden.path_for(base, "cpu", "ops")) in new.golden_reason  # where it looked


def test_a_user_file_hides_the_base_file(tmp_path):
    base = _shipped(tmp_path, [_record(0.0)])
    user = _shipped(tmp_path / "u", [_record(0.0, case="mine")])
    s = GoldenSession(user, "strict", base_dir=base)
    rec = _record(0.0)
    s.judge([rec])
    assert rec.golden == Golden.MISSING  # per file: the user's file is the whole truth


def test_refresh_writes_the_user_folder_and_keeps_the_base_rows(tmp_path):
    base = _shipped(tmp_path, [_record(0.0), _record(0.0, case="c2")])
    before = _digests(base)
    user = tmp_path / "user"
    s = GoldenSession(user, "refresh", base_dir=base)
    changed = _record(2.0 ** -5)  # a loss of several bits in case c1
    s.judge([changed])
    rep = s.finish([changed], {"numcheck": "test"})
    path = golden.path_for(user, "cpu", "ops")
    assert rep.written == [path]
    rows = golden.read(path).rows
    assert {k[3] for k in rows} == {"c1", "c2"}  # the untouched base row came along
    assert _digests(base) == before


def test_refresh_without_change_says_the_base_holds(tmp_path):
    base = _shipped(tmp_path, [_record(0.0)])
    s = GoldenSession(tmp_path / "user", "refresh", base_dir=base)
    same = _record(0.0)
    s.judge([same])
    rep = s.finish([same], {"numcheck": "test"})
    assert not rep.written and not (tmp_path / "user").exists()
    assert any("equal the shipped goldens" in line for line in rep.lines())
