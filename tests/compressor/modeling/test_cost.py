"""Analytic cost: multiply-adds from the model's actual structure, sparsity, compressed size."""

from __future__ import annotations

import zlib

import pytest
import torch

from compressor.modeling.cost import compressed_size, encoder_linears, encoder_sparsity, multiply_adds
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
