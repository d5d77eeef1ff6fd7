"""How much each attention head, FFN neuron or layer matters, measured on train examples.

Shared by the structured pruning passes (compressor/passes/pruning.py) and `drop-layers`.

- Taylor (Michel et al. 2019 for heads): a gate xi = 1 multiplies each head's context vector
  (each neuron's activation) where it enters the output projection; the score is |dL/dxi|
  summed batch by batch over a train sample, divided by the sample's tokens. For a head this
  is the same gradient as Transformers' `head_mask` gives, but the gate sits on the output
  Linear's input, so it works whatever the attention implementation (eager, sdpa) and
  whatever each layer's head count is after earlier pruning.
- Magnitude: the L2 norm of the weights a head (neuron) owns: its rows of Q, K, V (of the
  inner FFN Linear) and its columns of the output projection (of the outer Linear).
- Random: seeded uniform scores, the control.

Scores are per layer, indexed by the layer's current heads (neurons), lowest = least needed.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Literal, Sequence

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel

from pretrain.batching import MAX_LENGTH, Encoded, encode, inference_order, iterate, usable_length
from pretrain.data import Split, TaskData
from pretrain.errors import UserError
from pretrain.families import Family
from pretrain.structured import submodule
from pretrain.train import accepts_token_types

Importance = Literal["taylor", "magnitude", "random"]


# --- data ---

def train_rows(task: TaskData, start: int, stop: int, what: str) -> Split:
    """Rows [start, stop) of the train split (one-line error when it is shorter)."""
    train = task.split("train")
    check_train_rows(len(train), stop, what)
    pairs = train.text_pairs[start:stop] if train.text_pairs is not None else None
    return Split(train.texts[start:stop], train.labels[start:stop], pairs)


def check_train_rows(available: int | None, needed: int, what: str) -> None:
    """Refuse (UserError) a sample of `needed` train rows from a split of `available` (None: unknown)."""
    if available is not None and available < needed:
        raise UserError(f"{what}: needs {needed} train examples but the task's train split has {available}; "
                        "lower samples (or validation_samples)")


def encode_for_model(model: PreTrainedModel, tokenizer, task: TaskData, split: Split,
                     max_length: int = MAX_LENGTH) -> Encoded:
    """`split` tokenised for `model` at `max_length` (the bundle's: the length it was fine-tuned
    at), labels turned into the model's class ids."""
    from compressor.evaluate import label_permutation
    data = encode(tokenizer, split, usable_length(model, max_length))
    labels = model.config.id2label
    to_model = np.argsort(label_permutation(tuple(labels[i] for i in sorted(labels)), task))
    return Encoded(data.input_ids, data.token_type_ids, to_model[data.labels], data.pad_id, data.pad_left)


