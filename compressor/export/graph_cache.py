"""The fp32 graphs one run has exported, by what they are made from.

A recipe's variants often export the same weights more than once: the teacher as it is,
its dynamic int8 and its static int8 are three exports of one model, and a 3-layer model is
shipped in fp32 and in int8. Each export traces that model, fuses the graph, checks parity
twice and scores the fused graph on the test split before it quantizes anything. With an
`Fp32Graphs` of the run, the later exports start from the first one's gated, scored graph:
the same file, record and test logits they would have computed, without the minutes.

The key holds everything the fp32 graph and its gate depend on: the model's class, config
and every tensor's bytes, the tokenizer's inputs as encoded for the gate, the export
settings, the fusions left out and the embedding rank. Graphs live in a scratch dir for the
run's exports and go with it; the pipeline gives the store only to the exports of models that
more than one of its stages hold (pipeline/run.py), so that only graphs read again are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from compressor.bundle import ModelBundle
from compressor.export.gate import Gate
from pretrain.atomic import scratch_dir
from pretrain.batching import Encoded


@dataclass(frozen=True)
class Fp32Graph:
    """A gated fp32 (fused where it applies) graph, its export record and its test logits."""

    path: Path
    record: dict
    logits: np.ndarray


@dataclass
class Fp32Graphs:
    """The fp32 graphs kept so far, in `directory`, by `fp32_graph_key`."""

    directory: Path
    kept: dict[str, Fp32Graph] = field(default_factory=dict)

    def get(self, key: str) -> Fp32Graph | None:
        return self.kept.get(key)

    def keep(self, key: str, graph: Fp32Graph) -> None:
        path = self.directory / f"{key}.onnx"
        shutil.copyfile(graph.path, path)
        self.kept[key] = Fp32Graph(path, dict(graph.record), graph.logits.copy())


@contextlib.contextmanager
def fp32_graphs() -> Iterator[Fp32Graphs]:
    """An empty store for one run's exports; its graphs are deleted on leaving."""
    with scratch_dir("graphs") as directory:
        yield Fp32Graphs(Path(directory))


def fp32_graph_key(bundle: ModelBundle, settings_json: str, gate: Gate, fusion: object) -> str:
    """What the fp32 graph of `bundle` and its gate's measurements are made from; `fusion`:
    how it is fused (whether, and the fusions left out: a frozen dataclass, keyed by its repr)."""
    digest = hashlib.sha256()
    model = bundle.model
    digest.update(json.dumps([type(model).__name__, model.config.to_json_string(), settings_json,
                              list(bundle.tokenizer.model_input_names), bundle.deploy.get("embedding_rank"),
                              repr(fusion)], default=str).encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor_bytes(tensor))
    for data in (gate.data, gate.parity_data):
        digest.update(encoded_bytes(data))
    digest.update(gate.labels.tobytes())
    digest.update(np.asarray(gate.to_task).tobytes())
    return digest.hexdigest()[:32]


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's raw bytes, whatever its dtype (numpy has no bfloat16)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def encoded_bytes(data: Encoded) -> bytes:
    return json.dumps([data.input_ids, data.token_type_ids, data.pad_id, data.pad_left]).encode() + \
        np.asarray(data.labels).tobytes()
