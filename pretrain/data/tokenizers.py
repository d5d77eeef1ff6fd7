"""Training subword tokenizers on a corpus, saved so Transformers' AutoTokenizer loads them.

Three kinds, all trained with Hugging Face `tokenizers` on the corpus's training documents
(every HELD_OUT_EVERY-th document is held out to measure the unknown-token rate):
- `wordpiece`: BERT's normalisation (lower-casing, accent stripping, CJK spacing) and
  pre-tokenisation (whitespace and punctuation), `##` continuation pieces, [CLS]/[SEP]/...;
- `bpe`: GPT-2/RoBERTa byte-level BPE. Every byte is in the alphabet, so nothing is ever
  unknown; a prefix space is added so every word starts with `Ġ` (whole-word masking can
  then find word starts from the vocabulary alone);
- `wordlevel`: one id per BERT-pre-tokenised word, the pre-subword baseline that shows what
  the subword kinds buy (the same vocabulary size leaves many held-out words unknown).

The output dir is an ordinary HF tokenizer dir (tokenizer.json, tokenizer_config.json,
special_tokens_map.json) plus `tokenizer_metrics.json` with the held-out unknown rates.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from pretrain.data import load_corpus
from pretrain.errors import AcrossFields, UserError

Kind = Literal["wordpiece", "bpe", "wordlevel"]
KINDS: tuple[str, ...] = ("wordpiece", "bpe", "wordlevel")
HELD_OUT_EVERY = 20          # documents 19, 39, 59, ... are held out (5%)
MAX_HELD_OUT_DOCS = 5000     # enough for a rate to 0.1%; keeps the check fast on big corpora
METRICS_FILE = "tokenizer_metrics.json"

# BERT's names for WordPiece and word-level; RoBERTa's for byte-level BPE.
BERT_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                 "sep_token": "[SEP]", "mask_token": "[MASK]"}
ROBERTA_SPECIALS = {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<s>",
                    "sep_token": "</s>", "mask_token": "<mask>", "bos_token": "<s>", "eos_token": "</s>"}
BYTE_ALPHABET = len(pre_tokenizers.ByteLevel.alphabet())   # 256


class TokenizerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: Kind = "wordpiece"
    vocab_size: int = Field(8192, ge=1)
    min_frequency: int = Field(2, ge=1)
    lowercase: bool = True          # WordPiece / word-level only (byte-level BPE keeps case)

    @model_validator(mode="after")
    def _room_for_the_alphabet(self) -> TokenizerConfig:
        least = smallest_vocab(self.kind)
        if self.vocab_size < least:
            what = "special tokens plus the 256 bytes" if self.kind == "bpe" else "special tokens plus one"
            raise AcrossFields(f"{{vocab_size:{self.vocab_size}}} is too small for {{kind:{self.kind}}}; "
                               f"expected at least {least} ({what})")
        return self


def special_tokens(kind: str) -> dict[str, str]:
    return ROBERTA_SPECIALS if kind == "bpe" else BERT_SPECIALS


def distinct_specials(kind: str) -> list[str]:
    return list(dict.fromkeys(special_tokens(kind).values()))


def smallest_vocab(kind: str) -> int:
    """Special tokens, plus the 256 bytes for byte-level BPE (its alphabet is fixed)."""
    return len(distinct_specials(kind)) + (BYTE_ALPHABET if kind == "bpe" else 1)


def is_held_out(index: int) -> bool:
    return index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


def training_lines(corpus: str) -> Iterator[str]:
    """Lines of the training documents, streamed."""
    for i, doc in enumerate(load_corpus(corpus)):
        if not is_held_out(i):
            yield from doc


def held_out_lines(corpus: str, max_docs: int = MAX_HELD_OUT_DOCS) -> list[str]:
    docs = (doc for i, doc in enumerate(load_corpus(corpus)) if is_held_out(i))
    return [line for doc in itertools.islice(docs, max_docs) for line in doc]


def new_tokenizer(cfg: TokenizerConfig) -> tuple[Tokenizer, trainers.Trainer]:
    specials = special_tokens(cfg.kind)
    names = distinct_specials(cfg.kind)
    if cfg.kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=None))  # bytes cover everything: no unknowns
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                      special_tokens=names, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        return tok, trainer
    bert_norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                           strip_accents=None, lowercase=cfg.lowercase)
    if cfg.kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=specials["unk_token"]))
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                            special_tokens=names, show_progress=False)
    else:
        tok = Tokenizer(models.WordLevel(unk_token=specials["unk_token"]))
        trainer = trainers.WordLevelTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                            special_tokens=names, show_progress=False)
    tok.normalizer = bert_norm
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok, trainer


def add_post_processor(tok: Tokenizer, kind: str) -> None:
    """[CLS] A [SEP] (B [SEP]) with token types 0 / 1, as BERT-style models expect."""
    s = special_tokens(kind)
    cls, sep = s["cls_token"], s["sep_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A:0 {sep}:0", pair=f"{cls} $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])


def train_tokenizer(corpus: str, cfg: TokenizerConfig) -> PreTrainedTokenizerFast:
    """Train on the corpus's training documents; a Transformers fast tokenizer."""
    tok, trainer = new_tokenizer(cfg)
    lines = training_lines(corpus)
    first = next(lines, None)
    if first is None:
        raise UserError(f"corpus {corpus!r} has no training text: expected plain UTF-8 text, "
                        "documents separated by blank lines")
    tok.train_from_iterator(itertools.chain([first], lines), trainer=trainer)
    add_post_processor(tok, cfg.kind)
    # Transformers rewrites a ByteLevel pre-tokenizer's add_prefix_space from this kwarg
    # (default False), so it must be passed for byte-level BPE.
    extra = {"add_prefix_space": True} if cfg.kind == "bpe" else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=512,
                                   **special_tokens(cfg.kind), **extra)


def unknown_rates(tokenizer: PreTrainedTokenizerFast, lines: Iterable[str]) -> dict[str, float | int]:
    """Share of tokens that are the unknown token, and of words containing one."""
    lines = list(lines)
    unk = tokenizer.unk_token_id
    backend = tokenizer.backend_tokenizer
    tokens = unknown = words = words_unknown = 0
    for enc in backend.encode_batch(lines, add_special_tokens=False):
        ids = enc.ids
        tokens += len(ids)
        unknown += sum(1 for i in ids if i == unk)
        # word_ids maps each token to its pre-tokenised word: a word is unknown if any piece is.
        seen: dict[int, bool] = {}
        for word, i in zip(enc.word_ids, ids):
            if word is not None:
                seen[word] = seen.get(word, False) or i == unk
        words += len(seen)
        words_unknown += sum(seen.values())
    return {"held_out_lines": len(lines), "tokens": tokens, "unknown_tokens": unknown,
            "unk_token_rate": unknown / tokens if tokens else 0.0,
            "words": words, "unknown_words": words_unknown,
            "unk_word_rate": words_unknown / words if words else 0.0,
            "tokens_per_word": tokens / words if words else 0.0}


def tokenizer_metrics(corpus: str, cfg: TokenizerConfig, tokenizer: PreTrainedTokenizerFast) -> dict:
    held_out = held_out_lines(corpus)
    return {"corpus": corpus, "kind": cfg.kind, "requested_vocab_size": cfg.vocab_size,
            "vocab_size": len(tokenizer), "held_out": f"every {HELD_OUT_EVERY}th document "
            f"(at most {MAX_HELD_OUT_DOCS}), not seen in training",
            **unknown_rates(tokenizer, held_out), "config": cfg.model_dump()}


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    tokenizer.save_pretrained(str(directory))
