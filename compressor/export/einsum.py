"""XLNet's attention projections as MatMuls, so that the quantizers see their weights.

XLNet keeps its query, key, value, output and relative-position projections as [hidden,
heads, head_dim] parameters applied with einsum (`ibh,hnd->ibnd`, and `ibnd,hnd->ibh` for the
output), which the TorchScript exporter writes as ONNX Einsum nodes. ONNX Runtime's
quantizers (dynamic and static int8, 4-bit MatMulNBits) act on MatMul and Gather only, so
these weights, 5 of XLNet's 13 hidden x hidden matrices per layer, would stay fp32 in every
int8 and int4 export. Each such Einsum is the MatMul of the input with the weight viewed as
a [hidden, heads * head_dim] matrix, plus a reshape: the same products and sums, which the
exporter's parity gate checks like every other graph.
"""

from __future__ import annotations

from pathlib import Path

# einsum equation -> how it becomes a MatMul
PROJECT_IN = "ibh,hnd->ibnd"    # x [i, b, h] times W [h, n, d]: MatMul(x, W as [h, n*d]), reshape to [i, b, n, d]
PROJECT_OUT = "ibnd,hnd->ibh"   # x [i, b, n, d] times W [h, n, d]: reshape x to [i, b, n*d], MatMul(x, W as [n*d, h])


def weight_einsums_as_matmuls(path: Path) -> int:
    """Rewrite the graph at `path` in place; return how many Einsum nodes became MatMuls."""
    import onnx
    from onnx import helper, numpy_helper
    model = onnx.load(str(path))
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes, added, rewritten = [], {}, 0
    for node in graph.node:
        equation = next((helper.get_attribute_value(a).decode() for a in node.attribute if a.name == "equation"), "")
        weight = weights.get(node.input[1]) if node.op_type == "Einsum" and len(node.input) == 2 else None
        if weight is None or len(weight.dims) != 3 or equation.replace(" ", "") not in (PROJECT_IN, PROJECT_OUT):
            nodes.append(node)
            continue
        h, n, d = weight.dims
        matrix = numpy_helper.to_array(weight).reshape(h, n * d)
        x, out = node.input[0], node.output[0]
        name = node.name or out       # an unnamed node is named by its output
        if equation.replace(" ", "") == PROJECT_IN:
            added[f"{weight.name}.matrix"] = numpy_helper.from_array(matrix, f"{weight.name}.matrix")
            added[f"{name}.shape"] = numpy_helper.from_array(_shape([0, 0, n, d]), f"{name}.shape")
            nodes += [helper.make_node("MatMul", [x, f"{weight.name}.matrix"], [f"{out}.flat"], name=f"{name}/MatMul"),
                      helper.make_node("Reshape", [f"{out}.flat", f"{name}.shape"], [out], name=f"{name}/Reshape")]
        else:
            added[f"{weight.name}.matrix_t"] = numpy_helper.from_array(matrix.T.copy(), f"{weight.name}.matrix_t")
            added[f"{name}.shape"] = numpy_helper.from_array(_shape([0, 0, n * d]), f"{name}.shape")
            nodes += [helper.make_node("Reshape", [x, f"{name}.shape"], [f"{x}.flat/{name}"], name=f"{name}/Reshape"),
                      helper.make_node("MatMul", [f"{x}.flat/{name}", f"{weight.name}.matrix_t"], [out],
                                       name=f"{name}/MatMul")]
        rewritten += 1
    if rewritten:
        used = {i for node in nodes for i in node.input}
        kept = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept + list(added.values()))
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.save(model, str(path))
    return rewritten


def _shape(dims: list[int]):
    import numpy as np
    return np.asarray(dims, dtype=np.int64)   # Reshape: 0 keeps that input dimension
