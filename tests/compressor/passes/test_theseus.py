"""The `theseus` pass: BERT-of-Theseus module replacing on the tiny 4-layer BERT (k = 2)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from transformers import BertForSequenceClassification, DistilBertForSequenceClassification

from compressor.bundle import ModelBundle
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.passes import Context, apply_pass, check_pass_family, get_pass
from compressor.passes import theseus
from compressor.pipeline.recipe import parse_recipe, parse_step
from compressor.pipeline.run import run_recipe
from pretrain.batching import collate, encode
from pretrain.errors import UserError
from pretrain.models import encoder_layers, keep_encoder_layers
from pretrain.train import CHECKPOINT_FILE

BUDGET = {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_train_samples": 96}   # 6 steps


def config(**kw) -> theseus.TheseusConfig:
    return theseus.TheseusConfig.model_validate({"successor_layers": 2, **BUDGET, **kw})


def ctx(task, **kw) -> Context:
    return Context(task=task, seed=0, show_progress=False, **kw)


class Interrupt(Exception):
    pass


@pytest.fixture
def extra_callbacks(monkeypatch):
    """Callbacks (and a look at the model at the end of training, wrapper still in place)
    added to the pass's training run."""
    added, seen = [], {}
    real = theseus.finetune

    def spy(model, tokenizer, task, cfg, **kw):
        result = real(model, tokenizer, task, cfg, **{**kw, "callbacks": [*kw["callbacks"], *added]})
        seen["layers"] = encoder_layers(model)
        seen["state"] = {k: v.clone() for k, v in model.state_dict().items()}
        return result
    monkeypatch.setattr(theseus, "finetune", spy)
    return added, seen


def test_output_is_a_plain_model_of_n_layers(model_dirs, tiny_task):
    for family, cls in (("bert", BertForSequenceClassification), ("distilbert", DistilBertForSequenceClassification)):
        bundle = ModelBundle.load(model_dirs[family]).replace(task=tiny_task.spec)
        n = 1 if family == "distilbert" else 2        # the tiny DistilBERT has 3 layers
        out = apply_pass(bundle, "theseus", config(successor_layers=n, max_train_samples=32), ctx(tiny_task))
        assert type(out.model) is cls
        assert len(encoder_layers(out.model)) == n
        assert out.model.config.to_dict()[{"bert": "num_hidden_layers", "distilbert": "n_layers"}[family]] == n
        wrapper = [m for m in out.model.modules() if isinstance(m, (theseus.TheseusBlock, theseus.TheseusLayers))]
        assert not wrapper
        # the same parameters as the plain model of that depth, and all trainable again
        plain = cls(out.model.config)
        assert out.model.state_dict().keys() == plain.state_dict().keys()
        assert all(p.requires_grad for p in out.model.parameters())


def test_only_successors_train_and_they_start_as_the_block_layers(bert_bundle, tiny_task, extra_callbacks):
    _, seen = extra_callbacks
    before = {k: v.clone() for k, v in bert_bundle.model.state_dict().items()}
    out = apply_pass(bert_bundle, "theseus", config(), ctx(tiny_task))
    after = out.model.state_dict()
    frozen = [k for k in after if not k.startswith("bert.encoder.layer.")]
    assert any(k.startswith("bert.embeddings.") for k in frozen) and "classifier.weight" in frozen
    assert all(torch.equal(after[k], before[k]) for k in frozen)
    # successors 0, 1 started as predecessor layers 0, 2 (init "block") and trained
    for new, old in enumerate([0, 2]):
        keys = [k for k in before if k.startswith(f"bert.encoder.layer.{old}.")]
        moved = [k for k in keys if not torch.equal(after[k.replace(f"layer.{old}.", f"layer.{new}.")], before[k])]
        assert "attention" in " ".join(moved) and "output.dense.weight" in " ".join(moved)
    # at the end of training the wrapper held the predecessors, all four unchanged
    assert isinstance(seen["layers"], theseus.TheseusLayers) and int(seen["layers"].steps_done) == 6
    for layer in range(4):
        block, inner = divmod(layer, 2)
        prefix = f"bert.encoder.layer.{block}.predecessors.{inner}."
        keys = [k for k in before if k.startswith(f"bert.encoder.layer.{layer}.")]
        assert keys and all(torch.equal(seen["state"][k.replace(f"bert.encoder.layer.{layer}.", prefix)], before[k])
                            for k in keys)