def batches(model: nn.Module, data: Encoded, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    for _, batch in iterate(data, inference_order(data.lengths(), batch_size), accepts_token_types(model)):
        yield batch


@torch.no_grad()
def mean_loss(model: nn.Module, data: Encoded, batch_size: int = 64) -> float:
    model.eval()
    total = sum(float(model(**batch).loss) * len(batch["labels"]) for batch in batches(model, data, batch_size))
    return total / len(data)


@torch.no_grad()
def accuracy(model: nn.Module, data: Encoded, batch_size: int = 64) -> float:
    model.eval()
    right = sum(int((model(**b).logits.argmax(-1) == b["labels"]).sum()) for b in batches(model, data, batch_size))
    return right / len(data)


# --- structure ---

def head_dim(model: PreTrainedModel, family: Family) -> int:
    """Width of one head: the config's hidden size over its (original) head count."""
    config = model.config
    return getattr(config, family.hidden_field) // getattr(config, family.heads_field)


def attention_outputs(model: PreTrainedModel, family: Family, layers: nn.ModuleList) -> list[nn.Linear]:
    return [submodule(layer, family.attention.output) for layer in layers]


def heads_per_layer(model: PreTrainedModel, family: Family, layers: nn.ModuleList) -> list[int]:
    return [out.in_features // head_dim(model, family) for out in attention_outputs(model, family, layers)]


# --- scores ---

@contextmanager
def input_gates(linears: Sequence[nn.Linear], group: int) -> Iterator[list[torch.Tensor]]:
    """A gate of ones per `group` input features of each Linear, multiplied into its input.

    Yields the gates (leaf tensors that require grad); the hooks go when the block ends.
    """
    gates = [torch.ones(linear.in_features // group, requires_grad=True) for linear in linears]

    def hook_for(gate: torch.Tensor):
        def scale(module: nn.Module, args: tuple):
            x = args[0]
            return (x * gate.to(x.dtype).repeat_interleave(group),) + args[1:]
        return scale
    handles = [linear.register_forward_pre_hook(hook_for(gate)) for linear, gate in zip(linears, gates)]
    try:
        yield gates
    finally:
        for handle in handles:
            handle.remove()


def taylor_scores(model: nn.Module, data: Encoded, linears: Sequence[nn.Linear], group: int,
                  batch_size: int) -> list[torch.Tensor]:
    """|dL/dgate| per batch, summed over the sample and divided by its tokens (one vector per Linear).

    The model's weights get no gradient (they are not changed and need none)."""
    model.eval()   # no dropout: the score of a gate is its effect on the deployed function
    flags = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    scores = [torch.zeros(linear.in_features // group) for linear in linears]
    tokens = 0
    try:
        with input_gates(linears, group) as gates:
            for batch in batches(model, data, batch_size):
                loss = model(**batch).loss * len(batch["labels"])   # summed over the batch's examples
                for score, grad in zip(scores, torch.autograd.grad(loss, gates)):
                    score += grad.abs()
                tokens += int(batch["attention_mask"].sum())
    finally:
        for param, flag in zip(model.parameters(), flags):
            param.requires_grad_(flag)
    return [score / max(tokens, 1) for score in scores]


def per_layer_l2(scores: list[torch.Tensor]) -> list[torch.Tensor]:
    """Michel et al.: each layer's scores divided by their L2 norm, so layers compare."""
    return [s / s.norm().clamp_min(1e-20) for s in scores]


def random_scores(sizes: Sequence[int], seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(n, generator=generator) for n in sizes]


def head_importance(model: PreTrainedModel, family: Family, layers: nn.ModuleList, kind: Importance,
                    data: Encoded | None, seed: int, batch_size: int) -> list[torch.Tensor]:
    """One score per current head of every layer, normalized per layer (L2)."""
    dim = head_dim(model, family)
    outputs = attention_outputs(model, family, layers)
    if kind == "random":
        return random_scores([out.in_features // dim for out in outputs], seed)
    if kind == "taylor":
        return per_layer_l2(taylor_scores(model, data, outputs, dim, batch_size))
    scores = []
    for layer, out in zip(layers, outputs):
        squares = out.weight.detach().pow(2).sum(0)                       # per input column
        for path in (family.attention.query, family.attention.key, family.attention.value):
            squares = squares + submodule(layer, path).weight.detach().pow(2).sum(1)   # per output row
        scores.append(squares.view(-1, dim).sum(1).sqrt())
    return per_layer_l2(scores)


def neuron_importance(family: Family, layers: nn.ModuleList, kind: Importance, model: nn.Module,
                      data: Encoded | None, seed: int, batch_size: int) -> list[torch.Tensor]:
    """One score per FFN neuron of every layer (the outer Linear's input features), not normalized."""
    outers = [submodule(layer, family.ffn.outer) for layer in layers]
    if kind == "random":
        return random_scores([outer.in_features for outer in outers], seed)
    if kind == "taylor":
        return taylor_scores(model, data, outers, 1, batch_size)
    return [(submodule(layer, family.ffn.inner).weight.detach().pow(2).sum(1)
             + outer.weight.detach().pow(2).sum(0)).sqrt() for layer, outer in zip(layers, outers)]


def lowest(scores: list[torch.Tensor], count: int, keep_per_layer: int,
           sizes: Sequence[int] | None = None) -> dict[int, list[int]]:
    """The `count` globally lowest-scoring units, never taking a layer below `keep_per_layer`:
    {layer: [unit indices]} (layers with nothing removed left out).

    `sizes[r]` (1 each by default) is how many layers row r stands for (layers sharing one set
    of weights): one of its units counts that many towards `count`, and a unit that would take
    the total past `count` is passed over for a cheaper one."""
    sizes = sizes or [1] * len(scores)
    order = sorted((float(s), layer, unit) for layer, row in enumerate(scores) for unit, s in enumerate(row))
    left = [len(row) for row in scores]
    chosen: dict[int, list[int]] = {}
    taken = 0
    for _, layer, unit in order:
        if taken == count:
            break
        if left[layer] > keep_per_layer and taken + sizes[layer] <= count:
            left[layer] -= 1
            taken += sizes[layer]
            chosen.setdefault(layer, []).append(unit)
    return {layer: sorted(units) for layer, units in sorted(chosen.items())}
