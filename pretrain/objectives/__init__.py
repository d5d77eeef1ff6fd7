"""Pretraining objectives: each a data transformation plus a loss over a Transformers model.

An objective turns a batch of tokenized documents into model inputs (masking, noising,
pairing, permuting: numpy with an explicit Generator, so every draw is reproducible and
property-testable) and computes a loss on the model it builds. The pretraining command
(`compressor pretrain`) streams documents from a corpus, hands them to the objective in
batches, and trains with the project's one loop (`pretrain/train.py`).

The data unit is a *document*: a list of sentences, each a list of token ids without
special tokens (the corpus reader cuts long documents into chunks of whole sentences of
at most `max_length` tokens). Sentence-pair objectives draw consecutive segments from one
document; sentence permutation permutes whole sentences.

One module per objective family (mlm.py, clm.py, pairs.py, span.py, plm.py, dae.py,
rtd.py, seq2seq.py, unilm.py, bilm.py); each registers its objectives by name here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pretrain.errors import UserError

Document = list[list[int]]          # sentences of token ids, no special tokens
Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ModelSize:
    """Shape of a model pretrained from scratch (`--size`)."""

    layers: int
    hidden: int
    heads: int
    intermediate: int


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(layers=2, hidden=128, heads=2, intermediate=512),
    "small": ModelSize(layers=4, hidden=256, heads=4, intermediate=1024),
    "base": ModelSize(layers=12, hidden=768, heads=12, intermediate=3072),
}


class Objective(Protocol):
    """What the pretraining command needs from an objective."""

    name: str

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize,
                    max_length: int, seed: int) -> nn.Module:
        """A freshly initialised model (a Transformers model, or a wrapper holding several)."""

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        """Model inputs and targets for one batch; drawn fresh every time (dynamic masking)."""

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Scalar training loss."""

    def deliverable(self, model: nn.Module) -> PreTrainedModel:
        """The Transformers model written as the HF dir (e.g. ELECTRA keeps only the
        discriminator); usable as `teacher.model` in a recipe."""


_OBJECTIVES: dict[str, Callable[[], Objective]] = {}
_WITH_OPTIONS: dict[str, Callable[[str], Objective]] = {}   # objectives that take an options string


def register_objective(name: str, with_options: Callable[[str], Objective] | None = None
                       ) -> Callable[[Callable[[], Objective]], Callable[[], Objective]]:
    """Register a zero-argument factory under the name `--objective` takes, and optionally
    a factory from an options string (`--objective-option`s; the objective then has an
    `options` property giving its canonical string)."""
    def decorate(factory: Callable[[], Objective]) -> Callable[[], Objective]:
        if name in _OBJECTIVES:
            raise ValueError(f"objective {name!r} registered twice")
        _OBJECTIVES[name] = factory
        if with_options is not None:
            _WITH_OPTIONS[name] = with_options
        return factory
    return decorate


def load_objective_modules() -> None:
    """Import every module of this package, so each registers its objectives.

    The modules import this one (for the interface and the decorator), so they cannot be
    imported at its top; they are imported on first look-up instead.
    """
    import importlib
    import pkgutil
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


def objective_names() -> list[str]:
    load_objective_modules()
    return sorted(_OBJECTIVES)


def get_objective(name: str, options: str = "") -> Objective:
    """The objective `name`, configured by `options` (empty: its defaults)."""
    load_objective_modules()
    if name not in _OBJECTIVES:
        raise UserError(f"unknown objective {name!r}; known objectives: {', '.join(objective_names())}")
    if not options:
        return _OBJECTIVES[name]()
    if name not in _WITH_OPTIONS:
        raise UserError(f"objective {name!r} takes no options (got {options!r}); objectives with options: "
                        f"{', '.join(sorted(_WITH_OPTIONS))}")
    return _WITH_OPTIONS[name](options)
