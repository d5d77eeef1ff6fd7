"""`dae`: BART's denoising autoencoder (Lewis et al. 2020) on BartForConditionalGeneration.

The encoder reads a noised document, the decoder regenerates the original. Five noise
functions, each selectable and composable through an options string (`NoiseConfig.parse`),
applied in this order (fairseq's: sentences, then tokens, then spans, then rotation):

    permute[=F]   sentence permutation: a share F of the sentences swap places (default 1.0)
    mask[=R]      token masking: each token -> [MASK] with probability R (default 0.15)
    delete[=R]    token deletion: each token dropped with probability R (default 0.15)
    infill[=R]    text infilling: R of the words covered by spans of Poisson(lambda) words,
                  each span -> one [MASK], each zero-length span inserts a [MASK] (default 0.3)
    rotate[=P]    document rotation to a uniformly chosen token, with probability P (default 1.0)
    poisson=L     lambda of the infilling span lengths (default 3; BART's paper reports 3.5)
    whole_words=0 infill over tokens instead of whole words

e.g. "infill=0.3,permute" (BART's final recipe; also what the plain `dae` objective uses),
"mask=0.3", "delete=0.2,rotate". The functions may also be named by their nouns (masking,
deletion, infilling, permutation, rotation). The noise functions only ever see the text
between the document's start and end tokens, which frame the result. Each is in noising.py.

On the command line: `compressor pretrain --objective dae --dae-noise infilling,permutation
--mask-ratio 0.3` or `--objective-option infill=0.3 --objective-option rotate`
(`compose_options` turns the flags into one options string).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import BartForConditionalGeneration, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.errors import UserError, number_range
from pretrain.objectives import Batch, Document, ModelSize, register_objective
from pretrain.objectives.architectures import fresh_bart
from pretrain.objectives.noising import (delete_tokens, fit_sentences, flatten, infill, mask_tokens, pad,
                                         permute_sentences, rotate, special_tokens, token_units,
                                         word_start_table, word_units)

# Value a function takes when named without one ("rotate" = "rotate=1.0").
BARE_DEFAULTS = {"permute": 1.0, "mask": 0.15, "delete": 0.15, "infill": 0.3, "rotate": 1.0}
ALIASES = {"masking": "mask", "deletion": "delete", "infilling": "infill", "permutation": "permute",
           "rotation": "rotate"}
KNOWN = ("mask (token masking), delete (token deletion), infill (text infilling), permute (sentence "
         "permutation), rotate (document rotation); settings poisson=LAMBDA, whole_words=0|1")
MASKING = ("mask", "infill")        # what --mask-ratio sets (fairseq's --mask)


def parse_items(options: str) -> dict[str, str | None]:
    """'infilling, mask=0.2' -> {'infill': None, 'mask': '0.2'}: canonical names, raw values,
    each value checked against what its option takes."""
    items: dict[str, str | None] = {}
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, has_value, raw = (part.strip() for part in item.partition("="))
        key = ALIASES.get(key, key)
        if key not in NoiseConfig.model_fields:
            raise UserError(f"unknown dae noise option {key!r}; known: {KNOWN} (e.g. 'infill=0.3,permute')")
        if key in items:
            raise UserError(f"dae noise option {key!r} is given twice in {options!r}; expected each once")
        if has_value:
            check_value(key, raw, item)
        items[key] = raw if has_value else None
    return items


def check_value(key: str, raw: str, item: str) -> None:
    """A one-line error where option `key` cannot take `raw`: what the option takes, and the
    item as typed (`masking=2`, whose option is mask), not pydantic's "Input should be ..."."""
    try:
        NoiseConfig.model_validate({key: raw})
    except ValidationError:
        takes = number_range(NoiseConfig.model_fields[key]) or "0 or 1"     # whole_words, the one switch
        raise UserError(f"dae noise option {key}: expected {takes} (got {item!r})") from None


def compose_options(noise: str | None, mask_ratio: float | None, extra: tuple[str, ...] = ()) -> str:
    """The options string of `--dae-noise`, `--mask-ratio` and `--objective-option`s.

    The noise list and the extra options are joined; `--mask-ratio` sets the rate of token
    masking and text infilling among them. When they name no noise function (only a setting
    such as poisson=3.5, or only --mask-ratio), the functions are BART's: infilling +
    permutation. Empty when no flag is given.
    """
    items = parse_items(",".join(filter(None, [noise or "", *extra])))
    if (items or mask_ratio is not None) and not any(k in BARE_DEFAULTS for k in items):
        items = {"infill": None, "permute": None, **items}     # settings alone: BART's functions
    if mask_ratio is not None:
        targets = [k for k in MASKING if k in items]
        if not targets:
            raise UserError(f"--mask-ratio sets the rate of token masking or text infilling, but the noise "
                            f"({', '.join(items)}) has neither: expected mask or infill among them")
        for key in targets:
            if items[key] is not None:
                raise UserError(f"the rate of {key} is given twice ({key}={items[key]} and --mask-ratio "
                                f"{mask_ratio}); expected one of them")
            items[key] = str(mask_ratio)
    return ",".join(key if value is None else f"{key}={value}" for key, value in items.items())


