"""What every registered objective promises the pretraining command (one test, all names)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from pretrain.errors import UserError
from pretrain.objectives import ModelSize, get_objective, objective_names

NAMES = tuple(objective_names())   # every registered objective: a new one is covered as it lands
MASKED = ("span", "plm", "dae", "rtd", "seq2seq-mlm", "unilm")        # need a [MASK] token
SMALL = ModelSize(layers=1, hidden=32, heads=1, intermediate=64)


def test_all_are_registered():
    assert {"mlm", "mlm-wwm", "clm", "nsp", "sop", "mlm+nsp", "mlm+sop", "span", "plm", "dae", "rtd",
            "seq2seq-mlm", "unilm", "bilm"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_batches_are_reproducible_bounded_and_trainable(name, wp_tokenizer, documents):
    objective = get_objective(name)
    assert objective.name == name
    docs = documents[100:108] + [[list(range(5, 200))]]        # one document longer than max_length
    first = objective.make_batch(docs, wp_tokenizer, np.random.default_rng(7), 32)
    again = objective.make_batch(docs, wp_tokenizer, np.random.default_rng(7), 32)
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    assert first["input_ids"].shape[1] <= 32, "sequences never exceed the model's positions"
    # attention_mask is the 2-D padding mask everywhere (a generic loop counts tokens with it).
    assert torch.equal(first["attention_mask"], (first["input_ids"] != wp_tokenizer.pad_token_id).long())
    model = objective.build_model(wp_tokenizer, SMALL, 32, seed=0)
    assert model.get_input_embeddings().num_embeddings == len(wp_tokenizer)
    loss = objective.loss(model, first)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert isinstance(objective.deliverable(model), PreTrainedModel)


@pytest.mark.parametrize("name", ("span", "plm", "rtd", "seq2seq-mlm", "unilm"))
def test_an_all_empty_batch_is_refused(name, wp_tokenizer):
    # (dae and bilm still have targets in an empty document: the end token, the start token.)
    with pytest.raises(UserError, match="no text tokens"):
        get_objective(name).make_batch([[[]], [[]]], wp_tokenizer, np.random.default_rng(0), 32)


@pytest.mark.parametrize("name", MASKED)
def test_a_tokenizer_without_mask_token_is_refused(name, wp_tokenizer):
    bare = PreTrainedTokenizerFast(tokenizer_object=wp_tokenizer.backend_tokenizer, unk_token="[UNK]",
                                   pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]")
    with pytest.raises(UserError, match="needs a tokenizer with a mask token"):
        get_objective(name).build_model(bare, SMALL, 32, seed=0)


@pytest.mark.parametrize("name", NAMES)
def test_minilm_and_byte_level_bpe_tokenizers(name, tokenizer, bpe_tokenizer, corpus_texts):
    """The real MiniLM WordPiece vocabulary and a BPE one (<s> </s> framing, 'Ġ' word starts)."""
    objective = get_objective(name)
    for tok, start, end in ((tokenizer, "[CLS]", "[SEP]"), (bpe_tokenizer, "<s>", "</s>")):
        docs = [[tok(s, add_special_tokens=False)["input_ids"] for s in doc] for doc in corpus_texts[:6]]
        batch = objective.make_batch(docs, tok, np.random.default_rng(0), 48)
        first = tok.convert_ids_to_tokens(batch["input_ids"][0].tolist())
        assert {start, end} <= set(first)
        if tok is bpe_tokenizer:
            model = objective.build_model(tok, SMALL, 48, seed=0)
            assert torch.isfinite(objective.loss(model, batch))


def test_bpe_word_starts_follow_the_space_marker(bpe_tokenizer):
    from pretrain.objectives.noising import word_start_table, word_units
    starts = word_start_table(bpe_tokenizer)
    ids = bpe_tokenizer("a flowering shrub", add_special_tokens=False)["input_ids"]
    words = ["".join(bpe_tokenizer.convert_ids_to_tokens(ids[s:e])) for s, e in word_units(ids, starts)]
    assert words == ["a", "Ġflowering", "Ġshrub"]
