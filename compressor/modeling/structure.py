"""Structural model surgery (head pruning, FFN slicing, layer sharing), and the record that
makes it survive a save. No pass calls it yet; the tests exercise it on the tiny models.

- `prune_heads(model, {layer: [head, ...]})`: Transformers' own head pruning (recorded by
  Transformers in `config.pruned_heads`, rebuilt by `from_pretrained`).
- `remove_current_heads(model, {layer: [head, ...]})`: the same with heads numbered as the
  layer has them now; a layer that loses every head is removed whole.
- `set_intermediate_size(model, layer, keep)`: slice one layer's FFN to the listed neurons.
- `tie_layers(model, groups)`: layers of a group share the first one's parameters.

Layers that share their attention or FFN weights (`tie_layers`) compute with one set of
weights, so pruning treats them as one: heads given for one layer of such a group go from
all of them (different heads for two of them are refused), an FFN sliced in one layer is
sliced in all, and the sharing is restored afterwards. Pruning layer by layer would give
each layer new tensors for what it prunes while the rest of the sublayer (its LayerNorm,
the outer bias) stayed tied: a half-shared model whose record no longer describes it.

The last two change what the config implies, so they keep a record in the config
(`compressor_structure`, format in pretrain/structured.py) and `update_record` points
`config.auto_map` at the modeling file `save_structure_code` copies beside the weights. The
record always describes the model as it is: it is derived from the model, not maintained
by hand.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

import torch
from transformers import PreTrainedModel

from pretrain import structured
from pretrain.errors import UserError
from pretrain.families import FAMILIES, Family
from pretrain.models import encoder_layers, keep_encoder_layers

AUTO_CLASS = "AutoModelForSequenceClassification"


def family_for(model: PreTrainedModel, capability: str) -> Family:
    family = FAMILIES.get(model.config.model_type)
    if family is None:
        raise UserError(f"{capability}: model family {model.config.model_type!r} has no Transformer layers")
    family.check(capability, f"{capability} is not available for model family {family.name!r}")
    if family.layers is None:
        raise UserError(f"{capability}: model family {family.name!r} has no Transformer layers")
    return family


def prune_heads(model: PreTrainedModel, heads: dict[int, list[int]]) -> None:
    """Remove attention heads in place: {layer index: [head indices]}, numbered as in the
    unpruned model (heads already gone are skipped, as Transformers does)."""
    remaining = remaining_heads(model, family_for(model, "prune-heads"))
    heads = {int(layer): hs for layer, hs in heads.items()}
    remove_current_heads(model, {layer: [remaining[layer].index(h) for h in hs if h in remaining[layer]]
                                 for layer, hs in heads.items()})


def remaining_heads(model: PreTrainedModel, family: Family) -> list[list[int]]:
    """Each layer's heads as the unpruned model numbered them, in their current order."""
    total = getattr(model.config, family.heads_field)
    already = {int(k): set(v) for k, v in (getattr(model.config, "pruned_heads", None) or {}).items()}
    return [[h for h in range(total) if h not in already.get(layer, set())]
            for layer in range(len(encoder_layers(model)))]


def remove_current_heads(model: PreTrainedModel, heads: dict[int, list[int]]) -> None:
    """Remove heads in place, numbered by their current position in each layer.

    Transformers' `prune_heads` numbers heads as the unpruned model did (and breaks on a layer
    with no heads left), so current positions are mapped to original numbers through
    `config.pruned_heads`, and a layer losing all its heads is dropped whole (its FFN with it):
    what remains is an ordinary model that saves, reloads and exports like any other. Layers
    sharing their attention lose the same heads and keep sharing it (see the module doc).
    """
    family = family_for(model, "prune-heads")
    heads = same_in_groups(heads, head_groups(model, family), "heads to remove")
    remaining = remaining_heads(model, family)
    original, emptied = {}, []
    for layer, current in heads.items():
        if not all(0 <= h < len(remaining[layer]) for h in current):
            raise UserError(f"layer {layer}: heads to remove must be in [0, {len(remaining[layer])}); "
                            f"got {list(current)}")
        if len(set(current)) == len(remaining[layer]):
            emptied.append(layer)
        elif current:
            original[layer] = [remaining[layer][h] for h in current]
    if len(emptied) == len(encoder_layers(model)):
        raise UserError("removing these heads would leave no layer at all; expected at least one head to stay")
    shared = record_for(model)
    model.prune_heads(original)
    restore_sharing(model, shared)
    if emptied:
        keep_encoder_layers(model, [i for i in range(len(encoder_layers(model))) if i not in emptied])


def set_intermediate_size(model: PreTrainedModel, layer: int, keep: Sequence[int]) -> None:
    """Keep only the FFN neurons `keep` (indices into the layer's current width) of one layer,
    and of every layer that shares its FFN weights (they are one FFN)."""
    family = family_for(model, "prune-ffn")
    layers = encoder_layers(model)
    width = structured.submodule(layers[layer], family.ffn.inner).out_features
    if not keep or len(set(keep)) != len(keep) or not all(0 <= i < width for i in keep):
        raise UserError(f"layer {layer}: FFN neurons to keep must be distinct indices in [0, {width}); got {list(keep)}")
    shared = record_for(model)
    group = next(g for g in ffn_groups(model, family) if layer in g)
    for index in group:   # each slices the same tensors with the same indices: equal values
        structured.keep_ffn_neurons(layers[index], (family.ffn.inner, family.ffn.outer), torch.tensor(sorted(keep)))
    restore_sharing(model, shared)
    update_record(model)


