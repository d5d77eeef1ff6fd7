"""Masked language modelling (BERT), with RoBERTa's dynamic masking and whole-word masking.

Two objectives: `mlm` selects tokens independently; `mlm-wwm` selects whole words (every
piece of a selected word is selected). Both:
- select each maskable token (or word) with probability 0.15; special tokens and padding are
  never selected;
- replace each selected token with [MASK] with probability 0.8, with a random non-special
  token with 0.1, and leave it unchanged with 0.1 (the decision is made per token, as in
  BERT's create_pretraining_data.py);
- draw a fresh mask every time a sequence is seen: `make_batch` is called per step with the
  run's generator, so a chunk seen in two epochs gets two different masks (dynamic masking).
Only the selected positions are predicted; the loss runs the vocabulary projection on those
rows only (15% of the tokens), which is where most of a small model's MLM compute would go.

Selection is Bernoulli per token (per word), as Transformers' DataCollatorForLanguageModeling
does, rather than BERT's fixed round(0.15 * n): the expected rate is the same and every
token's chance is independent, which makes the rate property easy to state and test.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertForMaskedLM, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.errors import UserError
from pretrain.objectives import Batch, Document, ModelSize, register_objective

IGNORE = -100            # label of positions that are not predicted (PyTorch's ignore_index)
MASK_RATE = 0.15
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1      # the rest (0.1) stays unchanged


# -- tokenizer facts ----------------------------------------------------------------------

@dataclass(frozen=True)
class Vocab:
    """What masking needs to know about a tokenizer's vocabulary."""

    size: int
    cls: int
    sep: int
    pad: int
    mask: int
    special: np.ndarray          # (size,) bool: never selected, never a random replacement
    continuation: np.ndarray     # (size,) bool: the token continues the previous word

    @property
    def replacement_ids(self) -> np.ndarray:
        return np.flatnonzero(~self.special)


def vocab_of(tokenizer: PreTrainedTokenizerBase) -> Vocab:
    """Special ids and word-continuation pieces of a WordPiece (`##x`) or byte-level BPE
    (`Ġ` starts a word) vocabulary; any other vocabulary counts every token as a word."""
    missing = [name for name in ("cls_token", "sep_token", "pad_token", "mask_token")
               if getattr(tokenizer, name) is None]
    if missing:
        raise UserError(f"tokenizer has no {', '.join(missing)}: masked-LM objectives need "
                        "[CLS], [SEP], [PAD] and [MASK] tokens (a BERT or RoBERTa-style tokenizer)")
    size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    special = np.zeros(size, dtype=bool)
    special[tokenizer.all_special_ids] = True
    if any(t.startswith("##") for t in tokens):
        continuation = np.array([t.startswith("##") for t in tokens])
    elif any(t.startswith("Ġ") for t in tokens):
        continuation = np.array([not t.startswith("Ġ") for t in tokens])
    else:
        continuation = np.zeros(size, dtype=bool)
    continuation &= ~special
    return Vocab(size=size, cls=tokenizer.cls_token_id, sep=tokenizer.sep_token_id,
                 pad=tokenizer.pad_token_id, mask=tokenizer.mask_token_id,
                 special=special, continuation=continuation)


# -- masking (numpy, property-tested) -----------------------------------------------------

def word_ids(ids: np.ndarray, maskable: np.ndarray, continuation: np.ndarray) -> np.ndarray:
    """(B, L) index of the word each maskable token belongs to, -1 elsewhere.

    A word starts at every maskable token that is not a continuation piece, and also after
    any non-maskable token (so a word never spans a [SEP])."""
    starts = maskable & ~continuation[ids]
    starts[:, 1:] |= maskable[:, 1:] & ~maskable[:, :-1]
    starts[:, 0] |= maskable[:, 0]
    index = np.cumsum(starts, axis=1) - 1
    return np.where(maskable, index, -1)


def select_for_masking(maskable: np.ndarray, rng: np.random.Generator, rate: float = MASK_RATE,
                       words: np.ndarray | None = None) -> np.ndarray:
    """(B, L) bool: each maskable token, or each whole word, chosen with probability `rate`."""
    if words is None:
        return maskable & (rng.random(maskable.shape) < rate)
    draws = rng.random(maskable.shape) < rate       # one draw per (row, word index)
    rows = np.arange(maskable.shape[0])[:, None]
    return maskable & draws[rows, np.maximum(words, 0)]


