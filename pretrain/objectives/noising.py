"""Masking and noising functions shared by the objectives of this package.

Every function here is plain numpy over token-id lists with an explicit `np.random.Generator`,
so each draw is reproducible and the property tests in tests/pretrain/objectives/ can check
rates, spans and permutations directly. Sequences passed in carry no special tokens; the
objectives add [CLS]/[SEP] (or <s>/</s>) around the result, so special tokens are never
masked, deleted, permuted or rotated.

Span machinery works on *units*: a unit is a word (a run of word pieces, see `word_units`)
when masking at whole words, or a single token otherwise. A span is a run of consecutive
units and is returned as a half-open token range (start, end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from pretrain.errors import UserError

Span = tuple[int, int]                      # half-open token range [start, end)
LengthSampler = Callable[[np.random.Generator], int]


# ---------------------------------------------------------------------------------------------
# Special tokens, words, padding
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpecialTokens:
    """The ids an objective needs, read once from the tokenizer.

    `start`/`end` are [CLS]/[SEP] for a WordPiece tokenizer and <s>/</s> for a BPE one.
    """

    start: int
    end: int
    pad: int
    mask: int
    all: frozenset[int]        # every special id: never masked, never drawn as a random token
    vocab_size: int            # len(tokenizer), added tokens included


def special_tokens(tokenizer: PreTrainedTokenizerBase, objective: str) -> SpecialTokens:
    def first(*names: str) -> int:
        for name in names:
            value = getattr(tokenizer, f"{name}_token_id", None)
            if value is not None:
                return int(value)
        raise UserError(f"objective {objective!r} needs a tokenizer with a {' or '.join(names)} token; "
                        f"this tokenizer has none (expected a WordPiece or BPE tokenizer with special tokens)")

    specials = SpecialTokens(start=first("cls", "bos"), end=first("sep", "eos"), pad=first("pad"),
                             mask=first("mask"), all=frozenset(int(i) for i in tokenizer.all_special_ids),
                             vocab_size=len(tokenizer))
    if len(specials.all) >= specials.vocab_size:
        raise UserError(f"objective {objective!r}: the tokenizer has no ordinary tokens "
                        f"({specials.vocab_size} ids, all special)")
    return specials


def word_start_table(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """vocab-size bool array: does this token begin a word?

    WordPiece marks continuations with '##'; byte-level BPE marks word starts with 'Ġ' and
    SentencePiece with '▁' (the first piece of a sentence is a word start either way, see
    `word_units`). A vocabulary with none of these marks is treated as one token per word.
    """
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    tokens = [t or "" for t in tokens]
    if any(t.startswith("##") for t in tokens):
        return np.array([not t.startswith("##") for t in tokens])
    for marker in ("Ġ", "▁"):
        if any(t.startswith(marker) for t in tokens):
            special = set(tokenizer.all_special_ids)
            return np.array([t.startswith(marker) or i in special for i, t in enumerate(tokens)])
    return np.ones(len(tokens), dtype=bool)


def word_units(ids: Sequence[int], starts: np.ndarray) -> list[Span]:
    """Token ranges of the words of `ids` (position 0 always starts a word)."""
    bounds = [i for i, token in enumerate(ids) if i == 0 or starts[token]]
    return [(b, e) for b, e in zip(bounds, bounds[1:] + [len(ids)])]


def token_units(n: int) -> list[Span]:
    return [(i, i + 1) for i in range(n)]


def maskable(units: Sequence[Span], ids: Sequence[int], specials: SpecialTokens) -> list[Span]:
    """The units holding no special token (an [UNK] inside a text is never selected)."""
    return [(s, e) for s, e in units if not any(int(ids[i]) in specials.all for i in range(s, e))]


def flatten(doc: Sequence[Sequence[int]], max_tokens: int) -> list[int]:
    """A document's sentences as one token list, cut to `max_tokens`."""
    out: list[int] = []
    for sentence in doc:
        out.extend(sentence)
        if len(out) >= max_tokens:
            break
    return out[:max_tokens]


