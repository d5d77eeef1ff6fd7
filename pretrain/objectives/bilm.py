"""`bilm`: ELMo's bidirectional LSTM language model (Peters et al. 2018) as a pretraining
objective; the model classes are in pretrain/bilm_model.py.

Each document is read as [CLS] x1 .. xn [SEP]; the loss is the mean of the forward LM's
next-token and the backward LM's previous-token cross-entropies over non-pad targets. ELMo
has two layers; so do these (`--size` sets the widths: embedding = size.hidden, LSTM cells =
size.intermediate).

A pretrained BiLM is also a classifier teacher: `BiLMForSequenceClassification` (registered
with AutoModelForSequenceClassification, so `compressor finetune` and a recipe's
`teacher.model` load it from the same dir). Passes that need Transformer layers
(drop-layers, adapters, head pruning) refuse it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pretrain.bilm_model import BiLanguageModel, BiLMConfig
from pretrain.objectives import Batch, Document, ModelSize, register_objective
from pretrain.objectives.noising import flatten, pad, special_tokens


class BilmObjective:
    name = "bilm"

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> BiLanguageModel:
        specials = special_tokens(tokenizer, self.name)
        torch.manual_seed(seed)
        return BiLanguageModel(BiLMConfig(vocab_size=specials.vocab_size, embedding_dim=size.hidden,
                                          hidden_size=max(size.intermediate, size.hidden + 1),
                                          pad_token_id=specials.pad))

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        specials = special_tokens(tokenizer, self.name)
        input_ids = pad([[specials.start, *flatten(doc, max_length - 2), specials.end] for doc in docs],
                        specials.pad)
        return {"input_ids": input_ids, "attention_mask": (input_ids != specials.pad).long()}

    def loss(self, model: BiLanguageModel, batch: Batch) -> torch.Tensor:
        return model(**batch).loss

    def deliverable(self, model: BiLanguageModel) -> PreTrainedModel:
        return model


@register_objective("bilm")
def bilm_objective() -> BilmObjective:
    return BilmObjective()
