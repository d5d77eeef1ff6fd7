"""Structured pruning passes: `prune-heads` and `prune-ffn`.

Both score units on a sample of the train split (compressor/modeling/importance.py: taylor,
magnitude or random) and remove the lowest-scoring ones physically: smaller Q/K/V and output
matrices, narrower FFN layers (compressor/modeling/structure.py). Per-layer head counts and
FFN widths may differ; they survive save, reload and ONNX export. Nothing trains here: follow
with `finetune` in the recipe to recover accuracy.

Layers that share their attention or FFN weights (`share-layers` earlier in the variant) are
one set of weights: their scores are summed (a head's gradient reaches the shared tensors
from every layer of the group) and the group loses the same units in every layer, so the
model keeps its sharing. A unit of a group of k layers counts k towards `fraction` / `count`,
as the layers compute it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from transformers import PreTrainedModel

from compressor.bundle import ModelBundle
from compressor.modeling import importance
from compressor.modeling.cost import unit_costs
from compressor.modeling.importance import Importance
from compressor.modeling.structure import (family_for, ffn_groups, head_groups, remove_current_heads,
                                           set_intermediate_size)
from compressor.passes.registry import Context, Known, PassConfig, Shape, register
from pretrain.errors import UserError
from pretrain.families import FAMILIES, families_supporting
from pretrain.models import encoder_layers


class PruningConfig(PassConfig):
    importance: Importance = "taylor"
    samples: int = Field(512, ge=1)          # first N train examples the taylor scores are summed over
    batch_size: int = Field(32, ge=1)
    # Rank units by importance per multiply-add they cost in the deployed graph rather than by
    # importance alone: the export runs the last layer on the first token only, so its units
    # save little when removed, and the same share of units removed buys more speed elsewhere.
    cost_aware: bool = False


class PruneHeads(PruningConfig):
    # Which heads go: exactly one of fraction / count / per_layer, or `iterative` (alone, or
    # with `fraction` as the most it may remove).
    fraction: float | None = Field(None, ge=0, lt=1)     # of all heads, lowest scores first
    count: int | None = Field(None, ge=0)                # this many heads, lowest scores first
    per_layer: tuple[int, ...] | None = None             # heads to remove in each layer
    iterative: bool = False                              # `step` at a time, re-scored after each step
    step: float = Field(0.1, gt=0, lt=1)                 # iterative: share of the start's heads per step
    min_retention: float = Field(0.98, gt=0, le=1)       # iterative: stop before accuracy < this x start
    validation_samples: int = Field(1000, ge=1)          # iterative: train rows after `samples`, held out
    allow_drop_layers: bool = False                      # a layer may lose all heads (it is removed whole)

    @model_validator(mode="after")
    def one_selection(self) -> "PruneHeads":
        given = [name for name in ("fraction", "count", "per_layer") if getattr(self, name) is not None]
        if self.iterative and given not in ([], ["fraction"]):
            raise ValueError(f"iterative pruning takes at most `fraction` (the most it removes), not {given}")
        if not self.iterative and len(given) != 1:
            raise ValueError(f"expected exactly one of fraction, count, per_layer or iterative; got {given or 'none'}")
        if self.per_layer is not None and any(n < 0 for n in self.per_layer):
            raise ValueError(f"per_layer counts heads to remove; expected non-negative counts, got {list(self.per_layer)}")
        return self


class PruneFFN(PruningConfig):
    fraction: float = Field(ge=0, lt=1)                  # of FFN neurons to remove
    scope: Literal["global", "per_layer"] = "global"     # rank across all layers, or the fraction in each


def refuse_unsupported(capability: str):
    """The registered family check: a one-line refusal naming the reason and the families that work."""
    def check(cfg: PassConfig, family: str) -> None:
        supported = families_supporting(capability)
        if family not in supported:
            reason = FAMILIES[family].refusals[capability] if family in FAMILIES else "not a supported family"
            raise UserError(f"{capability}: model family {family!r} is refused ({reason}); "
                            f"supported families: {', '.join(supported)}")
    return check


# --- prune-heads ---

def check_per_layer_length(cfg: PruneHeads, layers: int | None) -> None:
    if cfg.per_layer is not None and layers is not None and len(cfg.per_layer) != layers:
        raise UserError(f"prune-heads: per_layer has {len(cfg.per_layer)} entries but the model has "
                        f"{layers} layers; expected one count per layer")


def pruned_heads_shape(cfg: PruneHeads, known: Known) -> Shape:
    """Where the heads of each layer are known: the removal must fit them (the checks the pass
    makes); which heads go is known only once they are scored, unless `per_layer` says."""
    shape = known.model
    check_per_layer_length(cfg, shape.layers)
    removed = heads_to_remove(cfg, list(shape.heads)) if shape.heads is not None else None
    if cfg.per_layer is not None and shape.shared_attention and shape.layers is not None:
        per_group_counts(list(cfg.per_layer), [list(g) for g in shape.shared_attention])
    # iterative: the held-out rows come after the scored ones, scored or not
    needed = cfg.samples + cfg.validation_samples if cfg.iterative else cfg.samples if needs_sample(cfg) else 0
    importance.check_train_rows(known.train_rows, needed, "prune-heads")
    if cfg.allow_drop_layers:       # an emptied layer goes whole: the rest are numbered anew
        return dataclasses.replace(shape, heads=None, layers=None, shared_attention=None, ffn=None, shared_ffn=None)
    if removed is not None and cfg.per_layer is not None:
        return dataclasses.replace(shape, heads=tuple(h - n for h, n in zip(shape.heads, removed)))
    return dataclasses.replace(shape, heads=None, heads_vary=(
        "prune-heads before it chooses each layer's count by score; expected share-layers before prune-heads "
        "(which then prunes a group's layers alike), or prune-heads with per_layer giving the layers of a group "
        "one count"))


@register("prune-heads", PruneHeads, check_family=refuse_unsupported("prune-heads"), check_shape=pruned_heads_shape,
          renames_layers=lambda cfg: cfg.allow_drop_layers)      # a layer left with no head goes whole
def prune_heads_pass(bundle: ModelBundle, cfg: PruneHeads, ctx: Context) -> ModelBundle:
    """Remove the least important attention heads (Michel et al. 2019)."""
    model = bundle.copy_model()
    family = family_for(model, "prune-heads")
    counts = importance.heads_per_layer(model, family, encoder_layers(model))
    target = heads_to_remove(cfg, counts)          # every check on the config runs before scoring
    if isinstance(target, list):
        per_group_counts(target, head_groups(model, family))
    data = sample(bundle, model, ctx, 0, cfg.samples, "prune-heads") if needs_sample(cfg) else None
    if cfg.iterative:
        model = prune_iteratively(bundle, model, cfg, ctx, target, data)
    else:
        remove_current_heads(model, choose_heads(model, cfg, ctx, data, target))
    return bundle.replace(model=model)


def heads_to_remove(cfg: PruneHeads, counts: list[int]) -> int | list[int]:
    """The total to remove (or, with per_layer, the list), after checking it fits the model."""
    total, layers = sum(counts), len(counts)
    floor = 0 if cfg.allow_drop_layers else 1        # heads every layer keeps
    hint = "" if cfg.allow_drop_layers else " (set allow_drop_layers: true to remove an emptied layer whole)"
    if cfg.per_layer is not None:
        check_per_layer_length(cfg, layers)
        for layer, (n, have) in enumerate(zip(cfg.per_layer, counts)):
            if n > have - floor:
                raise UserError(f"prune-heads: per_layer asks layer {layer} to lose {n} heads but it has {have}; "
                                f"expected at most {have - floor}{hint}")
        if sum(cfg.per_layer) == total:
            raise UserError("prune-heads: per_layer removes every head of every layer; expected one to stay")
        return list(cfg.per_layer)
    limit = total - max(floor * layers, 1)
    if cfg.count is not None and cfg.count > total:
        raise UserError(f"prune-heads: count {cfg.count} is more heads than the model has ({total}); "
                        f"expected at most {limit}{hint}")
    if cfg.iterative and cfg.fraction is None:
        return limit                                 # as far as accuracy allows
    wanted = cfg.count if cfg.count is not None else round(cfg.fraction * total)
    if wanted > limit:
        raise UserError(f"prune-heads: removing {wanted} of {total} heads would empty a layer; expected at "
                        f"most {limit}{hint}")
    return wanted


def choose_heads(model: PreTrainedModel, cfg: PruneHeads, ctx: Context, data, target: int | list[int]
                 ) -> dict[int, list[int]]:
    """{layer: [current head indices]} of the lowest-scoring heads."""
    family = family_for(model, "prune-heads")
    scores = importance.head_importance(model, family, encoder_layers(model), cfg.importance, data, ctx.seed,
                                        cfg.batch_size)
    groups = head_groups(model, family)
    costs = unit_costs_of(model, "head", data) if cfg.cost_aware and not isinstance(target, list) else None
    scores = group_scores(scores, groups, costs)
    if isinstance(target, list):
        counts = per_group_counts(target, groups)
        chosen = {g: sorted(row.argsort()[:n].tolist()) for g, (row, n) in enumerate(zip(scores, counts)) if n}
    else:
        chosen = importance.lowest(scores, target, 0 if cfg.allow_drop_layers else 1, list(map(len, groups)))
    return for_each_layer(chosen, groups)


def per_group_counts(per_layer: list[int], groups: list[list[int]]) -> list[int]:
    """`per_layer`'s count for each group, whose layers must be given the same one."""
    for group in groups:
        if len({per_layer[i] for i in group}) > 1:
            raise UserError(f"prune-heads: per_layer asks layers {group} to lose {[per_layer[i] for i in group]} "
                            f"heads, but they share their attention weights (share-layers); expected one count "
                            f"for all of them")
    return [per_layer[group[0]] for group in groups]


