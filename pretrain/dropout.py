"""Dropout with a cheaper random mask, swapped in while the loop trains.

On a small CPU, torch's dropout is a large share of a fine-tuning step (13% of MiniLM's on
2 cores in bf16 on AMX, benchmarks/README.md "Where the time goes"): `bernoulli_` draws one
random number per element, on one thread, and turns it into a float. Most of that is the
random draw. Here one 64-bit random word gives the keep decisions of four elements, each
from its own 16 bits: an element is kept when its 16-bit slice, read as a signed integer,
is at least a threshold. That is a quarter of the draws, then one comparison and one
select: the mask of a [32, 16, 384] activation in 0.24 ms against torch's 1.1 ms (2 threads).

The drop probability is `p` rounded to a multiple of 1/65536 (0.1 -> 0.100006), and kept
elements are scaled by 1 / (1 - that probability), so the expected output is the input, as
with torch's dropout. The draws come from torch's default generator: `torch.manual_seed`
makes runs repeatable and the loop's checkpoints carry the state, as before.

`packed_dropout(model)` swaps every `nn.Dropout` of the model for this one while the block
runs and puts the originals back afterwards, so a saved or exported model is the plain
Transformers model. The attention-probability dropout of Transformers' SDPA attention is not
a module: `scaled_dot_product_attention` draws it inside, with torch's masks. So, within the
block, the SDPA self-attention of the BERT layout (BERT, RoBERTa, XLM-R, ELECTRA) runs its
eager parent's forward instead: the same softmax(QK^T / sqrt(d) + mask) V, written out, which
applies the module's own `dropout` (swapped) to the probabilities. On CPU that is what
SDPA's math kernel computes when dropout is on (its fused kernels take no dropout), and it
measured no slower (benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
from torch import nn

LANES = 4                 # 16-bit slices per 64-bit random word
LEVELS = 1 << 16


def drop_threshold(p: float) -> int:
    """The signed 16-bit value below which an element is dropped, for probability ~p."""
    return round(p * LEVELS) - LEVELS // 2


def effective_probability(p: float) -> float:
    """The drop probability the 16-bit threshold really gives."""
    return round(p * LEVELS) / LEVELS


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """A boolean mask of `shape`, each element True with probability 1 - effective_probability(p)."""
    count = shape.numel()
    words = torch.empty((count + LANES - 1) // LANES, dtype=torch.int64, device=device)
    # the full signed range, so every bit of a word (the sign bit too) is uniform
    words.random_(-(1 << 63), (1 << 63) - 1)
    slices = words.view(torch.int16)[:count].view(shape)
    return slices >= drop_threshold(p)


class PackedBitsDropout(nn.Module):
    """`nn.Dropout(p)` with masks from 16-bit slices of random words (see module doc)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability {p} is outside [0, 1)")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or effective_probability(self.p) == 0:
            return x
        scale = 1.0 / (1.0 - effective_probability(self.p))
        # where() keeps only the boolean mask for the backward pass, as torch's dropout does
        return torch.where(keep_mask(x.shape, self.p, x.device), x * scale, 0.0)

    def extra_repr(self) -> str:
        return f"p={self.p}"


@contextlib.contextmanager
def packed_dropout(model: nn.Module) -> Iterator[int]:
    """Within the block, every `nn.Dropout` of `model` with 0 < p < 1 is a PackedBitsDropout of
    the same p, and every SDPA self-attention that `eager_forward` knows runs its eager
    forward (so its attention dropout is the swapped module); the originals come back on
    leaving, whatever happened. Yields how many dropout modules were swapped. A module
    reachable from several parents (shared layers) is swapped wherever it sits."""
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    eager: list[tuple[nn.Module, object]] = []
    try:
        for module in model.modules():
            forward = eager_forward(module)
            if forward is not None:      # modules() yields a shared module once
                eager.append((module, module.__dict__.get("forward")))
                module.forward = types.MethodType(forward, module)
        for parent in model.modules():
            for name, child in list(parent.named_children()):
                if type(child) is nn.Dropout and 0 < child.p < 1:
                    replacement = PackedBitsDropout(child.p)
                    replacement.train(child.training)
                    parent._modules[name] = replacement
                    swapped.append((parent, name, child))
        yield len(swapped)
    finally:
        for parent, name, original in reversed(swapped):
            parent._modules[name] = original
        for module, own_forward in reversed(eager):
            del module.forward
            if own_forward is not None:
                module.forward = own_forward


def eager_forward(module: nn.Module):
    """The eager forward to run in place of an SDPA self-attention's, or None.

    Only Transformers' `<Family>SdpaSelfAttention(<Family>SelfAttention)` pairs of the BERT
    layout qualify: both forwards take the same arguments and the same additive mask (the
    model prepares it for SDPA, and the eager forward adds it to the scores), and the eager
    one applies `self.dropout` to the probabilities. DistilBERT's and ALBERT's eager
    attention expect other masks, so they keep SDPA and torch's masks inside it."""
    cls = type(module)
    if not cls.__name__.endswith("SdpaSelfAttention") or len(cls.__bases__) != 1:
        return None
    parent = cls.__bases__[0]
    dropout = getattr(module, "dropout", None)
    if parent.__name__ != cls.__name__.replace("Sdpa", "") or type(dropout) is not nn.Dropout or not 0 < dropout.p < 1:
        return None
    return parent.forward
