"""The `quantize` pass and dynamic int8 at export: size, embeddings, options and the accuracy gate."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from compressor.bundle import ModelBundle
from compressor.cli import main
from compressor.export import onnx as export_onnx
from compressor.export.gate import GateFailure
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.export.trace import write_onnx
from compressor.passes import Context, apply_pass, get_pass
from compressor.pipeline.recipe import parse_step
from pretrain.batching import encode
from pretrain.errors import UserError
from pretrain.finetune import predict_logits

from .conftest import relabelled

def quantize_step(**config):
    return parse_step({"quantize": config}, "variants.v[0]").config


def test_pass_records_the_precision_and_keeps_the_weights(tiny_bundle, tiny_task, tmp_path):
    cfg = quantize_step(per_channel=True)
    out = apply_pass(tiny_bundle, "quantize", cfg, Context(task=tiny_task, show_progress=False))
    assert out.deploy["quantize"]["mode"] == "dynamic-int8"
    assert out.deploy["quantize"]["per_channel"] is True and out.deploy["quantize"]["weight_type"] == "qint8"
    assert tiny_bundle.deploy == {}
    assert get_pass("quantize").preserves_function
    loaded = ModelBundle.load(out.save(tmp_path / "q"))
    assert loaded.deploy == out.deploy and loaded.history == out.history


@pytest.mark.parametrize("config, why", [
    ({"calibration": "percentile"}, "calibration applies to quantize mode static-int8, not dynamic-int8"),
    ({"mode": "fp16", "per_channel": True}, "per_channel applies to quantize mode"),
    ({"mode": "static-int8", "block_size": 64}, "block_size applies to quantize mode int4-weight-only"),
    # A check of the one field is that field's error (`--block-size` on the command line).
    ({"mode": "int4-weight-only", "block_size": 48},
     "quantize.block_size: expected a power of 2 >= 16, such as 32 or 64 (got 48)"),
    # A check across fields names them as a recipe writes them (the command line: --scope linears).
    ({"mode": "static-int8", "scope": "linears", "format": "qoperator"},
     "quantize: scope: linears writes a QDQ graph; expected format: qdq with it, or scope: ops"),
])
def test_options_of_another_mode_are_rejected(config, why):
    with pytest.raises(UserError) as err:
        quantize_step(**config)
    assert why in str(err.value) and "variants.v[0].quantize" in str(err.value)
    assert "\n" not in str(err.value)


def test_per_channel_default_depends_on_the_mode():
    assert quantize_step().per_channel is False
    assert quantize_step(mode="static-int8").per_channel is True
    assert quantize_step(mode="static-int8", per_channel=False).per_channel is False
    # The dumped config validates back to itself (compressor.json round trip).
    assert quantize_step(mode="static-int8").calibration == "entropy"
    cfg = quantize_step(mode="static-int8", calibration="percentile")
    assert type(cfg).model_validate(cfg.model_dump(mode="json")) == cfg


def test_unknown_mode_and_weight_type_are_rejected():
    with pytest.raises(UserError, match="dynamic-int8"):
        quantize_step(mode="int2")
    with pytest.raises(UserError, match="qint8"):
        quantize_step(weight_type="int4")


def test_each_mode_is_its_own_frozen_config_with_only_its_options():
    from compressor.export.quantize import (MODE_CONFIGS, ONNX_QUANTIZERS, DynamicInt8Config, Fp16Config,
                                            QuantizeConfig, StaticInt8Config, quantize_config_from_record)
    cfg = quantize_step(mode="static-int8", calibration="minmax")
    assert type(cfg) is StaticInt8Config and QuantizeConfig(mode="static-int8", calibration="minmax") == cfg
    assert type(quantize_step()) is DynamicInt8Config and set(Fp16Config.model_fields) == {"mode"}
    assert {mode: type(QuantizeConfig.model_validate({"mode": mode})) for mode in MODE_CONFIGS} == MODE_CONFIGS
    assert set(quantize_step().model_dump()) == {"mode", "per_channel", "reduce_range", "weight_type"}
    # The ONNX quantizers are found by config type, one per mode that acts on a graph.
    assert {c.model_fields["mode"].default for c in ONNX_QUANTIZERS} == {"dynamic-int8", "static-int8",
                                                                         "int4-weight-only", "fp16"}
    # compressor.json written before the split held every mode's options at their defaults.
    legacy = {"mode": "dynamic-int8", "per_channel": True, "reduce_range": False, "weight_type": "qint8",
              "calibration": "entropy", "format": "qdq", "scope": "ops", "calibration_samples": 512,
              "block_size": 32, "tolerable_loss": 0.01, "max_trials": 8}
    assert quantize_config_from_record(legacy) == DynamicInt8Config(per_channel=True)
    assert get_pass("quantize").config_type is QuantizeConfig
    from compressor.passes import pass_name_of
    assert pass_name_of(cfg) == "quantize"


def fp32_initializers(path) -> list[tuple[str, tuple[int, ...]]]:
    graph = onnx.load(str(path)).graph
    return [(t.name, tuple(t.dims)) for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT]


@pytest.mark.parametrize("optimize, options", [
    (False, {}),
    (True, {"per_channel": True, "weight_type": "quint8"}),
    (True, {"reduce_range": True}),
])
def test_dynamic_int8_quantizes_embeddings_and_shrinks_the_file(sliced_bundle, tiny_task, tmp_path, optimize, options):
    bundle = sliced_bundle.replace(deploy={"quantize": {"mode": "dynamic-int8", **options}})
    settings = ExportSettings(optimize=optimize, accuracy_tolerance=1.0)
    record = export_bundle(bundle, tmp_path / "q", settings, tiny_task).record
    assert record["precision"] == "dynamic-int8" and record["quantization"]["mode"] == "dynamic-int8"
    assert record["optimized"] is optimize
    # The word embeddings (vocab x hidden) dominate the tiny model: int8 must cover them.
    vocab = bundle.model.config.vocab_size
    assert not [name for name, dims in fp32_initializers(tmp_path / "q" / "model.onnx") if vocab in dims]
    # int8 weights are a quarter of fp32; the graph's own nodes weigh more in a tiny model
    # (MiniLM's int8 file is about 25.5% of fp32).
    assert record["size_ratio_to_fp32"] <= 0.30
    assert record["size_bytes"] == (tmp_path / "q" / "model.onnx").stat().st_size
    assert 0 <= record["agreement_with_fp32"] <= 1
    assert record["accuracy_change"] == pytest.approx(record["accuracy"] - record["accuracy_fp32"])


@pytest.fixture
def self_labelled(tiny_bundle, tiny_task):
    """The tiny task with test labels = the fp32 model's predictions: fp32 accuracy is 1.0."""
    return relabelled(tiny_task, split_logits(tiny_bundle, tiny_task).argmax(axis=1))


