"""XLNet permutation LM: the factorization masks and a short real training run."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings, strategies as st
from transformers import XLNetLMHeadModel

from pretrain.objectives import get_objective
from pretrain.objectives.plm import permutation_targets


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), pads=st.integers(0, 5), k=st.sampled_from([6.0, 7.0, 2.0]),
       seed=st.integers(0, 2**32 - 1))
def test_targets_are_the_last_part_of_a_factorization_order(n, pads, k, seed):
    maskable = np.array([False] * pads + [True] * n + [False, False])   # pads, text, [SEP] [CLS]
    targets, perm_mask = permutation_targets(len(maskable), maskable, k, np.random.default_rng(seed))
    assert len(targets) == max(1, round(n / k))
    assert len(set(targets.tolist())) == len(targets) and maskable[targets].all()
    context = np.flatnonzero(~np.isin(np.arange(len(maskable)), targets))
    # Context sees all context and no target; nothing sees a target that is not before it.
    assert not perm_mask[np.ix_(context, context)].any()
    assert perm_mask[np.ix_(context, targets)].all()
    for t, i in enumerate(targets):
        assert not perm_mask[i, context].any()
        assert not perm_mask[i, targets[:t]].any() and perm_mask[i, targets[t:]].all()


def test_every_position_is_a_target_equally_often():
    rng = np.random.default_rng(0)
    maskable = np.ones(12, dtype=bool)
    counts = np.zeros(12)
    for _ in range(3000):
        targets, _ = permutation_targets(12, maskable, 6.0, rng)
        counts[targets] += 1
    expected = 3000 * 2 / 12            # round(12 / 6) = 2 targets each time
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_batch_layout(wp_tokenizer, documents, max_length):
    batch = get_objective("plm").make_batch(documents[:8], wp_tokenizer, np.random.default_rng(0), max_length)
    ids, attention = batch["input_ids"], batch["attention_mask"]
    assert (ids[:, -2] == wp_tokenizer.sep_token_id).all() and (ids[:, -1] == wp_tokenizer.cls_token_id).all()
    assert ((ids == wp_tokenizer.pad_token_id) == (attention == 0)).all()
    assert attention.cummax(dim=1).values.eq(attention).all(), "padding is on the left"
    mapping, labels = batch["target_mapping"], batch["labels"]
    real = labels != -100
    assert (mapping.sum(-1) == real.float()).all()
    positions = mapping.argmax(-1)
    assert (ids.gather(1, positions)[real] == labels[real]).all()
    special = torch.tensor(wp_tokenizer.all_special_ids)
    assert not torch.isin(labels[real], special).any()


def test_training_reduces_loss_and_the_model_saves(trains_and_round_trips):
    trains_and_round_trips("plm", XLNetLMHeadModel)
