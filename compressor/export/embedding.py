"""A low-rank word embedding: V x H stored as V x r times r x H (ALBERT's factorization).

The word embedding is half of MiniLM's parameters (30522 x 384). The `factorize-embedding`
pass replaces it by its best rank-r approximation, still as one dense V x H matrix, so the
model stays an ordinary Transformers model (save_pretrained, from_pretrained, training with
`embedding_updates: frozen` keeps the rank). The exporter then stores the two factors
instead of their product: the graph's embedding Gather reads the V x r factor and a MatMul
by the r x H factor follows, so the file holds (V + H) r numbers instead of V H, and the
int8/int4 modes quantize both factors like any other Gather and MatMul.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def low_rank_factors(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(V x r, r x H) with the product closest to `weight` in Frobenius norm (truncated SVD)."""
    u, s, vh = torch.linalg.svd(weight.detach().double(), full_matrices=False)
    return (u[:, :rank] * s[:rank]).float(), vh[:rank].float()


def factorize_graph(graph: Path, embedding: torch.Tensor, rank: int) -> dict:
    """Rewrite the graph at `graph` in place: Gather(E, ids) -> MatMul(Gather(A, ids), B)."""
    import onnx
    from onnx import helper, numpy_helper
    model = onnx.load(str(graph))
    weight = embedding.detach().float().numpy()
    name = next((t.name for t in model.graph.initializer if tuple(t.dims) == weight.shape
                 and np.array_equal(numpy_helper.to_array(t), weight)), None)
    if name is None:
        raise ValueError("the word-embedding matrix is not an initializer of the exported graph")
    low, up = (f.numpy() for f in low_rank_factors(embedding, rank))
    kept = [t for t in model.graph.initializer if t.name != name]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + [numpy_helper.from_array(low, f"{name}.low_rank"),
                                           numpy_helper.from_array(up, f"{name}.up_projection")])
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        if node.op_type == "Gather" and node.input[0] == name:
            out = node.output[0]
            node.input[0], node.output[0] = f"{name}.low_rank", f"{out}.low_rank"
            nodes.append(helper.make_node("MatMul", [f"{out}.low_rank", f"{name}.up_projection"], [out],
                                          name=f"{node.name}/up_projection"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(graph))
    vocab, hidden = weight.shape
    return {"rank": rank, "parameters": (vocab + hidden) * rank, "dense_parameters": vocab * hidden}
