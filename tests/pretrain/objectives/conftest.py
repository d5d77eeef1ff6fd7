"""Fixtures for the objective tests: real WordNet documents and a small real tokenizer.

A WordPiece tokenizer trained here on WordNet glosses (vocabulary 800) keeps the
embedding and softmax matrices small, so a tiny model trains a handful of steps in well
under a second while every code path (word pieces, special tokens, padding) stays real.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from pretrain.data import load_corpus
from pretrain.objectives import Document, ModelSize, Objective, get_objective

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MICRO = ModelSize(layers=2, hidden=64, heads=2, intermediate=128)   # smaller than SIZES["tiny"]
MAX_LENGTH = 64


@pytest.fixture(scope="session")
def corpus_texts() -> list[list[str]]:
    """The first 3000 WordNet documents (a synset's gloss and examples each)."""
    return list(itertools.islice(load_corpus("wordnet"), 3000))


@pytest.fixture(scope="session")
def wp_tokenizer(corpus_texts) -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    raw.normalizer = normalizers.BertNormalizer(lowercase=True)
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    raw.decoder = decoders.WordPiece()
    raw.train_from_iterator((line for doc in corpus_texts for line in doc),
                            trainers.WordPieceTrainer(vocab_size=800, special_tokens=SPECIALS))
    raw.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, raw.token_to_id(t)) for t in ("[CLS]", "[SEP]")])
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


@pytest.fixture(scope="session")
def bpe_tokenizer(corpus_texts) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with RoBERTa's special tokens (<s> </s> <pad> <mask>)."""
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator((line for doc in corpus_texts[:1000] for line in doc),
                            trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")


@pytest.fixture(scope="session")
def documents(corpus_texts, wp_tokenizer) -> list[Document]:
    """The documents as the pretraining command hands them over: sentences of token ids."""
    return [[wp_tokenizer(s, add_special_tokens=False)["input_ids"] for s in doc]
            for doc in corpus_texts]


@pytest.fixture
def max_length() -> int:
    return MAX_LENGTH


@pytest.fixture
def train_briefly(wp_tokenizer, documents):
    """`train_briefly(objective)` -> (model, held-out loss before, after) on real documents."""
    def run(objective: Objective, **kwargs):
        return _train_briefly(objective, wp_tokenizer, documents, **kwargs)
    return run


@pytest.fixture
def trains_and_round_trips(wp_tokenizer, documents, train_briefly, tmp_path):
    """`trains_and_round_trips(name, model_class)`: a few steps lower the held-out loss, and
    the deliverable, saved and reloaded with `model_class`, computes the same loss."""
    def check(name: str, model_class) -> None:
        objective = get_objective(name)
        model, before, after = train_briefly(objective)
        assert after < before - 0.2, (before, after)   # same held-out batch, eval mode
        delivered = objective.deliverable(model)
        delivered.save_pretrained(tmp_path)
        loaded = model_class.from_pretrained(tmp_path)
        batch = objective.make_batch(documents[:4], wp_tokenizer, np.random.default_rng(3), MAX_LENGTH)
        delivered.eval()
        with torch.no_grad():
            assert torch.allclose(delivered(**batch).loss, loaded(**batch).loss, atol=1e-5)
    return check


def _train_briefly(objective: Objective, tokenizer, documents: list[Document], steps: int = 12,
                   batch_size: int = 16, lr: float = 3e-3, size: ModelSize = MICRO):
    """Build a model, train it `steps` steps on fresh batches, and return
    (model, loss on a held-out batch before, the same loss after)."""
    model = objective.build_model(tokenizer, size, MAX_LENGTH, seed=0)
    rng = np.random.default_rng(0)
    held_out = objective.make_batch(documents[-batch_size:], tokenizer, np.random.default_rng(1), MAX_LENGTH)

    def held_out_loss() -> float:
        model.eval()
        with torch.no_grad():
            torch.manual_seed(0)
            value = float(objective.loss(model, held_out))
        model.train()
        return value

    before = held_out_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        docs = documents[step * batch_size:(step + 1) * batch_size]
        batch = objective.make_batch(docs, tokenizer, rng, MAX_LENGTH)
        loss = objective.loss(model, batch)
        assert torch.isfinite(loss), f"step {step}: loss {loss}"
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, before, held_out_loss()
