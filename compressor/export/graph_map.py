"""Which ONNX node computes which torch Linear layer.

Passes that work on the torch model (`sensitivity`, `qat`) name Linear modules
(`bert.encoder.layer.0.attention.self.query`); the quantizer acts on graph nodes. Names do
not survive export and fusion (the TorchScript exporter renames weights, fusion merges the
query/key/value MatMuls into one Attention node), but weight values do: a node computes a
Linear when the Linear's weight is its weight initializer, or a column block of it (fused
Attention concatenates Q, K and V). Matching values is exact and needs no naming scheme.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import nn

WEIGHT_OPS = ("MatMul", "Gemm", "Attention")


@dataclass(frozen=True)
class LinearNode:
    node: str          # the graph node that computes the Linear (possibly with others)
    activation: str    # the node's activation input: the tensor the Linear reads


def linear_nodes(graph: Path, model: nn.Module) -> dict[str, tuple[LinearNode, ...]]:
    """Linear module name -> the nodes computing it, for every Linear found in the graph:
    one, or one per layer that applies the Linear's weight (layers that share weights:
    `share-layers`, ALBERT's one layer group at every depth)."""
    import onnx
    from onnx import numpy_helper
    proto = onnx.load(str(graph))
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    candidates = []
    for node in proto.graph.node:
        if node.op_type in WEIGHT_OPS and len(node.input) > 1 and node.input[1] in weights:
            matrix = weights[node.input[1]]
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            candidates.append((node, matrix.T if trans_b else matrix))   # (in, out) like x @ B
    found = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        weight = module.weight.detach().float().numpy().T   # (in, out)
        nodes = tuple(LinearNode(node.name, node.input[0]) for node, matrix in candidates
                      if holds_block(matrix, weight))
        if nodes:
            found[name] = nodes
    return found


def holds_block(matrix: np.ndarray, weight: np.ndarray) -> bool:
    """True when `weight` (in, out) equals `matrix` or one of its out-column blocks."""
    if matrix.ndim != 2 or matrix.shape[0] != weight.shape[0] or matrix.shape[1] % weight.shape[1]:
        return False
    width = weight.shape[1]
    return any(np.array_equal(matrix[:, start:start + width], weight)
               for start in range(0, matrix.shape[1], width))


def embedding_gathers(graph: Path, model: nn.Module) -> list[str]:
    """The Gather nodes that look up word embeddings: their table has one row per vocabulary
    entry (the dense V x H matrix, or its V x r factor after `factorize-embedding`)."""
    import onnx
    proto = onnx.load(str(graph), load_external_data=False)
    vocab = model.get_input_embeddings().weight.shape[0]
    tables = {t.name for t in proto.graph.initializer if len(t.dims) == 2 and t.dims[0] == vocab}
    return [n.name for n in proto.graph.node if n.op_type == "Gather" and n.input[0] in tables]
