"""Edits of ONNX graphs around quantization: what ORT's quantizers need before they run, and
what their output needs so that int8 reaches only the nodes it should.
"""

from __future__ import annotations

import contextlib
from pathlib import Path


def has_op(path: Path, op_type: str) -> bool:
    import onnx
    return any(n.op_type == op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def gathered_tables(graph: Path, gathers: tuple[str, ...]) -> list[str]:
    import onnx
    if not gathers:
        return []
    wanted = set(gathers)
    return [n.input[0] for n in onnx.load(str(graph), load_external_data=False).graph.node if n.name in wanted]


def unshare_initializers(path: Path, quantized: set[str]) -> None:
    """Give a quantized node its own copy of a constant that other nodes read too.

    The exporter stores identical constants once (e.g. the all-zero biases of a fresh
    model), so a Linear's bias may also be a LayerNorm's; quantizing it for the Linear
    must not hand the LayerNorm an int32-rounded copy. A table that only quantized Gathers
    read stays shared (BART's encoder and decoder look up one embedding table): it is
    quantized once, with one scale, whichever Gather reads it.

    A constant whose readers all got a copy (a weight of layers that share it, every one of
    them a quantized Linear) goes: left unread, it would make every session built on the
    graph, the quantizer's calibration session first, warn that it removes it.
    """
    import onnx
    model = onnx.load(str(path))
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in set(node.input):
            if name in initializers:
                readers.setdefault(name, []).append(node)
    copied, unread = False, set()
    for name, nodes in readers.items():
        if all(n.op_type == "Gather" and n.input[0] == name and n.name in quantized for n in nodes):
            continue
        if len(nodes) > 1 and any(n.name in quantized for n in nodes):
            for node in (n for n in nodes if n.name in quantized):
                copy = onnx.TensorProto()
                copy.CopyFrom(initializers[name])
                copy.name = f"{name}/{node.name}"
                graph.initializer.append(copy)
                node.input[:] = [copy.name if i == name else i for i in node.input]
                copied = True
            if not still_read(graph, name):
                unread.add(name)
    if unread:
        kept = [t for t in graph.initializer if t.name not in unread]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    if copied:
        onnx.save(model, str(path))


def still_read(graph, name: str) -> bool:
    """Whether a node (of the graph or a subgraph) reads `name`, or the graph has it as an
    input (a constant a caller may override) or an output."""
    return any(v.name == name for v in (*graph.input, *graph.output)) or \
        any(name in node.input for node in all_nodes(graph))


def deduplicate_initializers(path: Path) -> int:
    """Store identical constants once: every node reads the first of a set of initializers
    with the same type, shape and bytes; the others go. Returns how many went.

    The TorchScript exporter stores a tensor that several layers share once, but ORT's
    fusions and quantizers build new constants per node: a fused Attention concatenates its
    layer's Q, K and V weights, a quantizer writes each MatMul's int8 weight and scale, so
    layers that share weights (`share-layers`, ALBERT) would get one copy per layer again.
    Merging equal constants changes no value, so it is safe on any graph (run it after the
    quantizer: before, unshare_initializers may have split constants on purpose).
    """
    import hashlib

    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(path))
    graph = model.graph
    overridable = {i.name for i in graph.input}   # an initializer that is also an input stays
    first: dict[tuple, str] = {}
    renamed: dict[str, str] = {}
    for tensor in graph.initializer:
        if tensor.name in overridable:
            continue
        array = numpy_helper.to_array(tensor)
        key = (tensor.data_type, tuple(tensor.dims), hashlib.sha256(array.tobytes()).hexdigest())
        kept = first.setdefault(key, tensor.name)
        if kept != tensor.name:
            renamed[tensor.name] = kept
    if renamed:
        for node in all_nodes(graph):
            node.input[:] = [renamed.get(name, name) for name in node.input]
        kept_tensors = [t for t in graph.initializer if t.name not in renamed]
        del graph.initializer[:]
        graph.initializer.extend(kept_tensors)
        onnx.save(model, str(path))
    return len(renamed)