def fit_sentences(doc: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """The leading whole sentences within `max_tokens` (the first one cut if it alone is longer)."""
    out, used = [], 0
    for sentence in doc:
        if used + len(sentence) > max_tokens:
            if not out:
                out.append(list(sentence[:max_tokens]))
            break
        out.append(list(sentence))
        used += len(sentence)
    return out


def pad(seqs: Sequence[Sequence[int]], value: int, length: int | None = None) -> torch.Tensor:
    """Right-pad to the longest (or `length`); returns a LongTensor [batch, length]."""
    length = max((len(s) for s in seqs), default=0) if length is None else length
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, :len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
    return out


def require_targets(count: int, objective: str) -> None:
    """An all-empty batch would give a NaN loss (a mean over nothing): refuse it instead."""
    if count == 0:
        raise UserError(f"objective {objective!r}: the batch has no text tokens to predict "
                        "(all its documents are empty); expected documents with at least one token")


def random_tokens(rng: np.random.Generator, n: int, specials: SpecialTokens) -> np.ndarray:
    """`n` ids drawn uniformly from the non-special vocabulary."""
    out = rng.integers(0, specials.vocab_size, size=n)
    bad = np.isin(out, list(specials.all))
    while bad.any():                                  # rejection: specials are a handful of ids
        out[bad] = rng.integers(0, specials.vocab_size, size=int(bad.sum()))
        bad = np.isin(out, list(specials.all))
    return out


# ---------------------------------------------------------------------------------------------
# Span lengths
# ---------------------------------------------------------------------------------------------

def geometric_length_probs(p: float, max_length: int) -> np.ndarray:
    """SpanBERT's span-length law: Geometric(p) on 1..max_length, renormalised.

    This is what the official SpanBERT code samples from (p=0.2, max 10: mean 3.8 words).
    """
    lengths = np.arange(1, max_length + 1)
    probs = p * (1 - p) ** (lengths - 1)
    return probs / probs.sum()


def geometric_sampler(p: float = 0.2, max_length: int = 10) -> LengthSampler:
    probs = geometric_length_probs(p, max_length)
    return lambda rng: int(rng.choice(len(probs), p=probs)) + 1


def categorical_sampler(probs: Sequence[float]) -> LengthSampler:
    """Lengths 1..len(probs) with the given probabilities (UniLM: 80% 1, 10% 2, 10% 3)."""
    p = np.asarray(probs, dtype=float) / np.sum(probs)
    return lambda rng: int(rng.choice(len(p), p=p)) + 1


def poisson_lengths(rng: np.random.Generator, total: int, lam: float) -> np.ndarray:
    """BART's span lengths: Poisson(lam) draws until they cover `total` units; the last is
    cut so the lengths sum to exactly `total`. Zero-length spans are kept (they insert)."""
    lengths: list[int] = []
    covered = 0
    while covered < total:
        draw = rng.poisson(lam, size=max(8, int(2 * (total - covered) / max(lam, 1e-3)) + 1))
        for length in draw:
            take = min(int(length), total - covered)
            lengths.append(take)
            covered += take
            if covered >= total:
                break
    return np.array(lengths, dtype=int)


# ---------------------------------------------------------------------------------------------
# Span selection and 80/10/10 corruption
# ---------------------------------------------------------------------------------------------

def select_spans(units: Sequence[Span], budget: int, sample_length: LengthSampler,
                 rng: np.random.Generator) -> list[Span]:
    """SpanBERT-style span selection: draw a length, an anchor unit that is not yet masked,
    and take that many consecutive free units, until `budget` tokens are masked.

    Spans never overlap, never cut a unit and only join units that touch (units may have
    gaps where special tokens were left out); the budget is never exceeded except by a
    first unit longer than the whole budget (so every non-empty sequence gets one span).
    """
    free = np.ones(len(units), dtype=bool)
    spans: list[Span] = []
    masked = 0
    while masked < budget and free.any():
        length = sample_length(rng)
        first = int(rng.choice(np.flatnonzero(free)))
        size = units[first][1] - units[first][0]
        if masked and masked + size > budget:
            break                                   # the next unit would overshoot: done
        last = first
        while (last + 1 < len(units) and free[last + 1] and last + 1 - first < length
               and units[last + 1][0] == units[last][1]
               and masked + size + (units[last + 1][1] - units[last + 1][0]) <= budget):
            last += 1
            size += units[last][1] - units[last][0]
        free[first:last + 1] = False
        masked += size
        spans.append((units[first][0], units[last][1]))
    return sorted(spans)


def mask_budget(n_tokens: int, rate: float) -> int:
    return max(1, round(n_tokens * rate)) if n_tokens else 0


def corrupt(ids: Sequence[int], spans: Sequence[Span], rng: np.random.Generator,
            specials: SpecialTokens, per: str = "span", mask_rate: float = 0.8,
            random_rate: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """BERT's 80/10/10: each selected span (per="span", SpanBERT) or token (per="token") is
    replaced by [MASK] with prob. 0.8, by random tokens with 0.1, else left as is.

    Returns (corrupted ids, labels) with labels = original id at selected positions, -100 elsewhere.
    """
    out = np.array(ids, dtype=np.int64)
    labels = np.full(len(out), -100, dtype=np.int64)
    groups = ([(s, e) for s, e in spans] if per == "span"
              else [(i, i + 1) for s, e in spans for i in range(s, e)])
    for start, end in groups:
        labels[start:end] = out[start:end]
        u = rng.random()
        if u < mask_rate:
            out[start:end] = specials.mask
        elif u < mask_rate + random_rate:
            out[start:end] = random_tokens(rng, end - start, specials)
    return out, labels


# ---------------------------------------------------------------------------------------------
# BART noise functions (fairseq's denoising dataset, one function each)
# ---------------------------------------------------------------------------------------------

def permute_sentences(sentences: Sequence[Sequence[int]], rng: np.random.Generator,
                      fraction: float = 1.0) -> list[list[int]]:
    """Shuffle a `fraction` of the sentences among their own slots (whole sentences move)."""
    out = [list(s) for s in sentences]
    count = math.ceil(len(out) * fraction)
    if count < 2:
        return out
    slots = np.sort(rng.choice(len(out), size=count, replace=False))
    moved = rng.permutation(slots)
    originals = [out[i] for i in slots]
    for target, source in zip(moved, range(count)):
        out[int(target)] = originals[source]
    return out


def mask_tokens(ids: Sequence[int], rng: np.random.Generator, rate: float, mask_id: int) -> list[int]:
    """Token masking: each token becomes [MASK] independently with probability `rate`."""
    hit = rng.random(len(ids)) < rate
    return [mask_id if h else int(t) for t, h in zip(ids, hit)]


def delete_tokens(ids: Sequence[int], rng: np.random.Generator, rate: float) -> list[int]:
    """Token deletion: each token is dropped with probability `rate`; survivors keep their order."""
    keep = rng.random(len(ids)) >= rate
    return [int(t) for t, k in zip(ids, keep) if k]


def infill(ids: Sequence[int], units: Sequence[Span], rng: np.random.Generator, rate: float,
           lam: float, mask_id: int) -> tuple[list[int], list[Span]]:
    """Text infilling: ceil(rate * units) units are covered by spans of Poisson(lam) length;
    each span becomes one [MASK]; each zero-length span inserts a [MASK] at a random place.

    `units` must tile `ids` (word_units or token_units do). Spans do not overlap and are
    placed uniformly (a random interleaving of spans and free units). Returns the noised ids
    and the masked token ranges of the input.
    """
    total = math.ceil(len(units) * rate) if units else 0
    lengths = poisson_lengths(rng, total, lam) if total else np.zeros(0, dtype=int)
    spans_len = rng.permutation(lengths[lengths > 0])
    inserts = int((lengths == 0).sum())
    n_free = len(units) - total
    # Lay out len(spans_len) spans and n_free free units in random order.
    slots = np.zeros(n_free + len(spans_len), dtype=bool)
    slots[rng.choice(len(slots), size=len(spans_len), replace=False)] = True
    out: list[int] = []
    masked: list[Span] = []
    unit, k = 0, 0
    for is_span in slots:
        if is_span:
            first, last = units[unit][0], units[unit + int(spans_len[k]) - 1][1]
            masked.append((first, last))
            out.append(mask_id)
            unit += int(spans_len[k])
            k += 1
        else:
            out.extend(int(t) for t in ids[units[unit][0]:units[unit][1]])
            unit += 1
    for _ in range(inserts):
        out.insert(int(rng.integers(0, len(out) + 1)), mask_id)
    return out, masked


def rotate(ids: Sequence[int], rng: np.random.Generator) -> tuple[list[int], int]:
    """Document rotation: a uniformly chosen token becomes the first. Returns (ids, offset)."""
    if not ids:
        return [], 0
    offset = int(rng.integers(0, len(ids)))
    return [int(t) for t in ids[offset:]] + [int(t) for t in ids[:offset]], offset
