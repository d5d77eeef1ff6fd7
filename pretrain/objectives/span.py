"""`span`: SpanBERT (Joshi et al. 2020) span masking with the span boundary objective.

Masking: span lengths in whole words ~ Geometric(p=0.2) on 1..10 (renormalised, as the
official code samples them; mean 3.8 words), anchors drawn uniformly among unmasked words,
until 15% of the tokens are masked; one 80/10/10 decision per span (all of a span's tokens
become [MASK], or random tokens, or stay). No NSP; one segment per document.

Span boundary objective (SBO): every masked token x_i of a span (s..e) is predicted from the
encoder outputs at the boundary tokens x_{s-1} and x_{e+1} plus a learned embedding of its
offset i - s, through a 2-layer GeLU + LayerNorm MLP and the (tied) word-embedding softmax.
Loss = MLM + SBO. The deliverable is the BertForMaskedLM; the SBO head is training-only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from transformers import BertForMaskedLM, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.objectives import Batch, Document, ModelSize, register_objective
from pretrain.objectives.architectures import bert_config
from pretrain.objectives.noising import (corrupt, flatten, geometric_sampler, mask_budget, maskable, pad,
                                         require_targets, select_spans, special_tokens, token_units, word_start_table,
                                         word_units)


class SpanConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    rate: float = Field(0.15, gt=0, lt=1)          # share of tokens masked
    geometric_p: float = Field(0.2, gt=0, le=1)    # span length ~ Geometric(p) ...
    max_span: int = Field(10, ge=1)                # ... on 1..max_span words
    whole_words: bool = True                       # spans cover whole words (SpanBERT), else tokens
    mask_rate: float = Field(0.8, ge=0, le=1)      # per span: [MASK] ...
    random_rate: float = Field(0.1, ge=0, le=1)    # ... random tokens; the rest stays


class SpanBoundaryHead(nn.Module):
    """h_i = LN(GeLU(W2 LN(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s}])))) (SpanBERT's SBO MLP)."""

    def __init__(self, hidden: int, max_offsets: int, vocab_size: int, eps: float = 1e-12):
        super().__init__()
        self.offsets = nn.Embedding(max_offsets, hidden)
        self.mlp = nn.Sequential(nn.Linear(3 * hidden, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=eps),
                                 nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=eps))
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, left: torch.Tensor, right: torch.Tensor, offsets: torch.Tensor,
                word_embeddings: torch.Tensor) -> torch.Tensor:
        # left, right: [targets, hidden]; offsets: [targets] -> logits [targets, vocab]
        offsets = offsets.clamp(max=self.offsets.num_embeddings - 1)
        h = self.mlp(torch.cat([left, right, self.offsets(offsets)], dim=-1))
        return h @ word_embeddings.T + self.bias


class SpanBertForPreTraining(nn.Module):
    """A BertForMaskedLM plus the SBO head that reads its last hidden states."""

    def __init__(self, mlm: BertForMaskedLM, max_offsets: int):
        super().__init__()
        self.mlm = mlm
        self.sbo = SpanBoundaryHead(mlm.config.hidden_size, max_offsets, mlm.config.vocab_size,
                                    mlm.config.layer_norm_eps)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.mlm.get_input_embeddings()

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.mlm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       labels=batch["labels"], output_hidden_states=True)
        hidden = out.hidden_states[-1]                       # [batch, seq, hidden]
        rows = batch["sbo_row"]
        logits = self.sbo(hidden[rows, batch["sbo_left"]], hidden[rows, batch["sbo_right"]],
                          batch["sbo_offset"], self.mlm.get_input_embeddings().weight)
        sbo_loss = nn.functional.cross_entropy(logits, batch["sbo_target"])
        return out.loss, sbo_loss


class SpanObjective:
    name = "span"

    def __init__(self, config: SpanConfig = SpanConfig()):
        self.config = config
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._word_starts: np.ndarray | None = None

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> SpanBertForPreTraining:
        specials = special_tokens(tokenizer, self.name)
        torch.manual_seed(seed)
        return SpanBertForPreTraining(BertForMaskedLM(bert_config(specials, size, max_length)), max_length)

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        specials = special_tokens(tokenizer, self.name)
        starts = self.word_starts(tokenizer)
        sampler = geometric_sampler(self.config.geometric_p, self.config.max_span)
        inputs, labels, sbo = [], [], []
        for row, doc in enumerate(docs):
            ids = flatten(doc, max_length - 2)
            units = word_units(ids, starts) if self.config.whole_words else token_units(len(ids))
            units = maskable(units, ids, specials)
            spans = select_spans(units, mask_budget(len(ids), self.config.rate), sampler, rng)
            noised, target = corrupt(ids, spans, rng, specials, "span",
                                     self.config.mask_rate, self.config.random_rate)
            inputs.append([specials.start, *noised.tolist(), specials.end])
            labels.append([-100, *target.tolist(), -100])
            # +1: position 0 is [CLS], so token i of `ids` sits at i + 1; boundaries are
            # the tokens just outside the span (at worst [CLS] / [SEP]).
            for start, end in spans:
                sbo.extend((row, start, end + 1, i - start, ids[i]) for i in range(start, end))
        require_targets(len(sbo), self.name)
        sbo_cols = torch.tensor(sbo, dtype=torch.long).reshape(-1, 5).T
        input_ids = pad(inputs, specials.pad)
        return {"input_ids": input_ids, "attention_mask": (input_ids != specials.pad).long(),
                "labels": pad(labels, -100),
                **dict(zip(("sbo_row", "sbo_left", "sbo_right", "sbo_offset", "sbo_target"), sbo_cols))}

    def loss(self, model: SpanBertForPreTraining, batch: Batch) -> torch.Tensor:
        mlm_loss, sbo_loss = model(batch)
        return mlm_loss + sbo_loss

    def deliverable(self, model: SpanBertForPreTraining) -> PreTrainedModel:
        return model.mlm

    def word_starts(self, tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
        # The table costs one pass over the vocabulary: computed once per tokenizer.
        if self._tokenizer is not tokenizer:
            self._tokenizer, self._word_starts = tokenizer, word_start_table(tokenizer)
        return self._word_starts


@register_objective("span")
def span_objective() -> SpanObjective:
    return SpanObjective()
