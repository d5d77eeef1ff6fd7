"""The quantization modes at export: static int8, int4, fp16, torch-dynamic-int8, the floor."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from compressor.cli import main
from compressor.evaluate import evaluate_path, load_predictor
from compressor.export.gate import GateFailure
from compressor.export.onnx import ExportSettings, export_bundle
from pretrain.errors import UserError

LOOSE = ExportSettings(optimize=True, accuracy_tolerance=1.0)   # random tiny models: gate on mechanics


def export(bundle, task, path, settings=LOOSE, **quantize):
    return export_bundle(bundle.replace(deploy={"quantize": quantize}), path, settings, task).record


def op_counts(path) -> Counter:
    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def float_weight_bytes(path) -> int:
    graph = onnx.load(str(path)).graph
    return sum(np.prod(t.dims) * 4 for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT)


@pytest.mark.parametrize("calibration, fmt", [("minmax", "qdq"), ("entropy", "qoperator"),
                                              ("percentile", "qdq")])
def test_static_int8_calibrates_activations(sliced_bundle, tiny_task, tmp_path, calibration, fmt):
    record = export(sliced_bundle, tiny_task, tmp_path / "s", mode="static-int8", calibration=calibration,
                    format=fmt, calibration_samples=64)
    assert record["precision"] == "static-int8" and record["optimized"] is True
    assert record["quantization"]["calibration"] == calibration and record["quantization"]["per_channel"]
    ops = op_counts(tmp_path / "s" / "model.onnx")
    if fmt == "qdq":
        # Activations are quantized too: more QuantizeLinear nodes than just the inputs' lookups.
        assert ops["QuantizeLinear"] >= 4 and ops["DequantizeLinear"] > ops["QuantizeLinear"]
    else:
        assert ops["QLinearMatMul"] >= 4 or ops["QAttention"] >= 1
    assert record["size_ratio_to_fp32"] <= 0.40
    assert 0 <= record["agreement_with_fp32"] <= 1


def test_calibration_set_smaller_than_asked_is_one_line_and_writes_nothing(tiny_bundle, tiny_task, tmp_path):
    with pytest.raises(UserError) as err:
        export(tiny_bundle, tiny_task, tmp_path / "s", mode="static-int8", calibration_samples=1000)
    message = str(err.value)
    assert "calibration set too small" in message and "calibration_samples=1000" in message
    assert f"has {len(tiny_task.split('train'))} examples" in message and "\n" not in message
    assert not (tmp_path / "s").exists()


def test_int4_weight_only_packs_matmuls_and_the_embedding(sliced_bundle, tiny_task, tmp_path):
    record = export(sliced_bundle, tiny_task, tmp_path / "q", mode="int4-weight-only", block_size=16)
    ops = op_counts(tmp_path / "q" / "model.onnx")
    assert ops["MatMulNBits"] >= 4 * 4 and ops["GatherBlockQuantized"] >= 1
    assert record["optimized"] is False and "int4-weight-only quantizes the unfused graph" in record["fusion_fallback"]
    # 4-bit weights plus one fp32 scale per 16 weights: well under a quarter of fp32.
    assert record["size_ratio_to_fp32"] <= 0.22


def test_fp16_keeps_io_fp32_and_warns_on_cpu(tiny_bundle, tiny_task, tmp_path, capsys):
    record = export(tiny_bundle, tiny_task, tmp_path / "h", mode="fp16")
    model = onnx.load(str(tmp_path / "h" / "model.onnx"))
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    halves = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert sum(np.prod(t.dims) for t in halves) > 0.9 * tiny_bundle.params
    assert record["precision"] == "fp16" and record["size_ratio_to_fp32"] <= 0.55
    cpu_only = set(ort.get_available_providers()) <= {"CPUExecutionProvider", "AzureExecutionProvider"}
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: fp16")]
    assert len(warning) == (1 if cpu_only else 0)


def test_torch_dynamic_int8_saves_only_int8_weights_and_loads_back(tiny_bundle, tiny_task, tmp_path, capsys):
    out = tmp_path / "t"
    record = export(tiny_bundle, tiny_task, out, mode="torch-dynamic-int8")
    assert record["format"] == "torch" and record["precision"] == "torch-dynamic-int8"
    assert (out / "model.int8.pt").is_file()
    assert not list(out.glob("*.safetensors")) and not list(out.glob("*.onnx"))
    assert record["size_bytes"] == (out / "model.int8.pt").stat().st_size
    assert record["size_ratio_to_fp32"] <= 0.35          # Linear layers and word embedding in int8
    predictor = load_predictor(out)
    # Named as report.json and `compressor bench` name it: the runtime, then the precision.
    assert (predictor.kind, predictor.precision) == ("torch", "torch-dynamic-int8")
    result = evaluate_path(str(out), tiny_task.spec)
    assert result["accuracy"] == pytest.approx(record["accuracy"])
    assert main(["evaluate", "--model", str(out), "--task", tiny_task.spec["path"]]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["kind"], printed["precision"]) == ("torch", "torch-dynamic-int8")


def test_accuracy_floor_names_the_shortfall(tiny_bundle, tiny_task, tmp_path):
    settings = ExportSettings(optimize=False, accuracy_tolerance=1.0, min_accuracy=0.99)
    with pytest.raises(GateFailure) as err:
        export(tiny_bundle, tiny_task, tmp_path / "q", settings, mode="dynamic-int8")
    message = str(err.value)
    assert "falls below the accuracy floor (min_accuracy, --min-accuracy)" in message and "points under min_accuracy 0.9900" in message
    assert "\n" not in message and not (tmp_path / "q").exists()


def test_inc_autotunes_in_pytorch_and_ships_its_choice_as_onnx(tiny_bundle, tiny_task, tmp_path):
    record = export(tiny_bundle, tiny_task, tmp_path / "i", mode="inc", calibration_samples=30,
                    tolerable_loss=0.0, max_trials=2)
    inc = record["inc"]
    assert record["precision"] == "inc" and record["quantization"]["mode"] == "inc"
    assert inc["validation_samples"] == 30 and 1 <= len(inc["trials"]) <= 2
    assert inc["trials"][0]["config"] == {"w_granularity": "per_channel", "w_sym": True}
    assert all(0 <= t["accuracy"] <= 1 for t in inc["trials"]) and 0 <= inc["baseline_accuracy"] <= 1
    # INC's rule: stop at the first trial within the relative loss, else take the most accurate.
    accuracies = [t["accuracy"] for t in inc["trials"]]
    meets = [a >= inc["baseline_accuracy"] for a in accuracies]
    assert not any(meets[:-1])
    expected = len(meets) - 1 if meets[-1] else int(np.argmax(accuracies))
    assert inc["chosen"] == inc["trials"][expected]["config"] and inc["met_tolerable_loss"] == meets[-1]
    assert inc["realised_as"]["per_channel"] == (inc["chosen"]["w_granularity"] == "per_channel")
    assert op_counts(tmp_path / "i" / "model.onnx")["DynamicQuantizeLinear"] >= 1
    assert record["size_ratio_to_fp32"] <= 0.30


def test_static_int8_of_an_unfused_graph_leaves_nothing_in_the_working_dir(tiny_bundle, tiny_task, tmp_path,
                                                                             monkeypatch):
    # ORT's symbolic shape inference gives up on the unfused graph and dumps its partial
    # model into the working dir; the exporter must keep that out of the user's files.
    monkeypatch.chdir(tmp_path)
    settings = ExportSettings(optimize=False, accuracy_tolerance=1.0)
    record = export(tiny_bundle, tiny_task, tmp_path / "s", settings, mode="static-int8", calibration_samples=32)
    assert record["precision"] == "static-int8" and record["optimized"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
