"""`textcnn`: a 1-D convolutional sentence classifier (Kim 2014), a student for distillation.

Tang et al. 2019 distil BERT into small non-Transformer networks; this is their CNN kind
(the BiLSTM kind is the BiLM classifier of pretrain/bilm_model.py with one layer).

    token ids [batch, seq] -> embedding [batch, seq, E]
      -> for each kernel size k: Conv1d(E -> F, k), "same" padding -> ReLU    [batch, F, seq]
      -> max over the real tokens (padding masked out)                       [batch, F]
      -> concatenation over kernel sizes [batch, K*F] -> dropout -> Linear -> logits

Transformers has no such model, so this is a small custom `PreTrainedModel` (the usual
on-disk format: config.json with model_type "textcnn", model.safetensors). Importing this
module registers it with AutoConfig and AutoModelForSequenceClassification, so a saved dir
loads like any other classifier, and it exports to ONNX (Conv, ReLU, ReduceMax, Gemm).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput


class TextCNNConfig(PretrainedConfig):
    model_type = "textcnn"

    def __init__(self, vocab_size: int = 30522, embedding_dim: int = 256, kernel_sizes: tuple[int, ...] = (3, 4, 5),
                 filters: int = 128, dropout: float = 0.2, pad_token_id: int = 0,
                 initializer_range: float = 0.02, **kwargs):
        self.vocab_size = vocab_size
        self.embedding_dim = embedding_dim
        self.kernel_sizes = list(kernel_sizes)
        self.filters = filters
        self.dropout = dropout
        self.initializer_range = initializer_range
        super().__init__(pad_token_id=pad_token_id, **kwargs)


class TextCNNForSequenceClassification(PreTrainedModel):
    config_class = TextCNNConfig
    base_model_prefix = "textcnn"

    def __init__(self, config: TextCNNConfig):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=config.pad_token_id)
        # "same" padding is applied once in forward, for every kernel size: torch's own
        # padding="same" copies the input per convolution for an even kernel (and warns).
        self.convolutions = nn.ModuleList(
            nn.Conv1d(config.embedding_dim, config.filters, k) for k in config.kernel_sizes)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.filters * len(config.kernel_sizes), config.num_labels)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        # Embedding and classifier drawn as BERT draws them; convolutions keep PyTorch's
        # fan-in initialisation (suited to the ReLU that follows).
        if isinstance(module, nn.Embedding):
            module.weight.data.normal_(0.0, self.config.initializer_range)
            module.weight.data[self.config.pad_token_id].zero_()
        elif isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, self.config.initializer_range)
            module.bias.data.zero_()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **_: object) -> SequenceClassifierOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        # Padded positions read as zeros, as the convolutions' own padding does: a text gets the
        # same logits whatever the batch pads it to, even where the [PAD] row is not zero (a
        # table copied from a teacher).
        real = attention_mask.unsqueeze(-1).to(self.embeddings.weight.dtype)
        x = (self.embeddings(input_ids) * real).transpose(1, 2)             # [batch, E, seq]
        padding = (attention_mask == 0).unsqueeze(1)                         # [batch, 1, seq]
        # ReLU output is >= 0, so a padded position set to 0 never wins the max over a row
        # that has a real token (and every row has at least one).
        pooled = [torch.relu(conv(window)).masked_fill(padding, 0.0).amax(dim=2)
                  for conv, window in zip(self.convolutions, same_padded_windows(x, self.config.kernel_sizes))]
        logits = self.classifier(self.dropout(torch.cat(pooled, dim=1)))    # [batch, labels]
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


def same_padded_windows(x: torch.Tensor, kernel_sizes: list[int]) -> list[torch.Tensor]:
    """For each kernel size k, `x` [batch, E, seq] zero-padded as torch's padding="same" pads
    it ((k - 1) // 2 on the left, the rest on the right), so a convolution without padding
    gives `seq` outputs. One padded copy serves every k: each reads its own slice of it."""
    left = max((k - 1) // 2 for k in kernel_sizes)
    right = max(k - 1 - (k - 1) // 2 for k in kernel_sizes)
    padded = nn.functional.pad(x, (left, right))
    # Bounds from both ends, never from the length, so an ONNX export keeps the length dynamic.
    return [padded[:, :, left - (k - 1) // 2: (k - 1 - (k - 1) // 2 - right) or None] for k in kernel_sizes]


AutoConfig.register("textcnn", TextCNNConfig, exist_ok=True)
AutoModelForSequenceClassification.register(TextCNNConfig, TextCNNForSequenceClassification, exist_ok=True)
