"""Sentence-pair objectives: next sentence prediction (BERT) and sentence order prediction
(ALBERT), alone or with masked LM (`nsp`, `sop`, `mlm+nsp`, `mlm+sop`).

Every pair comes from one chunk (whole consecutive sentences of one document, see
pretrain/data/stream.py), cut at a random point into two consecutive segments A and B:
- at a random sentence boundary when the chunk has two or more sentences;
- inside the sentence, at a random token, when it has one (most WordNet documents are a
  single gloss line; cutting inside it still gives two consecutive segments of one
  document).
Then, with probability 0.5:
- NSP: B is replaced by a random segment of *another* document of the batch (the batch is a
  uniformly shuffled sample of the corpus, as BERT's random document is), label 1
  ("not next"); otherwise label 0;
- SOP: A and B are swapped, label 1 ("swapped"); otherwise label 0.
The input is [CLS] A [SEP] B [SEP] with token types 0 for A and 1 for B, as BERT's.

Labels follow BertForPreTraining's `next_sentence_label`: 0 means B continues A. The pair
head is BERT's pooler + 2-way classifier; with `mlm` the masking of mlm.py is applied to
the pair (never to [CLS]/[SEP]) and the two losses are summed, as in BERT and ALBERT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (BertForNextSentencePrediction, BertForPreTraining, PreTrainedModel,
                          PreTrainedTokenizerBase)

from pretrain.errors import UserError
from pretrain.objectives import Batch, Document, ModelSize, register_objective
from pretrain.objectives.mlm import (Vocab, bert_config, mask_tokens, masked_lm_loss, pad_rows,
                                     vocab_of_cached)

PairKind = Literal["nsp", "sop"]
SWAP_OR_RANDOM = 0.5
PAIR_SPECIALS = 3        # [CLS] A [SEP] B [SEP]


@dataclass(frozen=True)
class Pair:
    a: list[int]
    b: list[int]
    label: int           # 0: B continues A; 1: random B (NSP) or swapped (SOP)


def flat(doc: Document) -> list[int]:
    return [t for sentence in doc for t in sentence]


def truncate_document(doc: Document, budget: int) -> Document:
    """The first `budget` tokens of a document, sentence structure kept (chunks from the
    stream already fit; this guards direct callers)."""
    out: Document = []
    left = budget
    for sentence in doc:
        if left <= 0:
            break
        if sentence:
            out.append(list(sentence[:left]))
            left -= len(out[-1])
    return out


def split_segments(doc: Document, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Two non-empty consecutive segments of one chunk whose concatenation is the chunk."""
    sentences = [s for s in doc if s]
    if len(sentences) >= 2:
        cut = int(rng.integers(1, len(sentences)))          # sentences before the cut go to A
        return flat(sentences[:cut]), flat(sentences[cut:])
    tokens = flat(sentences)
    if len(tokens) < 2:
        raise ValueError("a sentence pair needs a chunk of at least 2 tokens")
    cut = int(rng.integers(1, len(tokens)))
    return tokens[:cut], tokens[cut:]


def random_segment(doc: Document, rng: np.random.Generator, max_tokens: int) -> list[int]:
    """Consecutive sentences of `doc` from a random sentence on, at most max_tokens tokens."""
    sentences = [s for s in doc if s]
    start = int(rng.integers(len(sentences)))
    return flat(sentences[start:])[:max_tokens]


def nsp_pair(doc: Document, others: Sequence[Document], rng: np.random.Generator, budget: int) -> Pair:
    """B is A's continuation, or (p=0.5) a random segment of another document."""
    a, b = split_segments(truncate_document(doc, budget), rng)
    if rng.random() < SWAP_OR_RANDOM:
        other = others[int(rng.integers(len(others)))]
        return Pair(a, random_segment(other, rng, budget - len(a)), 1)
    return Pair(a, b, 0)


def sop_pair(doc: Document, rng: np.random.Generator, budget: int) -> Pair:
    """Two consecutive segments of one document, swapped with probability 0.5."""
    a, b = split_segments(truncate_document(doc, budget), rng)
    if rng.random() < SWAP_OR_RANDOM:
        return Pair(b, a, 1)
    return Pair(a, b, 0)


def make_pairs(docs: Sequence[Document], kind: PairKind, rng: np.random.Generator, budget: int) -> list[Pair]:
    usable = [d for d in docs if len(flat(d)) >= 2]
    if kind == "nsp" and len(usable) < 2:
        raise UserError("next sentence prediction draws random segments from other documents of "
                        "the batch: expected a batch size of at least 2")
    pairs = []
    for i, doc in enumerate(usable):
        if kind == "nsp":
            pairs.append(nsp_pair(doc, usable[:i] + usable[i + 1:], rng, budget))
        else:
            pairs.append(sop_pair(doc, rng, budget))
    return pairs


def encode_pairs(pairs: Sequence[Pair], vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """[CLS] A [SEP] B [SEP] ids and token types (0 for A, 1 for B), right-padded."""
    rows = [[vocab.cls, *p.a, vocab.sep, *p.b, vocab.sep] for p in pairs]
    types = [[0] * (len(p.a) + 2) + [1] * (len(p.b) + 1) for p in pairs]
    return pad_rows(rows, vocab.pad), pad_rows(types, 0)


@dataclass(frozen=True)
class SentencePair:
    name: str
    kind: PairKind
    with_mlm: bool
    whole_word: bool = False

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> nn.Module:
        vocab_of_cached(tokenizer)
        torch.manual_seed(seed)
        config = bert_config(tokenizer, size, max_length)
        return BertForPreTraining(config) if self.with_mlm else BertForNextSentencePrediction(config)

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        vocab = vocab_of_cached(tokenizer)
        pairs = make_pairs(docs, self.kind, rng, max_length - PAIR_SPECIALS)
        ids, types = encode_pairs(pairs, vocab)
        batch = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
                 "attention_mask": torch.from_numpy((ids != vocab.pad).astype(np.int64)),
                 "pair_labels": torch.tensor([p.label for p in pairs], dtype=torch.long)}
        if self.with_mlm:
            inputs, labels = mask_tokens(ids, vocab, rng, self.whole_word)
            batch["input_ids"] = torch.from_numpy(inputs)
            batch["labels"] = torch.from_numpy(labels)
        return batch

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        hidden, pooled = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    token_type_ids=batch["token_type_ids"])[:2]
        if self.with_mlm:
            heads = model.cls                        # BertPreTrainingHeads
            pair_logits = heads.seq_relationship(pooled)
            mlm = masked_lm_loss(hidden, batch["labels"], heads.predictions)
            return mlm + F.cross_entropy(pair_logits, batch["pair_labels"])
        return F.cross_entropy(model.cls(pooled), batch["pair_labels"])

    def deliverable(self, model: nn.Module) -> PreTrainedModel:
        return model


register_objective("nsp")(lambda: SentencePair("nsp", "nsp", with_mlm=False))
register_objective("sop")(lambda: SentencePair("sop", "sop", with_mlm=False))
register_objective("mlm+nsp")(lambda: SentencePair("mlm+nsp", "nsp", with_mlm=True))
register_objective("mlm+sop")(lambda: SentencePair("mlm+sop", "sop", with_mlm=True))