def weight_groups(model: PreTrainedModel, family: Family, paths: Sequence[str]) -> list[list[int]]:
    """Every layer once, in layer order: the layers whose modules at `paths` hold the very
    same tensors (shared by `tie_layers`) together, each other layer alone."""
    shared = structured.shared_groups(model, family.layers, tuple(paths))
    grouped = {i for group in shared for i in group}
    alone = [[i] for i in range(len(encoder_layers(model))) if i not in grouped]
    return sorted(shared + alone)


def head_groups(model: PreTrainedModel, family: Family) -> list[list[int]]:
    """Layers that compute with one set of attention weights, which lose their heads together."""
    attention = family.attention
    return weight_groups(model, family, (attention.query, attention.key, attention.value, attention.output))


def ffn_groups(model: PreTrainedModel, family: Family) -> list[list[int]]:
    """Layers that compute with one FFN, which lose their neurons together."""
    return weight_groups(model, family, (family.ffn.inner, family.ffn.outer))


def same_in_groups(units: dict[int, list[int]], groups: list[list[int]], what: str) -> dict[int, list[int]]:
    """`units` ({layer: [unit, ...]}) with a group's entry given to each of its layers; a
    group whose layers are given different units is refused (one set of weights)."""
    spread = {int(layer): sorted(set(us)) for layer, us in units.items()}
    for group in groups:
        given = [(layer, spread[layer]) for layer in group if spread.get(layer)]
        for layer, chosen in given[1:]:
            if chosen != given[0][1]:
                raise UserError(f"layers {given[0][0]} and {layer} share their weights (share-layers), so "
                                f"they lose the same {what}; got {given[0][1]} and {chosen}")
        if given:
            spread |= dict.fromkeys(group, given[0][1])
    return spread


def restore_sharing(model: PreTrainedModel, record: dict | None) -> None:
    """Point the layers of each group the record (taken before pruning) names at their
    leader's tensors again: pruning gave every layer new tensors for what it pruned, equal
    to its leader's since the same units went."""
    if record is not None and (record["shared_layers"] or record.get("shared_sublayers")):
        structured.tie_shared(model, record)
        update_record(model)


def tie_layers(model: PreTrainedModel, groups: Sequence[Sequence[int]], sublayer: str | None = None) -> None:
    """Make each group's layers share the first layer's parameters (cross-layer sharing):
    all of them, or only those of one sublayer (the family's "attention" or "ffn")."""
    family = family_for(model, "share-layers")
    count = len(encoder_layers(model))
    flat = [i for group in groups for i in group]
    if len(set(flat)) != len(flat) or not all(0 <= i < count for i in flat) or any(len(g) < 2 for g in groups):
        raise UserError(f"layer groups to share must be disjoint groups of 2 or more layer indices "
                        f"in [0, {count}); got {[list(g) for g in groups]}")
    modules = sublayer_modules(family, sublayer)
    # share_layers raises ValueError on a shape mismatch (the pass refuses it up front, in one
    # line, before copying the model; this guards direct callers)
    structured.share_layers(model, family.layers, [sorted(g) for g in groups], modules)
    update_record(model)
    structured.tie_shared(model, structured.record_of(model.config))


def sublayer_modules(family: Family, sublayer: str | None) -> tuple[str, ...]:
    """The module paths (under one layer) of `sublayer`; ("",), the whole layer, for None."""
    if sublayer is None:
        return ("",)
    if sublayer not in family.sublayers:
        known = ", ".join(family.sublayers) or "none"
        raise UserError(f"share-layers: family {family.name!r} has no sublayer {sublayer!r} to share; "
                        f"expected one of: {known}")
    return family.sublayers[sublayer]


def record_for(model: PreTrainedModel) -> dict | None:
    """The model's structure record, or None when its config already implies its structure."""
    family = FAMILIES.get(model.config.model_type)
    if family is None or family.layers is None:
        return None
    record = structured.describe(model, family.layers, (family.ffn.inner, family.ffn.outer), family.sublayers)
    configured = getattr(model.config, family.intermediate_field)
    shared = record["shared_layers"] or record.get("shared_sublayers")
    if all(w == configured for w in record["intermediate_sizes"]) and not shared:
        return None
    return record


def update_record(model: PreTrainedModel) -> None:
    """Write (or remove) the record and the auto_map entry that loads it."""
    config = model.config
    record = record_for(model)
    auto_map = dict(getattr(config, "auto_map", None) or {})
    if record is None:
        if hasattr(config, structured.RECORD_FIELD):
            delattr(config, structured.RECORD_FIELD)
        if auto_map.get(AUTO_CLASS, "").startswith(structured.MODULE_NAME + "."):
            del auto_map[AUTO_CLASS]
    else:
        setattr(config, structured.RECORD_FIELD, record)
        base = type(model).__qualname__.removeprefix("Structured")
        auto_map[AUTO_CLASS] = f"{structured.MODULE_NAME}.Structured{base}"
    if auto_map:
        config.auto_map = auto_map
    elif "auto_map" in vars(config):
        del config.auto_map


def save_structure_code(model: PreTrainedModel, directory: Path) -> None:
    """Copy the modeling file into a saved dir whose config records a structure."""
    if structured.record_of(model.config) is not None:
        shutil.copyfile(structured.__file__, Path(directory) / f"{structured.MODULE_NAME}.py")
