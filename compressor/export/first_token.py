"""The exported graph's last layer computes the first token only: the one the head reads.

A sequence classifier of the BERT layout reads one vector: BERT's pooler and the RoBERTa and
ELECTRA heads all take the last layer's state of the first token ([CLS], <s>). Every other
position of the last layer is computed and thrown away: its query, attention output and FFN
for S - 1 tokens, about 10/12 of that layer's multiply-adds. In the graph this module traces,
the last layer still projects keys and values for every token (the first token attends to
all of them), but its query, attention output, residual, LayerNorm and FFN run on the first
token alone. The logits are the same (the parity gate checks them against the untouched
PyTorch model); the saving is one layer in six for the teacher and up to one in two for a
two-layer student.

Applied at export only, on a copy (the bundle's model is never changed). Where it cannot
apply, `skip_reason` says why and the export traces the model as it is.
"""

from __future__ import annotations

import copy
import math
import types

import torch
from torch import nn
from transformers import PreTrainedModel

from pretrain.families import BERT_ATTENTION, BERT_FFN, FAMILIES
from pretrain.models import encoder_layers

# Classifier classes whose head reads only the first token of the last hidden state.
FIRST_TOKEN_HEADS = ("BertForSequenceClassification", "RobertaForSequenceClassification",
                     "XLMRobertaForSequenceClassification", "ElectraForSequenceClassification")


def skip_reason(model: PreTrainedModel) -> str | None:
    """Why the last layer must stay whole for this model; None when it can run on the first token."""
    family = FAMILIES.get(model.config.model_type)
    if family is None or family.attention != BERT_ATTENTION or family.ffn != BERT_FFN:
        return f"model family {model.config.model_type!r} does not have BERT's layer layout"
    if not any(cls.__name__ in FIRST_TOKEN_HEADS for cls in type(model).__mro__):
        return f"the head of {type(model).__name__} may read more than the first token"
    if getattr(model.config, "compressor_scalar_mix", False):
        return "the scalar-mix head reads every position of every layer"
    if getattr(model.config, "position_embedding_type", "absolute") != "absolute":
        return "relative position embeddings need the full query"
    if getattr(model.config, "is_decoder", False):
        return "a decoder's layers attend causally"
    return None


def first_token_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of `model` whose last encoder layer computes the first token only (see module doc).

    Call only when `skip_reason(model)` is None. The layer keeps its module path (only its
    forward differs), so weight and node names in the graph are the ones the quantizers'
    module maps expect."""
    traced = copy.deepcopy(model)   # layers that share weights keep sharing them
    layers = encoder_layers(traced)
    last = copy.copy(layers[len(layers) - 1])   # its own object, should the list hold it twice
    last.forward = types.MethodType(first_token_forward, last)
    layers[len(layers) - 1] = last
    return traced


def first_token_forward(layer: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                        *args, **kwargs) -> tuple[torch.Tensor]:
    """A BERT layer's forward for the first token only: output [batch, 1, hidden]. Keys and
    values come from every token; the attention mask's first query row masks them."""
    first = hidden_states[:, :1]
    mask = None if attention_mask is None else attention_mask[..., :1, :]
    context = first_token_attention(layer.attention.self, first, hidden_states, mask)
    attended = layer.attention.output(context, first)          # dense, dropout, residual, LayerNorm
    return (layer.output(layer.intermediate(attended), attended),)


def first_token_attention(attention: nn.Module, first: torch.Tensor, states: torch.Tensor,
                          mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention of the first token over all tokens, with the layer's own
    projections and head count (after head pruning); [batch, 1, heads x head size]."""
    heads, size = attention.num_attention_heads, attention.attention_head_size
    batch = states.shape[0]

    def split(x: torch.Tensor) -> torch.Tensor:   # [batch, tokens, heads*size] -> [batch, heads, tokens, size]
        return x.view(batch, -1, heads, size).transpose(1, 2)

    query, key, value = split(attention.query(first)), split(attention.key(states)), split(attention.value(states))
    scores = query @ key.transpose(-1, -2) / math.sqrt(size)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool \
            else scores + mask
    context = torch.softmax(scores, dim=-1) @ value
    return context.transpose(1, 2).reshape(batch, 1, heads * size)
