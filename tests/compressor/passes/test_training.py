"""The `finetune` pass with a strategy: the output carries its adapters, the input is untouched."""

from __future__ import annotations

import torch

from compressor.bundle import ModelBundle
from compressor.passes.registry import Context, apply_pass, get_pass


def test_finetune_pass_with_adapters(bert_bundle, tiny_task, tmp_path):
    before = {k: v.clone() for k, v in bert_bundle.model.state_dict().items()}
    cfg = get_pass("finetune").config_type.model_validate(
        {"epochs": 1, "batch_size": 16, "lr": 1e-3, "strategy": "adapters", "adapter_size": 8, "max_train_samples": 64})
    out = apply_pass(bert_bundle, "finetune", cfg, Context(task=tiny_task, show_progress=False))
    assert not any(".adapter." in n for n, _ in bert_bundle.model.named_parameters())
    assert all(torch.equal(v, bert_bundle.model.state_dict()[k]) for k, v in before.items())
    assert any(".adapter." in n for n, _ in out.model.named_parameters())
    assert out.history[-1]["config"]["strategy"] == "adapters"
    out.save(tmp_path / "out")
    reloaded = ModelBundle.load(tmp_path / "out")
    assert reloaded.params == out.params


def test_finetune_pass_with_domain_mlm_leaves_its_input_alone(bert_bundle, tiny_task, tmp_path):
    corpus = tmp_path / "glosses.txt"
    corpus.write_text("\n\n".join(tiny_task.split("train").texts[:64]) + "\n", encoding="utf-8")
    before = {k: v.clone() for k, v in bert_bundle.model.state_dict().items()}
    cfg = get_pass("finetune").config_type.model_validate(
        {"epochs": 1, "batch_size": 16, "lr": 1e-3, "strategy": "frozen", "max_train_samples": 32,
         "domain_corpus": str(corpus), "domain_steps": 2, "domain_lr": 1e-3})
    out = apply_pass(bert_bundle, "finetune", cfg, Context(task=tiny_task, show_progress=False))
    assert all(torch.equal(v, bert_bundle.model.state_dict()[k]) for k, v in before.items())
    # frozen fine-tuning leaves the encoder as it was: what moved, the domain MLM moved
    assert not torch.equal(out.model.bert.encoder.layer[0].output.dense.weight,
                           before["bert.encoder.layer.0.output.dense.weight"])
    assert out.history[-1]["config"]["domain_corpus"] == str(corpus)


def test_finetune_pass_gets_the_strategys_default_lr():
    from pretrain.finetune import DEFAULT_LR
    validate = get_pass("finetune").config_type.model_validate
    for strategy, lr in DEFAULT_LR.items():
        assert validate({"strategy": strategy}).lr == lr
    assert validate({"strategy": "adapters"}).lr == 1e-3
    assert validate({"strategy": "adapters", "lr": 5e-5}).lr == 5e-5       # the recipe's lr wins


def test_finetune_pass_trains_at_the_strategys_default_lr(bert_bundle, tiny_task, trained_rates):
    cfg = get_pass("finetune").config_type.model_validate(
        {"epochs": 1, "batch_size": 16, "strategy": "adapters", "adapter_size": 8, "max_train_samples": 16})
    out = apply_pass(bert_bundle, "finetune", cfg, Context(task=tiny_task, show_progress=False))
    assert trained_rates == [1e-3]
    assert out.history[-1]["config"]["lr"] == 1e-3                          # the bundle records the rate used


def test_a_stopped_finetune_pass_resumes_from_its_checkpoint_with_identical_weights(bert_bundle, tiny_task,
                                                                                  stopped_then_resumed):
    """The pass checkpoints in the stage's work dir, so a stopped recipe resumes it there."""
    from compressor.passes import training
    cfg = get_pass("finetune").config_type.model_validate(
        {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_train_samples": 96})          # 6 steps
    reference = apply_pass(bert_bundle, "finetune", cfg, Context(task=tiny_task, show_progress=False))
    saved, steps, resumed = stopped_then_resumed(training, "finetune", bert_bundle, cfg, tiny_task)
    assert saved["progress"]["step"] == 4
    assert steps == [5, 6]
    a, b = reference.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