def read_initializers_directly(path: Path) -> int:
    """Point the readers of `Identity(initializer)` at the initializer itself; drop the Identity.

    The TorchScript exporter stores a parameter that several layers share once and hands
    every layer after the first an Identity of it. ORT's quantizers and the graph map
    (graph_map.py) only see a weight that is an initializer, so those layers' MatMuls would
    stay float. Returns how many Identity nodes went.
    """
    import onnx
    model = onnx.load(str(path))
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    source = {n.output[0]: n.input[0] for n in graph.node
              if n.op_type == "Identity" and n.input[0] in initializers and n.output[0] not in outputs}
    if not source:
        return 0
    for node in all_nodes(graph):
        node.input[:] = [source.get(name, name) for name in node.input]
    kept = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in source)]
    del graph.node[:]
    graph.node.extend(kept)
    onnx.save(model, str(path))
    return len(source)


def all_nodes(graph):
    """Every node of `graph` and of the subgraphs its nodes hold (If/Loop bodies)."""
    from onnx import AttributeProto
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                yield from all_nodes(attribute.g)
            elif attribute.type == AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from all_nodes(subgraph)


def keep_float_elsewhere(path: Path, quantized: set[str]) -> None:
    """Rewrite a QDQ graph so that int8 reaches only the `quantized` nodes.

    ORT's quantizer gives a tensor one Q/DQ pair that every consumer reads: the residual
    branch beside a Linear's input would read the rounded values too. Those consumers get
    the float tensor back. A Gather of a quantized table is turned round to gather the int8
    rows and dequantize only those (ORT would otherwise dequantize the whole 30522-row
    table on every run), which is exact for a per-tensor scale. Q/DQ nodes nobody reads
    any more are dropped.
    """
    import onnx
    from onnx import helper
    model = onnx.load(str(path))
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    initializers = {t.name for t in graph.initializer}
    nodes = []
    for node in graph.node:
        nodes.append(node)
        dq = producer.get(node.input[0]) if node.op_type == "Gather" else None
        if node.name in quantized and dq is not None and dq.op_type == "DequantizeLinear" \
                and dq.input[0] in initializers and is_scalar(graph, dq.input[1]):
            rows = f"{node.output[0]}_int8_rows"
            nodes.append(helper.make_node("DequantizeLinear", [rows, *dq.input[1:]], [node.output[0]],
                                          name=f"{node.name}_DequantizeRows"))
            node.input[0], node.output[0] = dq.input[0], rows
    del graph.node[:]
    graph.node.extend(nodes)
    producer = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        if node.name in quantized or node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for i, name in enumerate(node.input):
            dq = producer.get(name)
            q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[i] = q.input[0]   # the float tensor the pair was made from
    drop_unread_qdq(graph)
    onnx.save(model, str(path))


def is_scalar(graph, name: str) -> bool:
    return any(t.name == name and len(t.dims) == 0 for t in graph.initializer)


def drop_unread_qdq(graph) -> None:
    outputs = {o.name for o in graph.output}
    while True:
        read = {name for node in graph.node for name in node.input} | outputs
        unread = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                  and not any(o in read for o in n.output)]
        if not unread:
            break
        for node in unread:
            graph.node.remove(node)
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def with_shapes(source: Path, target: Path) -> None:
    """Annotate every tensor with its type: the static quantizer skips tensors of unknown type.

    ORT's symbolic shape inference understands the fused contrib ops (Attention,
    EmbedLayerNormalization); on graphs where it gives up, ONNX's own inference covers the
    standard ops.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process
    source, target = Path(source).resolve(), Path(target).resolve()
    # When symbolic inference gives up, ORT saves its partial model as
    # ./sym_shape_infer_temp.onnx (+ a 90 MB external-data file): run it from the target's
    # (temporary) dir so that nothing lands in the user's working dir.
    with contextlib.chdir(target.parent):
        try:
            quant_pre_process(str(source), str(target), skip_optimization=True)
        except Exception:  # "Incomplete symbolic shape inference" and friends
            try:
                # Unfused embeddings stop it at the position Add ("sequence" vs a Slice's
                # length) unless it may merge the two symbolic dims.
                quant_pre_process(str(source), str(target), skip_optimization=True, auto_merge=True)
            except Exception:
                quant_pre_process(str(source), str(target), skip_optimization=True, skip_symbolic_shape=True)


def graph_inputs(path: Path) -> set[str]:
    import onnx
    return {i.name for i in onnx.load(str(path), load_external_data=False).graph.input}
