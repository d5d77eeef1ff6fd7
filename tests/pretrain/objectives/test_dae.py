"""BART noise functions (one property test each), their composition, and the dae objective."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from transformers import BartForConditionalGeneration

from pretrain.errors import UserError
from pretrain.objectives import get_objective
from pretrain.objectives.dae import DaeObjective, NoiseConfig, compose_options, noise_document
from pretrain.objectives.noising import (delete_tokens, infill, mask_tokens, permute_sentences, poisson_lengths,
                                         rotate, token_units, word_units)

MASK = 4
STARTS = np.arange(50) < 30            # ids >= 30 continue a word
texts = st.lists(st.integers(5, 49), min_size=0, max_size=80)
seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=60, deadline=None)
@given(sentences=st.lists(st.lists(st.integers(5, 49), min_size=1, max_size=8), max_size=12),
       fraction=st.sampled_from([0.0, 0.3, 0.5, 1.0]), seed=seeds)
def test_permutation_moves_whole_sentences(sentences, fraction, seed):
    out = permute_sentences(sentences, np.random.default_rng(seed), fraction)
    assert sorted(map(tuple, out)) == sorted(map(tuple, sentences))
    moved = sum(a != b for a, b in zip(out, sentences))
    assert moved <= math.ceil(len(sentences) * fraction)


def test_full_permutation_is_uniform():
    rng = np.random.default_rng(0)
    firsts = np.bincount([permute_sentences([[1], [2], [3], [4]], rng)[0][0] for _ in range(4000)], minlength=5)[1:]
    assert np.all(np.abs(firsts - 1000) < 150), firsts


@settings(max_examples=60, deadline=None)
@given(ids=texts, rate=st.sampled_from([0.0, 0.15, 0.5, 1.0]), seed=seeds)
def test_token_masking_only_replaces(ids, rate, seed):
    out = mask_tokens(ids, np.random.default_rng(seed), rate, MASK)
    assert len(out) == len(ids)
    assert all(o == t or o == MASK for o, t in zip(out, ids))
    if rate == 1.0:
        assert all(o == MASK for o in out)


@settings(max_examples=60, deadline=None)
@given(ids=texts, rate=st.sampled_from([0.0, 0.15, 0.5, 0.9]), seed=seeds)
def test_deletion_keeps_survivors_in_order(ids, rate, seed):
    out = delete_tokens(ids, np.random.default_rng(seed), rate)
    it = iter(ids)
    assert all(any(t == s for t in it) for s in out), "output is not a subsequence of the input"
    if rate == 0.0:
        assert out == ids


def test_masking_and_deletion_rates():
    rng = np.random.default_rng(0)
    ids = list(range(5, 45)) * 250                     # 10,000 tokens
    masked = sum(t == MASK for t in mask_tokens(ids, rng, 0.3, MASK)) / len(ids)
    kept = len(delete_tokens(ids, rng, 0.2)) / len(ids)
    assert abs(masked - 0.3) < 0.02 and abs(kept - 0.8) < 0.02


@settings(max_examples=80, deadline=None)
@given(ids=texts, rate=st.sampled_from([0.1, 0.3, 0.6, 1.0]), lam=st.sampled_from([0.5, 3.0, 3.5]),
       whole=st.booleans(), seed=seeds)
def test_infilling_replaces_each_span_by_one_mask(ids, rate, lam, whole, seed):
    units = word_units(ids, STARTS) if whole and ids else token_units(len(ids))
    out, spans = infill(ids, units, np.random.default_rng(seed), rate, lam, MASK)
    unit_starts, unit_ends = {s for s, _ in units}, {e for _, e in units}
    assert all(s in unit_starts and e in unit_ends for s, e in spans), "a span cuts a word"
    covered_units = sum(1 for s, e in units if any(a <= s < b for a, b in spans))
    assert covered_units == math.ceil(len(units) * rate)
    masked = {i for s, e in spans for i in range(s, e)}
    assert len(masked) == sum(e - s for s, e in spans), "spans overlap"
    # Without its masks the output is the input without the masked spans, in order.
    assert [t for t in out if t != MASK] == [t for i, t in enumerate(ids) if i not in masked]
    assert sum(t == MASK for t in out) >= len(spans)   # the rest are zero-length insertions


def test_poisson_span_lengths():
    rng = np.random.default_rng(0)
    for total in (1, 7, 30):
        lengths = poisson_lengths(rng, total, 3.0)
        assert lengths.sum() == total and (lengths >= 0).all()
    lengths = poisson_lengths(rng, 30000, 3.0)[:-1]    # ~10,000 spans; the last is cut to fit
    assert abs(lengths.mean() - 3.0) < 0.06
    assert abs((lengths == 0).mean() - math.exp(-3.0)) < 0.01   # zero-length spans: insertions


def test_infilling_inserts_masks_for_zero_length_spans():
    rng = np.random.default_rng(0)
    ids = list(range(5, 45))
    extra = 0
    for _ in range(500):
        out, spans = infill(ids, token_units(len(ids)), rng, 0.3, 1.0, MASK)
        extra += sum(t == MASK for t in out) - len(spans)
    assert extra > 0


@settings(max_examples=60, deadline=None)
@given(ids=texts, seed=seeds)
def test_rotation_is_a_rotation(ids, seed):
    out, offset = rotate(ids, np.random.default_rng(seed))
    assert out == ids[offset:] + ids[:offset]
    assert len(ids) == 0 or 0 <= offset < len(ids)


def test_rotation_offset_is_uniform():
    rng = np.random.default_rng(0)
    counts = np.bincount([rotate(list(range(8)), rng)[1] for _ in range(4000)], minlength=8)
    assert np.all(np.abs(counts - 500) < 100), counts


def test_options_string():
    assert NoiseConfig.parse("infill=0.3,permute") == NoiseConfig(infill=0.3, permute=1.0)
    cfg = NoiseConfig.parse(" mask = 0.2 , delete, rotate=0.5, poisson=3.5, whole_words=0")
    assert (cfg.mask, cfg.delete, cfg.rotate, cfg.poisson, cfg.whole_words) == (0.2, 0.15, 0.5, 3.5, False)
    assert cfg.infill == 0 and cfg.permute == 0
    for bad, said in [("shuffle", "unknown dae noise option 'shuffle'"), ("mask=2", "mask"),
                      ("poisson", "needs a value"), ("poisson=3", "switch no noise function on"),
                      ("mask=lots", "mask")]:
        with pytest.raises(UserError, match=said):
            NoiseConfig.parse(bad)


@pytest.mark.parametrize("options, message", [
    # Not pydantic's "Input should be less than or equal to 1" / "a valid boolean": what the
    # option takes, and the item as typed (an alias too: masking is mask).
    ("mask=2", "dae noise option mask: expected a number in [0, 1] (got 'mask=2')"),
    ("infilling,masking=lots", "dae noise option mask: expected a number in [0, 1] (got 'masking=lots')"),
    ("delete=1", "dae noise option delete: expected a number in [0, 1) (got 'delete=1')"),
    ("permute,poisson=-1", "dae noise option poisson: expected a positive number (got 'poisson=-1')"),
    ("rotate=nan", "dae noise option rotate: expected a number in [0, 1] (got 'rotate=nan')"),
    ("infill,whole_words=maybe", "dae noise option whole_words: expected 0 or 1 (got 'whole_words=maybe')"),
])
def test_a_bad_value_says_what_its_option_takes(options, message):
    for parse in (NoiseConfig.parse, lambda text: compose_options(text, None)):     # --dae-noise's path too
        with pytest.raises(UserError) as err:
            parse(options)
        assert str(err.value) == message


def test_command_line_flags_compose_into_options():
    parse = NoiseConfig.parse
    assert parse(compose_options("infilling,permutation", 0.4)) == NoiseConfig(infill=0.4, permute=1.0)
    assert parse(compose_options(None, 0.4)) == NoiseConfig(infill=0.4, permute=1.0)        # BART's, at 0.4
    assert parse(compose_options("masking,deletion=0.1", 0.2)) == NoiseConfig(mask=0.2, delete=0.1)
    assert parse(compose_options("rotation", None, ("delete=0.1",))) == NoiseConfig(rotate=1.0, delete=0.1)
    assert parse(compose_options(None, None, ("poisson=3.5",))) == NoiseConfig(infill=0.3, permute=1.0, poisson=3.5)
    assert compose_options(None, None) == ""
    for noise, ratio, said in [("permute", 0.3, "neither"), ("infill=0.3", 0.4, "given twice"),
                               ("mask,masking", None, "given twice"), ("shuffle", None, "infill .text infilling.")]:
        with pytest.raises(UserError, match=said):
            compose_options(noise, ratio)


@settings(max_examples=40, deadline=None)
@given(rates=st.lists(st.sampled_from([0.0, 0.1, 0.35, 1.0]), min_size=5, max_size=5),
       poisson=st.sampled_from([1.0, 3.0, 3.5]), whole=st.booleans())
def test_canonical_options_round_trip(rates, poisson, whole):
    rates[2] = min(rates[2], 0.9)                      # delete < 1
    if not any(rates):
        rates[0] = 1.0
    cfg = NoiseConfig(**dict(zip(["permute", "mask", "delete", "infill", "rotate"], rates)),
                      poisson=poisson, whole_words=whole)
    assert NoiseConfig.parse(cfg.options()) == cfg


def test_composed_noise_on_real_documents(wp_tokenizer, documents, max_length):
    objective = DaeObjective.from_options("permute,mask=0.1,delete=0.1,infill=0.3,rotate")
    batch = objective.make_batch(documents[:32], wp_tokenizer, np.random.default_rng(0), max_length)
    cls, sep, mask = wp_tokenizer.cls_token_id, wp_tokenizer.sep_token_id, wp_tokenizer.mask_token_id
    for doc, source, target in zip(documents, batch["input_ids"], batch["labels"]):
        source, target = source[source != wp_tokenizer.pad_token_id].tolist(), target[target != -100].tolist()
        assert source[0] == cls and source[-1] == sep and target[0] == cls and target[-1] == sep
        assert cls not in source[1:-1] and sep not in source[1:-1]
        flat = [t for s in doc for t in s]
        assert target[1:-1] == flat[:len(target) - 2], "the target is the original text"
        assert set(source[1:-1]) - {mask} <= set(target[1:-1])
        assert len(source) <= max_length


def test_plain_dae_is_barts_recipe(wp_tokenizer, documents):
    sentences = [[10, 11, 12], [20, 21], [30, 31, 32, 33]]
    rng = np.random.default_rng(0)
    out = noise_document(sentences, get_objective("dae").noise, rng, MASK, None)
    assert MASK in out


def test_training_reduces_loss_and_the_model_saves(trains_and_round_trips):
    trains_and_round_trips("dae", BartForConditionalGeneration)
