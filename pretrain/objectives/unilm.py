"""`unilm`: UniLM (Dong et al. 2019), one BERT trained as four language models at once.

Every sequence of a batch draws its mode with UniLM's proportions: bidirectional 1/3,
sequence-to-sequence 1/3, left-to-right 1/6, right-to-left 1/6. All modes share one
cloze task: 15% of the text tokens are chosen (80% of the time one token, 20% a bigram or
trigram, as in UniLM), 80/10/10 per token, and predicted by BertForMaskedLM's head. Only
the self-attention mask differs:

    bidirectional   every token sees every token
    left-to-right   token i sees tokens j <= i ([CLS] x [SEP], so [SEP] is last)
    right-to-left   token i sees tokens j >= i
    seq2seq         [CLS] source [SEP] target [SEP]: the source sees the source; a target
                    token sees the source and the target up to itself. The document is cut
                    at a random sentence boundary (or inside its one sentence), and the
                    target segment gets token type 1.

The masks go to BERT as a 3-D [batch, query, key] tensor of 0/1: Transformers 4.57's
BertModel sends a 3-D mask through `get_extended_attention_mask` (-> [batch, 1, query,
key], additive) for both eager and SDPA attention (SDPA's own 2-D fast path is skipped),
and the tests check that the two agree and that no mode lets information leak.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import BertForMaskedLM, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.objectives import Batch, Document, ModelSize, register_objective
from pretrain.objectives.architectures import bert_config
from pretrain.objectives.noising import (categorical_sampler, corrupt, fit_sentences, mask_budget, maskable, pad,
                                         require_targets, select_spans, special_tokens, token_units)

MODES = ("bidirectional", "seq2seq", "left-to-right", "right-to-left")


class UnilmConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mode_probs: tuple[float, float, float, float] = (1 / 3, 1 / 3, 1 / 6, 1 / 6)   # order of MODES
    rate: float = Field(0.15, gt=0, lt=1)
    ngram_probs: tuple[float, ...] = (0.8, 0.1, 0.1)     # masked n-gram lengths 1, 2, 3


def attention_mask(mode: str, length: int, source_length: int, padded: int) -> np.ndarray:
    """[padded, padded] 0/1: row i may attend to column j. Columns past `length` are padding.

    `source_length` counts [CLS] source [SEP] (seq2seq only).
    """
    i = np.arange(padded)[:, None]
    j = np.arange(padded)[None, :]
    real = j < length
    if mode == "bidirectional":
        allowed = np.broadcast_to(real, (padded, padded))
    elif mode == "left-to-right":
        allowed = real & (j <= i)
    elif mode == "right-to-left":
        allowed = real & (j >= i)
    elif mode == "seq2seq":
        allowed = real & ((j < source_length) | ((i >= source_length) & (j <= i)))
    else:
        raise ValueError(f"unknown UniLM mode {mode!r}")
    return allowed.astype(np.int64)


def split_source_target(doc: Document, max_tokens: int,
                        rng: np.random.Generator) -> tuple[list[int], list[int]] | None:
    """A random cut between sentences (or inside a lone sentence); None under 2 tokens."""
    sentences = fit_sentences(doc, max_tokens)
    if len(sentences) >= 2:
        cut = int(rng.integers(1, len(sentences)))
        return ([t for s in sentences[:cut] for t in s], [t for s in sentences[cut:] for t in s])
    tokens = sentences[0] if sentences else []
    if len(tokens) < 2:
        return None
    cut = int(rng.integers(1, len(tokens)))
    return tokens[:cut], tokens[cut:]


class UnilmObjective:
    name = "unilm"

    def __init__(self, config: UnilmConfig = UnilmConfig()):
        self.config = config

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> BertForMaskedLM:
        specials = special_tokens(tokenizer, self.name)
        torch.manual_seed(seed)
        return BertForMaskedLM(bert_config(specials, size, max_length))

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        specials = special_tokens(tokenizer, self.name)
        sampler = categorical_sampler(self.config.ngram_probs)
        mode_probs = np.asarray(self.config.mode_probs) / sum(self.config.mode_probs)
        rows = []              # (mode, tokens with specials, token types, labels, source length)
        for doc in docs:
            mode = MODES[int(rng.choice(len(MODES), p=mode_probs))]
            split = split_source_target(doc, max_length - 3, rng) if mode == "seq2seq" else None
            if split is None:
                if mode == "seq2seq":
                    mode = "bidirectional"      # a one-token document has nothing to cut
                source = [t for s in fit_sentences(doc, max_length - 2) for t in s]
                text, types, source_length = [source], [0], 0
            else:
                text, types, source_length = list(split), [0, 1], len(split[0]) + 2
            tokens, token_types, labels = [specials.start], [0], [-100]
            for segment, kind in zip(text, types):
                spans = select_spans(maskable(token_units(len(segment)), segment, specials),
                                     mask_budget(len(segment), self.config.rate), sampler, rng)
                noised, target = corrupt(segment, spans, rng, specials, "token")
                tokens += [*noised.tolist(), specials.end]
                token_types += [kind] * (len(segment) + 1)
                labels += [*target.tolist(), -100]
            rows.append((mode, tokens, token_types, labels, source_length))
        require_targets(sum(sum(t != -100 for t in r[3]) for r in rows), self.name)
        padded = max(len(r[1]) for r in rows)
        masks = np.stack([attention_mask(mode, len(tokens), source_length, padded)
                          for mode, tokens, _, _, source_length in rows])
        input_ids = pad([r[1] for r in rows], specials.pad)
        # attention_mask stays the usual 2-D padding mask (what generic code counts tokens
        # with); the mode's 3-D mask travels as self_attention_mask.
        return {"input_ids": input_ids, "attention_mask": (input_ids != specials.pad).long(),
                "self_attention_mask": torch.from_numpy(masks),
                "token_type_ids": pad([r[2] for r in rows], 0),
                "labels": pad([r[3] for r in rows], -100),
                "mode": torch.tensor([MODES.index(r[0]) for r in rows])}

    def loss(self, model: BertForMaskedLM, batch: Batch) -> torch.Tensor:
        return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                     attention_mask=batch["self_attention_mask"], labels=batch["labels"]).loss

    def deliverable(self, model: BertForMaskedLM) -> PreTrainedModel:
        return model


@register_objective("unilm")
def unilm_objective() -> UnilmObjective:
    return UnilmObjective()
