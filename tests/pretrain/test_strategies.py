"""Adapters and scalar mix on real Transformers models: init, what trains, save/reload, copy, ONNX."""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from compressor.bundle import ModelBundle
from compressor.export.trace import write_onnx
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig
from pretrain.models import count_params, load_saved_classifier
from pretrain.strategies import STRATEGIES, add_adapters, add_scalar_mix, prepare, trainable_for


def batch(tokenizer, texts=("a small green house", "the old river walks slowly near the road")):
    enc = tokenizer(list(texts), padding=True, return_tensors="pt")
    return dict(enc)


def logits(model, inputs) -> torch.Tensor:
    model.eval()
    if model.config.model_type == "distilbert":
        inputs = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_adapters_start_near_identity_and_train_few_parameters(model_dirs, tokenizer, family):
    model, _ = load_saved_classifier(model_dirs[family])
    inputs = batch(tokenizer)
    before, total_before = logits(model, inputs), count_params(model)
    add_adapters(model, bottleneck=8)
    layers = model.config.num_hidden_layers if family == "bert" else model.config.n_layers
    adapters = [m for n, m in model.named_modules() if n.endswith(".adapter")]
    assert len(adapters) == 2 * layers
    after = logits(model, inputs)
    assert not torch.equal(before, after)                       # they are in the forward path
    assert torch.allclose(before, after, atol=5e-2)             # but start near the identity
    with trainable_for(model, "adapters", model.base_model) as trainable:
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        assert all(".adapter." in n or "LayerNorm" in n or "layer_norm" in n or not n.startswith(
            model.base_model_prefix) for n in names)
        assert any(".adapter." in n for n in names) and any("classifier" in n for n in names)
        assert trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert all(p.requires_grad for p in model.parameters())     # restored afterwards
    assert count_params(model) == total_before + sum(count_params(a) for a in adapters)


def test_adapter_init_std_defaults_to_houlsby_and_is_configurable(bert_bundle):
    weights = {}
    for std in (None, 1e-2):
        model = bert_bundle.copy_model()
        prepare(model, "adapters", 64, **({} if std is None else {"adapter_init_std": std}))
        weights[std] = torch.cat([p.flatten() for n, p in model.named_parameters()
                                  if ".adapter." in n and n.endswith("weight")])
    assert weights[None].std().item() == pytest.approx(1e-3, rel=0.05)     # Houlsby's near-identity init
    assert weights[1e-2].std().item() == pytest.approx(1e-2, rel=0.05)
    assert FinetuneConfig().adapter_init_std == 1e-3
    with pytest.raises(ValidationError):
        FinetuneConfig(adapter_init_std=0)


def test_frozen_and_scalar_mix_train_only_the_head_side(bert_bundle):
    model = bert_bundle.copy_model()
    prepare(model, "scalar-mix")
    for strategy, extra in (("frozen", {"scalar_mix.weights", "scalar_mix.gamma"}),
                            ("scalar-mix", {"scalar_mix.weights", "scalar_mix.gamma"})):
        with trainable_for(model, strategy, model.base_model):
            names = {n for n, p in model.named_parameters() if p.requires_grad}
        assert names == {"classifier.weight", "classifier.bias"} | extra, strategy
    with trainable_for(model, "full", model.base_model) as trainable:
        assert trainable == count_params(model)


def test_scalar_mix_feeds_the_head_a_mix_of_all_layers(bert_bundle, tokenizer):
    model = bert_bundle.copy_model()
    inputs = batch(tokenizer)
    before = logits(model, inputs)
    add_scalar_mix(model)
    assert model.scalar_mix.weights.shape == (model.config.num_hidden_layers + 1,)
    mixed = logits(model, inputs)
    assert not torch.allclose(before, mixed)
    # Put all weight on the last layer with gamma 1: the original model again.
    with torch.no_grad():
        model.scalar_mix.weights.copy_(torch.tensor([-1e4] * model.config.num_hidden_layers + [0.0]))
    assert torch.allclose(logits(model, inputs), before, atol=1e-5)
    model.train()
    model(**inputs, labels=torch.tensor([0, 1])).loss.backward()
    assert model.scalar_mix.gamma.grad is not None and model.scalar_mix.gamma.grad != 0


@pytest.mark.parametrize("strategy", ["adapters", "scalar-mix"])
def test_added_modules_survive_save_reload_and_copy(bert_bundle, tokenizer, tmp_path, strategy):
    model = bert_bundle.copy_model()
    prepare(model, strategy, adapter_size=4)
    with torch.no_grad():                        # move them away from their init
        for name, p in model.named_parameters():
            if ".adapter." in name or name.startswith("scalar_mix"):
                p.add_(torch.randn_like(p) * 0.3)
    inputs = batch(tokenizer)
    expected = logits(model, inputs)
    bundle = bert_bundle.replace(model=model)
    bundle.save(tmp_path / "saved")
    reloaded = ModelBundle.load(tmp_path / "saved").model
    assert torch.allclose(logits(reloaded, inputs), expected, atol=1e-6)

    twin = copy.deepcopy(model)                  # passes copy models: the copy's hooks use its own modules
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if ".adapter." in name or name.startswith("scalar_mix"):
                p.zero_()
    assert torch.allclose(logits(model, inputs), expected)
    assert not torch.allclose(logits(twin, inputs), expected)


def test_adapter_model_exports_to_onnx_with_parity(bert_bundle, tokenizer, tmp_path):
    model = bert_bundle.copy_model()
    add_adapters(model, 4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".adapter." in name:
                p.add_(torch.randn_like(p) * 0.3)
    inputs = batch(tokenizer)
    write_onnx(model, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {k: v.numpy() for k, v in inputs.items()})[0]
    np.testing.assert_allclose(got, logits(model, inputs).numpy(), atol=1e-4)


def test_adapters_need_the_expected_layers(bert_bundle):
    model = bert_bundle.copy_model()
    model.bert.encoder.layer[1].output = nn.Identity()          # e.g. a replaced module
    with pytest.raises(UserError, match="cannot add adapters.*lacks"):
        add_adapters(model)


def test_strategies_are_the_four_of_the_issue():
    assert STRATEGIES == ("full", "frozen", "scalar-mix", "adapters")


def test_adapters_on_a_family_without_known_sites_name_the_known_ones(tokenizer):
    from transformers import AlbertConfig, AlbertForSequenceClassification
    model = AlbertForSequenceClassification(AlbertConfig(vocab_size=len(tokenizer), embedding_size=16, hidden_size=32,
                                                         num_hidden_layers=1, num_attention_heads=2,
                                                         intermediate_size=64))
    before = count_params(model)
    with pytest.raises(UserError, match="not available for model family 'albert'; expected one of: bert, .*distilbert"):
        prepare(model, "adapters")
    assert count_params(model) == before and not getattr(model.config, "compressor_adapter_size", None)
