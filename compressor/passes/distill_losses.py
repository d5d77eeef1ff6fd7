"""What the `distill` pass compares between a student and its teacher, and how.

Layer states are read with forward hooks (`tapped`), so the models run as they are
(SDPA attention included) and nothing is asked of them beyond their family record
(pretrain/families.py): the input and output of each Transformer layer, and the outputs of
its query / key / value projections, from which the attention scores, the attention
distributions and MiniLM's value relations are computed.

Shapes: B examples, T positions, H heads, D width; masks are (B, T), 1 for real tokens.
Every loss is a mean over real tokens (padding never counts) and is exactly zero when the
student computes what the teacher computes.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from pretrain.families import FAMILIES
from pretrain.first_token import reader_of
from pretrain.models import encoder_layers
from pretrain.train import accepts_token_types
from pretrain.structured import submodule

QKV = ("query", "key", "value")


@dataclass
class Taps:
    """What one forward pass exposed.

    hidden[0] is the embedding output (the first layer's input), hidden[i + 1] layer i's
    output; projections[(i, "query")] is layer i's query projection output (B, T, H*dh).
    """

    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    projections: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)


def head_size(model: PreTrainedModel) -> int:
    """Width of one attention head (what stays fixed when heads are pruned)."""
    family = FAMILIES[model.config.model_type]
    return getattr(model.config, family.hidden_field) // getattr(model.config, family.heads_field)


def heads_per_layer(model: PreTrainedModel) -> list[int]:
    """Attention heads of every layer, read off the query projections (pruning changes them)."""
    family = FAMILIES[model.config.model_type]
    size = head_size(model)
    return [submodule(layer, family.attention.query).out_features // size for layer in encoder_layers(model)]


def hidden_width(model: PreTrainedModel) -> int:
    return getattr(model.config, FAMILIES[model.config.model_type].hidden_field)


@contextlib.contextmanager
def tapped(model: PreTrainedModel, hidden: bool = False, projections: dict[int, tuple[str, ...]] | None = None
           ) -> Iterator[Taps]:
    """Hooks that fill a Taps during the forward passes inside the block; removed after.

    `hidden`: every layer's output and the embedding output; `projections`: {layer: parts}
    of "query", "key", "value".
    """
    taps, handles = Taps(), []
    if not hidden and not projections:   # logits only: any family (ALBERT, BiLSTM, CNN)
        yield taps
        return
    layers = encoder_layers(model)
    family = FAMILIES[model.config.model_type]
    if hidden:
        def embedding_output(module, args, kwargs):
            taps.hidden[0] = args[0] if args else next(iter(kwargs.values()))
        handles.append(layers[0].register_forward_pre_hook(embedding_output, with_kwargs=True))
        for i, layer in enumerate(layers):
            def layer_output(module, args, output, i=i):
                taps.hidden[i + 1] = output[0] if isinstance(output, tuple) else output
            handles.append(layer.register_forward_hook(layer_output))
    for i, parts in (projections or {}).items():
        for part in parts:
            def projection_output(module, args, output, key=(i, part)):
                taps.projections[key] = output
            linear = submodule(layers[i], getattr(family.attention, part))
            handles.append(linear.register_forward_hook(projection_output))
    try:
        yield taps
    finally:
        for handle in handles:
            handle.remove()


# --- prediction-layer losses ---

def soft_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """DistilBERT / Hinton: KL(teacher/T || student/T) * T^2, mean over examples."""
    return F.kl_div(F.log_softmax(student / temperature, -1), F.log_softmax(teacher / temperature, -1),
                    reduction="batchmean", log_target=True) * temperature ** 2


NO_LABEL = -100        # a row without a task label (an augmented copy): F.cross_entropy's ignore_index


def hard_ce(student: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Task cross-entropy over the labelled rows (augmented copies carry NO_LABEL);
    a batch of copies alone gives 0, not the NaN of a mean over nothing."""
    labelled = labels != NO_LABEL
    if not labelled.any():
        return student.sum() * 0.0
    return F.cross_entropy(student[labelled], labels[labelled])


class TeacherLogits:
    """The teacher's logits for a batch, each distinct example computed once per run.

    The teacher only reads (eval mode, no dropout) and the transfer texts are fixed, so an
    example's logits are the same in every epoch: a run of E epochs pays one teacher forward
    per example instead of E (Tang et al. label their transfer set once, too). Examples are
    known by their real token ids (and token types), padding cut off; the rows a batch has
    not seen run through the teacher together. A cached row comes from a batch padded to
    another width, which moves logits by float rounding only.

    `reader` is the teacher as it runs: with `first_token` and where the model allows, a copy
    whose last layer computes the first token only (same logits, less work; the teacher
    itself is never changed). Loops take it as an aux module. `cache=False` runs the teacher
    on every batch; a dict as `cache` holds logits other passes' readers of the same teacher,
    run the same way, computed (Context.kept_logits), and keeps this one's for them."""

    def __init__(self, teacher: PreTrainedModel, first_token: bool = True,
                 cache: bool | dict[bytes, torch.Tensor] = True):
        self.reader = reader_of(teacher) if first_token else teacher
        self.takes_token_types = accepts_token_types(teacher)
        self.cache: dict[bytes, torch.Tensor] | None = cache if isinstance(cache, dict) else {} if cache else None

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items()
                  if k in ("input_ids", "attention_mask") or (k == "token_type_ids" and self.takes_token_types)}
        if self.cache is None:
            with torch.no_grad():
                return self.reader(**inputs).logits
        keys = example_keys(inputs)
        missing = [i for i, key in enumerate(keys) if key not in self.cache]
        if missing:
            with torch.no_grad():
                logits = self.reader(**{k: v[missing] for k, v in inputs.items()}).logits
            self.cache.update((keys[i], row) for i, row in zip(missing, logits))
        return torch.stack([self.cache[key] for key in keys])


