"""Analytic cost: multiply-adds from the model's actual structure, sparsity, compressed size."""

from __future__ import annotations

import zlib

import pytest
import torch

from compressor.modeling.cost import compressed_size, encoder_linears, encoder_sparsity, multiply_adds, unit_costs
from compressor.modeling.structure import prune_heads, set_intermediate_size
from pretrain.models import keep_encoder_layers


def bert_macs(length: int, heads: list[int], widths: list[int], hidden: int = 32, head_dim: int = 8,
              labels: int = 4) -> int:
    """The tiny BERT by hand: per layer Q, K, V, attention output and the two FFN matrices on
    every token, QK^T and AV; the pooler and classifier on one vector."""
    total = 0
    for h, width in zip(heads, widths):
        inner = h * head_dim
        total += length * (3 * hidden * inner + inner * hidden + 2 * hidden * width) + 2 * length ** 2 * inner
    return total + hidden * hidden + hidden * labels


def test_multiply_adds_of_the_dense_model(bert_bundle):
    assert multiply_adds(bert_bundle.model, 16) == bert_macs(16, [4] * 4, [64] * 4)
    assert multiply_adds(bert_bundle.model, 16, embedding_rank=8) == bert_macs(16, [4] * 4, [64] * 4) + 16 * 8 * 32


def test_multiply_adds_follow_per_layer_heads_widths_and_dropped_layers(bert_bundle):
    model = bert_bundle.copy_model()
    prune_heads(model, {0: [0, 1, 2], 2: [1]})
    set_intermediate_size(model, 1, list(range(10)))
    keep_encoder_layers(model, [0, 1, 2])
    assert multiply_adds(model, 12) == bert_macs(12, [1, 4, 3], [64, 10, 64])


def test_zeros_cost_the_same_but_compress(bert_bundle, tmp_path):
    model = bert_bundle.copy_model()
    with torch.no_grad():
        for linear in encoder_linears(model).values():
            linear.weight[:, : linear.in_features // 2] = 0
    assert encoder_sparsity(model) == pytest.approx(0.5)
    assert encoder_sparsity(bert_bundle.model) == 0
    assert multiply_adds(model, 8) == multiply_adds(bert_bundle.model, 8)
    data = torch.cat([m.weight.detach().flatten() for m in encoder_linears(model).values()]).numpy().tobytes()
    (tmp_path / "w.bin").write_bytes(data)
    assert compressed_size([tmp_path / "w.bin"]) == len(zlib.compress(data, 6)) < 0.7 * len(data)


def test_every_family_is_counted(model_dirs):
    """Each supported family's classifier runs the counting pass (the report counts every variant)."""
    from transformers import AutoModelForSequenceClassification, BartConfig, XLNetConfig

    from pretrain.bilm_model import BiLMConfig, BiLMForSequenceClassification
    torch.manual_seed(0)
    small = dict(vocab_size=100, num_labels=3)
    models = {
        "bart": AutoModelForSequenceClassification.from_config(BartConfig(
            d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64, **small)),
        "xlnet": AutoModelForSequenceClassification.from_config(XLNetConfig(d_model=16, n_layer=2, n_head=2,
                                                                            d_inner=32, **small)),
        "bilm": BiLMForSequenceClassification(BiLMConfig(embedding_dim=8, hidden_size=16, num_layers=2, **small)),
    }
    for family, model in models.items():
        assert multiply_adds(model, 10) > 0, family
    # the BiLM: 2 layers x 2 directions of LSTMP cells (input 8 -> 4 x 16 gates, recurrent 8, projection 16 -> 8)
    per_cell = 4 * 16 * 8 + 4 * 16 * 8 + 8 * 16
    assert multiply_adds(models["bilm"], 10) >= 10 * 4 * per_cell


def test_the_cnn_student_counts_its_convolutions():
    """textcnn by hand: each kernel size k, Conv1d(E -> F, k, same padding) on every token, then
    the classifier on the pooled F x kernels vector (embedding lookups are not counted)."""
    from pretrain.textcnn import TextCNNConfig, TextCNNForSequenceClassification
    torch.manual_seed(0)
    model = TextCNNForSequenceClassification(TextCNNConfig(vocab_size=100, embedding_dim=8, kernel_sizes=(3, 4, 5),
                                                           filters=6, num_labels=3))
    length = 10
    convs = sum(length * 6 * 8 * k for k in (3, 4, 5))
    assert multiply_adds(model, length) == convs + 6 * 3 * 3


def test_unit_costs_match_the_multiply_adds_a_unit_removes(bert_bundle):
    """A neuron or head of an inner layer costs what removing it takes off multiply_adds (every
    token); the last layer, which the export runs on the first token only, costs less."""
    length = 12
    neuron, head = unit_costs(bert_bundle.model, "neuron", length), unit_costs(bert_bundle.model, "head", length)
    narrower = bert_bundle.copy_model()
    set_intermediate_size(narrower, 1, list(range(63)))
    assert neuron[1] == multiply_adds(bert_bundle.model, length) - multiply_adds(narrower, length) == 2 * 32 * 12
    fewer = bert_bundle.copy_model()
    prune_heads(fewer, {2: [0]})
    assert head[2] == multiply_adds(bert_bundle.model, length) - multiply_adds(fewer, length)
    assert neuron[3] == 2 * 32 * 1                                   # one query token
    assert head[3] == 32 * 8 * (2 * 12 + 2) + 2 * 12 * 8             # K, V on every token
    assert neuron[:3] == [neuron[0]] * 3 and head[:3] == [head[0]] * 3
