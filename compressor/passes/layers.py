"""Passes that change which Transformer layers a model has: `drop-layers`."""

from __future__ import annotations

from pydantic import Field, field_validator

from compressor.bundle import ModelBundle
from compressor.passes.registry import Context, PassConfig, register
from pretrain.errors import UserError
from pretrain.models import check_transformer_family, encoder_layers, keep_encoder_layers


class DropLayers(PassConfig):
    keep: tuple[int, ...] = Field(min_length=1)   # indices of the layers to keep, in order

    @field_validator("keep")
    @classmethod
    def _distinct(cls, keep: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(keep)) != len(keep):
            raise ValueError(f"layer indices must be distinct, got {list(keep)}")
        return keep


@register("drop-layers", DropLayers, check_family=lambda cfg, family: check_transformer_family(family, "drop-layers"))
def drop_layers(bundle: ModelBundle, cfg: DropLayers, ctx: Context) -> ModelBundle:
    """Keep only the listed encoder layers (a DistilBERT-style shallow student init)."""
    n_layers = len(encoder_layers(bundle.model))
    out_of_range = [i for i in cfg.keep if not 0 <= i < n_layers]
    if out_of_range:
        raise UserError(f"drop-layers: layer index {out_of_range[0]} out of range; "
                        f"the model has {n_layers} layers (0..{n_layers - 1})")
    model = bundle.copy_model()
    keep_encoder_layers(model, list(cfg.keep))
    return bundle.replace(model=model)
