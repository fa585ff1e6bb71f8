"""`numcheck doctor` and numcheck.measure.environment: what the machine description must contain."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from numcheck import UsageError
from numcheck.measure import environment as env
from numcheck.frontends.cli import _command, main
from numcheck.frontends.doctor import exact_hex
from numcheck.formats import FORMATS


@pytest.fixture(scope="module")
def doctor_text() -> str:
    """One text run shared by the tests that read it (doctor probes every device)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["doctor"]) == 0
    return buf.getvalue()


def _format_rows(text: str) -> dict[str, list[str]]:
    """Rows of the value table (name, max, min normal, min subnormal), keyed by format name."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["name", "max"])
    rows = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        name, rest = line.split(maxsplit=1)
        rows[name] = re.findall(r"(\S+) \((\S+)\)|none", rest)
    return rows


def test_doctor_text_exit_and_sections(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for section in ("Versions and provenance", "CPU ISA", "Device cpu", "dtype support",
                    "SDPA backends", "Optional libraries", "Number formats"):
        assert section in out
    assert f"torch               {torch.__version__}" in out
    for dtype in env.LOW_PRECISION_DTYPES:
        assert dtype in out
    for lib in env.OPTIONAL_LIBRARIES:
        assert re.search(rf"^  {lib} ", out, re.M), lib


def test_doctor_format_table_lists_every_format_with_its_max(doctor_text):
    rows = _format_rows(doctor_text)
    assert list(rows) == list(FORMATS)  # all 11, in table order
    for name, f in FORMATS.items():
        (max_dec, max_hex), (mn_dec, mn_hex) = rows[name][:2]
        assert float.fromhex(max_hex) == f.max, name
        assert float(max_dec) == pytest.approx(f.max, rel=1e-5), name  # printed with %.6g
        assert float.fromhex(mn_hex) == f.min_normal, name
    assert "448 (0x1.cp+8)" in doctor_text  # the documented short form, not float.hex's padding
    assert rows["e8m0"][2] == ("", "")  # 'none': e8m0 has no subnormals


def test_doctor_structural_table_matches_formats(doctor_text):
    lines = doctor_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["name", "bits"])
    seen = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        cells = line.split()
        seen[cells[0]] = [int(c) for c in cells[1:7]]
    assert seen == {n: [f.bits, f.ebits, f.mbits, f.bias, f.emin, f.emax]
                    for n, f in FORMATS.items()}


def test_doctor_json(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= {"numcheck", "provenance", "cpu_isa", "devices", "optional_libraries",
                           "formats"}
    assert report["devices"][0]["device"] == "cpu"
    assert report["devices"][0]["device_class"] == "cpu"
    assert len(report["devices"]) == 1 + (torch.cuda.device_count()
                                          if torch.cuda.is_available() else 0)
    for dev in report["devices"]:
        assert set(dev["dtype_support"]) == set(env.LOW_PRECISION_DTYPES)
        assert set(dev["sdpa_backends"]) == {"MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION",
                                             "CUDNN_ATTENTION"}
    formats = {r["name"]: r for r in report["formats"]}
    assert list(formats) == list(FORMATS)
    for name, f in FORMATS.items():
        assert formats[name]["max"] == f.max
        assert float.fromhex(formats[name]["max_hex"]) == f.max
        assert formats[name]["bits"] == f.bits
        assert formats[name]["min_subnormal"] == f.min_subnormal
    prov = report["provenance"]
    for key in ("numcheck", "python", "torch", "cuda", "cudnn", "driver", "device_name",
                "compute_capability", "device_class", "cpu_isa", "numpy", "ml_dtypes",
                "torchao", "date"):
        assert isinstance(prov[key], str) and prov[key], key
    assert set(report["optional_libraries"]) == set(env.OPTIONAL_LIBRARIES)


@pytest.mark.parametrize("x", [448.0, 2.0**-1074, FORMATS["fp64"].max, 2.0**-149, -6.0, 1.0])
def test_hex_is_exact_and_short(x):
    h = exact_hex(x)
    assert float.fromhex(h) == x
    assert not re.search(r"0p", h)  # no trailing zero digits
    assert h.lstrip("-").startswith("0x1")


def test_usage_errors_exit_2(capsys):
    assert main([]) == 2  # no subcommand
    assert main(["no-such-command"]) == 2
    assert main(["doctor", "--no-such-flag"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_usage_error_in_a_command_is_reported_and_exits_2(capsys, monkeypatch):
    from numcheck.frontends import cli

    monkeypatch.setattr(cli, "_COMMANDS", dict(cli._COMMANDS))

    @_command("boom", help="raise a UsageError")
    def _boom(args):
        raise UsageError("op 'nope' is not registered")

    assert main(["boom"]) == 2
    assert capsys.readouterr().err == "numcheck: error: op 'nope' is not registered\n"


def test_device_class_cpu():
    assert env.device_class("cpu") == "cpu"
    assert env.device_class(torch.device("cpu")) == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a CUDA device")
def test_device_class_without_cuda_is_a_usage_error():
    with pytest.raises(UsageError, match="cuda"):
        env.device_class("cuda")
    assert env.device_class() == "cpu"


def test_provenance_is_strings_and_hostname_free():
    import socket

    prov = env.provenance("cpu")
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in prov.items())
    assert prov["device_class"] == "cpu"
    assert prov["torch"] == torch.__version__
    assert prov["cpu_isa"] == env.cpu_isa()["summary"]
    host = socket.gethostname()
    if len(host) >= 4:  # a short hostname could occur by chance in a version string
        assert all(host not in v for v in prov.values())


def test_cpu_isa_shape():
    isa = env.cpu_isa()
    for flag in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"):
        assert isinstance(isa[flag], bool)
    assert isa["torch_capability"] == str(torch.backends.cpu.get_cpu_capability())
    if isa["amx_tile"]:
        assert isa["summary"] == "AMX"
    elif isa["avx512_bf16"]:
        assert isa["summary"] == "AVX512-BF16"
    assert isa["summary"]


def test_dtype_support_cpu():
    # PLATFORM.md: fp8 casts and tensor-wise _scaled_mm run on the CPU; fp4 is storage only.
    support = env.dtype_support("cpu")
    assert support["bfloat16"] == "cast"
    assert support["float8_e4m3fn"].startswith("cast")
    if hasattr(torch, "float4_e2m1fn_x2"):
        assert support["float4_e2m1fn_x2"] in ("storage only", "cast")


def test_probes_never_raise_on_a_missing_device():
    bad = "cuda:99"
    assert all(v.startswith("error") for v in env.dtype_support(bad).values())
    assert all(v.startswith("unavailable") for v in env.sdpa_backends(bad).values())


def test_sdpa_math_runs_on_cpu():
    backends = env.sdpa_backends("cpu")
    assert backends["MATH"] == "fp32, bf16"
    assert all(v for v in backends.values())


def test_optional_libraries_does_not_import_torchao(monkeypatch):
    # torchao and its submodules out of sys.modules for the test, put back after: popping the
    # package alone left torchao.float8 behind, and the next `import torchao` (transformers',
    # in a later test of the same worker) built a package without its float8 attribute
    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    libs = env.optional_libraries()
    assert "torchao" not in sys.modules
    assert libs["pyarrow"]["importable"] and libs["pyarrow"]["version"]
    assert libs["ml_dtypes"]["importable"] and libs["ml_dtypes"]["version"]


@pytest.mark.cuda
def test_cuda_device_class_and_fp8():
    assert re.fullmatch(r"cuda-sm\d+", env.device_class("cuda"))
    support = env.dtype_support("cuda")
    assert support["float8_e4m3fn"].startswith("cast")
    assert support["float8_e5m2"].startswith("cast")
    major, _ = torch.cuda.get_device_capability()
    if major >= 9:  # Hopper and later run tensor-wise fp8 GEMMs (cuBLASLt)
        assert support["float8_e4m3fn"] == "cast+scaled_mm"
    prov = env.provenance("cuda")
    assert prov["compute_capability"] != "n/a" and prov["cuda"] != "n/a"
    backends = env.sdpa_backends("cuda")
    assert "bf16" in backends["MATH"] and "fp16" in backends["MATH"]


def test_console_script_runs():
    exe = shutil.which("numcheck")
    cmd = [exe, "doctor"] if exe else [sys.executable, "-m", "numcheck", "doctor"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "Number formats" in res.stdout


def test_python_dash_m_usage_error_exits_2():
    res = subprocess.run([sys.executable, "-m", "numcheck", "no-such-command"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "usage: numcheck" in res.stderr
