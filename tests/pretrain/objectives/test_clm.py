"""Left-to-right LM: causality, the shifted loss, and a deliverable a recipe can fine-tune."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from pretrain.models import load_classifier
from pretrain.objectives import ModelSize, get_objective
from pretrain.objectives.mlm import IGNORE

TINY = ModelSize(layers=1, hidden=32, heads=2, intermediate=64)


@pytest.fixture(scope="module")
def wordnet_docs(tokenizer):
    from pretrain.data.stream import ChunkStream
    return ChunkStream("wordnet", tokenizer, 64, buffer_size=1, seed=0).take(8)


def test_position_t_never_sees_later_tokens(tokenizer, wordnet_docs):
    objective = get_objective("clm")
    model = objective.build_model(tokenizer, TINY, 64, seed=0).eval()
    batch = objective.make_batch(wordnet_docs, tokenizer, np.random.default_rng(0), 64)
    changed = batch["input_ids"].clone()
    changed[:, 5:] = tokenizer.mask_token_id
    with torch.no_grad():
        before = model(input_ids=batch["input_ids"]).logits
        after = model(input_ids=changed).logits
    torch.testing.assert_close(before[:, :5], after[:, :5])
    assert not torch.allclose(before[:, 5:], after[:, 5:])


def test_loss_predicts_the_next_token_and_ignores_padding(tokenizer, wordnet_docs):
    objective = get_objective("clm")
    model = objective.build_model(tokenizer, TINY, 64, seed=0).eval()
    batch = objective.make_batch(wordnet_docs, tokenizer, np.random.default_rng(0), 64)
    pad = batch["input_ids"] == tokenizer.pad_token_id
    assert pad.any() and (batch["labels"][pad] == IGNORE).all()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        manual = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                 batch["labels"][:, 1:].reshape(-1), ignore_index=IGNORE)
        torch.testing.assert_close(objective.loss(model, batch), manual, rtol=1e-5, atol=1e-5)


def test_deliverable_is_a_bidirectional_bert_that_still_loads_as_an_lm(tokenizer, wordnet_docs, tmp_path):
    objective = get_objective("clm")
    model = objective.build_model(tokenizer, TINY, 64, seed=0)
    delivered = objective.deliverable(model)
    assert model.config.is_decoder and not delivered.config.is_decoder
    delivered.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    classifier, _ = load_classifier(str(tmp_path), ("a", "b", "c"))
    assert not classifier.config.is_decoder
    lm = AutoModelForCausalLM.from_pretrained(tmp_path, is_decoder=True).eval()
    torch.testing.assert_close(lm.bert.embeddings.word_embeddings.weight,
                               model.bert.embeddings.word_embeddings.weight)
