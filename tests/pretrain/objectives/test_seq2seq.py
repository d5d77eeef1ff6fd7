"""MASS-style seq2seq MLM: fragment placement, the aligned decoder input, and training."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings, strategies as st
from transformers import BartForConditionalGeneration

from pretrain.objectives import get_objective
from pretrain.objectives.seq2seq import draw_fragment


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 200), share=st.sampled_from([0.15, 0.5, 1.0]), seed=st.integers(0, 2**32 - 1))
def test_fragment_is_one_contiguous_run_of_the_right_length(n, share, seed):
    start, end = draw_fragment(n, share, np.random.default_rng(seed))
    assert 0 <= start <= end <= n
    assert end - start == (min(n, max(1, round(share * n))) if n else 0)


def test_fragment_start_is_uniform():
    rng = np.random.default_rng(0)
    starts = np.bincount([draw_fragment(10, 0.5, rng)[0] for _ in range(3000)], minlength=6)
    assert len(starts) == 6 and np.all(np.abs(starts - 500) < 100), starts


def test_batch_aligns_encoder_decoder_and_labels(wp_tokenizer, documents, max_length):
    batch = get_objective("seq2seq-mlm").make_batch(documents[:64], wp_tokenizer, np.random.default_rng(0),
                                                    max_length)
    mask, pad = wp_tokenizer.mask_token_id, wp_tokenizer.pad_token_id
    masked = predicted = 0
    for doc, source, decoder, labels in zip(documents, batch["input_ids"], batch["decoder_input_ids"],
                                            batch["labels"]):
        flat = [t for s in doc for t in s][:max_length - 2]
        fragment = torch.nonzero(labels != -100).squeeze(-1)
        start, end = int(fragment[0]), int(fragment[-1]) + 1
        assert fragment.tolist() == list(range(start, end)), "one contiguous fragment"
        assert end - start == max(1, round(0.5 * len(flat)))
        assert labels[start:end].tolist() == flat[start - 1:end - 1]
        # The decoder reads the fragment shifted right, [MASK] elsewhere.
        real = decoder != pad
        assert decoder[start] == mask and decoder[start + 1:end].tolist() == flat[start - 1:end - 2]
        outside = torch.ones_like(real)
        outside[start + 1:end] = False
        assert (decoder[outside & real] == mask).all()
        assert source[0] == wp_tokenizer.cls_token_id and source[real].tolist()[-1] == wp_tokenizer.sep_token_id
        assert source[real][1:-1][:start - 1].tolist() == flat[:start - 1], "text outside the fragment is intact"
        masked += int((source[start:end] == mask).sum())
        predicted += end - start
    assert abs(masked / predicted - 0.8) < 0.05


def test_training_reduces_loss_and_the_model_saves(trains_and_round_trips):
    trains_and_round_trips("seq2seq-mlm", BartForConditionalGeneration)