def example_keys(inputs: dict[str, torch.Tensor]) -> list[bytes]:
    """Each row's real token ids (then token types), as bytes."""
    real = inputs["attention_mask"].bool().cpu().numpy()
    parts = [inputs[k].cpu().numpy() for k in ("input_ids", "token_type_ids") if k in inputs]
    return [b"".join(p[i][real[i]].tobytes() for p in parts) for i in range(len(real))]


# --- hidden-state losses ---

def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of per-token values (B, T) over real tokens."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def hidden_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TinyBERT: MSE of (projected) student states against the teacher's (B, T, D), real tokens."""
    return masked_mean((student - teacher).pow(2).mean(-1), mask)


def cosine_distance(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """DistilBERT's cosine embedding loss on last hidden states: 1 - cos, per real token."""
    return masked_mean(1 - F.cosine_similarity(student, teacher, dim=-1), mask)


# --- attention losses (per head, one to one: the head counts must match) ---

def split_heads(x: torch.Tensor, size: int) -> torch.Tensor:
    """(B, T, H*dh) -> (B, H, T, dh)."""
    b, t, _ = x.shape
    return x.view(b, t, -1, size).transpose(1, 2)


def attention_scores(query: torch.Tensor, key: torch.Tensor, size: int) -> torch.Tensor:
    """Pre-softmax scores q k^T / sqrt(dh): (B, H, T, T)."""
    return split_heads(query, size) @ split_heads(key, size).transpose(-1, -2) / math.sqrt(size)


def pair_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T): 1 where both the query and the key position are real tokens."""
    mask = mask.bool()
    return (mask[:, None, :, None] & mask[:, None, None, :])


def scores_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TinyBERT: MSE of attention scores over real (query, key) pairs. The official code zeroes
    the scores at padded keys and keeps them, and the rows of padded queries, in its mean; here
    padding never counts, so the value is larger by the share of padding (the weights absorb it)."""
    pairs = pair_mask(mask).expand_as(student)
    return (student - teacher).pow(2)[pairs].mean()


def relation_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MiniLM: KL(teacher || student) of the row distributions softmax(scores) over real keys,
    per head and real query; mean over them. Inputs are pre-softmax (B, H, T, T)."""
    keys = mask.bool()[:, None, None, :]
    log_s = F.log_softmax(student.masked_fill(~keys, float("-inf")), -1)
    log_t = F.log_softmax(teacher.masked_fill(~keys, float("-inf")), -1)
    per_key = torch.where(keys, log_t.exp() * (log_t - log_s), torch.zeros((), dtype=student.dtype))
    per_query = per_key.sum(-1)                                  # (B, H, T)
    queries = mask.bool()[:, None, :].expand_as(per_query)
    return per_query[queries].mean()


def value_relation(value: torch.Tensor, size: int) -> torch.Tensor:
    """MiniLM's value relation, pre-softmax: V V^T / sqrt(dh) per head (B, H, T, T)."""
    return attention_scores(value, value, size)


# --- choosing a layer map ---

def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA (Kornblith et al. 2019) of two representations of the same n tokens,
    (n, d1) and (n, d2): ||Y^T X||^2 / (||X^T X|| ||Y^T Y||) after centring; 1 for identical
    (or rotated, rescaled) representations, widths may differ."""
    x = x.double() - x.double().mean(0)
    y = y.double() - y.double().mean(0)
    cross = (y.T @ x).norm() ** 2
    return float(cross / ((x.T @ x).norm() * (y.T @ y).norm()).clamp(min=1e-12))