class NoiseConfig(BaseModel):
    """Which noise functions run, and how hard (0 = off)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    permute: float = Field(0.0, ge=0, le=1)
    mask: float = Field(0.0, ge=0, le=1)
    delete: float = Field(0.0, ge=0, lt=1)
    infill: float = Field(0.0, ge=0, le=1)
    rotate: float = Field(0.0, ge=0, le=1)
    poisson: float = Field(3.0, gt=0)
    whole_words: bool = True

    @classmethod
    def parse(cls, options: str) -> "NoiseConfig":
        """'infill=0.3,permute' -> NoiseConfig; functions not named stay off."""
        values: dict[str, object] = {}
        for key, raw in parse_items(options).items():
            if raw is None and key not in BARE_DEFAULTS:
                raise UserError(f"dae noise option {key!r} needs a value, e.g. {key}=3.5")
            values[key] = raw if raw is not None else BARE_DEFAULTS[key]
        config = cls(**values)        # each value checked by parse_items
        if not any(getattr(config, k) for k in BARE_DEFAULTS):
            raise UserError(f"dae noise options {options!r} switch no noise function on; "
                            f"expected some of: {KNOWN}")
        return config

    def options(self) -> str:
        """The canonical options string: the functions switched on, then settings changed."""
        on = [f"{k}={getattr(self, k)}" for k in BARE_DEFAULTS if getattr(self, k)]
        changed = [f"{k}={getattr(self, k)}" for k in ("poisson", "whole_words")
                   if getattr(self, k) != NoiseConfig.model_fields[k].default]
        return ",".join(on + changed)


BART = NoiseConfig(permute=1.0, infill=0.3, poisson=3.0)


def noise_document(sentences: Sequence[Sequence[int]], cfg: NoiseConfig, rng: np.random.Generator,
                   mask_id: int, word_starts: np.ndarray | None) -> list[int]:
    """The noised text of one document (no start/end tokens)."""
    if cfg.permute:
        sentences = permute_sentences(sentences, rng, cfg.permute)
    ids = [t for sentence in sentences for t in sentence]
    if cfg.mask:
        ids = mask_tokens(ids, rng, cfg.mask, mask_id)
    if cfg.delete:
        ids = delete_tokens(ids, rng, cfg.delete)
    if cfg.infill:
        units = word_units(ids, word_starts) if cfg.whole_words and word_starts is not None \
            else token_units(len(ids))
        ids, _ = infill(ids, units, rng, cfg.infill, cfg.poisson, mask_id)
    if cfg.rotate and rng.random() < cfg.rotate:
        ids, _ = rotate(ids, rng)
    return ids


class DaeObjective:
    name = "dae"

    def __init__(self, noise: NoiseConfig = BART):
        self.noise = noise
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._word_starts: np.ndarray | None = None

    @classmethod
    def from_options(cls, options: str) -> "DaeObjective":
        return cls(NoiseConfig.parse(options))

    @property
    def options(self) -> str:
        return self.noise.options()

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> BartForConditionalGeneration:
        return fresh_bart(tokenizer, self.name, size, max_length, seed)

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        specials = special_tokens(tokenizer, self.name)
        starts = self.word_starts(tokenizer)
        sources, targets = [], []
        for doc in docs:
            sentences = fit_sentences(doc, max_length - 2)
            noised = noise_document(sentences, self.noise, rng, specials.mask, starts)
            # Insertions can lengthen the text; the encoder's positions stop at max_length.
            sources.append([specials.start, *noised[:max_length - 2], specials.end])
            targets.append([specials.start, *flatten(sentences, max_length - 2), specials.end])
        input_ids = pad(sources, specials.pad)
        return {"input_ids": input_ids, "attention_mask": (input_ids != specials.pad).long(),
                "labels": pad(targets, -100)}

    def loss(self, model: BartForConditionalGeneration, batch: Batch) -> torch.Tensor:
        # BART shifts the labels right (prepending eos) to make the decoder's inputs.
        return model(**batch).loss

    def deliverable(self, model: BartForConditionalGeneration) -> PreTrainedModel:
        return model

    def word_starts(self, tokenizer: PreTrainedTokenizerBase) -> np.ndarray | None:
        if not self.noise.whole_words:
            return None
        if self._tokenizer is not tokenizer:
            self._tokenizer, self._word_starts = tokenizer, word_start_table(tokenizer)
        return self._word_starts


@register_objective("dae", with_options=DaeObjective.from_options)
def dae_objective() -> DaeObjective:
    """BART's final recipe: sentence permutation + text infilling (30% of words, Poisson 3)."""
    return DaeObjective(BART)