def split_logits(bundle, task) -> np.ndarray:
    return predict_logits(bundle.model, encode(bundle.tokenizer, task.split("test")))


@pytest.fixture
def wrong_quantizer(tiny_bundle, self_labelled, monkeypatch):
    """A "quantizer" whose graph always predicts the fp32 model's rarest class."""
    predicted = split_logits(tiny_bundle, self_labelled).argmax(axis=1)
    rarest = np.bincount(predicted, minlength=len(self_labelled.label_names)).argmin()
    broken = tiny_bundle.copy_model()
    broken.classifier.bias.data[rarest] += 100.0
    monkeypatch.setattr(export_onnx, "quantize_onnx", lambda source, target, *args: write_onnx(broken, target))


def test_accuracy_gate_failure_writes_nothing(tiny_bundle, self_labelled, wrong_quantizer, tmp_path):
    bundle = tiny_bundle.replace(deploy={"quantize": {"mode": "dynamic-int8"}})
    with pytest.raises(GateFailure) as err:
        export_bundle(bundle, tmp_path / "q", ExportSettings(optimize=False), self_labelled)
    message = str(err.value)
    assert "dynamic-int8 model fails the accuracy gate" in message
    assert "fp32 1.0000" in message and "accuracy_tolerance allows 1.00" in message
    assert "agreement with fp32" in message and "\n" not in message
    n = len(self_labelled.split("test"))         # fewer than 100: one example outweighs the 1-point tolerance
    assert f"one of the {n} test examples is {100 / n:.2f} points, more than the tolerance" in message
    assert err.value.setting == "accuracy_tolerance"
    assert not list(tmp_path.iterdir())


def test_cli_accuracy_gate_failure_is_one_line_exit_2(tiny_bert_dir, self_labelled, wrong_quantizer,
                                                      tmp_path, monkeypatch, capsys):
    from compressor.cli import export_command
    monkeypatch.setattr(export_command, "load_task", lambda spec, seed=0: self_labelled)
    monkeypatch.setattr(export_command, "set_threads", lambda threads: None)
    code = main(["export", "--model", str(tiny_bert_dir), "--out", str(tmp_path / "q"),
                 "--quantize", "dynamic-int8", "--task", "wordnet-supersense"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith("error: dynamic-int8 model fails")
    assert "expected a larger --accuracy-tolerance (now 0.01)" in captured.err
    assert not list(tmp_path.iterdir())
