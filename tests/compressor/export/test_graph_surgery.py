"""Graph edits around quantization: a constant that quantized nodes share is copied for each
of them, and the original goes once nothing reads it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from compressor.export.graph_surgery import unshare_initializers
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.export.quantize import QuantizeConfig
from compressor.passes import Context, apply_pass
from compressor.passes.sharing import ShareLayers


def shared_weight_graph(path) -> None:
    """x -> MatMul(W) -> MatMul(W) -> Add(b) -> Add(b): W read by two MatMuls, b by two Adds."""
    value = helper.make_tensor_value_info
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")
    bias = numpy_helper.from_array(np.ones(4, dtype=np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h1"], name="first"),
             helper.make_node("MatMul", ["h1", "W"], ["h2"], name="second"),
             helper.make_node("Add", ["h2", "b"], ["h3"], name="add1"),
             helper.make_node("Add", ["h3", "b"], ["y"], name="add2")]
    graph = helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [1, 4])],
                              [value("y", TensorProto.FLOAT, [1, 4])], [weight, bias])
    onnx.save(helper.make_model(graph), str(path))


def test_a_constant_every_reader_of_which_got_a_copy_goes(tmp_path):
    """The shared weight stayed in the graph unread, and every ONNX Runtime session built on it
    (the static quantizer's calibration first) warned 'Removing initializer ... not used'."""
    path = tmp_path / "g.onnx"
    shared_weight_graph(path)
    unshare_initializers(path, {"first", "second", "add1"})
    graph = onnx.load(str(path)).graph
    names = {t.name for t in graph.initializer}
    assert {"W/first", "W/second", "b/add1"} <= names
    assert "W" not in names             # both readers have their copies
    assert "b" in names                 # add2, not quantized, still reads it
    onnx.checker.check_model(onnx.load(str(path)))


def test_a_shared_layers_qat_export_prints_no_unused_initializer_warnings(tiny_bundle, tiny_task, tmp_path, capfd):
    """share-layers then qat exports static int8 `scope: linears`: about a dozen ONNX Runtime
    warnings on stderr, one per shared weight, though the shipped file has none unused."""
    ctx = Context(task=tiny_task, seed=0, show_progress=False)
    shared = apply_pass(tiny_bundle, "share-layers", ShareLayers(groups=1), ctx)
    int8 = apply_pass(shared, "quantize", QuantizeConfig(mode="static-int8", scope="linears", calibration_samples=16),
                      ctx)
    capfd.readouterr()
    export_bundle(int8, tmp_path / "out", ExportSettings(accuracy_tolerance=1.0), tiny_task)
    assert "Removing initializer" not in capfd.readouterr().err
