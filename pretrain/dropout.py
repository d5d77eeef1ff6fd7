"""Dropout with a cheaper random mask, swapped in while the loop trains.

On a small CPU, torch's dropout is a large share of a fine-tuning step (12% of MiniLM's on
2 cores, benchmarks/README.md "Where the time goes"): `bernoulli_` draws one random number
per element and turns it into a float. Most of that is the random draw. Here one 64-bit
random word gives the keep decisions of four elements, each from its own 16 bits: an element
is kept when its 16-bit slice, read as a signed integer, is at least a threshold. That is
a quarter of the draws, then one comparison and one select, 4-5x faster than torch's
dropout at the shapes of a MiniLM step (2 threads).

The drop probability is `p` rounded to a multiple of 1/65536 (0.1 -> 0.100006), and kept
elements are scaled by 1 / (1 - that probability), so the expected output is the input, as
with torch's dropout. The draws come from torch's default generator: `torch.manual_seed`
makes runs repeatable and the loop's checkpoints carry the state, as before.

`packed_dropout(model)` swaps every `nn.Dropout` of the model for this one while the block
runs and puts the originals back afterwards, so a saved or exported model is the plain
Transformers model. Attention-probability dropout inside `scaled_dot_product_attention`
is not a module and stays torch's.
"""

from __future__ import annotations

import contextlib
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
    the same p; the originals come back on leaving, whatever happened. Yields how many
    were swapped. A dropout module reachable from several parents (shared layers) is
    swapped wherever it sits."""
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    try:
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
