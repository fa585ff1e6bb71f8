"""`numcheck fingerprint`: text and JSON output, a golden recorded and compared, usage errors
(exit 2) naming the argument."""
from __future__ import annotations

import json

from numcheck.frontends.cli import main


def test_text_and_json(capsys):
    assert main(["fingerprint", "--op", "matmul", "--kernel", "torch", "--dtype", "fp32",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("matmul/torch fp32 on cpu")
    for prop in ("acc_bits", "promote_every", "acc_rounding", "order", "deterministic",
                 "batch_invariant"):
        assert f"  {prop}" in out
    assert main(["fingerprint", "--op", "linear", "--kernel", "torch", "--json",
                 "--device", "cpu"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["acc_bits"] == 23 and d["op"] == "linear" and "order" in d["evidence"]


def test_golden_recorded_then_same(tmp_path, capsys):
    args = ["fingerprint", "--op", "matmul", "--kernel", "torch", "--device", "cpu",
            "--golden-dir", str(tmp_path)]
    assert main(args + ["--refresh"]) == 0
    assert (tmp_path / "cpu" / "fingerprint.parquet").exists()
    assert "wrote" in capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out.rstrip().endswith("golden: same")


def test_usage_errors(capsys):
    assert main(["fingerprint", "--op", "gelu", "--kernel", "torch"]) == 2
    assert "no probe" in capsys.readouterr().err
    assert main(["fingerprint", "--op", "matmul", "--kernel", "nope"]) == 2
    assert "--kernel 'nope'" in capsys.readouterr().err
    assert main(["fingerprint", "--op", "matmul", "--kernel", "torch", "--refresh"]) == 2
    assert "--golden-dir" in capsys.readouterr().err
