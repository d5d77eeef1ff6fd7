"""Streaming a corpus into tokenized, chunked, shuffled documents for pretraining.

Memory stays flat however large the corpus: the text file is read line by line
(`load_corpus`), documents are tokenized a block at a time, and shuffling uses a bounded
buffer (a uniformly random element of the buffer leaves each time a new one arrives), so
at most `buffer_size` chunks are held. The stream cycles through the corpus for as many
epochs as the step count needs.

A chunk is a `Document` (sentences of token ids, no special tokens) of at most `budget`
tokens made of whole consecutive sentences; a single sentence longer than the budget is cut
into budget-sized pieces. The budget leaves room for the special tokens an objective adds
(CHUNK_RESERVE: [CLS] A [SEP] B [SEP] needs 3).

The stream's position is a small state (epoch, documents read, buffer, generator state),
so training resumes from a checkpoint exactly where it stopped.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from pretrain.data import load_corpus
from pretrain.errors import UserError
from pretrain.objectives import Document

CHUNK_RESERVE = 3            # special tokens an objective may add around a chunk
TOKENIZE_BLOCK_DOCS = 256    # documents tokenized per call (the fast tokenizer batches)

# A sentence ends at . ! or ? followed by space and an upper-case letter, digit or quote.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


def split_sentences(line: str) -> list[str]:
    """Sentences of one line of text (a WordNet line is already one sentence)."""
    return [s for s in (p.strip() for p in _SENTENCE_END.split(line)) if s]


def chunk_document(doc: Document, budget: int) -> list[Document]:
    """Cut a document into chunks of whole consecutive sentences of at most `budget` tokens.

    Greedy: sentences are added to the current chunk until the next would overflow it. A
    sentence longer than the budget becomes budget-sized pieces, each a chunk of its own.
    Empty sentences are dropped; the concatenation of the chunks is the document.
    """
    if budget < 1:
        raise ValueError(f"chunk budget must be positive, got {budget}")
    chunks: list[Document] = []
    current: Document = []
    size = 0
    for sentence in doc:
        if not sentence:
            continue
        if len(sentence) > budget:
            if current:
                chunks.append(current)
                current, size = [], 0
            chunks.extend([sentence[i:i + budget]] for i in range(0, len(sentence), budget))
            continue
        if size + len(sentence) > budget:
            chunks.append(current)
            current, size = [], 0
        current.append(sentence)
        size += len(sentence)
    if current:
        chunks.append(current)
    return chunks


def tokenize_documents(docs: list[list[str]], tokenizer: PreTrainedTokenizerBase) -> list[Document]:
    """Each document's sentences as token ids (no special tokens), in one tokenizer call."""
    sentences = [[s for line in doc for s in split_sentences(line)] for doc in docs]
    flat = [s for doc in sentences for s in doc]
    if not flat:
        return [[] for _ in docs]
    ids = tokenizer(flat, add_special_tokens=False)["input_ids"]
    out, at = [], 0
    for doc in sentences:
        out.append(ids[at:at + len(doc)])
        at += len(doc)
    return out


@dataclass
class StreamState:
    """Where the stream is: enough to continue exactly after a restart."""

    epoch: int = 0
    docs_read: int = 0                         # raw documents consumed in this epoch
    buffer: list[Document] = field(default_factory=list)
    pending: list[Document] = field(default_factory=list)   # chunks of the last document read
    rng: dict[str, Any] | None = None          # numpy bit generator state

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "docs_read": self.docs_read, "buffer": self.buffer,
                "pending": self.pending, "rng": self.rng}

    @classmethod
    def from_dict(cls, data: dict) -> "StreamState":
        return cls(**data)


class ChunkStream:
    """Endless shuffled chunks of a corpus (cycling epochs), with a resumable state.

    `take(n)` returns the next n chunks; `state()` / `restore()` save and set the position.
    """

    def __init__(self, corpus: str, tokenizer: PreTrainedTokenizerBase, max_length: int,
                 buffer_size: int = 10_000, seed: int = 0, min_tokens: int = 1):
        if max_length <= CHUNK_RESERVE:
            raise UserError(f"max length {max_length} leaves no room for text: expected more than {CHUNK_RESERVE}")
        self.corpus = corpus
        self.tokenizer = tokenizer
        self.budget = max_length - CHUNK_RESERVE
        self.buffer_size = buffer_size
        self.min_tokens = min_tokens
        self._state = StreamState(rng=np.random.default_rng(seed).bit_generator.state)
        self._rng = np.random.default_rng(seed)
        self._chunks: Iterator[Document] | None = None
        load_corpus(corpus)  # a bad corpus name fails here, before anything is written

    # -- position -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """Completed passes over the corpus."""
        return self._state.epoch

    def state(self) -> dict:
        state = copy.deepcopy(self._state)
        state.rng = self._rng.bit_generator.state
        return state.to_dict()

    def restore(self, data: dict) -> None:
        self._state = StreamState.from_dict(copy.deepcopy(data))
        self._rng.bit_generator.state = self._state.rng
        self._chunks = None  # re-opened at docs_read on the next take()

    # -- reading --------------------------------------------------------------------------
    def take(self, n: int) -> list[Document]:
        if self._chunks is None:
            self._chunks = self._shuffled()
        return [next(self._chunks) for _ in range(n)]

    def _shuffled(self) -> Iterator[Document]:
        """Bounded-buffer shuffle: fill the buffer, then swap each new chunk for a random one."""
        state = self._state
        for chunk in self._unshuffled():
            if len(state.buffer) < self.buffer_size:
                state.buffer.append(chunk)
                continue
            i = int(self._rng.integers(len(state.buffer)))
            out, state.buffer[i] = state.buffer[i], chunk
            yield out

    def _unshuffled(self) -> Iterator[Document]:
        """Chunks in corpus order from the saved position on, epoch after epoch."""
        state = self._state
        while True:
            while state.pending:
                yield state.pending.pop(0)
            whole_epoch, found = state.docs_read == 0, False
            docs = load_corpus(self.corpus)
            for block in _blocks(itertools.islice(docs, state.docs_read, None), TOKENIZE_BLOCK_DOCS):
                for doc in tokenize_documents(block, self.tokenizer):
                    state.docs_read += 1
                    state.pending = [c for c in chunk_document(doc, self.budget)
                                     if sum(map(len, c)) >= self.min_tokens]
                    found = found or bool(state.pending)
                    while state.pending:
                        yield state.pending.pop(0)
            if whole_epoch and not found:
                raise UserError(f"corpus {self.corpus!r} has no usable text: expected plain UTF-8 "
                                "text, documents separated by blank lines")
            state.epoch += 1
            state.docs_read = 0


def _blocks(items: Iterator, size: int) -> Iterator[list]:
    while block := list(itertools.islice(items, size)):
        yield block
