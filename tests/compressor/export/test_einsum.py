"""XLNet's weight einsums rewritten as MatMuls: the same function, named or not."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from compressor.export.einsum import PROJECT_IN, PROJECT_OUT, weight_einsums_as_matmuls


def test_unnamed_einsum_nodes_become_matmuls_with_the_same_outputs(tmp_path):
    """The TorchScript exporter may leave nodes unnamed: the rewrite names them by their output."""
    rng = np.random.default_rng(0)
    w_in = numpy_helper.from_array(rng.standard_normal((8, 2, 4)).astype(np.float32), "w_in")
    w_out = numpy_helper.from_array(rng.standard_normal((8, 2, 4)).astype(np.float32), "w_out")
    nodes = [helper.make_node("Einsum", ["x", "w_in"], ["heads"], equation=PROJECT_IN),            # unnamed
             helper.make_node("Einsum", ["heads", "w_out"], ["y"], equation=PROJECT_OUT, name="out_proj")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2, 8])], [w_in, w_out])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    before = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert weight_einsums_as_matmuls(path) == 2
    rewritten = onnx.load(str(path))
    assert {n.op_type for n in rewritten.graph.node} >= {"MatMul"} and "Einsum" not in {n.op_type for n in rewritten.graph.node}
    after = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
