"""Tokenised splits, dynamic padding and the order of batches (training and inference)."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain.batching import Encoded, collate, encode, inference_order, iterate, training_order
from pretrain.data import Split


@pytest.fixture(scope="module")
def encoded_small(tokenizer, small_task) -> Encoded:
    """2000 real supersense training glosses, tokenised with MiniLM's tokenizer."""
    return encode(tokenizer, small_task.split("train"))


def _padding(lengths: np.ndarray, batches: list[np.ndarray]) -> int:
    """Pad tokens spent when each batch is padded to its longest member."""
    return int(sum(len(b) * lengths[b].max() - lengths[b].sum() for b in batches))


def test_encode_keeps_examples_unpadded_with_labels(tokenizer):
    split = Split(["a dog", "the quick brown fox jumps over the lazy dog"], [1, 0])
    enc = encode(tokenizer, split)
    assert len(enc) == 2
    assert [len(ids) for ids in enc.input_ids] == [4, 11]          # [CLS] ... [SEP], no padding
    assert enc.input_ids[0][0] == tokenizer.cls_token_id and enc.input_ids[0][-1] == tokenizer.sep_token_id
    assert enc.lengths().tolist() == [4, 11]
    assert enc.labels.dtype == np.int64 and enc.labels.tolist() == [1, 0]
    assert enc.pad_id == tokenizer.pad_token_id


def test_encode_truncates_to_max_length(tokenizer):
    enc = encode(tokenizer, Split([" ".join(["word"] * 50)], [0]), max_length=16)
    assert len(enc.input_ids[0]) == 16
    assert enc.input_ids[0][-1] == tokenizer.sep_token_id


def test_encode_pairs_marks_second_segment(tokenizer):
    enc = encode(tokenizer, Split(["first part"], [0], text_pairs=["second bit here"]))
    types = enc.token_type_ids[0]
    assert types[0] == 0 and types[-1] == 1
    assert types.count(1) == len(tokenizer("second bit here", add_special_tokens=False)["input_ids"]) + 1


def test_collate_pads_to_longest_in_batch_with_correct_mask(tokenizer):
    split = Split(["a dog", "a much longer sentence about a small dog", "cat"], [0, 1, 2])
    enc = encode(tokenizer, split)
    lengths = enc.lengths()
    batch = collate(enc, np.array([0, 2]))
    # Only examples 0 and 2 are in the batch: width is their longest, not the split's.
    assert batch["input_ids"].shape == (2, max(lengths[0], lengths[2]))
    assert batch["input_ids"].shape[1] < lengths[1]
    for row, i in enumerate([0, 2]):
        n = lengths[i]
        assert batch["input_ids"][row, :n].tolist() == enc.input_ids[i]
        assert (batch["input_ids"][row, n:] == enc.pad_id).all()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
    assert batch["token_type_ids"].shape == batch["input_ids"].shape
    assert batch["labels"].tolist() == [0, 2]

    full = collate(enc, np.arange(3))
    assert full["input_ids"].shape == (3, lengths.max())
    assert full["attention_mask"].sum(dim=1).tolist() == lengths.tolist()


def test_collate_can_leave_out_token_types(tokenizer):
    enc = encode(tokenizer, Split(["a", "b c"], [0, 1]))
    assert "token_type_ids" not in collate(enc, np.arange(2), with_token_types=False)


@pytest.mark.parametrize("group_by_length", [True, False])
def test_training_order_is_a_permutation_per_epoch(encoded_small, group_by_length):
    lengths = encoded_small.lengths()
    rng = np.random.default_rng(0)
    for _ in range(2):   # each call is one fresh epoch
        batches = training_order(lengths, 32, rng, group_by_length)
        flat = np.concatenate(batches)
        assert sorted(flat.tolist()) == list(range(len(lengths)))
        sizes = [len(b) for b in batches]
        assert len(batches) == -(-len(lengths) // 32)
        assert sum(s != 32 for s in sizes) <= 1 and max(sizes) == 32


def test_training_order_is_seeded_and_shuffled(encoded_small):
    lengths = encoded_small.lengths()
    a = training_order(lengths, 32, np.random.default_rng(3))
    b = training_order(lengths, 32, np.random.default_rng(3))
    c = training_order(lengths, 32, np.random.default_rng(4))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # Batch order is shuffled: the epoch does not walk from short to long sequences.
    maxima = [lengths[batch].max() for batch in a]
    assert maxima != sorted(maxima)


def test_length_grouping_reduces_padding_on_real_lengths(encoded_small):
    lengths = encoded_small.lengths()
    grouped = training_order(lengths, 32, np.random.default_rng(0), group_by_length=True)
    plain = training_order(lengths, 32, np.random.default_rng(0), group_by_length=False)
    grouped_pad, plain_pad = _padding(lengths, grouped), _padding(lengths, plain)
    assert plain_pad > 0
    assert grouped_pad < 0.1 * plain_pad, (grouped_pad, plain_pad)


def test_inference_order_covers_every_index_once_sorted_by_length(encoded_small):
    lengths = encoded_small.lengths()
    batches = inference_order(lengths, 64)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert np.all(np.diff(lengths[flat]) >= 0)
    assert [len(b) for b in batches[:-1]] == [64] * (len(batches) - 1)


def test_iterate_yields_indices_with_their_batches(tokenizer):
    texts = ["one", "two words", "now three words", "and now four words"]
    enc = encode(tokenizer, Split(texts, [0, 1, 2, 3]))
    seen = []
    for idx, batch in iterate(enc, inference_order(enc.lengths(), 3)):
        assert batch["labels"].tolist() == idx.tolist()   # label i belongs to example i
        assert batch["input_ids"].shape[1] == enc.lengths()[idx].max()
        seen += idx.tolist()
    assert sorted(seen) == [0, 1, 2, 3]
