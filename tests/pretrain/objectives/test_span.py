"""SpanBERT span masking (properties of the selection and corruption) and the SBO objective."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings, strategies as st
from transformers import AutoModelForSequenceClassification, BertForMaskedLM

from pretrain.objectives import get_objective
from pretrain.objectives.noising import (SpecialTokens, corrupt, geometric_length_probs, geometric_sampler,
                                         mask_budget, maskable, select_spans, token_units, word_units)

SPECIALS = SpecialTokens(start=2, end=3, pad=0, mask=4, all=frozenset({0, 1, 2, 3, 4}), vocab_size=50)
# Token ids >= 30 continue a word (like '##' pieces); the rest start one.
STARTS = np.arange(SPECIALS.vocab_size) < 30

token_lists = st.lists(st.integers(5, SPECIALS.vocab_size - 1), min_size=1, max_size=80)


@settings(max_examples=80, deadline=None)
@given(ids=token_lists, seed=st.integers(0, 2**32 - 1))
def test_spans_cover_whole_words_within_budget(ids, seed):
    rng = np.random.default_rng(seed)
    units = word_units(ids, STARTS)
    budget = mask_budget(len(ids), 0.15)
    spans = select_spans(units, budget, geometric_sampler(0.2, 10), rng)
    starts = {s for s, _ in units}
    ends = {e for _, e in units}
    covered = [i for s, e in spans for i in range(s, e)]
    assert len(covered) == len(set(covered)), "spans overlap"
    assert all(s in starts and e in ends for s, e in spans), "a span cuts a word"
    assert all(sum(1 for u in units if s <= u[0] < e) <= 10 for s, e in spans), "span over 10 words"
    longest_word = max(e - s for s, e in units)
    assert len(covered) <= max(budget, longest_word)
    if len(covered) < budget:     # stopped short only when the next word would overshoot
        assert budget - len(covered) < longest_word


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, SPECIALS.vocab_size - 1), min_size=1, max_size=60),
       seed=st.integers(0, 2**32 - 1))
def test_special_tokens_are_never_selected_or_replaced_in(ids, seed):
    rng = np.random.default_rng(seed)
    units = maskable(word_units(ids, STARTS), ids, SPECIALS)
    spans = select_spans(units, mask_budget(len(ids), 0.5), geometric_sampler(), rng)
    out, labels = corrupt(ids, spans, rng, SPECIALS)
    for i, token in enumerate(ids):
        if token in SPECIALS.all:
            assert labels[i] == -100 and out[i] == token
    unselected = labels == -100
    assert (out[unselected] == np.array(ids)[unselected]).all(), "only selected tokens change"


def test_geometric_lengths_have_the_clipped_mean():
    rng = np.random.default_rng(0)
    sample = geometric_sampler(0.2, 10)
    lengths = np.array([sample(rng) for _ in range(20000)])
    expected = float((np.arange(1, 11) * geometric_length_probs(0.2, 10)).sum())
    assert abs(expected - 3.79) < 0.01             # SpanBERT's reported mean span length
    assert abs(lengths.mean() - expected) < 0.05
    assert lengths.min() == 1 and lengths.max() == 10


def test_masking_rate_and_80_10_10_split_per_span():
    rng = np.random.default_rng(0)
    masked = total = 0
    kinds = {"mask": 0, "random": 0, "same": 0}
    for _ in range(2000):
        ids = rng.integers(5, SPECIALS.vocab_size, size=60)
        spans = select_spans(token_units(60), mask_budget(60, 0.15), geometric_sampler(), rng)
        out, labels = corrupt(ids, spans, rng, SPECIALS)
        masked += (labels != -100).sum()
        total += 60
        for s, e in spans:
            if (out[s:e] == SPECIALS.mask).all():
                kinds["mask"] += 1
            elif (out[s:e] == ids[s:e]).all():
                kinds["same"] += 1    # a random draw equal to the original lands here (rare)
            else:
                kinds["random"] += 1
            assert (labels[s:e] == ids[s:e]).all()
    assert masked / total == 9 / 60               # token-level units hit the budget exactly
    spans_seen = sum(kinds.values())
    assert abs(kinds["mask"] / spans_seen - 0.8) < 0.02
    assert abs(kinds["random"] / spans_seen - 0.1) < 0.02
    assert abs(kinds["same"] / spans_seen - 0.1) < 0.02


def test_whole_word_masking_rate_on_real_documents(wp_tokenizer, documents, max_length):
    batch = get_objective("span").make_batch(documents[:400], wp_tokenizer, np.random.default_rng(0), max_length)
    text = (batch["attention_mask"] == 1) & ~torch.isin(batch["input_ids"], torch.tensor([2, 3]))
    rate = float((batch["labels"] != -100).sum() / text.sum())
    assert 0.12 < rate <= 0.15, rate
    # Every masked token is an SBO target, with boundaries just outside its span.
    assert len(batch["sbo_target"]) == int((batch["labels"] != -100).sum())
    rows, left, right = batch["sbo_row"], batch["sbo_left"], batch["sbo_right"]
    position = left + 1 + batch["sbo_offset"]
    assert (batch["labels"][rows, position] == batch["sbo_target"]).all()
    assert (left < position).all() and (position < right).all()


def test_training_reduces_loss_and_delivers_a_bert(wp_tokenizer, documents, train_briefly, tmp_path):
    objective = get_objective("span")
    model, before, after = train_briefly(objective)
    assert after < before - 0.2, (before, after)   # same held-out batch, eval mode
    delivered = objective.deliverable(model)
    assert isinstance(delivered, BertForMaskedLM)
    delivered.save_pretrained(tmp_path)
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    encoded = wp_tokenizer(["a small tree"], return_tensors="pt")
    delivered.eval()
    classifier.eval()
    with torch.no_grad():
        expected = delivered.bert(**encoded).last_hidden_state
        got = classifier.bert(**encoded).last_hidden_state
    assert torch.allclose(expected, got, atol=1e-5), "the classifier starts from the pretrained encoder"
