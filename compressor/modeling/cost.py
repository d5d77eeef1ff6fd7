"""What a model costs, from its actual structure: multiply-adds per example, weight sparsity,
and the bytes a file takes once compressed.

`multiply_adds` runs one forward pass of a single example of the given length and counts
the work of every Linear (rows x in x out: per-layer head counts and FFN widths after
pruning, dropped and shared layers as they run, a pooler or classifier on one vector), adds
every LSTM's matrices once per token and direction, plus the attention products of
each Transformer layer (QK^T and AV: 2 x L^2 x heads x head_dim). Embedding lookups, norms,
activations and softmax are left out (a few percent at these lengths). Convolutions (the CNN
student) count every output value times its input channels and kernel width.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from compressor.modeling.importance import head_dim
from pretrain.families import FAMILIES
from pretrain.first_token import skip_reason          # the export's rule for the last layer
from pretrain.models import encoder_layers
from pretrain.structured import submodule

COMPRESSION_LEVEL = 6          # zlib's (and gzip's) default level
SPARSE_THRESHOLD = 0.1         # share of zeros above which a model counts as unstructured-sparse


def encoder_linears(model: PreTrainedModel) -> dict[str, nn.Linear]:
    """Every Linear inside the Transformer layers, by module name (a shared layer once)."""
    inside = {id(m) for layer in encoder_layers(model) for m in layer.modules() if isinstance(m, nn.Linear)}
    return {name: m for name, m in model.named_modules() if id(m) in inside}


def encoder_sparsity(model: PreTrainedModel) -> float | None:
    """Share of exact zeros in the encoder Linears' weights; None for a model without them."""
    family = FAMILIES.get(model.config.model_type)
    if family is None or family.layers is None or family.einsum_projections:
        return None
    weights = [m.weight for m in encoder_linears(model).values()]
    total = sum(w.numel() for w in weights)
    return sum(int((w == 0).sum()) for w in weights) / total if total else None


def compressed_size(files: list[Path]) -> int:
    """Bytes of the files compressed with zlib at level 6 (what gzip stores, less its header)."""
    size = 0
    for file in files:
        packer = zlib.compressobj(COMPRESSION_LEVEL)
        with open(file, "rb") as f:
            while chunk := f.read(1 << 22):
                size += len(packer.compress(chunk))
        size += len(packer.flush())
    return size


@torch.inference_mode()
def multiply_adds(model: PreTrainedModel, sequence_length: int, embedding_rank: int | None = None) -> int:
    """Multiply-adds of one example of `sequence_length` tokens (see the module docstring).

    `embedding_rank`: a factorized word embedding (deploy setting) costs its r x H projection per token.
    """
    total = 0

    def linear(module: nn.Linear, inputs: tuple, _output) -> None:
        nonlocal total
        total += inputs[0].numel() // module.in_features * module.in_features * module.out_features

    def convolution(module: nn.modules.conv._ConvNd, _inputs: tuple, output: torch.Tensor) -> None:
        # every output value sums (in channels / groups) x kernel products (the CNN student)
        nonlocal total
        total += output.numel() * module.in_channels // module.groups * math.prod(module.kernel_size)

    handles = [m.register_forward_hook(linear) for m in model.modules() if isinstance(m, nn.Linear)]
    handles += [m.register_forward_hook(convolution) for m in model.modules()
                if isinstance(m, nn.modules.conv._ConvNd)]
    was_training = model.training
    model.eval()
    try:
        ids = torch.full((1, sequence_length), min(5, model.config.vocab_size - 1), dtype=torch.long)
        if getattr(model.config, "eos_token_id", None) is not None:
            ids[0, -1] = model.config.eos_token_id   # BART classifies the last EOS state
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    hidden = model.get_input_embeddings().weight.shape[1]
    return (total + attention_products(model, sequence_length) + lstm_products(model, sequence_length)
            + sequence_length * (embedding_rank or 0) * hidden)


def lstm_products(model: nn.Module, sequence_length: int) -> int:
    """Every LSTM's input, recurrent and projection matrices once per token (and direction).

    Counted from the parameters, not by a hook: the BiLM runs its LSTMP cells through their
    weights (pretrain/bilm_model.py `lstmp`), not through the module's forward."""
    return sequence_length * sum(p.numel() for m in model.modules() if isinstance(m, nn.LSTM)
                                 for n, p in m.named_parameters() if n.startswith("weight_"))


def attention_products(model: PreTrainedModel, sequence_length: int) -> int:
    """QK^T and AV of every Transformer layer as it runs: 2 x L^2 x (heads x head_dim)."""
    family = FAMILIES.get(model.config.model_type)
    if family is None or family.layers is None:
        return 0
    width = 0
    for layer in encoder_layers(model):
        query = submodule(layer, family.attention.query)
        # a Linear, or XLNet's einsum weight [hidden, heads, head_dim]
        width += query.out_features if isinstance(query, nn.Linear) else query.shape[1] * query.shape[2]
    return 2 * sequence_length ** 2 * width


def unit_costs(model: PreTrainedModel, unit: str, sequence_length: float) -> list[float]:
    """Multiply-adds one attention head (`unit="head"`) or one FFN neuron (`"neuron"`) costs
    per example in each Transformer layer, as the deployed graph runs it.

    The export runs the last layer on the first token only where the model allows it
    (pretrain/first_token.py): there a neuron works on one token instead of L, and a head
    still projects keys and values for every token but its query, output and attention for
    one. Pruning a unit of that layer saves that much less."""
    family = FAMILIES[model.config.model_type]
    hidden, dim = getattr(model.config, family.hidden_field), head_dim(model, family)
    layers = len(encoder_layers(model))
    first_token_last = skip_reason(model) is None
    costs = []
    for index in range(layers):
        queries = 1.0 if first_token_last and index == layers - 1 else sequence_length
        if unit == "neuron":
            costs.append(2 * hidden * queries)                            # inner row + outer column
        else:
            costs.append(hidden * dim * (2 * sequence_length + 2 * queries)   # K, V; Q, output
                         + 2 * queries * sequence_length * dim)               # QK^T, AV
    return costs
