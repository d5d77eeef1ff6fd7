"""`rtd`: ELECTRA's replaced token detection (Clark et al. 2020).

A small generator (an MLM with hidden size 1/4 of the discriminator's, same depth, heads of
64 dims, sharing the discriminator's embeddings, so its softmax is tied to them too) fills
15% of the positions, drawn as in the official code: 85% become [MASK], 15% stay as they
are, and the generator then *samples* a token for every one of them from its softmax. The
discriminator labels every non-pad token original (0) or replaced (1); a sampled token
equal to the original counts as original. Loss = MLM_generator + 50 * BCE_discriminator.

Sampling is seeded from the batch (`sample_seed`, drawn by make_batch's generator), so a
batch gives the same replacements every time. Only the discriminator is kept: an
ElectraForPreTraining whose dir loads as ElectraForSequenceClassification (a teacher).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from transformers import (ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining, PreTrainedModel,
                          PreTrainedTokenizerBase)

from pretrain.objectives import Batch, Document, ModelSize, register_objective
from pretrain.objectives.noising import (SpecialTokens, corrupt, flatten, mask_budget, maskable, pad,
                                         require_targets, select_spans, special_tokens, token_units)


class RtdConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    rate: float = Field(0.15, gt=0, lt=1)            # share of tokens the generator fills
    mask_rate: float = Field(0.85, ge=0, le=1)       # of those: [MASK]; the rest keep their token
    generator_fraction: float = Field(0.25, gt=0, le=1)   # generator hidden / discriminator hidden
    discriminator_weight: float = Field(50.0, gt=0)


def electra_config(specials: SpecialTokens, size: ModelSize, max_length: int, hidden: int,
                   heads: int, intermediate: int) -> ElectraConfig:
    # embedding_size stays the discriminator's width for both models, so the two can share
    # one embedding table (the generator projects it down to its own width).
    return ElectraConfig(vocab_size=specials.vocab_size, embedding_size=size.hidden, hidden_size=hidden,
                         num_hidden_layers=size.layers, num_attention_heads=heads,
                         intermediate_size=intermediate, max_position_embeddings=max_length,
                         pad_token_id=specials.pad)


class ElectraForRtd(nn.Module):
    """Generator and discriminator with one shared embedding module."""

    def __init__(self, generator: ElectraForMaskedLM, discriminator: ElectraForPreTraining):
        super().__init__()
        self.generator = generator
        self.discriminator = discriminator
        generator.electra.embeddings = discriminator.electra.embeddings
        generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight

    def get_input_embeddings(self) -> nn.Embedding:
        return self.discriminator.get_input_embeddings()


def replace_with_samples(input_ids: torch.Tensor, original: torch.Tensor, selected: torch.Tensor,
                         logits: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample a token at every selected position; returns (discriminator inputs, 0/1 labels).

    input_ids: the generator's input; original: the uncorrupted ids; selected: bool [B, T];
    logits: generator logits at the selected positions [n_selected, vocab].
    """
    probs = torch.softmax(logits.detach().float(), dim=-1)
    sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    corrupted = original.clone()
    corrupted[selected] = sampled
    return corrupted, (corrupted != original).float()


class RtdObjective:
    name = "rtd"

    def __init__(self, config: RtdConfig = RtdConfig()):
        self.config = config

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> ElectraForRtd:
        specials = special_tokens(tokenizer, self.name)
        gen_hidden = max(1, round(size.hidden * self.config.generator_fraction))
        gen_heads = max(1, gen_hidden // 64)
        if gen_hidden % gen_heads:
            gen_heads = 1
        torch.manual_seed(seed)
        discriminator = ElectraForPreTraining(
            electra_config(specials, size, max_length, size.hidden, size.heads, size.intermediate))
        generator = ElectraForMaskedLM(electra_config(
            specials, size, max_length, gen_hidden, gen_heads,
            max(1, round(size.intermediate * self.config.generator_fraction))))
        return ElectraForRtd(generator, discriminator)

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        specials = special_tokens(tokenizer, self.name)
        originals, inputs, labels = [], [], []
        single = lambda _rng: 1                                   # noqa: E731 - token-level selection
        for doc in docs:
            ids = flatten(doc, max_length - 2)
            spans = select_spans(maskable(token_units(len(ids)), ids, specials),
                                 mask_budget(len(ids), self.config.rate), single, rng)
            noised, target = corrupt(ids, spans, rng, specials, "token", self.config.mask_rate, 0.0)
            originals.append([specials.start, *ids, specials.end])
            inputs.append([specials.start, *noised.tolist(), specials.end])
            labels.append([-100, *target.tolist(), -100])
        require_targets(sum(sum(t != -100 for t in row) for row in labels), self.name)
        input_ids = pad(inputs, specials.pad)
        return {"input_ids": input_ids, "original_ids": pad(originals, specials.pad),
                "attention_mask": (input_ids != specials.pad).long(), "labels": pad(labels, -100),
                "sample_seed": torch.tensor(int(rng.integers(0, 2**62)))}

    def loss(self, model: ElectraForRtd, batch: Batch) -> torch.Tensor:
        selected = batch["labels"] != -100
        gen = model.generator(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              labels=batch["labels"])
        sampler = torch.Generator(device=gen.logits.device).manual_seed(int(batch["sample_seed"]))
        corrupted, replaced = replace_with_samples(batch["input_ids"], batch["original_ids"], selected,
                                                   gen.logits[selected], sampler)
        # ElectraForPreTraining's BCE covers the non-pad tokens (attention_mask == 1).
        disc = model.discriminator(input_ids=corrupted, attention_mask=batch["attention_mask"],
                                   labels=replaced)
        return gen.loss + self.config.discriminator_weight * disc.loss

    def deliverable(self, model: ElectraForRtd) -> PreTrainedModel:
        return model.discriminator


@register_objective("rtd")
def rtd_objective() -> RtdObjective:
    return RtdObjective()
