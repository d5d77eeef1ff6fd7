"""Passes that change which Transformer layers a model has: `drop-layers`."""

from __future__ import annotations

import copy
import dataclasses

from pydantic import Field, field_validator, model_validator
from transformers import PreTrainedModel

from compressor.bundle import ModelBundle
from compressor.modeling.importance import check_train_rows, encode_for_model, mean_loss, train_rows
from compressor.passes.registry import Context, PassConfig, Shape, kept_groups, register
from pretrain.batching import Encoded
from pretrain.errors import UserError
from pretrain.models import check_transformer_family, encoder_layers, keep_encoder_layers


class DropLayers(PassConfig):
    # Exactly one of: the layers to keep, in order; or how many to keep, chosen by importance.
    keep: tuple[int, ...] | None = Field(None, min_length=1)
    count: int | None = Field(None, ge=1)
    samples: int = Field(512, ge=1)      # count: first N train examples the loss is measured on
    batch_size: int = Field(64, ge=1)

    @field_validator("keep")
    @classmethod
    def _distinct(cls, keep: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if keep is not None and len(set(keep)) != len(keep):
            raise ValueError(f"layer indices must be distinct, got {list(keep)}")
        return keep

    @model_validator(mode="after")
    def _keep_or_count(self) -> "DropLayers":
        if (self.keep is None) == (self.count is None):
            raise ValueError("expected exactly one of keep (the layers to keep) or count (how many, "
                             "chosen by importance)")
        return self


def kept_depth(cfg: DropLayers, n_layers: int | None) -> int:
    """The layers left, after checking that the indices or the count fit `n_layers` (when known)."""
    if n_layers is not None and cfg.count is not None and cfg.count > n_layers:
        raise UserError(f"drop-layers: count {cfg.count} is more layers than the model has ({n_layers})")
    out_of_range = [i for i in cfg.keep or () if n_layers is not None and not 0 <= i < n_layers]
    if out_of_range:
        raise UserError(f"drop-layers: layer index {out_of_range[0]} out of range; "
                        f"the model has {n_layers} layers (0..{n_layers - 1})")
    return len(cfg.keep) if cfg.keep is not None else cfg.count


def dropped_shape(cfg: DropLayers, shape: Shape, train_examples: int | None) -> Shape:
    """The kept depth (and heads, where `keep` names the layers); `count` measures on a sample."""
    layers = kept_depth(cfg, shape.layers)
    if cfg.count is not None:
        check_train_rows(train_examples, cfg.samples, "drop-layers")
    if cfg.keep is not None:
        heads = tuple(shape.heads[i] for i in cfg.keep) if shape.heads else None
        ffn = tuple(shape.ffn[i] for i in cfg.keep) if shape.ffn else None
        return dataclasses.replace(shape, layers=layers, heads=heads, ffn=ffn,
                                   shared_attention=kept_groups(shape.shared_attention, cfg.keep),
                                   shared_ffn=kept_groups(shape.shared_ffn, cfg.keep))
    # A measurement chooses the layers: layers of one count or width keep it; of several, the
    # kept ones may differ, which a later share-layers must refuse before the measurement runs.
    return dataclasses.replace(shape, layers=layers, heads=uniform(shape.heads, layers), ffn=uniform(shape.ffn, layers),
                               heads_vary=shape.heads_vary or varied(shape.heads, "head counts"),
                               ffn_vary=shape.ffn_vary or varied(shape.ffn, "FFN widths"),
                               shared_attention=kept_groups(shape.shared_attention, None),
                               shared_ffn=kept_groups(shape.shared_ffn, None))


def uniform(sizes: tuple[int, ...] | None, layers: int) -> tuple[int, ...] | None:
    """Each kept layer's size where every layer had one size; unknown otherwise."""
    return (sizes[0],) * layers if sizes and len(set(sizes)) == 1 else None


def varied(sizes: tuple[int, ...] | None, what: str) -> str | None:
    """Why a later share-layers may meet layers of different sizes, where the layers differ now."""
    if not sizes or len(set(sizes)) == 1:
        return None
    return (f"drop-layers before it keeps the layers a measurement chooses (count), among layers of different "
            f"{what} ({', '.join(map(str, sizes))}); expected drop-layers with keep: naming the layers, so that "
            f"their {what} are known")


@register("drop-layers", DropLayers, check_family=lambda cfg, family: check_transformer_family(family, "drop-layers"),
          check_shape=lambda cfg, known: dropped_shape(cfg, known.model, known.train_rows), renames_layers=True)
def drop_layers(bundle: ModelBundle, cfg: DropLayers, ctx: Context) -> ModelBundle:
    """Keep only the listed encoder layers (a DistilBERT-style shallow student init), or the
    `count` layers whose removal would cost the most."""
    kept_depth(cfg, len(encoder_layers(bundle.model)))
    model = bundle.copy_model()
    if cfg.keep is not None:
        keep_encoder_layers(model, list(cfg.keep))
        return bundle.replace(model=model)
    data = encode_for_model(model, bundle.tokenizer, ctx.task, train_rows(ctx.task, 0, cfg.samples, "drop-layers"),
                            bundle.max_length)
    keep, rounds = layers_to_keep(model, data, cfg.count, cfg.batch_size)
    keep_encoder_layers(model, keep)
    # Which layers the measurement chose is not in the config: record it (compressor.json, deploy).
    return bundle.replace(model=model, deploy={**bundle.deploy, "drop_layers": {"kept": keep, "rounds": rounds}})


def layers_to_keep(model: PreTrainedModel, data: Encoded, count: int,
                   batch_size: int) -> tuple[list[int], list[dict]]:
    """Greedy: drop, one at a time, the layer whose removal raises the loss on `data` least
    (re-measured after each removal, since layers compensate for each other). Returns the
    kept layers and, per round, the loss without each candidate and the layer dropped."""
    keep = list(range(len(encoder_layers(model))))
    rounds = []
    while len(keep) > count:
        losses = {}
        for layer in keep:
            trial = copy.deepcopy(model)
            keep_encoder_layers(trial, [i for i in keep if i != layer])
            losses[layer] = mean_loss(trial, data, batch_size)
        dropped = min(losses, key=losses.get)
        keep.remove(dropped)
        rounds.append({"loss_without": {str(layer): round(loss, 4) for layer, loss in losses.items()},
                       "dropped": dropped})
    return keep, rounds
