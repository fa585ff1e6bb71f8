"""numcheck from a wheel: the built-in suites and shipped goldens are inside it, `numcheck run`
works from an empty folder against them, and a refresh never writes into the package (issue
16). Also the golden session's read-only base folder that makes this work."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from numcheck.goldens import store as golden
from numcheck.records import Golden, Record, Status
from numcheck.goldens.session import GoldenSession
from numcheck.measure.stats import error_stats

REPO = Path(__file__).resolve().parent.parent


def _packages_on_disk() -> set[str]:
    return {".".join(p.parent.relative_to(REPO).parts)
            for p in (REPO / "numcheck").rglob("__init__.py")}


def test_pyproject_lists_every_package():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    mapped = set(conf["package-dir"])
    assert listed - mapped == _packages_on_disk(), \
        "a numcheck subpackage is missing from [tool.setuptools] packages (or listed in vain)"
    assert conf["package-dir"] == {"numcheck._builtin.suites": "suites",
                                   "numcheck._builtin.golden": "golden"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # built from a copy of the files git knows (tracked or not ignored): setuptools never
    # clears a checkout's build/, whose stale files would otherwise ship
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True, text=True).stdout.split()
    for f in files:
        if (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
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
    assert {n for n in names if n.startswith("numcheck/_builtin/")} == suites | goldens
    assert not [n for n in names if n.startswith(("tests/", "suites/", "golden/"))]
    assert not [n for n in names if n.startswith("numcheck/_builtin/") and n.endswith(".txt")]


def _shipped_platforms(path: Path) -> set[str]:
    import pyarrow.parquet as pq
    return {p for row in pq.read_table(path, columns=["platforms"]).to_pylist()
            for p in golden.platforms_of(row)}


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
    assert _digests(shipped) == before
    from numcheck.measure import environment
    here = golden.platform_of(environment.provenance("cpu"))
    if here in _shipped_platforms(shipped / "cpu" / "ops.parquet"):
        assert f"not written, the rows that ran equal the shipped goldens in {shipped}" \
            in ref.stdout
    else:  # another machine: its values merge into the envelope, in the user's folder
        assert re.search(r"^\s*merged ", ref.stdout, re.M), ref.stdout[-3000:]
        wrote = [Path(p) for p in re.findall(r"^\s*wrote (\S+)$", ref.stdout, re.M)]
        assert wrote and all(p.resolve().is_relative_to(work.resolve()) and p.exists()
                             for p in wrote), ref.stdout[-3000:]

    insp = numcheck("inspect", "--model", "mlp", "--steps", "1", "--out", "tel")
    assert insp.returncode == 0 and (work / "tel" / "telemetry.parquet").exists(), insp.stderr

    bad = numcheck("run", *sel, "--golden-dir", str(shipped))
    assert bad.returncode == 2
    assert "inside the installed numcheck package" in bad.stdout + bad.stderr

    # the user's pytest ini names their golden folder; a row of theirs wins over the shipped
    # one: here one recorded from other inputs, which a strict run fails as inputs_changed
    # (their addopts are not the built-in suites': pytest would stop at the unknown flag)
    (work / "pyproject.toml").write_text('[tool.pytest.ini_options]\nnumcheck_golden_dir = "gold"\n'
                                         'addopts = "--no-such-flag"\n')
    rows = golden.read(golden.path_for(shipped, "cpu", "ops")).rows
    key = next(k for k in rows if k[1:3] == ("rms_norm", "torch") and
               k[3].startswith("fp32-4x128") and k[4] == "out")
    golden.write(golden.GoldenFile(golden.path_for(work / "gold", "cpu", "ops")),
                 {key: {**rows[key], "input_digest": "0" * 12}}, {"numcheck": "test"})
    mine = numcheck("run", "--strict", *sel)
    assert mine.returncode == 1, mine.stdout[-3000:]
    assert re.search(r"golden: \d+ same, 1 inputs_changed", mine.stdout), mine.stdout[-3000:]


# --- the session's read-only base folder -------------------------------------------------------

def _record(sqnr_scale: float, case: str = "c1", digest: str = "d0") -> Record:
    import torch
    ref = torch.linspace(-2, 2, 64, dtype=torch.float64)
    out = (ref * (1 + sqnr_scale)).to(torch.bfloat16)
    return Record(suite="ops", op="rms_norm", kernel="k", case_id=case, output="out",
                  dtype="bf16", status=Status.PASSED, platforms="P", input_digest=digest,
                  kernel_stats=error_stats(out, ref),
                  baseline_stats=error_stats(ref.to(torch.bfloat16), ref))


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


def test_rows_layer_the_users_row_wins(tmp_path):
    base = _shipped(tmp_path, [_record(0.0), _record(0.0, case="c2")])
    user = _shipped(tmp_path / "u", [_record(0.0, case="c2", digest="d1"),
                                     _record(0.0, case="mine")])
    s = GoldenSession(user, "strict", base_dir=base)
    c1, c2, mine = _record(0.0), _record(0.0, case="c2"), _record(0.0, case="mine")
    s.judge([c1, c2, mine])
    assert c1.golden == Golden.SAME  # only in the shipped file
    assert c2.golden == Golden.INPUTS_CHANGED  # the user's row of c2 wins over the shipped one
    assert mine.golden == Golden.SAME


def test_refresh_writes_only_the_rows_that_differ_from_the_base(tmp_path):
    base = _shipped(tmp_path, [_record(0.0), _record(0.0, case="c2")])
    before = _digests(base)
    user = tmp_path / "user"
    s = GoldenSession(user, "refresh", base_dir=base)
    changed = _record(2.0 ** -5)  # a loss of several bits in case c1
    s.judge([changed])
    rep = s.finish([changed], {"numcheck": "test"})
    path = golden.path_for(user, "cpu", "ops")
    assert rep.written == [path]
    assert {k[3] for k in golden.read(path).rows} == {"c1"}  # only what differs from the base
    assert _digests(base) == before
    later = GoldenSession(user, "strict", base_dir=base)
    c1, c2 = _record(2.0 ** -5), _record(0.0, case="c2")
    later.judge([c1, c2])
    assert c1.golden == c2.golden == Golden.SAME


def test_refresh_without_change_says_the_base_holds(tmp_path):
    base = _shipped(tmp_path, [_record(0.0)])
    s = GoldenSession(tmp_path / "user", "refresh", base_dir=base)
    same = _record(0.0)
    s.judge([same])
    rep = s.finish([same], {"numcheck": "test"})
    assert not rep.written and not (tmp_path / "user").exists()
    assert any("equal the shipped goldens" in line for line in rep.lines())
