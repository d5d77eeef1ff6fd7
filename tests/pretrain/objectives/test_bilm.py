"""ELMo-style BiLM: padded reversal, direction-wise causality, training, and its save format."""

from __future__ import annotations

import json

import numpy as np
import torch
from hypothesis import given, settings, strategies as st
from safetensors.torch import load_file
from transformers import AutoModel

from pretrain.objectives import ModelSize, get_objective
from pretrain.bilm_model import BiLanguageModel, reverse_padded


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5), seed=st.integers(0, 2**16))
def test_reverse_padded_reverses_each_prefix(lengths, seed):
    x = torch.randn(len(lengths), 9, 3, generator=torch.Generator().manual_seed(seed))
    n = torch.tensor(lengths)
    out = reverse_padded(x, n)
    for row, length in enumerate(lengths):
        assert torch.equal(out[row, :length], x[row, :length].flip(0))
        assert torch.equal(out[row, length:], x[row, length:])
    assert torch.equal(reverse_padded(out, n), x)


def test_each_direction_sees_only_its_side(wp_tokenizer, documents, max_length):
    objective = get_objective("bilm")
    batch = objective.make_batch(documents[:6], wp_tokenizer, np.random.default_rng(0), max_length)
    model = objective.build_model(wp_tokenizer, ModelSize(layers=2, hidden=32, heads=1, intermediate=64),
                                  max_length, 0).eval()
    with torch.no_grad():
        base = model(**batch)
        for row in range(len(batch["input_ids"])):
            length = int(batch["attention_mask"][row].sum())
            k = length // 2
            original = {key: value[row:row + 1] for key, value in batch.items()}
            changed = {key: value.clone() for key, value in original.items()}
            changed["input_ids"][0, k] = (changed["input_ids"][0, k] + 11) % len(wp_tokenizer)
            same, out = model(**original), model(**changed)
            fwd = (out.forward_logits[0] != same.forward_logits[0]).any(-1)[:length]
            bwd = (out.backward_logits[0] != same.backward_logits[0]).any(-1)[:length]
            assert not fwd[:k].any() and fwd[k], "the forward LM sees only the past"
            assert not bwd[k + 1:].any() and bwd[k], "the backward LM sees only the future"
        # Padding changes nothing: one row alone gives what it gave inside the padded batch.
        row = int(batch["attention_mask"].sum(1).argmin())
        length = int(batch["attention_mask"][row].sum())
        alone = model(input_ids=batch["input_ids"][row:row + 1, :length])
        assert torch.allclose(alone.forward_logits[0], base.forward_logits[row, :length], atol=1e-5)
        assert torch.allclose(alone.backward_logits[0], base.backward_logits[row, :length], atol=1e-5)


def test_training_reduces_loss_and_the_format_round_trips(wp_tokenizer, documents, max_length,
                                                          train_briefly, tmp_path):
    objective = get_objective("bilm")
    model, before, after = train_briefly(objective)
    assert after < before - 0.2, (before, after)   # same held-out batch, eval mode
    delivered = objective.deliverable(model)
    delivered.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "bilm" and config["num_layers"] == 2
    tensors = load_file(tmp_path / "model.safetensors")
    assert tensors["embeddings.weight"].shape == (len(wp_tokenizer), 64)
    assert "forward_layers.1.weight_hr_l0" in tensors and "backward_layers.0.weight_ih_l0" in tensors
    for loaded in (BiLanguageModel.from_pretrained(tmp_path), AutoModel.from_pretrained(tmp_path)):
        assert isinstance(loaded, BiLanguageModel)
        assert loaded.softmax.weight is loaded.embeddings.weight, "softmax stays tied after loading"
        batch = objective.make_batch(documents[:4], wp_tokenizer, np.random.default_rng(3), max_length)
        delivered.eval()
        loaded.eval()
        with torch.no_grad():
            assert torch.allclose(delivered(**batch).loss, loaded(**batch).loss, atol=1e-5)
            layers = loaded.contextual(batch["input_ids"], batch["attention_mask"])
        assert len(layers) == 3 and all(h.shape[-1] == 128 for h in layers)


def test_lstmp_is_the_projected_lstm():
    """The plain-LSTM form the classifier (and its ONNX graph) uses computes nn.LSTM(proj_size=P)."""
    from pretrain.bilm_model import lstmp
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 24, batch_first=True, proj_size=8)
    x = torch.randn(3, 7, 8)
    with torch.no_grad():
        torch.testing.assert_close(lstmp(lstm, x), lstm(x)[0], rtol=1e-5, atol=1e-6)


def test_classifier_reads_the_pretrained_bilm(wp_tokenizer, documents, max_length, tmp_path):
    """BiLMForSequenceClassification loads a BiLM dir through AutoModelForSequenceClassification:
    the same ELMo layers as the LM, the LM softmax left out, and padding changes no logits."""
    from transformers import AutoModelForSequenceClassification

    from pretrain.bilm_model import BiLMForSequenceClassification
    objective = get_objective("bilm")
    model = objective.build_model(wp_tokenizer, ModelSize(layers=2, hidden=32, heads=1, intermediate=64),
                                  max_length, 0).eval()
    model.save_pretrained(tmp_path)
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3).eval()
    assert isinstance(classifier, BiLMForSequenceClassification)
    assert not any(name.startswith("bilm.softmax") for name in classifier.state_dict())
    batch = objective.make_batch(documents[:4], wp_tokenizer, np.random.default_rng(0), max_length)
    with torch.no_grad():
        for lm_layer, layer in zip(model.contextual(**batch), classifier.bilm(**batch)):
            torch.testing.assert_close(layer, lm_layer, rtol=1e-4, atol=1e-5)
        logits = classifier(**batch).logits
        row = int(batch["attention_mask"].sum(1).argmin())
        length = int(batch["attention_mask"][row].sum())
        alone = classifier(input_ids=batch["input_ids"][row:row + 1, :length]).logits
    assert logits.shape == (4, 3)
    torch.testing.assert_close(alone[0], logits[row], rtol=1e-4, atol=1e-5)
