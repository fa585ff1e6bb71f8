"""`numcheck inspect` (issue 14): a model trained a few steps under numcheck.telemetry; the
records and heatmap are written, the per-layer table and the first non-finite producer are
printed, the telemetry page (telemetry.html) holds the heatmaps and the producer line;
per-rank files merge."""
from __future__ import annotations

import pandas as pd
import pytest

from numcheck.frontends import cli

OVERFLOW = '''
import torch
from torch import nn


class Exp(nn.Module):
    def forward(self, x):
        return torch.exp(x)   # overflows fp32 once x > 88.7


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.act = Exp()
        self.out = nn.Linear(8, 1)        # propagates the inf it is fed
        self.norm = nn.LayerNorm(1)

    def loss(self, batch):
        return self.norm(self.out(self.act(self.inp(batch["x"])))).pow(2).mean()


class Task:
    def batch_at(self, seed, step):
        g = torch.Generator().manual_seed(step)
        scale = 1.0 if step < 2 else 1e4   # large activations from step 2 on
        return {"x": scale * torch.randn(16, 4, generator=g)}


def make(seed):
    torch.manual_seed(seed)
    return Net(), Task(), 1e-3
'''


def test_inspect_a_tiny_model(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["inspect", "--model", "mlp", "--recipe", "mxfp8", "--what-if", "nvfp4",
                     "--steps", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "first non-finite producer: none" in text and "sqnr_db" in text
    frame = pd.read_parquet(out / "telemetry.parquet")
    assert set(frame["step"]) == {0, 1}
    linear = frame[(frame["op"] == "linear") & ~frame["what_if"]]
    assert set(linear["role"]) == {"input", "weight", "output", "grad_output", "grad_input",
                                   "grad_weight"}
    assert set(frame.loc[frame["what_if"], "recipe"]) == {"nvfp4"}
    assert (out / "telemetry.png").stat().st_size > 0
    page = (out / "telemetry.html").read_text()
    assert f"page:    {out / 'telemetry.html'}" in text
    assert "<title>numcheck inspect: mlp</title>" in page and 'data-recipe="nvfp4"' in page
    assert "first non-finite producer: none" in page and "<script" not in page


def test_inspect_names_the_producer_and_exits_1(tmp_path, capsys, monkeypatch):
    (tmp_path / "overflowing.py").write_text(OVERFLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["inspect", "--model", "overflowing:make", "--steps", "4",
                     "--out", str(tmp_path / "o")]) == 1
    text = capsys.readouterr().out
    line = "first non-finite producer: step 2, act (module), output in the forward pass"
    assert line in text
    page = (tmp_path / "o" / "telemetry.html").read_text()
    assert f'<p class="producer"><code>{line}' in page
    # act has no rows of its own (op "module": producer checks only); out's output, fed the
    # inf, is flagged at step 2
    out_row = page[page.index('<tr data-module="out" data-op="linear" data-role="output">'):]
    out_row = out_row[:out_row.index("</tr>")]
    assert out_row.count('class="heat fail"') == 1 and 'data-step="2"' in \
        out_row[out_row.index('class="heat fail"'):]


def test_inspect_merges_per_rank_files(tmp_path, capsys):
    from numcheck import telemetry
    from numcheck.telemetry import inspect as ins

    t = ins.run("mlp", steps=2)
    whole = t.records()
    paths = []
    for rank in (0, 1):  # two ranks that each saw one of the steps
        part = whole[whole["step"] == rank].assign(step=0, rank=rank)
        paths.append(tmp_path / f"rank{rank}.parquet")
        part.to_parquet(paths[-1], index=False)
    assert cli.main(["inspect", "--merge", *map(str, paths), "--out", str(tmp_path / "m")]) == 0
    merged = pd.read_parquet(tmp_path / "m" / "telemetry.parquet")
    expect = telemetry.merge([pd.read_parquet(p) for p in paths])
    pd.testing.assert_frame_equal(merged.reset_index(drop=True), expect.reset_index(drop=True))
    assert (merged["n"].sum() == whole["n"].sum())
    page = (tmp_path / "m" / "telemetry.html").read_text()
    assert "ranks -1" in page and 'class="producer"' not in page  # no producer of a merge


def test_inspect_usage_errors(capsys):
    assert cli.main(["inspect"]) == 2
    assert "give --model" in capsys.readouterr().err
    assert cli.main(["inspect", "--model", "no_such_module:make"]) == 2
    assert "cannot load it" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_inspect_every_n_records_sampled_steps_and_still_names_the_producer(tmp_path, capsys,
                                                                           monkeypatch):
    (tmp_path / "overflowing.py").write_text(OVERFLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    # step 2 is not recorded at --every 3: the sentinel sees it and its replay names the layer
    assert cli.main(["inspect", "--model", "overflowing:make", "--steps", "4", "--every", "3",
                     "--out", str(tmp_path / "o")]) == 1
    text = capsys.readouterr().out
    assert "first non-finite producer: step 2, act (module), output in the forward pass" in text
    assert set(pd.read_parquet(tmp_path / "o" / "telemetry.parquet")["step"]) == {0}


NO_LOSS_METHOD = '''
import torch
from torch import nn


class LossAndLogits(nn.Module):
    """A model library's interface: model(x, labels=...) -> {"loss", "logits"}; no .loss."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, labels=None):
        logits = self.lin(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class Task:
    def __init__(self, labels=True):
        self.labels = labels

    def batch_at(self, seed, step):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 4, generator=g)
        return {"x": x, "labels": torch.randint(0, 3, (8,), generator=g)} if self.labels \\
            else {"x": x}


def make(seed):
    torch.manual_seed(seed)
    return LossAndLogits(), Task(), 1e-3


def make_unlabelled(seed):
    torch.manual_seed(seed)
    return LossAndLogits(), Task(labels=False), 1e-3


def my_loss(model, batch):
    return model(batch["x"])["logits"].pow(2).mean()
'''


@pytest.fixture
def no_loss_method(tmp_path, monkeypatch):
    (tmp_path / "noloss.py").write_text(NO_LOSS_METHOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_inspect_takes_the_loss_from_the_models_output(no_loss_method, capsys):
    """No .loss method: the dict output's "loss" (model libraries' labels= interface)."""
    assert cli.main(["inspect", "--model", "noloss:make", "--steps", "2",
                     "--out", str(no_loss_method / "o")]) == 0
    assert "first non-finite producer: none (all_finite" in capsys.readouterr().out


def test_inspect_without_a_loss_anywhere_is_a_usage_error(no_loss_method, capsys):
    """It was a raw AttributeError traceback and exit 1 (which means a numerical failure)."""
    assert cli.main(["inspect", "--model", "noloss:make_unlabelled", "--steps", "2",
                     "--out", str(no_loss_method / "o")]) == 2
    err = capsys.readouterr().err
    assert "no loss method" in err and "--loss module:attr" in err and "Traceback" not in err


def test_inspect_with_a_loss_callable(no_loss_method, capsys):
    assert cli.main(["inspect", "--model", "noloss:make_unlabelled", "--loss", "noloss:my_loss",
                     "--steps", "2", "--out", str(no_loss_method / "o")]) == 0
    frame = pd.read_parquet(no_loss_method / "o" / "telemetry.parquet")
    assert set(frame["step"]) == {0, 1}


def test_inspect_with_a_loss_that_cannot_be_loaded_exits_2(no_loss_method, capsys):
    assert cli.main(["inspect", "--model", "noloss:make", "--loss", "noloss:absent",
                     "--steps", "1", "--out", str(no_loss_method / "o")]) == 2
    assert "--loss 'noloss:absent': cannot load it" in capsys.readouterr().err


def test_the_heatmap_keeps_long_layer_names(tmp_path):
    """The plot cut module labels (issue 32): the saved image's box now fits every label, so a
    long name widens the image instead of being clipped."""
    from PIL import Image

    from numcheck.telemetry import inspect as ins

    def width(name: str) -> int:
        frame = pd.DataFrame({"step": [0, 1, 0, 1], "module": [name, name, "b", "b"],
                              "role": "input", "what_if": False,
                              "sqnr_db": [30.0, 31.0, 29.0, 28.0]})
        path = ins.plot(frame, tmp_path / f"{len(name)}.png")
        return Image.open(path).size[0]

    short, long_ = width("a"), width("model.transformer.layers.23.self_attn.q_proj" * 2)
    assert long_ > short + 300   # ~90 more characters at 7 pt, 110 dpi: ~ 5 px a character
