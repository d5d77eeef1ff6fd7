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

`packed_dropout(model)` gives every `nn.Dropout` of the model this forward while the block
runs and puts torch's back afterwards (the modules themselves, and the hooks adapters hang
on them, stay), so a saved or exported model is the plain Transformers model.

The attention-probability dropout of Transformers' SDPA attention is not a module:
`scaled_dot_product_attention` draws it inside, with torch's masks. So, within the block,
the SDPA self-attention of a BERT-layout encoder (BERT, RoBERTa, XLM-R; ELECTRA's attention
is eager already) runs its eager parent's forward instead: the same
softmax(QK^T / sqrt(d) + mask) V, written out, which applies the module's own `dropout`
(packed) to the probabilities. On CPU that is what SDPA's math kernel computes once dropout
is on, and in a MiniLM step on 2 cores it ran faster (benchmarks/README.md, the first
section of "Fine-tuning throughput vs the Transformers Trainer").
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


def packs(p: float) -> bool:
    """Whether a rate has a packed form: above 0 and below 1 once rounded to 1/65536."""
    return 0 < effective_probability(p) < 1


def packed_bits_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout of `x` at rate ~p in training (see module doc); for `packs(p)` rates."""
    scale = 1.0 / (1.0 - effective_probability(p))
    # where() keeps only the boolean mask for the backward pass, as torch's dropout does
    return torch.where(keep_mask(x.shape, p, x.device), x * scale, 0.0)


def packed_forward(module: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """An `nn.Dropout`'s forward with packed masks: its own p, and nothing in eval mode."""
    return packed_bits_dropout(x, module.p) if module.training else x


@contextlib.contextmanager
def packed_dropout(model: nn.Module) -> Iterator[int]:
    """Within the block, every `nn.Dropout` of `model` whose rate `packs` draws packed masks,
    and every SDPA self-attention that `eager_forward` knows runs its eager forward (so its
    attention dropout is one of those modules); both come back on leaving, whatever happened.
    Yields how many dropout modules draw packed masks.

    Only the modules' forwards change, never the modules: the forward hooks that adapters
    hang on a dropout module (pretrain/strategies.py) keep running, and a module reachable
    from several parents (shared layers) is one module."""
    changed: list[tuple[nn.Module, object]] = []
    dropouts = 0
    try:
        for module in model.modules():           # each module once, however often it is reachable
            if type(module) is nn.Dropout and packs(module.p):
                forward, dropouts = packed_forward, dropouts + 1
            else:
                forward = eager_forward(module)
            if forward is not None:
                changed.append((module, module.__dict__.get("forward")))
                module.forward = types.MethodType(forward, module)
        yield dropouts
    finally:
        for module, own_forward in reversed(changed):
            del module.forward
            if own_forward is not None:
                module.forward = own_forward


def eager_forward(module: nn.Module):
    """The eager forward to run in place of an SDPA self-attention's, or None.

    Only Transformers' `<Family>SdpaSelfAttention(<Family>SelfAttention)` pairs of the BERT
    layout qualify: both forwards take the same arguments and the same additive mask (the
    model prepares it for SDPA, and the eager forward adds it to the scores), and the eager
    one applies `self.dropout` to the probabilities. DistilBERT's and ALBERT's eager
    attention expect other masks, so they keep SDPA and torch's masks inside it; so does a
    decoder's (the `clm` objective's BERT), which SDPA makes causal by a flag the eager form
    does not take."""
    cls = type(module)
    if not cls.__name__.endswith("SdpaSelfAttention") or len(cls.__bases__) != 1:
        return None
    if getattr(module, "is_decoder", False):   # SDPA makes it causal by is_causal, which eager lacks
        return None
    parent = cls.__bases__[0]
    dropout = getattr(module, "dropout", None)
    if parent.__name__ != cls.__name__.replace("Sdpa", "") or type(dropout) is not nn.Dropout or not packs(dropout.p):
        return None
    return parent.forward
