"""Passes on the word embedding (half of MiniLM's weights): `factorize-embedding`, `trim-vocab`.

Both shrink the V x H word-embedding matrix, one in its inner size (rank), the other in
its rows (vocabulary); the surgery they need lives in export/embedding.py and
modeling/vocabulary.py.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Literal

from pydantic import Field, field_validator

from compressor.bundle import ModelBundle
from compressor.export.embedding import low_rank_factors
from compressor.modeling.vocabulary import (check_trimmable, ids_to_keep, token_counts, trim_embeddings,
                                            trim_tokenizer)
from compressor.passes.registry import Context, Known, PassConfig, Shape, register
from pretrain.errors import UserError
from pretrain.models import fit_tokenizer


class FactorizeEmbedding(PassConfig):
    rank: int = Field(128, ge=1)   # inner size r of V x r times r x H (ALBERT uses 128)


def check_rank_saves(rank: int, vocab: int, hidden: int) -> None:
    if not rank < hidden * vocab / (vocab + hidden):
        raise UserError(f"factorize-embedding: rank {rank} saves nothing for a {vocab} x {hidden} "
                        f"embedding; expected a rank below {int(hidden * vocab / (vocab + hidden))}")


def factorized_shape(cfg: FactorizeEmbedding, known: Known) -> Shape:
    """The rank checked up front where the embedding's size is known (a trimmed one is not)."""
    if known.model.embedding is not None:
        check_rank_saves(cfg.rank, *known.model.embedding)
    return dataclasses.replace(known.model, embedding_rank=cfg.rank)


@register("factorize-embedding", FactorizeEmbedding, check_shape=factorized_shape)
def factorize_embedding(bundle: ModelBundle, cfg: FactorizeEmbedding, ctx: Context) -> ModelBundle:
    """Replace the word embedding by its best rank-r approximation (export/embedding.py).

    The torch model keeps one dense matrix (of rank r), so it stays a plain Transformers
    model; the exporter stores the two factors. Fine-tune afterwards with
    `embedding_updates: frozen` to keep the rank.
    """
    model = bundle.copy_model()
    embedding = model.get_input_embeddings()
    check_rank_saves(cfg.rank, *embedding.weight.shape)
    low, up = low_rank_factors(embedding.weight, cfg.rank)
    embedding.weight.data = (low @ up).contiguous()
    return bundle.replace(model=model, deploy={**bundle.deploy, "embedding_rank": cfg.rank})


class TrimVocab(PassConfig):
    # Splits whose tokens are kept. Never the test split: accuracy is measured there, and a
    # vocabulary chosen from it would hide what unseen text costs.
    splits: tuple[Literal["train", "validation"], ...] = Field(("train",), min_length=1)
    min_count: int = Field(1, ge=1)   # keep a token used at least this often in those splits

    @field_validator("splits")
    @classmethod
    def _distinct(cls, splits: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(splits)) != len(splits):
            raise ValueError("splits must be distinct")
        return splits


def check_trim_tokenizer(cfg: TrimVocab, tokenizer) -> None:
    check_trimmable(tokenizer)


def trimmed_shape(cfg: TrimVocab, known: Known) -> Shape:
    """A subset of the vocabulary the model had (which one, only the task's texts tell)."""
    vocab = known.model.vocab
    return dataclasses.replace(known.model, vocab=vocab and f"trimmed:{vocab.removeprefix('trimmed:')}",
                               embedding=None)


@register("trim-vocab", TrimVocab, check_tokenizer=check_trim_tokenizer, check_shape=trimmed_shape)
def trim_vocab(bundle: ModelBundle, cfg: TrimVocab, ctx: Context) -> ModelBundle:
    """Keep only the tokens the task's texts use (plus special tokens), in the tokenizer and
    the embedding (modeling/vocabulary.py). Texts of those splits tokenize to the same
    tokens as before (renumbered); a word with a dropped piece splits into kept pieces, or
    becomes [UNK] where no kept piece fits."""
    counts = sum((token_counts(bundle.tokenizer, split.texts, split.text_pairs)
                  for split in map(ctx.task.split, cfg.splits)), start=Counter())
    used = [token for token, n in counts.items() if n >= cfg.min_count]
    model = bundle.copy_model()
    keep = ids_to_keep(bundle.tokenizer, model, used)
    trim_embeddings(model, keep)
    return bundle.replace(model=model, tokenizer=fit_tokenizer(trim_tokenizer(bundle.tokenizer, keep), model))
