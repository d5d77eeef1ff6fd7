"""Masked-LM masking: property-based tests on the real MiniLM WordPiece vocabulary.

Rates are checked within 5 standard deviations of a binomial proportion (a false alarm
about once in 3.5 million draws), on at least a few thousand tokens per example.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.objectives import SIZES, ModelSize, get_objective
from pretrain.objectives.mlm import (IGNORE, MASK_RATE, mask_tokens, pad_rows, select_for_masking,
                                     vocab_of, word_ids)

TINY = ModelSize(layers=1, hidden=32, heads=2, intermediate=64)
SETTINGS = settings(max_examples=25, deadline=None)


@pytest.fixture(scope="module")
def vocab(tokenizer):
    return vocab_of(tokenizer)


@pytest.fixture(scope="module")
def wordnet_docs(tokenizer):
    """Real WordNet documents as the stream hands them over (MiniLM token ids)."""
    from pretrain.data.stream import ChunkStream
    return ChunkStream("wordnet", tokenizer, 64, buffer_size=1, seed=0).take(64)


def random_batch(vocab, seed: int, rows: int, width: int) -> np.ndarray:
    """[CLS] random words [SEP] [PAD]..., with some special tokens in the middle too."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab.size, size=(rows, width))
    ids[rng.random(ids.shape) < 0.03] = vocab.sep       # specials inside the text
    lengths = rng.integers(2, width + 1, size=rows)
    ids[:, 0] = vocab.cls
    for i, n in enumerate(lengths):
        ids[i, n - 1] = vocab.sep
        ids[i, n:] = vocab.pad
    return ids


def within(observed: float, expected: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(observed - expected) <= sigmas * np.sqrt(expected * (1 - expected) / n) + 1e-12


batches = st.tuples(st.integers(0, 2**32 - 1), st.integers(64, 160), st.integers(48, 96))


@SETTINGS
@given(batches, st.booleans())
def test_special_tokens_and_padding_are_never_selected_or_changed(vocab, case, whole_word):
    seed, rows, width = case
    ids = random_batch(vocab, seed, rows, width)
    inputs, labels = mask_tokens(ids, vocab, np.random.default_rng(seed + 1), whole_word)
    special = vocab.special[ids]
    assert (labels[special] == IGNORE).all()
    assert (inputs[special] == ids[special]).all()


@SETTINGS
@given(batches, st.booleans())
def test_labels_hold_the_original_tokens_exactly_where_selected(vocab, case, whole_word):
    seed, rows, width = case
    ids = random_batch(vocab, seed, rows, width)
    inputs, labels = mask_tokens(ids, vocab, np.random.default_rng(seed), whole_word)
    selected = labels != IGNORE
    assert (labels[selected] == ids[selected]).all()
    assert (inputs[~selected] == ids[~selected]).all()          # unselected tokens untouched
    assert not vocab.special[inputs[selected & (inputs != vocab.mask)]].any()  # no random special


@SETTINGS
@given(batches)
def test_selection_rate_is_fifteen_percent(vocab, case):
    seed, rows, width = case
    ids = random_batch(vocab, seed, rows, width)
    _, labels = mask_tokens(ids, vocab, np.random.default_rng(seed))
    maskable = ~vocab.special[ids]
    assert within((labels != IGNORE).sum() / maskable.sum(), MASK_RATE, int(maskable.sum()))


@SETTINGS
@given(batches)
def test_replacement_split_is_80_10_10(vocab, case):
    seed, rows, width = case
    ids = random_batch(vocab, seed, rows, width * 4)            # enough selected tokens
    inputs, labels = mask_tokens(ids, vocab, np.random.default_rng(seed))
    selected = labels != IGNORE
    n = int(selected.sum())
    masked = (inputs[selected] == vocab.mask).mean()
    kept = (inputs[selected] == ids[selected]).mean()
    replaced = 1 - masked - kept
    # A random replacement equal to the original counts as kept: 1 / vocab, negligible.
    assert within(masked, 0.8, n) and within(kept, 0.1, n) and within(replaced, 0.1, n)


@SETTINGS
@given(batches)
def test_masks_are_resampled_each_time_a_sequence_is_seen(vocab, case):
    seed, rows, width = case
    ids = random_batch(vocab, seed, rows, width)
    rng = np.random.default_rng(seed)
    first, second = mask_tokens(ids, vocab, rng)[1], mask_tokens(ids, vocab, rng)[1]
    assert not np.array_equal(first, second)
    again = mask_tokens(ids, vocab, np.random.default_rng(seed))[1]
    assert np.array_equal(first, again)                          # a seed names one mask


def wordpiece_batch(tokenizer, texts):
    return pad_rows(tokenizer(texts)["input_ids"], tokenizer.pad_token_id)


def test_word_ids_group_wordpiece_continuations(tokenizer, vocab):
    ids = wordpiece_batch(tokenizer, ["unbelievably hyperventilating cats", "a b"])
    words = word_ids(ids, ~vocab.special[ids], vocab.continuation)
    tokens = tokenizer.convert_ids_to_tokens(ids[0].tolist())
    for j, token in enumerate(tokens):
        if token.startswith("##"):
            assert words[0, j] == words[0, j - 1]
        elif not vocab.special[ids[0, j]]:
            assert j == 1 or words[0, j] == words[0, j - 1] + 1
    assert words[0, 0] == -1 and words[1, 0] == -1               # [CLS] belongs to no word


@SETTINGS
@given(st.integers(0, 2**32 - 1))
def test_whole_word_masking_selects_all_or_none_of_each_word(tokenizer, vocab, seed):
    texts = ["unbelievably hyperventilating photosynthesizers outmaneuvered antidisestablishmentarianism"] * 300
    ids = wordpiece_batch(tokenizer, texts)
    maskable = ~vocab.special[ids]
    words = word_ids(ids, maskable, vocab.continuation)
    selected = select_for_masking(maskable, np.random.default_rng(seed), MASK_RATE, words)
    n_words = 0
    chosen_words = 0
    for row in range(len(ids)):
        for w in np.unique(words[row][words[row] >= 0]):
            picks = selected[row][words[row] == w]
            assert picks.all() or not picks.any()
            n_words += 1
            chosen_words += int(picks.all())
    assert (words[0] >= 0).sum() > words[0].max() + 1            # the words really have pieces
    assert within(chosen_words / n_words, MASK_RATE, n_words)


def test_mlm_loss_equals_the_models_own_loss(tokenizer, wordnet_docs):
    objective = get_objective("mlm")
    model = objective.build_model(tokenizer, TINY, 64, seed=0).eval()   # no dropout
    batch = objective.make_batch(wordnet_docs[:8], tokenizer, np.random.default_rng(0), 64)
    assert (batch["labels"] != IGNORE).any()
    ours = objective.loss(model, batch)
    reference = model(**batch).loss                               # logits at every position
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


def test_make_batch_respects_max_length(tokenizer, wordnet_docs):
    long_doc = [[[t for d in wordnet_docs[:20] for s in d for t in s]]]
    batch = get_objective("mlm-wwm").make_batch(long_doc, tokenizer, np.random.default_rng(0), 32)
    assert batch["input_ids"].shape == (1, 32)
    assert batch["input_ids"][0, 0] == tokenizer.cls_token_id and batch["input_ids"][0, -1] == tokenizer.sep_token_id


def test_sizes_are_the_shared_ones():
    assert SIZES["small"] == ModelSize(layers=4, hidden=256, heads=4, intermediate=1024)
