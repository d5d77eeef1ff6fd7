"""Model structure a Transformers config cannot express, rebuilt before the weights load.

Transformers rebuilds heads removed with `prune_heads` from `config.pruned_heads`, but not
per-layer FFN widths (each layer's intermediate size) nor layers that share one set of
weights. A model with either carries a record in its config:

    "compressor_structure": {
        "layers": "encoder.layer",                      # the layers' nn.ModuleList, under the base model
        "ffn": ["intermediate.dense", "output.dense"],  # one layer's FFN: hidden->width, width->hidden
        "intermediate_sizes": [37, 64, 20],             # FFN width of each layer
        "shared_layers": [[0, 2]],                      # layers that share one set of parameters
        "shared_sublayers": {                           # only when some: sublayers shared alone
            "attention": {"modules": ["attention"], "groups": [[0, 1, 2]]}
        }
    }

and `Structured<Classifier>` (a subclass of the Transformers classifier) applies it in
`__init__`, after the full-size model is built and before `from_pretrained` loads the
weights, so the state dict's shapes fit. The first layer of a group owns the shared
parameters; the others point at them, so `save_pretrained` stores them once. A shared
sublayer (`share-layers` with mode attention or ffn) names its modules under one layer, so
that only their parameters are shared; records written before sublayers existed have no
`shared_sublayers` and load as before.

This file imports only torch and transformers: it is copied as `compressor_structure.py` into
every saved model dir with a record, and `config.auto_map` names its class, so a plain
Transformers user loads such a dir with

    AutoModelForSequenceClassification.from_pretrained(dir, trust_remote_code=True)

Family knowledge (which paths to record) lives in pretrain/families.py; the record carries
the paths, so this file needs none.
"""

from __future__ import annotations

import re

import torch
import transformers
from torch import nn

RECORD_FIELD = "compressor_structure"
MODULE_NAME = "compressor_structure"       # the file's name inside a saved model dir


def record_of(config) -> dict | None:
    return getattr(config, RECORD_FIELD, None) or None


def submodule(root: nn.Module, path: str) -> nn.Module:
    for name in filter(None, path.split(".")):
        root = getattr(root, name)
    return root


def layer_list(model: nn.Module, layers_path: str) -> nn.ModuleList:
    return submodule(model.base_model, layers_path)


def keep_ffn_neurons(layer: nn.Module, ffn: tuple[str, str], keep: torch.Tensor) -> None:
    """Slice one layer's FFN to the intermediate neurons `keep` (1-D indices), in place:
    rows of the inner linear (hidden -> width), columns of the outer one (width -> hidden)."""
    inner, outer = submodule(layer, ffn[0]), submodule(layer, ffn[1])
    keep = keep.to(inner.weight.device)
    inner.weight = nn.Parameter(inner.weight.index_select(0, keep).clone())
    if inner.bias is not None:
        inner.bias = nn.Parameter(inner.bias.index_select(0, keep).clone())
    outer.weight = nn.Parameter(outer.weight.index_select(1, keep).clone())
    inner.out_features = outer.in_features = len(keep)


def intermediate_sizes(model: nn.Module, layers_path: str, ffn: tuple[str, str]) -> list[int]:
    return [submodule(layer, ffn[0]).out_features for layer in layer_list(model, layers_path)]


def share_layers(model: nn.Module, layers_path: str, groups: list[list[int]],
                 modules: tuple[str, ...] = ("",)) -> list[str]:
    """Point every layer of a group at the parameters of the group's first layer: all of
    them, or those of the listed modules (paths under one layer; "" is the whole layer).

    Parameters, not modules, are shared: each layer keeps its own module (its own hooks,
    its own position for KV caching). Returns the state-dict patterns of the followers'
    tensors: `tie_shared` hands them to `save_pretrained` as known duplicates
    (`_dynamic_tied_weights_keys`), so it stores the leader's once.
    """
    layers = layer_list(model, layers_path)
    qualified = {id(m): name for name, m in model.named_modules()}[id(layers)]
    duplicates = []
    for leader, *followers in groups:
        for module in modules:
            owned = dict(submodule(layers[leader], module).named_parameters())
            for index in followers:
                for name, param in owned.items():
                    owner_path, _, attr = name.rpartition(".")
                    target = submodule(submodule(layers[index], module), owner_path)
                    if getattr(target, attr).shape != param.shape:
                        raise ValueError(f"layers {leader} and {index} cannot share {module}.{name}: shapes "
                                         f"{tuple(param.shape)} and {tuple(getattr(target, attr).shape)} differ")
                    setattr(target, attr, param)
                prefix = f"{qualified}.{index}.{module}." if module else f"{qualified}.{index}."
                duplicates.append("^" + re.escape(prefix))
    return duplicates


def tie_shared(model: nn.Module, record: dict) -> None:
    """Share what `record` says is shared: whole layers, then sublayers."""
    duplicates = share_layers(model, record["layers"], record.get("shared_layers") or [])
    for part in (record.get("shared_sublayers") or {}).values():
        duplicates += share_layers(model, record["layers"], part["groups"], tuple(part["modules"]))
    model._dynamic_tied_weights_keys = duplicates


