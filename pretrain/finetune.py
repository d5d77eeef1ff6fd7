"""Fine-tuning a classifier on a task, and evaluating one.

`finetune` is what both `compressor finetune` and the `finetune` pass call: tokenise the
train split once, then run the shared training loop with the model's own cross-entropy.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pretrain.batching import Encoded, encode, inference_order, iterate
from pretrain.data import Split, TaskData
from pretrain.metrics import classification_metrics
from pretrain.train import TrainConfig, TrainResult, accepts_token_types, train


class FinetuneConfig(TrainConfig):
    """Training settings plus which data to train on."""

    max_train_samples: int | None = Field(None, ge=1)
    max_length: int = Field(128, ge=8, le=512)


def finetune(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: TaskData,
             cfg: FinetuneConfig, desc: str = "finetune", show_progress: bool = True) -> TrainResult:
    """Train `model` in place on the task's train split (the first max_train_samples)."""
    split = task.split("train").head(cfg.max_train_samples)
    data = encode(tokenizer, split, cfg.max_length)
    train_cfg = TrainConfig(**cfg.model_dump(include=set(TrainConfig.model_fields)))
    return train(model, data, train_cfg, desc=desc, show_progress=show_progress)


@torch.inference_mode()
def predict_logits(model: PreTrainedModel, data: Encoded, batch_size: int = 64) -> np.ndarray:
    """Logits for every example, in the original order: (n, num_labels) float32."""
    model.eval()
    out = np.zeros((len(data), model.config.num_labels), dtype=np.float32)
    with_types = accepts_token_types(model)
    for idx, batch in iterate(data, inference_order(data.lengths(), batch_size), with_types):
        batch.pop("labels")
        out[idx] = model(**batch).logits.float().numpy()
    return out


def evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, split: Split,
             max_length: int = 128) -> tuple[dict[str, float], np.ndarray]:
    """Accuracy and macro-F1 on a split, plus the predicted class of every example."""
    data = encode(tokenizer, split, max_length)
    predictions = predict_logits(model, data).argmax(axis=1)
    return classification_metrics(data.labels, predictions), predictions
