"""Tokenised examples and dynamically padded, length-grouped batches.

Glosses are short (about 16 tokens, 28 at the 95th percentile), so padding every batch to a
fixed length would spend most of the compute on pad tokens. Batches are padded only to
their longest member, and in training examples of similar length are grouped into the
same batch (within shuffled windows, so the order stays random).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.data import Split

# Tokens per example unless a caller asks otherwise (capped at the model's positions).
MAX_LENGTH = 128

# RoBERTa-style position ids start after the padding index: that many positions are unusable.
OFFSET_POSITIONS = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}

# How many batches' worth of examples are sorted by length together. Larger windows
# remove more padding; smaller ones keep batches closer to a uniform random sample.
GROUPING_WINDOW_BATCHES = 64


@dataclass(frozen=True)
class Encoded:
    """A tokenised split: one unpadded id list per example, plus labels."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None
    labels: np.ndarray  # (n,) int64
    pad_id: int
    pad_left: bool = False   # the tokenizer pads on the left (XLNet: its summary token stays last)

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> np.ndarray:
        return np.fromiter((len(ids) for ids in self.input_ids), dtype=np.int64, count=len(self))


def usable_length(model: PreTrainedModel | PretrainedConfig, max_length: int = MAX_LENGTH) -> int:
    """`max_length`, capped at the positions the model (or its config) has: a model
    pretrained here with `--max-length 64` (ELECTRA, SpanBERT) has 64 and cannot embed a
    longer sequence. Every place that encodes examples for a model asks this."""
    config = model.config if isinstance(model, PreTrainedModel) else model
    positions = getattr(config, "max_position_embeddings", None)
    if not positions or positions < 0:   # XLNet's relative positions: -1, no limit
        return max_length
    return min(max_length, positions - OFFSET_POSITIONS.get(config.model_type, 0))


def model_positions(model: PreTrainedModel | PretrainedConfig) -> int:
    """Every position the model can embed (no cap of our own): the longest sequence it can be
    run at, e.g. when a benchmark pads to a fixed length."""
    return usable_length(model, max_length=NO_POSITION_LIMIT)


NO_POSITION_LIMIT = 1 << 20     # relative positions (XLNet): nothing but memory bounds the length


def encode(tokenizer: PreTrainedTokenizerBase, split: Split, max_length: int = MAX_LENGTH) -> Encoded:
    """Tokenise a whole split once with the fast tokenizer (no padding), truncating to
    `max_length` or the tokenizer's `model_max_length` (the model's positions), if shorter."""
    max_length = min(max_length, tokenizer.model_max_length)
    if split.text_pairs is None:
        enc = tokenizer(split.texts, truncation=True, max_length=max_length)
    else:
        enc = tokenizer(split.texts, split.text_pairs, truncation="longest_first", max_length=max_length)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Encoded(input_ids=enc["input_ids"], token_type_ids=enc.get("token_type_ids"),
                   labels=np.asarray(split.labels, dtype=np.int64), pad_id=pad_id,
                   pad_left=tokenizer.padding_side == "left")


def collate(encoded: Encoded, indices: np.ndarray, with_token_types: bool = True) -> dict[str, torch.Tensor]:
    """Pad the selected examples to the longest among them."""
    rows = [encoded.input_ids[i] for i in indices]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), encoded.pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    def place(n: int) -> slice:   # where a row of n tokens goes: padding after it, or before
        return slice(width - n, width) if encoded.pad_left else slice(0, n)
    for j, r in enumerate(rows):
        input_ids[j, place(len(r))] = torch.tensor(r)
        attention_mask[j, place(len(r))] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if with_token_types and encoded.token_type_ids is not None:
        token_types = torch.zeros((len(rows), width), dtype=torch.long)
        for j, i in enumerate(indices):
            t = encoded.token_type_ids[i]
            token_types[j, place(len(t))] = torch.tensor(t)
        batch["token_type_ids"] = token_types
    batch["labels"] = torch.from_numpy(encoded.labels[indices])
    return batch


def training_order(lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                   group_by_length: bool = True) -> list[np.ndarray]:
    """One epoch of batches (index arrays): shuffled, optionally length-grouped."""
    order = rng.permutation(len(lengths))
    if group_by_length:
        window = batch_size * GROUPING_WINDOW_BATCHES
        chunks = [order[s: s + window] for s in range(0, len(order), window)]
        order = np.concatenate([c[np.argsort(lengths[c], kind="stable")] for c in chunks])
    batches = [order[s: s + batch_size] for s in range(0, len(order), batch_size)]
    # Shuffle batch order so one epoch does not walk from short to long sequences.
    return [batches[i] for i in rng.permutation(len(batches))]


def inference_order(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Batches of similar length for inference; callers scatter results back by index."""
    order = np.argsort(lengths, kind="stable")
    return [order[s: s + batch_size] for s in range(0, len(order), batch_size)]


def in_data_order(data: Encoded, batch_size: int, run: Callable[[dict[str, torch.Tensor]], object],
                  with_token_types: bool = True, columns: int | None = None) -> np.ndarray:
    """`run(batch)` over batches of similar length (`inference_order`), each result row put
    back at its example's index: an (n, columns) float32 array in data order.

    The one place that undoes the length sort, for every model kind (PyTorch, ONNX, traced).
    `columns` sizes the result of an empty `data`; otherwise the first batch's result does.
    """
    out = np.zeros((len(data), columns), dtype=np.float32) if columns is not None else None
    for idx, batch in iterate(data, inference_order(data.lengths(), batch_size), with_token_types):
        rows = run(batch)
        rows = rows.detach().float().cpu().numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)
        if out is None:
            out = np.zeros((len(data), rows.shape[1]), dtype=np.float32)
        out[idx] = rows
    return out if out is not None else np.zeros((0, 0), dtype=np.float32)


def iterate(encoded: Encoded, batches: list[np.ndarray], with_token_types: bool = True
            ) -> Iterator[tuple[np.ndarray, dict[str, torch.Tensor]]]:
    for idx in batches:
        yield idx, collate(encoded, idx, with_token_types)