def test_official_init_copies_the_first_layers(bert_bundle, tiny_task, monkeypatch):
    monkeypatch.setattr(theseus, "finetune", lambda *a, **kw: None)     # the starting point only
    out = apply_pass(bert_bundle, "theseus", config(init="first"), ctx(tiny_task))
    before, after = bert_bundle.model.state_dict(), out.model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in after)          # layers 0, 1 kept as they were


def tiny_batch(bundle, task) -> dict:
    return collate(encode(bundle.tokenizer, task.split("train").head(4)), np.arange(4))


def test_each_block_runs_its_successor_with_probability_p(bert_bundle, tiny_task):
    model = bert_bundle.copy_model().eval()
    predecessors = copy.deepcopy(encoder_layers(model))
    keep_encoder_layers(model, [0, 2])
    batch = tiny_batch(bert_bundle, tiny_task)
    with torch.no_grad():
        teacher_logits = bert_bundle.model(**batch).logits
        successor_logits = model(**batch).logits
    calls = {"successor": 0, "predecessor": 0}
    with theseus.replacing(model, predecessors) as layers:
        for block in layers:
            block.successor.register_forward_hook(lambda *_: calls.__setitem__("successor", calls["successor"] + 1))
            for layer in block.predecessors:
                layer.register_forward_hook(lambda *_: calls.__setitem__("predecessor", calls["predecessor"] + 1))
        with torch.no_grad():
            # p = 0: the predecessor itself; p = 1: the successor model
            layers.choose(0.0, seed=0)
            torch.testing.assert_close(model(**batch).logits, teacher_logits)
            layers.choose(1.0, seed=0)
            torch.testing.assert_close(model(**batch).logits, successor_logits)
            calls.update(successor=0, predecessor=0)
            steps, p = 200, 0.3
            drawn = 0
            for step in range(steps):
                layers.steps_done.fill_(step)
                drawn += sum(layers.choose(p, seed=0))
                model(input_ids=batch["input_ids"][:1, :4])
    blocks = steps * 2
    assert calls["successor"] == drawn and calls["predecessor"] == 2 * (blocks - drawn)
    assert abs(drawn / blocks - p) < 4 * (p * (1 - p) / blocks) ** 0.5     # within 4 sigma of p
    # the draws are a function of (seed, step): the same again, other for another seed
    layers.steps_done.fill_(7)
    assert layers.choose(0.5, seed=0) == layers.choose(0.5, seed=0)
    assert any(layers.choose(0.5, seed=s) != layers.choose(0.5, seed=0) for s in range(1, 10))
    assert type(encoder_layers(model)) is torch.nn.ModuleList and len(encoder_layers(model)) == 2


def test_soft_targets_are_the_predecessors_logits(bert_bundle, tiny_task, monkeypatch):
    """With soft_weight, each step adds soft_weight x KL(T) against the input model's own logits
    (in eval mode, on the same batch); the input model stays as it was."""
    seen, real_kl, real_loss = [], theseus.soft_kl, theseus.with_soft_targets
    batches = []
    monkeypatch.setattr(theseus, "with_soft_targets", lambda m, reader, b, c: batches.append(
        {k: v for k, v in b.items() if k != "labels"}) or real_loss(m, reader, b, c))
    monkeypatch.setattr(theseus, "soft_kl", lambda s, t, temp: seen.append((t.clone(), temp)) or real_kl(s, t, temp))
    before = {k: v.clone() for k, v in bert_bundle.model.state_dict().items()}
    out = apply_pass(bert_bundle, "theseus", config(soft_weight=0.5, temperature=3.0), ctx(tiny_task))
    assert len(seen) == 6 and {temp for _, temp in seen} == {3.0}
    predecessor = copy.deepcopy(bert_bundle.model).eval()
    with torch.no_grad():
        for (targets, _), inputs in zip(seen, batches):
            assert torch.allclose(targets, predecessor(**inputs).logits, atol=1e-5)
    assert all(torch.equal(v, before[k]) for k, v in bert_bundle.model.state_dict().items())
    plain = apply_pass(bert_bundle, "theseus", config(), ctx(tiny_task))
    assert not torch.equal(out.model.bert.encoder.layer[0].output.dense.weight,
                           plain.model.bert.encoder.layer[0].output.dense.weight)


def test_default_rate_is_the_measured_one_and_an_explicit_rate_wins():
    assert theseus.TheseusConfig(successor_layers=2).lr == 3e-4
    assert theseus.TheseusConfig(successor_layers=2, lr=1e-4).lr == 1e-4


