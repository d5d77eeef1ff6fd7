"""`seq2seq-mlm`: MASS-style masked sequence-to-sequence pretraining (Song et al. 2019).

Chosen over T5's sentinel spans because it needs only the tokenizer's [MASK] (T5 needs 100
sentinel tokens that tokenizers trained here do not have). For each sequence of m text
tokens one contiguous fragment of k = round(0.5 m) tokens (MASS's best ratio) starting at a
uniformly drawn position is masked in the encoder input (80% [MASK] / 10% random / 10%
unchanged per token, as MASS does; an [UNK] inside the fragment is text like any other);
the decoder generates exactly that fragment.

As in MASS's figure, the decoder input is aligned with the encoder positions: at fragment
positions it holds the fragment shifted right by one ([MASK] at the first), elsewhere
[MASK]; the loss covers the fragment positions only. So the decoder must draw on the
encoder for everything outside the fragment, which is what makes it learn to read it.
The model is a BartForConditionalGeneration (a plain Transformer encoder-decoder with
learned positions, the shape MASS used).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import BartForConditionalGeneration, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.objectives import Batch, Document, ModelSize, register_objective
from pretrain.objectives.architectures import fresh_bart
from pretrain.objectives.noising import corrupt, flatten, pad, require_targets, special_tokens


class MassConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    fragment: float = Field(0.5, gt=0, le=1)      # share of the tokens in the masked fragment
    mask_rate: float = Field(0.8, ge=0, le=1)
    random_rate: float = Field(0.1, ge=0, le=1)


def draw_fragment(n_tokens: int, share: float, rng: np.random.Generator) -> tuple[int, int]:
    """A contiguous [start, end) of round(share * n) tokens (at least one), uniformly placed."""
    if n_tokens == 0:
        return 0, 0
    length = min(n_tokens, max(1, round(share * n_tokens)))
    start = int(rng.integers(0, n_tokens - length + 1))
    return start, start + length


class MassObjective:
    name = "seq2seq-mlm"

    def __init__(self, config: MassConfig = MassConfig()):
        self.config = config

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> BartForConditionalGeneration:
        return fresh_bart(tokenizer, self.name, size, max_length, seed)

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        specials = special_tokens(tokenizer, self.name)
        sources, decoder_inputs, labels = [], [], []
        for doc in docs:
            ids = flatten(doc, max_length - 2)
            start, end = draw_fragment(len(ids), self.config.fragment, rng)
            noised, target = corrupt(ids, [(start, end)], rng, specials, "token",
                                     self.config.mask_rate, self.config.random_rate)
            sources.append([specials.start, *noised.tolist(), specials.end])
            labels.append([-100, *target.tolist(), -100])
            # Position p = i + 1 holds token i; the decoder sees the fragment shifted right.
            decoder = [specials.mask] * (len(ids) + 2)
            decoder[start + 2:end + 1] = ids[start:end - 1]
            decoder_inputs.append(decoder)
        require_targets(sum(sum(t != -100 for t in row) for row in labels), self.name)
        input_ids = pad(sources, specials.pad)
        decoder_ids = pad(decoder_inputs, specials.pad)
        return {"input_ids": input_ids, "attention_mask": (input_ids != specials.pad).long(),
                "decoder_input_ids": decoder_ids,
                "decoder_attention_mask": (input_ids != specials.pad).long(),
                "labels": pad(labels, -100)}

    def loss(self, model: BartForConditionalGeneration, batch: Batch) -> torch.Tensor:
        return model(**batch).loss

    def deliverable(self, model: BartForConditionalGeneration) -> PreTrainedModel:
        return model


@register_objective("seq2seq-mlm")
def seq2seq_mlm_objective() -> MassObjective:
    return MassObjective()
