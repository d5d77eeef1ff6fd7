"""Fixtures for the export tests: tiny bundles, including one with per-layer heads and FFN widths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from compressor.bundle import ModelBundle
from compressor.export.onnx import ExportSettings
from pretrain.data import Split, TaskData
from pretrain.models import encoder_layers

# Layer -> heads removed (4 heads per layer in the tiny BERT; layer 3 keeps all four).
PRUNED_HEADS = {0: [0], 1: [1, 2], 2: [0, 1, 2]}
FFN_WIDTHS = (48, 32, 16, 64)    # of 64 per layer


def linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    layer.weight.data, layer.bias.data = weight.clone(), bias.clone()
    return layer


def slice_ffn(layer: nn.Module, width: int) -> None:
    """Keep the first `width` FFN neurons of a BERT layer: rows of W1, columns of W2."""
    inner, outer = layer.intermediate.dense, layer.output.dense
    layer.intermediate.dense = linear(inner.weight[:width], inner.bias[:width])
    layer.output.dense = linear(outer.weight[:, :width], outer.bias)


@pytest.fixture
def tiny_bundle(tiny_bert_dir, tiny_task) -> ModelBundle:
    return ModelBundle.load(tiny_bert_dir).replace(task=tiny_task.spec)


@pytest.fixture
def sliced_bundle(tiny_bundle) -> ModelBundle:
    """The tiny BERT with a different head count and FFN width in every layer."""
    model = tiny_bundle.copy_model()
    model.prune_heads(PRUNED_HEADS)
    for layer, width in zip(encoder_layers(model), FFN_WIDTHS):
        slice_ffn(layer, width)
    return tiny_bundle.replace(model=model.eval())


@pytest.fixture
def fast_settings() -> ExportSettings:
    return ExportSettings(optimize=True)


def relabelled(task: TaskData, labels: np.ndarray) -> TaskData:
    """The task with its test labels replaced (e.g. by a model's own predictions)."""
    test = task.split("test")
    splits = {**task.splits, "test": Split(test.texts, [int(x) for x in labels], test.text_pairs)}
    return TaskData(task.name, task.label_names, splits, spec=task.spec)
