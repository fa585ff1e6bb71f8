"""Telemetry on a model from a model library installed from PyPI (the ``models`` extra:
transformers, measured on 5.23.0): a tiny Llama with grouped-query attention (sdpa with
``enable_gqa``), rotary embeddings, tied embeddings and the ``model(input_ids, labels=...)``
interface that returns the loss and the logits. Skipped where transformers is not installed
(CI installs ``.[test,torchao]``; ``pip install -e .[models]`` to run it)."""
from __future__ import annotations

import copy

import pytest
import torch

from numcheck import telemetry

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
transformers = pytest.importorskip("transformers", reason="the models extra: "
                                   "pip install -e .[models]")


def _llama(dtype=torch.bfloat16):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def _train(model, watch=None, steps=2, fault_at=None):
    """A few SGD steps on fixed tokens; the loss comes with the logits (labels=...)."""
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 16))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        if step == fault_at:   # finite weights whose products overflow fp32
            with torch.no_grad():
                model.model.layers[1].mlp.up_proj.weight.fill_(3e38)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss.detach().clone())
        opt.step()
        opt.zero_grad()
        if watch is not None:
            watch.step()
    return losses


def test_a_llama_is_watched_without_changing_it():
    model = _llama()
    plain = copy.deepcopy(model)
    with telemetry.watch(model, shadow=True) as t:
        losses = _train(model, t)
    assert all(torch.equal(a, b) for a, b in zip(losses, _train(plain), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), plain.parameters(),
                                                  strict=True))
    df = t.records()
    assert {"embedding", "linear", "norm", "rope", "sdpa"} <= set(df.op)
    sdpa = df[(df.op == "sdpa") & (df.role == "input")].iloc[0]
    assert sdpa.n == 2 * 4 * 16 * 16 + 2 * (2 * 2 * 16 * 16)   # q, and k, v before GQA
    out = df[(df.op == "sdpa") & (df.role == "output")]
    # bf16 attention against float64: ~8 bits (48 dB) within a few dB; e2e adds the layers'
    assert out.shadow_sqnr_db.between(40, 70).all() and out.e2e_sqnr_db.between(30, 70).all()
    # the rotary embedding by its class name: cos/sin tables rounded to bf16 (~8 bits)
    assert df[(df.op == "rope") & (df.role == "output")].shadow_sqnr_db.between(45, 75).all()
    # tied embeddings: the one gradient is checked once, named by its owner and its sharer
    assert {"model.embed_tokens", "lm_head"} <= set(df[df.role == "grad_weight"].module)
    assert not t.first_nonfinite() and t.first_nonfinite().reason == "all_finite"


@pytest.mark.parametrize("every", [1, 3])
def test_a_llama_overflow_is_named_at_any_every(every):
    """The fault at step 1 (a step every=3 does not record: found by the sentinel's replay of
    the loss+logits output, each output's gradient once): the MLP's up projection."""
    model = _llama(torch.float32)
    with telemetry.watch(model, every=every) as t:
        _train(model, t, steps=3, fault_at=1)
    got = t.first_nonfinite()
    assert got and (got.step, got.module, got.op, got.role, got.pass_) == \
        (1, "model.layers.1.mlp.up_proj", "linear", "output", "forward"), got


def test_compare_names_a_faulty_layer_of_a_llama():
    """``telemetry.compare`` on the library's model as users call it (``model(**batch)``
    returning loss and logits, tied embeddings): fp32 against fp8_tensor with one MLP
    projection's weight dequantized 25% off names that projection's output; uniform
    fp8_tensor names nobody."""
    from _support import fp8_with_a_fault

    model = _llama(torch.float32)
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 16))
    batches = [{"input_ids": ids, "labels": ids}]
    got = telemetry.compare(model, batches, "fp32",
                            fp8_with_a_fault("model.layers.1.mlp.up_proj"))
    assert got and (got.first["module"], got.first["role"]) == \
        ("model.layers.1.mlp.up_proj", "output"), got.summary()
    assert not telemetry.compare(model, batches, "fp32", "fp8_tensor"), "uniform: nobody"


