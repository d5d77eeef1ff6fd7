"""Cross-layer parameter sharing: `share-layers` (ALBERT, Lan et al. 2020).

Layer i of L joins group floor(i * G / L) (ALBERT's assignment; G = 1 shares one layer across
all), and every layer of a group computes with one set of weights: the whole layer
(`mode: all`), or only its attention or its FFN sublayer (each with its LayerNorm). The
layers stay separate modules whose parameters are the same tensors, so the model keeps its
depth (and its compute) and loses the other layers' weights: `save_pretrained`, the ONNX
export and `bundle.params` count each shared tensor once (compressor/modeling/structure.py
records the sharing so that it survives a reload). Follow it with `finetune` to recover:
the optimizer sees each shared tensor once and updates it with the sum of its layers'
gradients, as ALBERT trains.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from pydantic import Field, NonNegativeInt

from compressor.bundle import ModelBundle
from compressor.modeling.structure import sublayer_modules, tie_layers
from compressor.passes.registry import Context, Known, PassConfig, Shape, register
from pretrain.errors import UserError
from pretrain.families import FAMILIES
from pretrain.models import check_transformer_family, encoder_layers
from pretrain.structured import submodule


class ShareLayers(PassConfig):
    mode: Literal["all", "attention", "ffn"] = "all"   # what a group shares: whole layers or one sublayer
    groups: int = Field(1, ge=1)                        # G: layer i joins group floor(i * G / L)
    # The shared weights start as the group's first layer's, the mean of its layers', or
    # those of the layer at this position in each group (0 = first).
    init: Literal["first", "average"] | NonNegativeInt = "first"


def check_shareable(cfg: ShareLayers, family: str) -> None:
    """Refuse up front a family without (unshared) layers, or a sublayer it does not define."""
    check_transformer_family(family, "share-layers")
    record = FAMILIES[family]
    record.check("share-layers", f"share-layers on model family {family!r}")
    if cfg.mode != "all":
        sublayer_modules(record, cfg.mode)


def layer_groups(layers: int, groups: int) -> list[list[int]]:
    """ALBERT's assignment: layer i belongs to group floor(i * groups / layers)."""
    return [[i for i in range(layers) if i * groups // layers == g] for g in range(groups)]


def checked_groups(cfg: ShareLayers, n_layers: int) -> list[list[int]]:
    """The layer groups, after checking the groups and `init` fit a model of n_layers."""
    if cfg.groups >= n_layers:
        raise UserError(f"share-layers: groups={cfg.groups} shares nothing in a model of {n_layers} layers; "
                        f"expected 1 to {n_layers - 1}")
    groups = layer_groups(n_layers, cfg.groups)
    if isinstance(cfg.init, int) and cfg.init >= min(map(len, groups)):
        raise UserError(f"share-layers: init={cfg.init} is no position in every group (the smallest of "
                        f"{len(groups)} groups of {n_layers} layers has {min(map(len, groups))}); "
                        f"expected first, average or 0 to {min(map(len, groups)) - 1}")
    return groups


def shared_shape(cfg: ShareLayers, known: Known) -> Shape:
    """The groups fit the layers; with the attention (or FFN) shared, they are its groups
    (pruning then takes the same heads, or neurons, from every layer of one)."""
    shape = known.model
    attention, ffn = cfg.mode in ("all", "attention"), cfg.mode in ("all", "ffn")
    if shape.layers is None:
        return dataclasses.replace(shape, shared_attention=None if attention else shape.shared_attention,
                                   shared_ffn=None if ffn else shape.shared_ffn)
    groups = checked_groups(cfg, shape.layers)
    if attention:
        check_same_head_counts(groups, shape)
        shape = dataclasses.replace(shape, shared_attention=joined(groups, shape.shared_attention))
    if ffn:
        check_same_ffn_widths(groups, shape)
        shape = dataclasses.replace(shape, shared_ffn=joined(groups, shape.shared_ffn))
    return shape


def joined(groups: list[list[int]], shared: tuple[tuple[int, ...], ...] | None) -> tuple[tuple[int, ...], ...] | None:
    """The groups sharing a sublayer once these groups share it too."""
    # Sharing on top of sharing: what ties to what is known only once it has run.
    return tuple(tuple(g) for g in groups if len(g) > 1) if shared == () else None


def check_same_head_counts(groups: list[list[int]], shape: Shape) -> None:
    """Refuse up front a group whose layers keep different head counts (known from `per_layer`),
    or may (a scored prune-heads chose them, and the group was not one attention then): the
    pass itself would refuse it only once the steps before had run."""
    check_same_sizes(groups, shape.heads, shape.heads_vary, shape.shared_attention, "keep different head counts",
                     "share before pruning, or give the layers of a group one count in prune-heads' per_layer")


def check_same_ffn_widths(groups: list[list[int]], shape: Shape) -> None:
    """As check_same_head_counts, for FFN widths: known (a per_layer prune-ffn, or the model's
    record), or chosen by a global prune-ffn unless the group was one FFN then."""
    check_same_sizes(groups, shape.ffn, shape.ffn_vary, shape.shared_ffn, "have different FFN widths",
                     "expected share-layers before prune-ffn, or mode: attention")


def check_same_sizes(groups: list[list[int]], sizes: tuple[int, ...] | None, vary: str | None,
                     shared: tuple[tuple[int, ...], ...] | None, differ: str, remedy: str) -> None:
    """Each group's layers of one size: `sizes` where known, else none may `vary` (the step before
    that would choose them, with what to do instead) unless they were one sublayer then."""
    for group in groups:
        if sizes is not None:
            if len({sizes[i] for i in group}) > 1:
                raise UserError(f"share-layers: layers {group[0]} to {group[-1]} {differ} "
                                f"({', '.join(str(sizes[i]) for i in group)}) after the steps before; "
                                f"sharing needs layers of one shape: {remedy}")
        elif vary and len(group) > 1 and not within_shared(group, shared):
            raise UserError(f"share-layers: layers {group[0]} to {group[-1]} may {differ}: {vary}")


def within_shared(group: list[int], shared: tuple[tuple[int, ...], ...] | None) -> bool:
    """Whether the layers of `group` already computed with one sublayer (so lost the same units);
    `shared` are the groups sharing it, None where unknown."""
    return shared is None or any(set(group) <= set(g) for g in shared)


@register("share-layers", ShareLayers, check_family=check_shareable, check_shape=shared_shape)
def share_layers(bundle: ModelBundle, cfg: ShareLayers, ctx: Context) -> ModelBundle:
    """Share each group's weights (the mode's part of every layer), initialized per `init`."""
    layers = encoder_layers(bundle.model)
    groups = checked_groups(cfg, len(layers))
    family = FAMILIES[bundle.model.config.model_type]
    sublayer = None if cfg.mode == "all" else cfg.mode
    modules = sublayer_modules(family, sublayer)
    check_same_shapes(layers, groups, modules)
    model = bundle.copy_model()
    layers = encoder_layers(model)
    with torch.no_grad():
        for group in groups:
            initialize_leader(layers, group, modules, cfg.init)
    tie_layers(model, [g for g in groups if len(g) > 1], sublayer)   # a group of one shares nothing
    return bundle.replace(model=model)


def shared_tensors(layer: torch.nn.Module, modules: tuple[str, ...]) -> dict[str, torch.nn.Parameter]:
    """The parameters of `modules` (paths under `layer`; "" is the whole layer), by name."""
    return {f"{path}.{name}" if path else name: param for path in modules
            for name, param in submodule(layer, path).named_parameters(remove_duplicate=False)}


def check_same_shapes(layers, groups: list[list[int]], modules: tuple[str, ...]) -> None:
    """One-line refusal when layers of a group differ in shape (pruned heads or FFN widths)."""
    for group in groups:
        leader = shared_tensors(layers[group[0]], modules)
        for index in group[1:]:
            for name, param in shared_tensors(layers[index], modules).items():
                if name not in leader or leader[name].shape != param.shape:
                    theirs = tuple(leader[name].shape) if name in leader else "absent"
                    raise UserError(f"share-layers: layers {group[0]} and {index} differ in shape ({name}: "
                                    f"{theirs} vs {tuple(param.shape)}, after pruning?); sharing needs "
                                    f"layers of one shape: share before pruning, or share fewer layers")


def initialize_leader(layers, group: list[int], modules: tuple[str, ...], init: str | int) -> None:
    """Set the group's first layer (whose tensors the others will share) to the chosen start."""
    if init == "first":
        return
    members = [shared_tensors(layers[i], modules) for i in group]
    for name, param in members[0].items():
        if init == "average":
            start = torch.stack([m[name].detach() for m in members]).mean(dim=0)
        else:
            start = members[init][name].detach().clone()
        param.copy_(start)