def apply_masking(ids: np.ndarray, selected: np.ndarray, rng: np.random.Generator, vocab: Vocab
                  ) -> tuple[np.ndarray, np.ndarray]:
    """80/10/10 replacement of the selected tokens: (inputs, labels) with IGNORE elsewhere."""
    u = rng.random(ids.shape)
    to_mask = selected & (u < MASK_SHARE)
    to_random = selected & (u >= MASK_SHARE) & (u < MASK_SHARE + RANDOM_SHARE)
    inputs = ids.copy()
    inputs[to_mask] = vocab.mask
    inputs[to_random] = rng.choice(vocab.replacement_ids, size=int(to_random.sum()))
    labels = np.where(selected, ids, IGNORE)
    return inputs, labels


def mask_tokens(ids: np.ndarray, vocab: Vocab, rng: np.random.Generator, whole_word: bool = False,
                rate: float = MASK_RATE) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking of a padded (B, L) id array: (inputs, labels)."""
    maskable = ~vocab.special[ids]
    words = word_ids(ids, maskable, vocab.continuation) if whole_word else None
    return apply_masking(ids, select_for_masking(maskable, rng, rate, words), rng, vocab)


# -- sequences ----------------------------------------------------------------------------

def single_sequences(docs: Sequence[Document], vocab: Vocab, max_length: int) -> list[list[int]]:
    """[CLS] chunk [SEP] per document, cut to max_length."""
    out = []
    for doc in docs:
        body = [t for sentence in doc for t in sentence][: max_length - 2]
        out.append([vocab.cls, *body, vocab.sep])
    return out


def pad_rows(rows: Sequence[Sequence[int]], pad: int) -> np.ndarray:
    """(B, longest) int64, right-padded."""
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


BERT_POSITIONS = 512


def bert_config(tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int, **extra) -> BertConfig:
    """BERT's 512 positions whatever the pretraining length (as BERT pretrained at 128 and
    kept 512): the teacher is later fine-tuned at the task's own length."""
    if max_length > BERT_POSITIONS:
        raise UserError(f"max length {max_length} is longer than the model's {BERT_POSITIONS} positions: "
                        f"expected at most {BERT_POSITIONS}")
    return BertConfig(vocab_size=len(tokenizer), hidden_size=size.hidden, num_hidden_layers=size.layers,
                      num_attention_heads=size.heads, intermediate_size=size.intermediate,
                      max_position_embeddings=BERT_POSITIONS, pad_token_id=tokenizer.pad_token_id, **extra)


def masked_lm_loss(encoder_output: torch.Tensor, labels: torch.Tensor, head: nn.Module) -> torch.Tensor:
    """Cross-entropy over the selected positions only (the head sees N x hidden, not B x L x hidden)."""
    selected = labels != IGNORE
    if not selected.any():  # a batch where no token was drawn: nothing to predict
        return encoder_output.sum() * 0.0
    logits = head(encoder_output[selected])
    return F.cross_entropy(logits, labels[selected])


# -- the objectives -----------------------------------------------------------------------

@dataclass(frozen=True)
class MaskedLM:
    name: str = "mlm"
    whole_word: bool = False

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> BertForMaskedLM:
        vocab_of(tokenizer)  # fails early on a tokenizer without [MASK]
        torch.manual_seed(seed)
        return BertForMaskedLM(bert_config(tokenizer, size, max_length))

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        vocab = vocab_of_cached(tokenizer)
        ids = pad_rows(single_sequences(docs, vocab, max_length), vocab.pad)
        inputs, labels = mask_tokens(ids, vocab, rng, self.whole_word)
        return {"input_ids": torch.from_numpy(inputs),
                "attention_mask": torch.from_numpy((ids != vocab.pad).astype(np.int64)),
                "labels": torch.from_numpy(labels)}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
        return masked_lm_loss(hidden, batch["labels"], model.cls)

    def deliverable(self, model: nn.Module) -> PreTrainedModel:
        return model


@functools.lru_cache(maxsize=8)
def vocab_of_cached(tokenizer: PreTrainedTokenizerBase) -> Vocab:
    """vocab_of once per tokenizer object (it walks the whole vocabulary)."""
    return vocab_of(tokenizer)


register_objective("mlm")(lambda: MaskedLM("mlm", whole_word=False))
register_objective("mlm-wwm")(lambda: MaskedLM("mlm-wwm", whole_word=True))
