"""UniLM: attention masks per mode, their mix, no leaks through a real BERT, eager = SDPA, training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers import BertForMaskedLM

from pretrain.objectives import SIZES, get_objective
from pretrain.objectives.unilm import MODES, attention_mask, split_source_target


@settings(max_examples=80, deadline=None)
@given(length=st.integers(2, 30), extra=st.integers(0, 5), data=st.data())
def test_masks_per_mode(length, extra, data):
    source = data.draw(st.integers(1, length))
    padded = length + extra
    masks = {mode: attention_mask(mode, length, source, padded) for mode in MODES}
    for mask in masks.values():
        assert not mask[:, length:].any(), "nobody attends to padding"
        assert all(mask[i, i] for i in range(length)), "every token sees itself"
    real = np.arange(padded) < length
    assert (masks["bidirectional"][:length] == real).all()
    l2r, r2l, s2s = masks["left-to-right"][:length, :length], masks["right-to-left"][:length, :length], \
        masks["seq2seq"][:length, :length]
    assert (l2r == np.tril(np.ones_like(l2r))).all() and (r2l == l2r.T).all()
    assert s2s[:source, :source].all() and not s2s[:source, source:].any()
    assert s2s[source:, :source].all() and (s2s[source:, source:] == np.tril(np.ones((length - source,) * 2))).all()


def test_mode_mix_follows_unilms_proportions(wp_tokenizer, documents, max_length):
    batch = get_objective("unilm").make_batch(documents[:1800], wp_tokenizer, np.random.default_rng(0), max_length)
    share = np.bincount(batch["mode"].numpy(), minlength=4) / 1800
    assert np.allclose(share, [1 / 3, 1 / 3, 1 / 6, 1 / 6], atol=0.04), share
    structural = [wp_tokenizer.cls_token_id, wp_tokenizer.sep_token_id, wp_tokenizer.pad_token_id]
    text = ~torch.isin(batch["input_ids"], torch.tensor(structural))
    rate = float((batch["labels"] != -100).sum() / text.sum())
    assert 0.13 < rate <= 0.16, rate
    assert not torch.isin(batch["labels"][batch["labels"] != -100], torch.tensor(wp_tokenizer.all_special_ids)).any()


@settings(max_examples=40, deadline=None)
@given(doc=st.lists(st.lists(st.integers(5, 99), min_size=1, max_size=6), min_size=1, max_size=5),
       seed=st.integers(0, 2**32 - 1))
def test_seq2seq_split_is_a_cut_of_the_document(doc, seed):
    split = split_source_target(doc, 64, np.random.default_rng(seed))
    flat = [t for s in doc for t in s]
    if len(flat) < 2:
        assert split is None
        return
    source, target = split
    assert source and target and source + target == flat


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_no_mode_leaks_information(wp_tokenizer, documents, max_length, implementation):
    objective = get_objective("unilm")
    batch = objective.make_batch(documents[:48], wp_tokenizer, np.random.default_rng(1), max_length)
    model = objective.build_model(wp_tokenizer, SIZES["tiny"],
                                  max_length, 0)
    model = BertForMaskedLM.from_pretrained(None, config=model.config, state_dict=model.state_dict(),
                                            attn_implementation=implementation).eval()
    inputs = {"input_ids": batch["input_ids"], "token_type_ids": batch["token_type_ids"],
              "attention_mask": batch["self_attention_mask"]}
    with torch.no_grad():
        base = model(**inputs).logits
        for row in range(len(batch["input_ids"])):
            length = int(batch["attention_mask"][row].sum())
            k = length // 2
            changed = {key: value[row:row + 1].clone() for key, value in inputs.items()}
            changed["input_ids"][0, k] = (changed["input_ids"][0, k] + 7) % len(wp_tokenizer)
            moved = (model(**changed).logits[0] - base[row]).abs().amax(-1)[:length] > 1e-4
            sees_k = batch["self_attention_mask"][row, :length, k].bool()
            # Only positions that may see token k (in one layer or through others) can change.
            mode = MODES[int(batch["mode"][row])]
            if mode == "left-to-right":
                assert not moved[:k].any()
            elif mode == "right-to-left":
                assert not moved[k + 1:].any()
            elif mode == "seq2seq" and k >= int(batch["self_attention_mask"][row, 0, :length].sum()):
                assert not moved[:k].any(), "a target token leaked into the source or earlier targets"
            assert moved[sees_k].any()


def test_eager_and_sdpa_agree_on_3d_masks(wp_tokenizer, documents, max_length):
    objective = get_objective("unilm")
    batch = objective.make_batch(documents[:16], wp_tokenizer, np.random.default_rng(2), max_length)
    model = objective.build_model(wp_tokenizer, SIZES["tiny"],
                                  max_length, 0)
    outputs = []
    for implementation in ("eager", "sdpa"):
        twin = BertForMaskedLM.from_pretrained(None, config=model.config, state_dict=model.state_dict(),
                                               attn_implementation=implementation).eval()
        with torch.no_grad():
            outputs.append(twin(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                                attention_mask=batch["self_attention_mask"]).logits)
    real = batch["input_ids"] != wp_tokenizer.pad_token_id
    assert torch.allclose(outputs[0][real], outputs[1][real], atol=1e-4)


def test_training_reduces_loss_and_the_model_saves(wp_tokenizer, documents, max_length, train_briefly, tmp_path):
    objective = get_objective("unilm")
    model, before, after = train_briefly(objective)
    assert after < before - 0.2, (before, after)   # same held-out batch, eval mode
    objective.deliverable(model).save_pretrained(tmp_path)
    loaded = BertForMaskedLM.from_pretrained(tmp_path).eval()
    batch = objective.make_batch(documents[:4], wp_tokenizer, np.random.default_rng(3), max_length)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(objective.loss(model, batch), objective.loss(loaded, batch), atol=1e-5)
