"""Left-to-right language modelling (GPT's objective) on a BERT-shaped decoder.

The model is Transformers' BertLMHeadModel with `is_decoder=True`: a causal attention mask,
so position t sees only positions <= t, and the loss predicts token t+1 from them (the model
shifts the labels itself). A BERT body rather than GPT-2 keeps the result a family the
compression passes understand: the delivered model is a valid `teacher.model`.

Delivered with `is_decoder=False`: a teacher is fine-tuned as a classifier that pools the
first token ([CLS]), which under a causal mask would see nothing but itself. The weights are
the causally trained ones; load with `is_decoder=True` to use the model as a language model
again (`AutoModelForCausalLM.from_pretrained(dir, is_decoder=True)`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from transformers import BertLMHeadModel, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.objectives import Batch, Document, ModelSize, register_objective
from pretrain.objectives.mlm import IGNORE, bert_config, pad_rows, single_sequences, vocab_of_cached


def causal_labels(ids: np.ndarray, pad: int) -> np.ndarray:
    """Targets are the inputs themselves (the model shifts them by one); padding is ignored."""
    return np.where(ids == pad, IGNORE, ids)


@dataclass(frozen=True)
class CausalLM:
    name: str = "clm"

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> BertLMHeadModel:
        vocab_of_cached(tokenizer)
        torch.manual_seed(seed)
        return BertLMHeadModel(bert_config(tokenizer, size, max_length, is_decoder=True))

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        vocab = vocab_of_cached(tokenizer)
        ids = pad_rows(single_sequences(docs, vocab, max_length), vocab.pad)
        return {"input_ids": torch.from_numpy(ids),
                "attention_mask": torch.from_numpy((ids != vocab.pad).astype(np.int64)),
                "labels": torch.from_numpy(causal_labels(ids, vocab.pad))}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return model(**batch, use_cache=False).loss

    def deliverable(self, model: nn.Module) -> PreTrainedModel:
        delivered = copy.deepcopy(model)
        delivered.config.is_decoder = False
        delivered.config.pretrained_causal = True   # recorded in config.json: how it was trained
        return delivered


register_objective("clm")(CausalLM)
