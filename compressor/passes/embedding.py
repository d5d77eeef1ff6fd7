"""Passes on the word embedding: `factorize-embedding`."""

from __future__ import annotations

from pydantic import Field

from compressor.bundle import ModelBundle
from compressor.export.embedding import low_rank_factors
from compressor.passes.registry import Context, PassConfig, register
from pretrain.errors import UserError


class FactorizeEmbedding(PassConfig):
    rank: int = Field(128, ge=1)   # inner size r of V x r times r x H (ALBERT uses 128)


@register("factorize-embedding", FactorizeEmbedding)
def factorize_embedding(bundle: ModelBundle, cfg: FactorizeEmbedding, ctx: Context) -> ModelBundle:
    """Replace the word embedding by its best rank-r approximation (export/embedding.py).

    The torch model keeps one dense matrix (of rank r), so it stays a plain Transformers
    model; the exporter stores the two factors. Fine-tune afterwards with
    `embedding_updates: frozen` to keep the rank.
    """
    model = bundle.copy_model()
    embedding = model.get_input_embeddings()
    vocab, hidden = embedding.weight.shape
    if not cfg.rank < hidden * vocab / (vocab + hidden):
        raise UserError(f"factorize-embedding: rank {cfg.rank} saves nothing for a {vocab} x {hidden} "
                        f"embedding; expected a rank below {int(hidden * vocab / (vocab + hidden))}")
    low, up = low_rank_factors(embedding.weight, cfg.rank)
    embedding.weight.data = (low @ up).contiguous()
    return bundle.replace(model=model, deploy={**bundle.deploy, "embedding_rank": cfg.rank})
