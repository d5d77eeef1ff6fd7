"""Every supported family has a complete record whose paths resolve on a tiny model of it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (AlbertConfig, AutoModelForMaskedLM, AutoModelForSequenceClassification, BartConfig, BertConfig,
                          DistilBertConfig, ElectraConfig, RobertaConfig, XLMRobertaConfig, XLNetConfig)

from pretrain.domain import mlm_head
from pretrain.errors import UserError
from pretrain.families import CAPABILITIES, FAMILIES, SUPPORTED_FAMILIES, family_of
from pretrain.models import encoder_layers
from pretrain.bilm_model import BiLMConfig
from pretrain.textcnn import TextCNNConfig
from pretrain.strategies import submodule

SMALL = dict(vocab_size=64, max_position_embeddings=32, num_labels=3)
TINY_CONFIGS = {
    "bert": lambda: BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, **SMALL),
    "roberta": lambda: RobertaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, **SMALL),
    "xlm-roberta": lambda: XLMRobertaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=24, **SMALL),
    "electra": lambda: ElectraConfig(embedding_size=16, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=24, **SMALL),
    "distilbert": lambda: DistilBertConfig(dim=16, n_layers=2, n_heads=2, hidden_dim=24, **SMALL),
    "bart": lambda: BartConfig(d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                               decoder_attention_heads=2, encoder_ffn_dim=24, decoder_ffn_dim=24, **SMALL),
    "xlnet": lambda: XLNetConfig(vocab_size=64, d_model=16, n_layer=2, n_head=2, d_inner=24, num_labels=3),
    "bilm": lambda: BiLMConfig(vocab_size=64, embedding_dim=8, hidden_size=16, num_labels=3),
    "textcnn": lambda: TextCNNConfig(vocab_size=64, embedding_dim=8, filters=4, num_labels=3),
    "albert": lambda: AlbertConfig(embedding_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=24, **SMALL),
}


def tiny(family: str) -> nn.Module:
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(TINY_CONFIGS[family]())


def test_every_supported_family_has_a_tiny_config_here():
    assert set(TINY_CONFIGS) == set(SUPPORTED_FAMILIES)


@pytest.mark.parametrize("name", SUPPORTED_FAMILIES)
def test_record_is_complete_and_consistent(name):
    family = FAMILIES[name]
    assert family.name == name
    assert set(family.refusals) <= set(CAPABILITIES)
    assert all(why.strip() for why in family.refusals.values())
    # What the data says and what the refusals say agree.
    assert family.supports("adapters") == bool(family.adapter_sites)
    assert family.supports("domain-mlm") == bool(family.mlm_head)
    assert family.supports("fusion") == (family.ort_model_type is not None)
    if family.layers is None:
        assert family.attention is family.ffn is None
        assert not any(family.supports(c) for c in ("drop-layers", "prune-heads", "prune-ffn", "share-layers"))
        return
    assert family.attention and family.ffn and family.layer_count_fields
    assert family.heads_field and family.hidden_field and family.intermediate_field


@pytest.mark.parametrize("name", SUPPORTED_FAMILIES)
def test_paths_and_fields_resolve_on_a_tiny_model(name):
    family = FAMILIES[name]
    model = tiny(name)
    config = model.config
    if family.layers is None:
        with pytest.raises(UserError, match="Transformer layers"):
            encoder_layers(model)
        return
    layers = encoder_layers(model)
    assert isinstance(layers, nn.ModuleList) and len(layers) == 2
    assert all(getattr(config, f) == 2 for f in family.layer_count_fields)
    heads, hidden, inner = (getattr(config, f) for f in
                            (family.heads_field, family.hidden_field, family.intermediate_field))
    assert (heads, hidden, inner) == (2, 16, 24)
    for layer in layers:
        for path in (family.attention.query, family.attention.key, family.attention.value, family.attention.output):
            found = submodule(layer, path)
            assert isinstance(found, (nn.Linear, nn.Parameter)), path
        inner_linear, outer_linear = submodule(layer, family.ffn.inner), submodule(layer, family.ffn.outer)
        assert (inner_linear.in_features, inner_linear.out_features) == (hidden, inner)
        assert (outer_linear.in_features, outer_linear.out_features) == (inner, hidden)
        for hooked, owner in family.adapter_sites:
            assert isinstance(submodule(layer, hooked), nn.Module) and isinstance(submodule(layer, owner), nn.Module)
        # share-layers: attention and ffn together are the whole layer (mode all)
        assert set(family.sublayers) == {"attention", "ffn"}
        in_parts = [id(p) for paths in family.sublayers.values() for path in paths
                    for p in submodule(layer, path).parameters()]
        assert sorted(in_parts) == sorted(id(p) for p in layer.parameters())


@pytest.mark.parametrize("name", [n for n in SUPPORTED_FAMILIES if FAMILIES[n].mlm_head])
def test_mlm_head_maps_hidden_to_vocab(name):
    torch.manual_seed(0)
    mlm = AutoModelForMaskedLM.from_config(TINY_CONFIGS[name]())
    assert mlm_head(mlm)(torch.zeros(5, 16)).shape == (5, 64)


def test_unknown_family_names_the_supported_ones():
    with pytest.raises(UserError) as err:
        family_of("gpt2")
    assert all(name in str(err.value) for name in SUPPORTED_FAMILIES)
