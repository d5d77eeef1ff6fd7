"""Models as they ship (`Deployable`), the batches they are measured on, and their runners.

What is timed is one inference call on a prepared batch (`session.run` for ONNX Runtime,
`model(**batch)` under inference mode for PyTorch): a Runner's `prepare` builds the
runtime's inputs before the clock starts, so the harness adds a perf_counter pair per call
and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import numpy as np

from compressor.bench.profiles import Profile, ort_session_options
from pretrain.batching import MAX_LENGTH
from pretrain.data import Split
from pretrain.errors import UserError
from pretrain.models import first_line

Feed = dict[str, np.ndarray]
MAX_DISTINCT_BATCHES = 64     # real batches cycled through by the timed iterations


@dataclass(frozen=True)
class Runner:
    """A loaded model: `prepare` turns a batch into the runtime's inputs (untimed), `run` infers."""

    prepare: Callable[[Feed], object]
    run: Callable[[object], object]


@dataclass(frozen=True)
class Deployable:
    """A model as it ships: a PyTorch HF dir or an ONNX file."""

    name: str
    kind: Literal["torch", "onnx"]
    path: Path                 # HF model dir (torch) or model .onnx file
    precision: str             # fp32, dynamic-int8, static-int8, fp16, ...
    # (profile name, path) where a profile measures another build of this model: the Optimum
    # baseline is built with each profile's own preset.
    on_profiles: tuple[tuple[str, Path], ...] = ()

    def on(self, profile: str) -> "Deployable":
        """This model as `profile` measures it."""
        path = dict(self.on_profiles).get(profile, self.path)
        return Deployable(self.name, self.kind, path, self.precision)


def input_batches(tokenizer, split: Split, batch_size: int, sequence_length: int | str,
                  count: int = MAX_DISTINCT_BATCHES, max_length: int = MAX_LENGTH,
                  positions: int | None = None) -> list[Feed]:
    """Up to `count` batches of the split in its own order (not sorted by length).

    `real`: each batch padded to its longest member, as a server batching requests would,
    texts cut at `max_length` (pass `usable_length(model)`: the model's positions bound it);
    an int: every text truncated or padded to exactly that many tokens, at most the model's
    `positions` (`model_positions(model)`; `max_length` when not given). Not capped at the
    tokenizer's `model_max_length`: an export's is the length it was gated at, and timing the
    model at a longer shape it can run is a fair question.
    """
    max_length = min(max_length, tokenizer.model_max_length)   # the tokenizer knows its family's limit
    n = min(len(split), batch_size * count)
    if n < batch_size:
        raise UserError(f"the test split has {len(split)} examples, fewer than batch size {batch_size}")
    longest = positions or max_length
    if sequence_length != "real" and int(sequence_length) > longest:
        limit = f"the model's {longest} positions" if positions else f"the {longest} tokens texts are cut at"
        raise UserError(f"sequence length {sequence_length} is longer than {limit}; "
                        f"expected a sequence length of at most {longest} (or 'real')")
    n -= n % batch_size
    texts, pairs = split.texts[:n], (split.text_pairs[:n] if split.text_pairs is not None else None)
    padding = dict(padding="longest", max_length=max_length) if sequence_length == "real" else \
        dict(padding="max_length", max_length=int(sequence_length))
    batches = []
    for start in range(0, n, batch_size):
        args = (texts[start:start + batch_size],) + \
            ((pairs[start:start + batch_size],) if pairs is not None else ())
        enc = tokenizer(*args, truncation=True, return_tensors="np", **padding)
        batches.append({k: v.astype(np.int64) for k, v in enc.items()})
    return batches


def onnx_session(path: Path, profile: Profile):
    import onnxruntime as ort
    options = ort_session_options(profile.thread_count(), profile.graph_optimization)
    providers = [profile.provider] + (["CPUExecutionProvider"] if profile.provider != "CPUExecutionProvider" else [])
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as err:  # onnxruntime raises its own exception types for bad files
        raise UserError(f"cannot load ONNX model {path}: {first_line(err)}") from None


def onnx_runner(path: Path, profile: Profile) -> Runner:
    session = onnx_session(path, profile)
    wanted = {i.name for i in session.get_inputs()}

    return Runner(prepare=lambda feed: {k: v for k, v in feed.items() if k in wanted},
                  run=lambda feed: session.run(None, feed))


def torch_runner(path: Path, profile: Profile) -> Runner:
    import inspect

    import torch

    model = load_torch_model(Path(path))
    device = torch.device("cuda" if profile.device == "cuda" else "cpu")
    model.to(device).eval()
    wanted = set(inspect.signature(model.forward).parameters)

    def prepare(feed: Feed) -> dict:
        return {k: torch.from_numpy(v).to(device) for k, v in feed.items() if k in wanted}

    def run(batch: dict) -> object:
        with torch.inference_mode():
            out = model(**batch).logits
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out
    return Runner(prepare=prepare, run=run)


def load_torch_model(path: Path):
    """An HF model dir, or a torch-dynamic-int8 deployment dir (int8 state dict + config)."""
    from compressor.export.torch_int8 import is_int8_dir, load_int8_model
    if is_int8_dir(path):
        return load_int8_model(path)
    from pretrain.models import load_saved_classifier
    return load_saved_classifier(path)[0]


def load_runner(model: Deployable, profile: Profile, ids: np.ndarray | None = None) -> Runner:
    """The model's runner; `ids` (from `id_translation`) renumbers the batches' token ids
    for a model with a vocabulary of its own, in `prepare`, before the clock starts."""
    runner = (onnx_runner if model.kind == "onnx" else torch_runner)(model.path, profile)
    if ids is None:
        return runner
    return Runner(prepare=lambda feed: runner.prepare(translated(feed, ids)), run=runner.run)


def id_translation(model: Deployable, tokenizer) -> np.ndarray | None:
    """For a model whose tokenizer keeps part of `tokenizer`'s vocabulary (`trim-vocab`): the
    model's id of each of `tokenizer`'s ids, its unknown token's for a token it dropped; None
    when the model's dir holds the same vocabulary (or no tokenizer).

    Every model of a benchmark is fed the same batches (the reference tokenizer's), so their
    shapes, which set the latency, are the same for all; a trimmed model sees them renumbered.
    """
    from pretrain.models import load_tokenizer
    try:
        own = load_tokenizer(model.path if model.kind == "torch" else Path(model.path).parent)
    except UserError:
        return None
    reference, vocab = tokenizer.get_vocab(), own.get_vocab()
    if vocab == reference:
        return None
    table = np.full(max(reference.values()) + 1, own.unk_token_id, dtype=np.int64)
    for token, index in reference.items():
        table[index] = vocab.get(token, own.unk_token_id)
    return table


def translated(feed: Feed, ids: np.ndarray | None) -> Feed:
    return feed if ids is None else {**feed, "input_ids": ids[feed["input_ids"]]}
