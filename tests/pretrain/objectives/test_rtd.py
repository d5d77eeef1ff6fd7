"""ELECTRA replaced token detection: selection, sampled replacements, shared embeddings, teacher dir."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings, strategies as st

from pretrain.models import load_classifier
from pretrain.objectives import SIZES, get_objective
from pretrain.objectives.rtd import replace_with_samples


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), peak=st.floats(0, 8))
def test_replacements_and_labels(seed, peak):
    g = torch.Generator().manual_seed(seed)
    original = torch.randint(5, 20, (3, 10), generator=g)
    selected = torch.rand(3, 10, generator=g) < 0.3
    logits = torch.randn(int(selected.sum()), 20, generator=g)
    # Make the original token likely sometimes: a sample equal to it must count as original.
    logits[torch.arange(len(logits)), original[selected]] += peak
    corrupted, replaced = replace_with_samples(original, original, selected, logits, g)
    assert (corrupted[~selected] == original[~selected]).all()
    assert ((corrupted != original).float() == replaced).all()
    assert not replaced[~selected].any()


def test_selection_rate_and_mask_share(wp_tokenizer, documents, max_length):
    batch = get_objective("rtd").make_batch(documents[:400], wp_tokenizer, np.random.default_rng(0), max_length)
    special = torch.tensor(wp_tokenizer.all_special_ids)
    text = (batch["attention_mask"] == 1) & ~torch.isin(batch["original_ids"], special)
    selected = batch["labels"] != -100
    assert not (selected & ~text).any(), "special tokens are never selected"
    assert abs(float(selected.sum() / text.sum()) - 0.15) < 0.01
    masked = (batch["input_ids"] == wp_tokenizer.mask_token_id) & selected
    assert abs(float(masked.sum() / selected.sum()) - 0.85) < 0.03
    assert (batch["input_ids"][~selected] == batch["original_ids"][~selected]).all()
    assert (batch["labels"][selected] == batch["original_ids"][selected]).all()


def test_generator_is_small_and_shares_the_embeddings(wp_tokenizer):
    model = get_objective("rtd").build_model(wp_tokenizer, SIZES["tiny"], 64, 0)
    gen, disc = model.generator, model.discriminator
    assert gen.config.hidden_size * 4 == disc.config.hidden_size == 128
    assert gen.electra.embeddings is disc.electra.embeddings
    assert gen.generator_lm_head.weight is disc.electra.embeddings.word_embeddings.weight
    shared = sum(p.numel() for p in disc.electra.embeddings.parameters())
    total = sum(p.numel() for p in model.parameters())
    separate = sum(p.numel() for p in gen.parameters()) + sum(p.numel() for p in disc.parameters())
    assert total == separate - shared


def test_training_reduces_loss_and_only_the_discriminator_is_a_teacher(wp_tokenizer, documents, max_length,
                                                                        train_briefly, tmp_path):
    objective = get_objective("rtd")
    model, before, after = train_briefly(objective)
    assert after < before - 0.2, (before, after)   # same held-out batch, eval mode
    batch = objective.make_batch(documents[:8], wp_tokenizer, np.random.default_rng(5), max_length)
    model.eval()                                       # no dropout: only the sampling could differ
    with torch.no_grad():
        assert torch.equal(*(objective.loss(model, batch) for _ in range(2))), "sampling is seeded by the batch"
    delivered = objective.deliverable(model)
    assert type(delivered).__name__ == "ElectraForPreTraining"
    delivered.save_pretrained(tmp_path)
    wp_tokenizer.save_pretrained(tmp_path)
    classifier, _ = load_classifier(str(tmp_path), ("a", "b"))
    encoded = wp_tokenizer(["a small tree"], return_tensors="pt")
    delivered.eval()
    with torch.no_grad():
        assert torch.allclose(delivered.electra(**encoded).last_hidden_state,
                              classifier.electra(**encoded).last_hidden_state, atol=1e-5)
