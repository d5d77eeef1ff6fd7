"""`plm`: XLNet's permutation language modelling with partial prediction (Yang et al. 2019).

For each sequence a random factorization order z of its text tokens is drawn; only the last
1/K of z (K=6: XLNet's "K = 6 or 7") are prediction targets. As in the official code the
first tokens of the order (the context, with the special tokens) see each other fully, and
no target is visible to them; target z_t sees the context and the targets before it in z.
That is what `perm_mask` encodes (perm_mask[b, i, j] = 1: i may not see j), and XLNet's
two-stream attention does the rest: the content stream additionally sees itself, the
query stream (selected by `target_mapping`, one one-hot row per target) does not.

Layout is XLNet's: `text [SEP] [CLS]` (or `</s> <s>` for a BPE tokenizer), padded on the
left so the summary token stays last, as XLNet's tokenizer does for classification.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel, PreTrainedTokenizerBase, XLNetConfig, XLNetLMHeadModel

from pretrain.objectives import Batch, Document, ModelSize, register_objective
from pretrain.objectives.noising import flatten, require_targets, special_tokens


class PlmConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    predict_every: float = Field(6.0, ge=1)     # K: predict the last 1/K of the order


def permutation_targets(n_tokens: int, maskable: np.ndarray, k: float,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's factorization: returns (targets in factorization order, perm_mask).

    `maskable` marks the positions that may be predicted (text tokens, not specials or pads).
    The order is a uniform permutation of those positions; its last round(n/K) (at least
    one) are the targets. perm_mask [n_tokens, n_tokens]: 1 where i may not see j.
    """
    candidates = np.flatnonzero(maskable)
    order = rng.permutation(candidates)
    count = max(1, round(len(candidates) / k)) if len(candidates) else 0
    targets = order[len(order) - count:]
    rank = np.full(n_tokens, -1)                 # context (and specials, pads): rank -1
    rank[targets] = np.arange(count)
    is_target = rank >= 0
    # i may not see j when j is a target not strictly earlier in the order than i.
    perm_mask = is_target[None, :] & (rank[None, :] >= rank[:, None])
    return targets, perm_mask


class PlmObjective:
    name = "plm"

    def __init__(self, config: PlmConfig = PlmConfig()):
        self.config = config

    def build_model(self, tokenizer: PreTrainedTokenizerBase, size: ModelSize, max_length: int,
                    seed: int) -> XLNetLMHeadModel:
        specials = special_tokens(tokenizer, self.name)
        torch.manual_seed(seed)
        # Relative positions: XLNet has no position table, so max_length bounds nothing here.
        config = XLNetConfig(vocab_size=specials.vocab_size, d_model=size.hidden, n_layer=size.layers,
                             n_head=size.heads, d_inner=size.intermediate, pad_token_id=specials.pad,
                             bos_token_id=specials.start, eos_token_id=specials.end)
        return XLNetLMHeadModel(config)

    def make_batch(self, docs: Sequence[Document], tokenizer: PreTrainedTokenizerBase,
                   rng: np.random.Generator, max_length: int) -> Batch:
        specials = special_tokens(tokenizer, self.name)
        seqs = [[*flatten(doc, max_length - 2), specials.end, specials.start] for doc in docs]
        length = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), length), specials.pad, dtype=torch.long)
        attention_mask = torch.zeros((len(seqs), length), dtype=torch.long)
        perm_mask = torch.zeros((len(seqs), length, length))
        all_targets = []
        for row, seq in enumerate(seqs):
            offset = length - len(seq)                       # left padding
            input_ids[row, offset:] = torch.tensor(seq)
            attention_mask[row, offset:] = 1
            maskable = np.zeros(length, dtype=bool)
            maskable[offset:] = ~np.isin(seq, list(specials.all))
            targets, mask = permutation_targets(length, maskable, self.config.predict_every, rng)
            perm_mask[row] = torch.from_numpy(mask)
            all_targets.append(targets)
        predict = max(len(t) for t in all_targets)
        require_targets(predict, self.name)
        target_mapping = torch.zeros((len(seqs), predict, length))
        labels = torch.full((len(seqs), predict), -100, dtype=torch.long)
        for row, targets in enumerate(all_targets):
            target_mapping[row, np.arange(len(targets)), targets] = 1.0
            labels[row, :len(targets)] = input_ids[row, targets]
        return {"input_ids": input_ids, "attention_mask": attention_mask, "perm_mask": perm_mask,
                "target_mapping": target_mapping, "labels": labels}

    def loss(self, model: XLNetLMHeadModel, batch: Batch) -> torch.Tensor:
        return model(**batch).loss

    def deliverable(self, model: XLNetLMHeadModel) -> PreTrainedModel:
        return model


@register_objective("plm")
def plm_objective() -> PlmObjective:
    return PlmObjective()
