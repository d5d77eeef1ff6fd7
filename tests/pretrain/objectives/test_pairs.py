"""NSP / SOP pairing: property-based tests, plus the losses against BERT's own heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.errors import UserError
from pretrain.objectives import ModelSize, get_objective
from pretrain.objectives.mlm import IGNORE, vocab_of
from pretrain.objectives.pairs import (Pair, encode_pairs, flat, make_pairs, nsp_pair, sop_pair,
                                       split_segments)

TINY = ModelSize(layers=1, hidden=32, heads=2, intermediate=64)
SETTINGS = settings(max_examples=60, deadline=None)

# A document: 1-5 sentences of 1-12 token ids; token ids tell documents apart.
sentences = st.lists(st.integers(1000, 1999), min_size=1, max_size=12)
documents = st.lists(sentences, min_size=1, max_size=5).filter(lambda d: len(flat(d)) >= 2)
seeds = st.integers(0, 2**32 - 1)


def is_contiguous_slice(part: list[int], whole: list[int]) -> bool:
    return any(whole[i:i + len(part)] == part for i in range(len(whole) - len(part) + 1))


@SETTINGS
@given(documents, seeds)
def test_segments_are_consecutive_and_cover_the_chunk(doc, seed):
    a, b = split_segments(doc, np.random.default_rng(seed))
    assert a and b and a + b == flat(doc)
    if len(doc) >= 2:                      # cut at a sentence boundary
        boundaries = set(np.cumsum([len(s) for s in doc])[:-1].tolist())
        assert len(a) in boundaries


@SETTINGS
@given(documents, seeds, st.integers(4, 40))
def test_sop_pairs_are_the_two_segments_in_or_out_of_order(doc, seed, budget):
    pair = sop_pair(doc, np.random.default_rng(seed), budget)
    assert pair.a and pair.b and len(pair.a) + len(pair.b) <= budget
    first, second = (pair.a, pair.b) if pair.label == 0 else (pair.b, pair.a)
    assert is_contiguous_slice(first + second, flat(doc))      # consecutive, in document order
    assert flat(doc)[: len(first)] == first


@settings(max_examples=30, deadline=None)
@given(st.lists(documents, min_size=2, max_size=4), seeds, st.integers(4, 40))
def test_nsp_negatives_come_from_another_document(docs, seed, budget):
    # Give each document its own id range so we can tell where a segment came from.
    docs = [[[t + 1000 * k for t in s] for s in d] for k, d in enumerate(docs)]
    pair = nsp_pair(docs[0], docs[1:], np.random.default_rng(seed), budget)
    assert pair.a and pair.b and len(pair.a) + len(pair.b) <= budget
    assert flat(docs[0])[: len(pair.a)] == pair.a
    if pair.label == 0:
        assert flat(docs[0])[: len(pair.a) + len(pair.b)] == pair.a + pair.b
    else:
        owners = [k for k, d in enumerate(docs) if is_contiguous_slice(pair.b, flat(d))]
        assert owners and 0 not in owners


@pytest.mark.parametrize("kind", ["nsp", "sop"])
@settings(max_examples=10, deadline=None)
@given(seed=seeds)
def test_half_of_the_pairs_are_negatives(kind, seed):
    rng = np.random.default_rng(seed)
    docs = [[[1, 2, 3], [4, 5]], [[6, 7, 8, 9]], [[10, 11], [12]]] * 1000
    labels = np.array([p.label for p in make_pairs(docs, kind, rng, budget=20)])
    n = len(labels)
    assert abs(labels.mean() - 0.5) <= 5 * np.sqrt(0.25 / n)


def test_pair_layout_and_token_types(tokenizer):
    vocab = vocab_of(tokenizer)
    ids, types = encode_pairs([Pair([7, 8], [9], 0), Pair([7], [8, 9, 10], 1)], vocab)
    c, s, p = vocab.cls, vocab.sep, vocab.pad
    assert ids.tolist() == [[c, 7, 8, s, 9, s, p], [c, 7, s, 8, 9, 10, s]]
    assert types.tolist() == [[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1]]


def test_nsp_needs_a_second_document():
    with pytest.raises(UserError, match="batch size of at least 2"):
        make_pairs([[[1, 2, 3]]], "nsp", np.random.default_rng(0), 10)


@pytest.fixture(scope="module")
def wordnet_docs(tokenizer):
    from pretrain.data.stream import ChunkStream
    return ChunkStream("wordnet", tokenizer, 64, buffer_size=1, seed=0, min_tokens=2).take(32)


@pytest.mark.parametrize("name", ["mlm+nsp", "mlm+sop"])
def test_pretraining_loss_equals_bert_for_pretraining(tokenizer, wordnet_docs, name):
    objective = get_objective(name)
    model = objective.build_model(tokenizer, TINY, 64, seed=0).eval()
    batch = objective.make_batch(wordnet_docs[:16], tokenizer, np.random.default_rng(0), 64)
    ids = batch["input_ids"]
    special = torch.from_numpy(vocab_of(tokenizer).special)[ids] & (ids != tokenizer.mask_token_id)
    assert (batch["labels"][special] == IGNORE).all()            # [CLS] / [SEP] / pad never masked
    assert (batch["labels"] != IGNORE).any()
    assert batch["input_ids"].shape[1] <= 64
    reference = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch["token_type_ids"], labels=batch["labels"],
                      next_sentence_label=batch["pair_labels"]).loss
    torch.testing.assert_close(objective.loss(model, batch), reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["nsp", "sop"])
def test_pair_only_loss_equals_the_nsp_head(tokenizer, wordnet_docs, name):
    objective = get_objective(name)
    model = objective.build_model(tokenizer, TINY, 64, seed=0).eval()
    batch = objective.make_batch(wordnet_docs[:16], tokenizer, np.random.default_rng(0), 64)
    assert "labels" not in batch
    reference = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch["token_type_ids"], labels=batch["pair_labels"]).loss
    torch.testing.assert_close(objective.loss(model, batch), reference, rtol=1e-5, atol=1e-5)
