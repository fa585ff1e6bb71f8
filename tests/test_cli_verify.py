"""`numcheck verify` on a user's kernel module: exit codes, table, named kernel failures, repro."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from numcheck.frontends.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype")

KERNELS = textwrap.dedent('''
    import torch

    def good(x, weight, eps):
        xf = x.float()
        return (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)

    def no_eps(x, weight, eps):
        xf = x.float()
        return (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True)) * weight.float()).to(x.dtype)

    def raises_on_ragged(x, weight, eps):
        if x.shape[-1] % 16:
            raise ValueError("D must be a multiple of 16")
        return good(x, weight, eps)

    def wrong_shape(x, weight, eps):
        return good(x, weight, eps)[..., :1]

    def wrong_dtype(x, weight, eps):
        return good(x, weight, eps).double()

    def extra_rounding(x, weight, eps):  # normalized value stored in x's dtype: ~half a bit
        xf = x.float()
        y = (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps)).to(x.dtype).float()
        return (y * weight.float()).to(x.dtype)
''')


@pytest.fixture
def kernels_on_path(tmp_path, monkeypatch):
    (tmp_path / "user_kernels.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_kernels", None)
    return tmp_path


def _run(capsys, *argv):
    code = main(["verify", "--op", "rms_norm", "--device", "cpu", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_good_kernel_passes(kernels_on_path, capsys):
    code, out, _ = _run(capsys, "--kernel", "user_kernels:good")
    assert code == 0, out
    assert "PASSED" in out and "case(s) run" in out


def test_numerical_failure_exits_1_with_diagnostics(kernels_on_path, capsys, tmp_path):
    code, out, _ = _run(capsys, "--kernel", "user_kernels:no_eps",
                        "--save-failures", str(tmp_path / "saved"))
    assert code == 1
    assert "FAIL" in out and "non-finite" in out
    assert "worst elements:" in out and "numerics:" in out and "repro: numcheck verify" in out
    assert list((tmp_path / "saved").glob("*.pt"))


@pytest.mark.parametrize("fn, named", [
    ("raises_on_ragged", "raised ValueError: D must be a multiple of 16"),
    ("wrong_shape", "kernel returned shape"),
    ("wrong_dtype", "kernel returned dtype torch.float64"),
])
def test_kernel_failure_is_named_and_other_cases_kept(kernels_on_path, capsys, fn, named):
    code, out, _ = _run(capsys, "--kernel", f"user_kernels:{fn}")
    assert code == 1 and named in out
    if fn == "raises_on_ragged":
        assert re.search(r"PASSED|FAILED: [1-9]\d* passed", out)  # aligned cases still ran


def test_repro_line_reruns_exactly_that_case(kernels_on_path, capsys):
    _, out, _ = _run(capsys, "--kernel", "user_kernels:no_eps")
    repro = re.search(r"repro: numcheck verify (.*)", out).group(1)
    import shlex
    argv = shlex.split(repro)
    code = main(["verify", *argv])
    again = capsys.readouterr().out
    assert code == 1 and ": 1 case(s) run" in again


@pytest.mark.parametrize("argv, message", [
    (["--op", "no_such_op", "--kernel", "x:y"], "unknown op 'no_such_op'"),
    (["--op", "rms_norm", "--kernel", "not_a_module_xyz:fn"], "cannot import"),
    (["--op", "rms_norm", "--kernel", "user_kernels:missing"], "has no attribute"),
    (["--op", "rms_norm", "--kernel", "nope"], "not a built-in kernel"),
    (["--op", "rms_norm", "--kernel", "torch", "--adhoc", "{bad"], "--adhoc"),
])
def test_usage_errors_exit_2(kernels_on_path, capsys, argv, message):
    code = main(["verify", "--device", "cpu", *argv])
    assert code == 2
    assert message in capsys.readouterr().err


def test_from_the_shell(kernels_on_path):
    env = dict(os.environ, PYTHONPATH=str(kernels_on_path))
    res = subprocess.run([sys.executable, "-m", "numcheck", "verify", "--op", "rms_norm",
                          "--kernel", "user_kernels:good", "--device", "cpu"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rms_norm / good on cpu" in res.stdout


def test_golden_dir_refresh_then_regression(kernels_on_path, capsys):
    gdir = kernels_on_path / "golden"
    case = ["--case", "bf16-4x128-outlier_channels-s0-contiguous-same",
            "--case", "bf16-2x7x1025-zero_blocks-s0-contiguous-same", "--golden-dir", str(gdir)]
    code, out, _ = _run(capsys, "--kernel", "user_kernels:good", *case, "--refresh")
    assert code == 0, out
    path = gdir / "cpu" / "verify.parquet"
    assert path.exists()
    code, out, _ = _run(capsys, "--kernel", "user_kernels:good", *case)
    assert code == 0, out
    # the same kernel name with a worse body: a golden regression naming the metric
    import user_kernels
    user_kernels.good = user_kernels.extra_rounding
    code, out, _ = _run(capsys, "--kernel", "user_kernels:good", *case)
    assert code == 1 and "golden regressed: rel_l2" in out, out


def test_repro_line_carries_triton_interpret_where_it_was_set(monkeypatch):
    """A kernel run under Triton's interpreter needs it again: without TRITON_INTERPRET=1 the
    printed line would fail with "0 active drivers" on a CPU machine (issue 30)."""
    from numcheck.catalog import CATALOG
    from numcheck.run import repro_command

    spec = CATALOG.get_op("silu")
    kern, case = CATALOG.kernels("silu")["torch"], spec.grid("quick")[0]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert repro_command("silu", kern, case, "cpu").startswith("numcheck verify --op silu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    line = repro_command("silu", kern, case, "cpu")
    assert line.startswith("TRITON_INTERPRET=1 numcheck verify --op silu"), line
