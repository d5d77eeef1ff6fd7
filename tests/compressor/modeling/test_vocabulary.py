"""Vocabulary trimming in a tokenizer and a model: which tokenizers (refused up front by
`compressor run`), renumbering, tied heads."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

from compressor import Pipeline
from compressor.bundle import ModelBundle
from compressor.modeling.vocabulary import check_trimmable, ids_to_keep, trim_embeddings, trim_tokenizer
from compressor.passes.embedding import TrimVocab
from pretrain.errors import UserError

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song"]


def trained(model, trainer) -> PreTrainedTokenizerFast:
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(TEXTS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")


def byte_level_bpe() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel()
    backend.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>"]))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>")


@pytest.mark.parametrize("make, kind", [
    (byte_level_bpe, "BPE"),
    (lambda: trained(models.Unigram(), trainers.UnigramTrainer(vocab_size=40, special_tokens=["[UNK]", "[PAD]"],
                                                               unk_token="[UNK]")), "Unigram"),
])
def test_tokenizers_that_cannot_be_trimmed_are_refused_in_one_line(make, kind):
    with pytest.raises(UserError) as err:
        check_trimmable(make())
    message = str(err.value)
    assert f"a {kind} tokenizer" in message and "WordPiece or WordLevel" in message and "\n" not in message


def test_trim_vocab_refuses_a_byte_level_bpe_teacher_before_any_stage(tiny_bert_dir, tiny_csv, tmp_path):
    teacher = tmp_path / "bpe-teacher"
    ModelBundle.load(tiny_bert_dir).model.save_pretrained(str(teacher))
    byte_level_bpe().save_pretrained(str(teacher))
    pipe = Pipeline("bpe", teacher=str(teacher), task={"path": str(tiny_csv)}).variant("small", TrimVocab())
    with pytest.raises(UserError, match=r"variants\.small\[0\]: trim-vocab cannot trim a BPE tokenizer"):
        pipe.run(tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()


def test_a_word_level_tokenizer_keeps_its_words_and_maps_the_rest_to_unk():
    tokenizer = trained(models.WordLevel(unk_token="[UNK]"), trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]"]))
    check_trimmable(tokenizer)
    keep = sorted({tokenizer.convert_tokens_to_ids(w) for w in ["[UNK]", "[PAD]", "the", "cat", "mat"]})
    trimmed = trim_tokenizer(tokenizer, keep)
    assert len(trimmed) == 5 and trimmed.pad_token_id == keep.index(tokenizer.pad_token_id)
    assert trimmed.convert_ids_to_tokens(trimmed("the cat sat on the mat")["input_ids"]) == \
        ["the", "cat", "[UNK]", "[UNK]", "the", "mat"]


def test_embedding_rows_and_a_tied_mlm_decoder_are_trimmed_together():
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32, pad_token_id=3)).eval()
    decoder = model.get_output_embeddings()
    torch.nn.init.normal_(decoder.bias)
    ids = torch.tensor([[3, 7, 20, 41]])
    before = model(input_ids=ids).logits
    old_rows, old_bias = model.get_input_embeddings().weight.detach().clone(), decoder.bias.detach().clone()
    keep = [3, 7, 20, 41, 44]
    trim_embeddings(model, keep)
    assert model.config.vocab_size == 5 and model.config.pad_token_id == 0
    embedding = model.get_input_embeddings()
    assert embedding.padding_idx == 0 and torch.equal(embedding.weight, old_rows[keep])
    assert model.get_output_embeddings().weight is embedding.weight      # still tied
    assert torch.equal(model.get_output_embeddings().bias, old_bias[keep])
    after = model(input_ids=torch.tensor([[0, 1, 2, 3]])).logits
    torch.testing.assert_close(after, before[..., keep])


def test_ids_the_config_names_are_kept(tokenizer, make_tiny_bert):
    model = make_tiny_bert()
    model.config.eos_token_id = 1012       # a config naming an ordinary token: the model needs it
    keep = ids_to_keep(tokenizer, model, used=[2000])
    assert {0, 100, 101, 102, 103, 1012, 2000} == set(keep) and keep == sorted(keep)