def test_diff_by_digest_names_a_one_ulp_change_in_a_llama():
    """Two watched runs of the library's model (bf16), the second with one element of
    layers.1.mlp.up_proj's output one ULP up from step 1: the digests name that projection at
    step 1 (a statistic may move with it later: one bf16 ULP is the band's size)."""
    def run(bump: bool):
        model = _llama()
        proj = model.model.layers[1].mlp.up_proj
        at = {"step": 0}

        def one_ulp(m, args, out):
            if not bump or at["step"] < 1:
                return None
            v = out.detach().reshape(-1)[5]
            d = torch.zeros(out.numel(), dtype=out.dtype)
            d[5] = torch.nextafter(v, torch.tensor(float("inf"), dtype=out.dtype)) - v
            return out + d.view(out.shape)

        proj.register_forward_hook(one_ulp)
        with telemetry.watch(model, digests=True) as t:
            torch.manual_seed(1)
            ids = torch.randint(0, 128, (2, 16))
            opt = torch.optim.SGD(model.parameters(), lr=1e-2)
            for step in range(3):
                at["step"] = step
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad()
                t.step()
        return t.records()

    a = run(False)
    assert not telemetry.diff(a, run(False))
    got = telemetry.diff(a, run(True))
    bits = got.first_digest
    assert got.first is None or got.first.step >= 1, got.summary()
    assert (bits.step, bits.module, bits.role) == (1, "model.layers.1.mlp.up_proj", "output"), \
        got.summary()


def test_plan_keeps_a_llama_layer_with_massive_activations_wider():
    # massive activations planted in layers.0's down_proj input (four channels of 256, their
    # weight columns zero: the function is the plain model's minus four channels)
    torch.manual_seed(1)
    batches = [{"input_ids": (ids := torch.randint(0, 128, (2, 16))), "labels": ids}
               for _ in range(2)]
    model = _llama(torch.float32)
    down = model.model.layers[0].mlp.down_proj
    channels = [3, 40, 77, 100]
    with torch.no_grad():
        down.weight[:, channels] = 0.0

    def massive(mod, args):
        x = args[0].clone()
        x[..., channels] = 256.0
        return (x,)
    down.register_forward_pre_hook(massive)
    plan = telemetry.plan(telemetry.sensitivity(model, batches))
    wider = {m: r for m, r in plan.choices.items() if r != "nvfp4"}
    assert wider == {"model.layers.0.mlp.down_proj": "mxfp8"}
    assert len(plan.choices) == 15                    # 14 projections and the tied lm_head
    # the plan applied to a fresh Llama: tied weights stay tied, the loss and logits interface
    # still trains
    fresh = plan.apply(_llama(torch.float32))
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    out = fresh(**batches[0])
    out.loss.backward()
    assert torch.isfinite(out.loss) and fresh.model.embed_tokens.weight.grad is not None


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
@pytest.mark.xdist_group("ranks")
@pytest.mark.parametrize("plant", [False, True], ids=["clean", "one-ulp-exp_avg_sq"])
def test_ddp_llama_optimizer_state_replicas(tmp_path, plant):
    """Under DDP (2 gloo ranks) with tied embeddings, the replica check with the optimizer
    finds nothing on a clean run and names a one-ulp nudge of one Adam second moment on rank 1
    from its step on; the weights stay bitwise equal (the update rounds alike)."""
    import json

    import _distributed as D
    D.spawn(D.llama_state_run, 2, str(tmp_path), plant)
    rows = json.loads((tmp_path / "replicas.json").read_text())
    if not plant:
        assert rows == []
        return
    assert (rows[0]["step"], rows[0]["parameter"], rows[0]["ranks"]) == \
        (1, "model.layers.0.mlp.down_proj.weight:exp_avg_sq", [0, 1])
    assert {r["parameter"] for r in rows} == {"model.layers.0.mlp.down_proj.weight:exp_avg_sq"}
    assert 0 < rows[0]["max_abs_diff"] < 1e-12