def shared_groups(model: nn.Module, layers_path: str, modules: tuple[str, ...] = ("",)) -> list[list[int]]:
    """Groups (of 2 or more) of layers whose parameters (those of `modules`, or all) are the
    very same tensors, in layer order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, layer in enumerate(layer_list(model, layers_path)):
        tensors = tuple(id(p) for path in modules
                        for _, p in submodule(layer, path).named_parameters(remove_duplicate=False))
        groups.setdefault(tensors, []).append(index)
    return [group for group in groups.values() if len(group) > 1]


def describe(model: nn.Module, layers_path: str, ffn: tuple[str, str],
             sublayers: dict[str, tuple[str, ...]] | None = None) -> dict:
    """The record of `model` as it is now. `sublayers` (name -> module paths under one
    layer) are the sublayers that may be shared alone; a sublayer group that is a group of
    whole layers already is not repeated."""
    whole = shared_groups(model, layers_path)
    record = {"layers": layers_path, "ffn": list(ffn),
              "intermediate_sizes": intermediate_sizes(model, layers_path, ffn), "shared_layers": whole}
    parts = {}
    for name, modules in (sublayers or {}).items():
        groups = [g for g in shared_groups(model, layers_path, tuple(modules)) if g not in whole]
        if groups:
            parts[name] = {"modules": list(modules), "groups": groups}
    if parts:
        record["shared_sublayers"] = parts
    return record


def recorded_sublayers(record: dict) -> dict[str, tuple[str, ...]]:
    return {name: tuple(part["modules"]) for name, part in (record.get("shared_sublayers") or {}).items()}


def refresh_record(model: nn.Module) -> None:
    """Keep an existing record in step with the model (after layers were dropped, say)."""
    record = record_of(model.config)
    if record is not None:
        setattr(model.config, RECORD_FIELD, describe(model, record["layers"], tuple(record["ffn"]),
                                                     recorded_sublayers(record)))


def apply_structure(model: nn.Module, record: dict) -> None:
    """Give a freshly built (full-size) model the recorded structure; weights come after."""
    layers = layer_list(model, record["layers"])
    ffn = tuple(record["ffn"])
    for layer, width in zip(layers, record.get("intermediate_sizes") or []):
        device = submodule(layer, ffn[0]).weight.device
        if width != submodule(layer, ffn[0]).out_features:
            keep_ffn_neurons(layer, ffn, torch.arange(width, device=device))
    tie_shared(model, record)


def structured_class(base: type) -> type:
    """`base` (a Transformers classifier) that builds itself with its config's recorded structure."""

    class Structured(base):
        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            record = record_of(config)
            if record is not None:
                apply_structure(self, record)

        def tie_weights(self):
            # from_pretrained loads each tensor into the first layer of a group only, then
            # calls tie_weights: point the other layers at the loaded tensors again.
            super().tie_weights()
            record = record_of(self.config)
            if record is not None:
                tie_shared(self, record)

    # save_pretrained writes the class's __name__ into config.architectures: keep the plain
    # Transformers name there (what a reader of config.json and Optimum expect), while
    # config.auto_map names this class (by its module attribute, the qualname).
    Structured.__name__, Structured.__qualname__ = base.__name__, f"Structured{base.__name__}"
    return Structured


# One class per classifier of a family with Transformer layers (config.auto_map names one).
StructuredBertForSequenceClassification = structured_class(transformers.BertForSequenceClassification)
StructuredRobertaForSequenceClassification = structured_class(transformers.RobertaForSequenceClassification)
StructuredXLMRobertaForSequenceClassification = structured_class(transformers.XLMRobertaForSequenceClassification)
StructuredElectraForSequenceClassification = structured_class(transformers.ElectraForSequenceClassification)
StructuredDistilBertForSequenceClassification = structured_class(transformers.DistilBertForSequenceClassification)
StructuredBartForSequenceClassification = structured_class(transformers.BartForSequenceClassification)
StructuredXLNetForSequenceClassification = structured_class(transformers.XLNetForSequenceClassification)

STRUCTURED_CLASSES = {cls.__qualname__: cls for cls in (
    StructuredBertForSequenceClassification, StructuredRobertaForSequenceClassification,
    StructuredXLMRobertaForSequenceClassification, StructuredElectraForSequenceClassification,
    StructuredDistilBertForSequenceClassification, StructuredBartForSequenceClassification,
    StructuredXLNetForSequenceClassification)}


def classifier_class(config) -> type:
    """The class to load a classifier of `config` with: Structured<Classifier> when the config
    records a structure, else the Auto class."""
    if record_of(config) is None:
        return transformers.AutoModelForSequenceClassification
    base = transformers.AutoModelForSequenceClassification._model_mapping[type(config)]
    return STRUCTURED_CLASSES[f"Structured{base.__name__}"]
