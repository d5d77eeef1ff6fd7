"""The run's fp32 graphs: an export of a model already exported starts from its gated, scored
graph, and writes what it would have written without it; any change to what the graph is
made from is a new graph."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from compressor.export import onnx as export_onnx
from compressor.export.graph_cache import fp32_graphs
from compressor.export.onnx import ExportSettings, export_into

INT8 = {"quantize": {"mode": "dynamic-int8"}}
STATIC_LINEARS = {"quantize": {"mode": "static-int8", "scope": "linears", "calibration_samples": 16}}


@pytest.fixture
def traces(count_calls) -> list:
    """Every graph traced to ONNX (one entry per trace)."""
    return count_calls(export_onnx, "write_onnx")


def exported(tmp_path, name, bundle, settings, task, graphs=None):
    directory = tmp_path / name
    directory.mkdir()
    result = export_into(directory, bundle, settings, task, graphs=graphs)
    return result, (directory / "model.onnx").read_bytes()


def test_the_int8_export_of_an_exported_model_starts_from_its_graph_and_writes_the_same(
        tiny_bundle, tiny_task, fast_settings, tmp_path, traces):
    alone_fp32, alone_fp32_file = exported(tmp_path, "alone-fp32", tiny_bundle, fast_settings, tiny_task)
    alone_int8, alone_int8_file = exported(tmp_path, "alone-int8", tiny_bundle.replace(deploy=INT8),
                                           fast_settings, tiny_task)
    assert len(traces) == 2
    with fp32_graphs() as graphs:
        fp32, fp32_file = exported(tmp_path, "fp32", tiny_bundle, fast_settings, tiny_task, graphs)
        int8, int8_file = exported(tmp_path, "int8", tiny_bundle.replace(deploy=INT8), fast_settings, tiny_task,
                                   graphs)
        store = graphs.directory
        assert len(list(store.iterdir())) == 1
    assert len(traces) == 3             # the int8 export traced nothing
    assert not store.exists()           # the store goes with the run's exports
    for shared, alone in ((fp32, alone_fp32), (int8, alone_int8)):
        assert {k: v for k, v in shared.record.items() if k != "path"} == \
            {k: v for k, v in alone.record.items() if k != "path"}
        np.testing.assert_array_equal(shared.predictions, alone.predictions)
    assert (fp32_file, int8_file) == (alone_fp32_file, alone_int8_file)
    assert json.loads((tmp_path / "int8" / "export.json").read_text())["precision"] == "dynamic-int8"


def test_another_weight_setting_or_fusion_is_another_graph(tiny_bundle, tiny_task, fast_settings, tmp_path, traces):
    changed = tiny_bundle.replace(model=tiny_bundle.copy_model())
    with torch.no_grad():
        changed.model.classifier.bias[0] += 0.5
    with fp32_graphs() as graphs:
        exported(tmp_path, "a", tiny_bundle, fast_settings, tiny_task, graphs)
        exported(tmp_path, "b", changed, fast_settings, tiny_task, graphs)              # one weight
        exported(tmp_path, "c", tiny_bundle, ExportSettings(cls_only_last_layer=False), tiny_task, graphs)
        # static int8 of the Linears only: their MatMuls and the embedding Gather stay unfused
        exported(tmp_path, "d", tiny_bundle.replace(deploy=STATIC_LINEARS), fast_settings, tiny_task, graphs)
        assert len(traces) == len(list(graphs.directory.iterdir())) == 4
        exported(tmp_path, "e", changed.replace(deploy=INT8), fast_settings, tiny_task, graphs)
        assert len(traces) == 4          # the changed model's graph, again


def test_a_quantization_step_cannot_change_the_kept_graph(tiny_bundle, tiny_task, fast_settings, tmp_path,
                                                          monkeypatch):
    """Quantizing reads a copy: a step that wrote to its input would otherwise change what the
    next export of the same model starts from."""
    real = export_onnx.quantize_onnx

    def scribbling(graph, target, cfg, plan):
        real(graph, target, cfg, plan)
        changed = onnx.load(str(graph))
        changed.doc_string = "changed by the quantizer"
        onnx.save(changed, str(graph))
    monkeypatch.setattr(export_onnx, "quantize_onnx", scribbling)
    with fp32_graphs() as graphs:
        _, first = exported(tmp_path, "fp32", tiny_bundle, fast_settings, tiny_task, graphs)
        exported(tmp_path, "int8", tiny_bundle.replace(deploy=INT8), fast_settings, tiny_task, graphs)
        _, again = exported(tmp_path, "fp32-again", tiny_bundle, fast_settings, tiny_task, graphs)
    assert again == first
