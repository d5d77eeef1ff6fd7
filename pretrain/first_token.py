"""The last encoder layer computes the first token only: the one the head reads.

A sequence classifier of the BERT or DistilBERT layout reads one vector: BERT's pooler and
the RoBERTa, ELECTRA and DistilBERT heads all take the last layer's state of the first token
([CLS], <s>). Every other position of the last layer is computed and thrown away: its
query, attention output and FFN for S - 1 tokens, about 10/12 of that layer's multiply-adds.
In the graph this module traces, the last layer still projects keys and values for every
token (the first token attends to all of them), but its query, attention output, residual,
LayerNorm and FFN run on the first token alone. The logits are the same (the parity gate checks them against the untouched
PyTorch model); the saving is one layer in six for the teacher and up to one in two for a
two-layer student.

Used twice. The ONNX export traces a copy (`first_token_copy`; the bundle's model is never
changed). Fine-tuning on the task's own loss trains through it (`first_token_last_layer`):
the loss reads the logits only, so the gradient is the one the whole layer gives, for about
1/6 x 5/6 less of MiniLM's forward and backward (dropout acts on the positions computed,
attention dropout included). Where it cannot apply, `skip_reason` says why and the model
runs as it is.
"""

from __future__ import annotations

import contextlib
import copy
import math
import types
from collections.abc import Iterator

import torch
from torch import nn
from transformers import PreTrainedModel

from pretrain.families import BERT_ATTENTION, BERT_FFN, FAMILIES, Family
from pretrain.models import encoder_layers

# Classifier classes whose head reads only the first token of the last hidden state.
FIRST_TOKEN_HEADS = ("BertForSequenceClassification", "RobertaForSequenceClassification",
                     "XLMRobertaForSequenceClassification", "ElectraForSequenceClassification",
                     "DistilBertForSequenceClassification")


def skip_reason(model: PreTrainedModel) -> str | None:
    """Why the last layer must stay whole for this model; None when it can run on the first token."""
    family = FAMILIES.get(model.config.model_type)
    if family is None or layer_forward(family) is None:
        return f"model family {model.config.model_type!r} has neither BERT's nor DistilBERT's layer layout"
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
    swap_last_layer(traced)
    return traced


def reader_of(model: PreTrainedModel, *, always_copy: bool = False) -> PreTrainedModel:
    """The model as an inference-only reader of logits: its first-token copy where the family
    allows (same logits, less work), else the model itself, or a deep copy of it with
    `always_copy` (for a reader that must not follow later changes to `model`)."""
    if skip_reason(model) is None:
        return first_token_copy(model)
    return copy.deepcopy(model) if always_copy else model


@contextlib.contextmanager
def first_token_last_layer(model: PreTrainedModel) -> Iterator[None]:
    """Within the block, `model`'s last layer computes the first token only; the model's own
    layer is put back on leaving, whatever happened. Same parameters, so an optimizer built
    inside or outside the block trains the same weights. Call only when `skip_reason(model)`
    is None."""
    layers, original = swap_last_layer(model)
    try:
        yield
    finally:
        layers[len(layers) - 1] = original


def swap_last_layer(model: PreTrainedModel) -> tuple[nn.ModuleList, nn.Module]:
    """Put a first-token twin of the last layer in its place; returns the list and the original.

    The twin is a shallow copy: its parameters, buffers, submodules and hooks (adapters) are
    the original's, only its forward differs, and a layer the list holds twice (shared
    layers) keeps its full forward at its other positions."""
    layers = encoder_layers(model)
    original = layers[len(layers) - 1]
    twin = copy.copy(original)
    twin.forward = types.MethodType(layer_forward(FAMILIES[model.config.model_type]), twin)
    layers[len(layers) - 1] = twin
    return layers, original


def layer_forward(family: Family):
    """The first-token forward for the family's layer layout, or None."""
    if family.attention == BERT_ATTENTION and family.ffn == BERT_FFN:
        return bert_layer_forward
    if family.name == "distilbert":
        return distilbert_layer_forward
    return None


def bert_layer_forward(layer: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       *args, **kwargs) -> tuple[torch.Tensor]:
    """A BERT layer for the first token only: output [batch, 1, hidden]."""
    first, attention = hidden_states[:, :1], layer.attention.self
    context = first_token_attention((attention.query, attention.key, attention.value), attention.num_attention_heads,
                                    attention.attention_head_size, first, hidden_states, attention_mask,
                                    attention.dropout)
    attended = layer.attention.output(context, first)          # dense, dropout, residual, LayerNorm
    return (layer.output(layer.intermediate(attended), attended),)


def distilbert_layer_forward(layer: nn.Module, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                             *args, **kwargs) -> tuple[torch.Tensor]:
    """A DistilBERT block for the first token only: output [batch, 1, dim]."""
    first, attention = x[:, :1], layer.attention
    context = first_token_attention((attention.q_lin, attention.k_lin, attention.v_lin), attention.n_heads,
                                    attention.dim // attention.n_heads, first, x, attn_mask, attention.dropout)
    attended = layer.sa_layer_norm(attention.out_lin(context) + first)
    return (layer.output_layer_norm(layer.ffn(attended) + attended),)


def first_token_attention(projections: tuple[nn.Module, nn.Module, nn.Module], heads: int, size: int,
                          first: torch.Tensor, states: torch.Tensor, mask: torch.Tensor | None,
                          dropout: nn.Module) -> torch.Tensor:
    """Scaled dot-product attention of the first token over all tokens, with the layer's own
    query/key/value projections, head count (after head pruning) and attention-probability
    dropout (a no-op in eval mode); [batch, 1, heads x size].

    `mask` as the encoder hands it to its layers: additive or boolean [batch, 1, queries, keys]
    (its first query row is the first token's), or DistilBERT's [batch, keys] of ones and zeros."""
    batch = states.shape[0]

    def split(x: torch.Tensor) -> torch.Tensor:   # [batch, tokens, heads*size] -> [batch, heads, tokens, size]
        return x.view(batch, -1, heads, size).transpose(1, 2)

    query, key, value = (split(linear(x)) for linear, x in zip(projections, (first, states, states)))
    scores = query @ key.transpose(-1, -2) / math.sqrt(size)
    if mask is not None:
        keep = mask[:, None, None, :] != 0 if mask.dim() == 2 else mask[..., :1, :]
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min) if keep.dtype == torch.bool \
            else scores + keep
    context = dropout(torch.softmax(scores, dim=-1)) @ value
    return context.transpose(1, 2).reshape(batch, 1, heads * size)