def test_schedules():
    linear = config(schedule="linear")                       # b = 0.3, p = 1 at half the run
    assert [round(theseus.replacing_rate(linear, t, 100), 6) for t in (0, 25, 50, 99)] == [0.3, 0.65, 1.0, 1.0]
    given = config(schedule="linear", theta=0.01, b=0.1)
    assert [round(theseus.replacing_rate(given, t, 1000), 6) for t in (0, 10, 89, 90, 500)] == [0.1, 0.2, 0.99, 1.0, 1.0]
    constant = config(schedule="constant", replacing_fraction=0.75)
    assert [theseus.replacing_rate(constant, t, 100) for t in (0, 74, 75, 99)] == [0.5, 0.5, 1.0, 1.0]


def test_resumes_after_a_kill_with_identical_weights(bert_bundle, tiny_task, extra_callbacks, tmp_path):
    added, _ = extra_callbacks
    cfg = config(checkpoint_every=2)
    reference = apply_pass(bert_bundle, "theseus", cfg, ctx(tiny_task))

    def stop_at_5(log):
        if log.step == 5:
            raise Interrupt
    added.append(stop_at_5)
    with pytest.raises(Interrupt):
        apply_pass(bert_bundle, "theseus", cfg, ctx(tiny_task, work_dir=tmp_path))
    assert torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)["progress"]["step"] == 4
    steps: list[int] = []
    added[:] = [lambda log: steps.append(log.step)]
    resumed = apply_pass(bert_bundle, "theseus", cfg, ctx(tiny_task, work_dir=tmp_path))
    assert steps == [5, 6]
    a, b = reference.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_output_exports_fused_and_quantizes(bert_bundle, tiny_task, tmp_path):
    out = apply_pass(bert_bundle.replace(task=tiny_task.spec), "theseus", config(max_train_samples=32),
                     ctx(tiny_task))
    record = export_bundle(out, tmp_path / "fp32", ExportSettings(optimize=True), tiny_task).record
    assert record["format"] == "onnx" and record["optimized"]
    int8 = apply_pass(out, "quantize", get_pass("quantize").config_type(mode="dynamic-int8"), ctx(tiny_task))
    record = export_bundle(int8, tmp_path / "int8", ExportSettings(optimize=True, accuracy_tolerance=1.0),
                           tiny_task).record
    assert record["quantization"]["mode"] == "dynamic-int8"


@pytest.mark.parametrize("n", [3, 4, 5])
def test_refuses_successor_counts_that_do_not_split_the_depth(bert_bundle, tiny_task, monkeypatch, n):
    monkeypatch.setattr(theseus, "finetune", lambda *a, **kw: pytest.fail("trained before refusing"))
    with pytest.raises(UserError) as err:
        apply_pass(bert_bundle, "theseus", config(successor_layers=n), ctx(tiny_task))
    assert "\n" not in str(err.value) and "4 layers" in str(err.value) and f"successor_layers {n}" in str(err.value)


def test_refuses_a_family_without_transformer_layers():
    with pytest.raises(UserError, match="'bilm'"):
        check_pass_family("theseus", config(), "bilm")


@pytest.mark.parametrize("raw, why", [({"successor_layers": 0}, "greater than or equal to 1"),
                                      ({}, "successor_layers"),
                                      ({"successor_layers": 2, "strategy": "adapters"}, "strategy"),
                                      ({"successor_layers": 2, "schedule": "cubic"}, "schedule"),
                                      ({"successor_layers": 2, "p": 0}, "greater than 0"),
                                      ({"successor_layers": 2, "soft_weight": -1}, "soft_weight"),
                                      ({"successor_layers": 2, "temperature": 0}, "temperature")])
def test_config_validation(raw, why):
    with pytest.raises(ValidationError, match=why):
        theseus.TheseusConfig.model_validate(raw)
    with pytest.raises(UserError, match=r"variants\.v\[0\]\.theseus"):
        parse_step({"theseus": raw}, "variants.v[0]")


def test_a_recipe_that_cannot_split_the_depth_leaves_nothing(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    monkeypatch.setattr(theseus, "finetune", lambda *a, **kw: pytest.fail("trained before refusing"))
    raw = {"name": "tiny", "seed": 0, "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
           "variants": {"v": [{"theseus": {"successor_layers": 3}}]}}
    recipe, steps = parse_recipe(raw)
    with pytest.raises(UserError, match="4 layers"):
        run_recipe(recipe, steps, tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()