def prune_iteratively(bundle: ModelBundle, model: PreTrainedModel, cfg: PruneHeads, ctx: Context, target: int,
                      data) -> PreTrainedModel:
    """`step` of the start's heads at a time, re-scored after each, while accuracy on held-out
    train rows stays at or above min_retention x the start's (the step that falls under is undone)."""
    family = family_for(model, "prune-heads")
    held_out = sample(bundle, model, ctx, cfg.samples, cfg.samples + cfg.validation_samples, "prune-heads")
    floor = cfg.min_retention * importance.accuracy(model, held_out, cfg.batch_size)
    # a step removes at least one head of the largest group of shared layers (k heads at once)
    per_step = max(max(map(len, head_groups(model, family))),
                   math.ceil(cfg.step * sum(importance.heads_per_layer(model, family, encoder_layers(model)))))
    removed = 0
    while removed < target:
        candidate = copy.deepcopy(model)
        chosen = choose_heads(candidate, cfg, ctx, data, min(per_step, target - removed))
        if not chosen:        # what is left to remove is less than any group's heads
            break
        remove_current_heads(candidate, chosen)
        if importance.accuracy(candidate, held_out, cfg.batch_size) < floor:
            break
        model, removed = candidate, removed + sum(map(len, chosen.values()))
    return model


