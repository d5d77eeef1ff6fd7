"""Tokenizer training on real WordNet text: HF-loadable output, special tokens, unknown rates."""

from __future__ import annotations


import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from pretrain.data.tokenizers import (TokenizerConfig, save_tokenizer, smallest_vocab, tokenizer_metrics,
                                      train_tokenizer)
from pretrain.errors import UserError


@pytest.fixture(scope="module")
def corpus(wordnet_corpus_file) -> str:
    """The first 4000 WordNet documents as a user's plain-text corpus."""
    return wordnet_corpus_file(4000)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """kind -> (loaded tokenizer, metrics), each trained to 2000 tokens and saved."""
    out = {}
    for kind in ("wordpiece", "bpe", "wordlevel"):
        cfg = TokenizerConfig(kind=kind, vocab_size=2000)
        tok = train_tokenizer(corpus, cfg)
        folder = tmp_path_factory.mktemp(kind)
        save_tokenizer(tok, folder)
        out[kind] = (AutoTokenizer.from_pretrained(str(folder)), tokenizer_metrics(corpus, cfg, tok))
    return out


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_saved_tokenizer_loads_with_auto_tokenizer_and_adds_bert_specials(trained, kind):
    tok, metrics = trained[kind]
    assert len(tok) == metrics["vocab_size"] <= 2000
    enc = tok("The cat sat.", "It purred.")
    ids, types = enc["input_ids"], enc["token_type_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    first_sep = ids.index(tok.sep_token_id)
    assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    assert tok.mask_token_id is not None and tok.pad_token_id is not None
    assert tok.decode(tok("the cat sat", add_special_tokens=False)["input_ids"]).strip() == "the cat sat"


def test_bpe_pieces_mark_word_starts(trained):
    tok, _ = trained["bpe"]
    pieces = tok.tokenize("Zanzibar photosynthesis")
    assert pieces[0].startswith("Ġ") and sum(p.startswith("Ġ") for p in pieces) == 2


def test_unknown_rates_order_bpe_wordpiece_wordlevel(trained):
    rates = {kind: metrics["unk_token_rate"] for kind, (_, metrics) in trained.items()}
    assert rates["bpe"] == 0.0                               # bytes cover every character
    assert rates["wordlevel"] > 0.05                         # 2000 words miss much held-out text
    assert rates["wordpiece"] < rates["wordlevel"] / 10
    assert trained["wordpiece"][1]["held_out_lines"] > 100


def test_bad_vocabulary_size_and_empty_corpus(tmp_path, corpus):
    # A check across kind and vocab_size, made by the config: `compressor tokenizer` names the
    # flags (--vocab-size 5 ... --kind wordpiece), Python the fields.
    with pytest.raises(ValidationError, match="vocab_size: 5 is too small for kind: wordpiece; expected at least 6"):
        TokenizerConfig(kind="wordpiece", vocab_size=5)
    with pytest.raises(ValidationError, match="256 bytes"):
        TokenizerConfig(kind="bpe", vocab_size=smallest_vocab("bpe") - 1)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(UserError, match="no training text"):
        train_tokenizer(str(empty), TokenizerConfig(kind="wordpiece", vocab_size=100))
