"""Corpus streaming: chunking properties, bounded shuffling, exact resume, bad corpora."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretrain.data import load_corpus
from pretrain.data.stream import (CHUNK_RESERVE, ChunkStream, chunk_document, split_sentences,
                                   tokenize_documents)
from pretrain.errors import UserError

sentences = st.lists(st.integers(0, 50), min_size=0, max_size=30)
documents = st.lists(sentences, min_size=0, max_size=8)


@settings(max_examples=200, deadline=None)
@given(documents, st.integers(1, 40))
def test_chunks_are_whole_sentences_within_budget(doc, budget):
    chunks = chunk_document(doc, budget)
    assert [t for c in chunks for s in c for t in s] == [t for s in doc for t in s]   # nothing lost
    for chunk in chunks:
        assert 0 < sum(map(len, chunk)) <= budget
        for sentence in chunk:
            # A sentence is split only when it alone exceeds the budget.
            assert sentence in doc or any(len(s) > budget for s in doc)
    long_ones = [s for s in doc if len(s) > budget]
    if not long_ones:                      # greedy packing: no two neighbours would fit together
        sizes = [sum(map(len, c)) for c in chunks]
        firsts = [len(c[0]) for c in chunks]
        assert all(sizes[i] + firsts[i + 1] > budget for i in range(len(chunks) - 1))


def test_split_sentences():
    assert split_sentences("He left. She stayed! Why? 3 dogs ran.") == ["He left.", "She stayed!", "Why?", "3 dogs ran."]
    assert split_sentences("e.g. this stays whole") == ["e.g. this stays whole"]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """40 documents of 1-4 sentences; each sentence names its document."""
    rng = np.random.default_rng(0)
    docs = []
    for d in range(40):
        n = int(rng.integers(1, 5))
        docs.append("\n".join(f"Document {d} sentence {k} says hello world." for k in range(n)))
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return path


def keyed(chunks):
    return Counter(tuple(tuple(s) for s in c) for c in chunks)


def test_chunks_leave_the_buffer_in_shuffled_order_and_none_is_lost(tokenizer, small_corpus):
    budget = 24 - CHUNK_RESERVE
    docs = tokenize_documents(list(load_corpus(str(small_corpus))), tokenizer)
    in_order = [c for doc in docs for c in chunk_document(doc, budget)]
    stream = ChunkStream(str(small_corpus), tokenizer, 24, buffer_size=16, seed=0)
    taken = stream.take(len(in_order) - 16)
    buffer = stream.state()["buffer"]
    assert len(buffer) == 16                            # memory is bounded by the buffer
    assert keyed(taken + buffer) == keyed(in_order)     # every chunk of the epoch, once
    assert taken != in_order[: len(taken)]              # in shuffled order
    assert all(sum(map(len, c)) <= budget for c in taken)
    more = stream.take(len(in_order))                   # the next epoch goes on seamlessly
    assert set(keyed(more)) <= set(keyed(in_order))


def test_resume_continues_exactly(tokenizer, small_corpus):
    stream = ChunkStream(str(small_corpus), tokenizer, 24, buffer_size=8, seed=3)
    stream.take(37)                                     # mid-epoch, mid-document
    saved = stream.state()
    expected = stream.take(50)
    resumed = ChunkStream(str(small_corpus), tokenizer, 24, buffer_size=8, seed=3)
    resumed.restore(saved)
    assert resumed.take(50) == expected


def test_empty_and_non_text_corpora_are_user_errors(tokenizer, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(UserError, match="no usable text"):
        ChunkStream(str(empty), tokenizer, 32).take(1)
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(UserError, match="not UTF-8"):
        ChunkStream(str(binary), tokenizer, 32).take(1)
    with pytest.raises(UserError, match="no such file"):
        ChunkStream(str(tmp_path / "missing.txt"), tokenizer, 32)
