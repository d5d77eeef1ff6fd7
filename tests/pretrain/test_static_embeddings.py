"""Skip-gram with negative sampling: pair sampling properties, the loss, export and reload."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from compressor.pretrain_command import embeddings_command
from pretrain.data import load_corpus
from pretrain.errors import UserError
from pretrain.static_embeddings import EmbeddingConfig, PairSampler, SkipGram, load_embeddings


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "wordnet-2000.txt"
    docs = itertools.islice(load_corpus("wordnet"), 2000)
    path.write_text("".join("\n".join(doc) + "\n\n" for doc in docs))
    return str(path)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4))
def test_pairs_stay_in_window_and_document(step, window):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=3000)
    doc_of = np.repeat(np.arange(300), 10)
    counts = np.bincount(ids, minlength=50).astype(float) + 1
    sampler = PairSampler(ids, doc_of, counts, EmbeddingConfig(window=window, batch_size=256, seed=1))
    batch = sampler.batch(step)
    centres, contexts = batch["input_ids"].numpy(), batch["contexts"].numpy()
    assert len(centres) > 0 and batch["negatives"].shape == (len(centres), 5)
    assert ((batch["negatives"] >= 0) & (batch["negatives"] < 50)).all()
    # Every pair is some (i, i+d) with 1 <= |d| <= window inside one document.
    for c, o in zip(centres[:20], contexts[:20]):
        found = any(ids[i] == c and 0 <= i + d < len(ids) and ids[i + d] == o and doc_of[i] == doc_of[i + d]
                    for i in range(len(ids)) for d in range(-window, window + 1) if d)
        assert found
    again = sampler.batch(step)                                   # a pure function of the step
    assert all(torch.equal(batch[k], again[k]) for k in batch)


def test_loss_is_the_negative_sampling_objective():
    torch.manual_seed(0)
    model = SkipGram(20, 8)
    torch.nn.init.normal_(model.context.weight)
    c, o, n = torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([[5, 6], [7, 8]])
    v, u, un = model.centre.weight[c], model.context.weight[o], model.context.weight[n]
    manual = -(F.logsigmoid((v * u).sum(-1)) + F.logsigmoid(-(un @ v.unsqueeze(-1)).squeeze(-1)).sum(-1)).mean()
    torch.testing.assert_close(model(c, o, n), manual)


def test_embeddings_command_exports_a_matrix_and_vocab(corpus, tmp_path):
    out = tmp_path / "emb"
    metrics = embeddings_command(corpus, out, {"dim": 16, "steps": 150, "batch_size": 512, "min_count": 3},
                                 show_progress=False)
    words, matrix = load_embeddings(out)
    assert matrix.shape == (metrics["vocab_size"], 16) and matrix.dtype == np.float32
    assert len(set(words)) == len(words) and "the" in words
    assert metrics["final_loss"] < metrics["initial_loss"]
    for probe, neighbours in metrics["nearest_neighbours"].items():
        assert len(neighbours) == 5 and probe not in [w for w, _ in neighbours]


def test_tiny_corpus_is_a_user_error(tmp_path):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("one two three\n")
    with pytest.raises(UserError, match="min-count"):
        embeddings_command(str(tiny), tmp_path / "out", {"steps": 1}, show_progress=False)
    assert not (tmp_path / "out").exists()