def needs_sample(cfg: PruningConfig) -> bool:
    """Taylor scores need train examples; so does the cost of a unit (their mean length)."""
    return cfg.importance == "taylor" or cfg.cost_aware


def unit_costs_of(model: PreTrainedModel, unit: str, data) -> list[float]:
    """What one unit of each layer costs (mean cost 1), at the sample's mean length."""
    costs = torch.tensor(unit_costs(model, unit, float(data.lengths().mean())))
    return (costs / costs.mean()).tolist()


def group_scores(scores: list[torch.Tensor], groups: list[list[int]], costs: list[float] | None = None
                 ) -> list[torch.Tensor]:
    """One row per group of layers sharing the pruned weights (a layer alone is a group of one):
    the sum of its layers' scores, since their units are one set of weights. With `costs`, divided
    by what the unit costs in all of them: global ranking then removes the units that buy least
    per multiply-add."""
    rows = [sum(scores[i] for i in group) for group in groups]
    if costs is None:
        return rows
    return [row / sum(costs[i] for i in group) for row, group in zip(rows, groups)]


def for_each_layer(chosen: dict[int, list[int]], groups: list[list[int]]) -> dict[int, list[int]]:
    """{group: units} as {layer: units}, every layer of a group losing the same units."""
    return {layer: units for g, units in chosen.items() for layer in groups[g]}


def sample(bundle: ModelBundle, model: PreTrainedModel, ctx: Context, start: int, stop: int, name: str):
    """Train rows [start, stop), encoded for `model`."""
    rows = importance.train_rows(ctx.task, start, stop, name)
    return importance.encode_for_model(model, bundle.tokenizer, ctx.task, rows, bundle.max_length)


# --- prune-ffn ---

def pruned_ffn_shape(cfg: PruneFFN, known: Known) -> Shape:
    """The sample the scores read must exist. `per_layer` takes the same share of every layer,
    so the widths it leaves are known; a global ranking leaves widths only scoring tells."""
    importance.check_train_rows(known.train_rows, cfg.samples if needs_sample(cfg) else 0, "prune-ffn")
    shape = known.model
    if cfg.scope == "global":
        return dataclasses.replace(shape, ffn=None, ffn_vary=(
            "prune-ffn before it with scope: global chooses each layer's width by score; expected share-layers "
            "before prune-ffn (which then prunes a group's layers alike), or prune-ffn with scope: per_layer"))
    ffn = tuple(width - min(round(cfg.fraction * width), width - 1) for width in shape.ffn) if shape.ffn else None
    return dataclasses.replace(shape, ffn=ffn)


@register("prune-ffn", PruneFFN, check_family=refuse_unsupported("prune-ffn"), check_shape=pruned_ffn_shape)
def prune_ffn_pass(bundle: ModelBundle, cfg: PruneFFN, ctx: Context) -> ModelBundle:
    """Remove the least important FFN neurons, narrowing each layer's intermediate size."""
    model = bundle.copy_model()
    family = family_for(model, "prune-ffn")
    layers = encoder_layers(model)
    data = sample(bundle, model, ctx, 0, cfg.samples, "prune-ffn") if needs_sample(cfg) else None
    scores = importance.neuron_importance(family, layers, cfg.importance, model, data, ctx.seed, cfg.batch_size)
    groups = ffn_groups(model, family)
    sizes = list(map(len, groups))
    costs = unit_costs_of(model, "neuron", data) if cfg.cost_aware and cfg.scope == "global" else None
    scores = group_scores(scores, groups, costs)
    if cfg.scope == "per_layer":
        drop = {g: row.argsort()[:min(round(cfg.fraction * len(row)), len(row) - 1)].tolist()
                for g, row in enumerate(scores)}
    else:
        count = round(cfg.fraction * sum(len(row) * k for row, k in zip(scores, sizes)))   # as the layers compute
        drop = importance.lowest(scores, count, 1, sizes)
    for g, row in enumerate(scores):
        gone = set(drop.get(g, ()))
        if gone:   # slices every layer of the group (one FFN)
            set_intermediate_size(model, groups[g][0], [i for i in range(len(row)) if i not in gone])
    return bundle.replace(model=model)
