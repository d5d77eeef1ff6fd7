"""Every other pass and quantize mode on BART, XLNet and BiLM teachers, and a full benchmark stage.

One tiny recipe per family (the Python API, the same stages as `compressor run`): the
teacher pretrained here and fine-tuned until it predicts several classes, a static-int8
variant, both exported behind the parity and accuracy gates, then benchmarked against the
pytorch-eager-fp32 and onnxruntime-fp32 baselines. The other passes and modes run on that
fine-tuned teacher and export behind the same gates: QAT (with its int8 export of the
Linear layers), fp16, factorize-embedding followed by int4 weights, sensitivity followed by
dynamic int8, prune-ffn (BART, XLNet), and INC on BART (through the traceable view of its EOS classifier). The
BiLM's refusals (sensitivity, inc) write nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from compressor import Pipeline
from compressor.bundle import ModelBundle
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.export.quantize import QuantizeConfig
from compressor.passes import Context, apply_pass
from compressor.passes.embedding import FactorizeEmbedding
from compressor.passes.layers import DropLayers
from compressor.passes.pruning import PruneFFN
from compressor.passes.quantization import QATConfig, SensitivityConfig
from pretrain.batching import collate, encode
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig, predict_logits

pytestmark = pytest.mark.usefixtures("family_test_size")

FAMILIES = ("bart", "xlnet", "bilm")
# Fine-tuning that makes each tiny teacher predict several classes (a constant predictor
# would agree with any quantized copy of itself): 5 epochs on 240 examples.
TEACHER_LR = {"bart": 2e-3, "xlnet": 2e-3, "bilm": 1e-2}
ACCURACY_TOLERANCE = 0.1   # 3 of the 30 test examples, against each export's own fp32 graph
GATES = ExportSettings(accuracy_tolerance=ACCURACY_TOLERANCE)
# The direct exports skip ORT's fusion (seconds per BART graph); the recipe's exports fuse.
UNFUSED_GATES = ExportSettings(accuracy_tolerance=ACCURACY_TOLERANCE, optimize=False)
BASELINES = ["pytorch-eager-fp32", "onnxruntime-fp32"]
RANK = 8
# case -> the passes applied to the fine-tuned teacher before its export
CASES = {
    "qat": (QATConfig(epochs=1, batch_size=16, lr=1e-3, max_train_samples=48),),
    "fp16": (QuantizeConfig(mode="fp16"),),
    "factorized-int4": (FactorizeEmbedding(rank=RANK), QuantizeConfig(mode="int4-weight-only", block_size=16)),
    "sensitive-int8": (SensitivityConfig(keep_fraction=0.25, samples=32), QuantizeConfig(mode="dynamic-int8")),
    "pruned-ffn": (PruneFFN(fraction=0.5, samples=32),),
}


@pytest.fixture(scope="module")
def runs(pretrained, tiny_csv, family_runs):
    """family -> (out dir, report) of the family's recipe (built on first use)."""
    def recipe(family: str) -> Pipeline:
        pipe = Pipeline(f"{family}-passes", teacher=str(pretrained(family)), task={"path": str(tiny_csv)},
                        finetune=FinetuneConfig(epochs=5, batch_size=16, lr=TEACHER_LR[family]),
                        max_train_samples=240)
        pipe.variant("static", QuantizeConfig(mode="static-int8", calibration_samples=64))
        pipe.export(GATES)
        return pipe.benchmark(profiles=["cpu"], batch_sizes=[2], iterations=3, baselines=BASELINES)
    return family_runs(recipe)


def teacher(runs, family: str, task) -> ModelBundle:
    """The recipe's fine-tuned teacher, loaded afresh."""
    return ModelBundle.load(runs(family)[0] / "teacher").replace(task=task.spec)


@pytest.fixture(scope="module")
def exports(runs, tiny_task, tmp_path_factory):
    """(family, case) -> (bundle after the case's passes, its export dir, export record)."""
    root = tmp_path_factory.mktemp("family-exports")
    done = {}

    def get(family: str, case: str):
        if (family, case) not in done:
            bundle = teacher(runs, family, tiny_task)
            for config in CASES[case]:
                bundle = apply_pass(bundle, *pass_of(config), Context(task=tiny_task, show_progress=False))
            path = root / f"{family}-{case}"
            done[family, case] = bundle, path, export_bundle(bundle, path, UNFUSED_GATES, tiny_task).record
        return done[family, case]
    return get


def pass_of(config) -> tuple:
    from compressor.passes import pass_name_of
    return pass_name_of(config), config


def graph(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path / "model.onnx"))


def op_counts(path: Path) -> Counter:
    return Counter(node.op_type for node in graph(path).graph.node)


def int8_initializers(model: onnx.ModelProto) -> set[str]:
    return {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8}


def within_gates(record: dict) -> None:
    assert record["parity_max_abs_diff"] <= record["parity_tolerance"]
    assert record["accuracy_change"] >= -ACCURACY_TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_benchmark_stage_measures_the_variant_and_both_baselines(runs, family):
    out, report = runs(family)
    models = {m["name"]: m for m in report["models"]}
    assert list(models) == ["static", *BASELINES]
    for model in models.values():
        assert [(r["profile"], r["batch_size"]) for r in model["latency"]] == [("cpu", 2)]
        row = model["latency"][0]
        assert 0 < row["p50_ms"] <= row["p99_ms"] and row["throughput"] > 0 and row["peak_rss_mb"] > 10
    assert models["pytorch-eager-fp32"]["kind"] == "torch"
    assert models["pytorch-eager-fp32"]["accuracy"] == report["teacher"]["accuracy"]
    assert models["onnxruntime-fp32"]["kind"] == "onnx" and models["onnxruntime-fp32"]["agreement"] == 1.0
    assert models["static"]["size_bytes"] < 0.4 * models["onnxruntime-fp32"]["size_bytes"]
    assert "speedup vs pytorch-eager-fp32" in (out / "report.md").read_text()
    stage = json.loads((out / "teacher" / "stage.json").read_text())
    assert len(set(stage["predictions"])) >= 2      # the accuracy gates compare real predictions
    for name in ("teacher", "static"):
        within_gates(json.loads((out / f"{name}-onnx" / "export.json").read_text()))


@pytest.mark.parametrize("family", FAMILIES)
def test_static_int8_reaches_each_familys_weights(runs, family):
    """BART's one shared embedding table is quantized once; XLNet's einsum projections are
    int8 MatMuls; a BiLM's LSTMs get ORT's only int8 LSTM beside the static ops."""
    out, _ = runs(family)
    record = json.loads((out / "static-onnx" / "export.json").read_text())
    model = graph(out / "static-onnx")
    ops = Counter(node.op_type for node in model.graph.node)
    assert record["precision"] == "static-int8" and ops["QuantizeLinear"] >= 2
    if family == "bart":
        assert record["optimized"] and record["size_ratio_to_fp32"] < 0.35
    if family == "xlnet":
        quantized = int8_initializers(model)
        for projection in "qkvor":
            assert any(f"rel_attn.{projection}.matrix" in name for name in quantized), projection
    if family == "bilm":
        assert ops["DynamicQuantizeLSTM"] == 4 and ops["LSTM"] == 0
        assert record["lstm_quantization"].startswith("dynamic int8")


@pytest.mark.parametrize("family", FAMILIES)
def test_qat_trains_and_ships_int8_linear_layers_and_embedding(runs, exports, tiny_task, family):
    if family == "bilm":    # its blocks are LSTMs: QAT would train the head alone, so it is refused
        with pytest.raises(UserError, match=r"^qat: a 'bilm' model has no Linear layers .*dynamic-int8"):
            exports(family, "qat")
        return
    trained, _, record = exports(family, "qat")
    within_gates(record)
    model = teacher(runs, family, tiny_task).model
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert any(not torch.equal(model.get_submodule(n).weight, trained.model.get_submodule(n).weight)
               for n in linears)
    assert record["quantization"]["scope"] == "linears" and record["quantized_linears"] == len(linears)
    assert record["qat_ranges_applied"] >= 1
    assert record["quantized_embedding_lookups"] == (2 if family == "bart" else 1)   # encoder and decoder
    if family == "bart":   # the shared table is one int8 tensor, not a copy per lookup
        assert record["size_ratio_to_fp32"] < 0.35


@pytest.mark.parametrize("family", FAMILIES)
def test_fp16_halves_every_weight(exports, family):
    bundle, path, record = exports(family, "fp16")
    within_gates(record)
    halves = sum(np.prod(t.dims) for t in graph(path).graph.initializer if t.data_type == onnx.TensorProto.FLOAT16)
    assert record["precision"] == "fp16" and halves > 0.9 * bundle.params


@pytest.mark.parametrize("family", FAMILIES)
def test_factorized_embedding_with_int4_weights(exports, family):
    bundle, path, record = exports(family, "factorized-int4")
    within_gates(record)
    assert record["embedding_factorized"]["rank"] == RANK
    ops = op_counts(path)
    assert ops["MatMulNBits"] >= 4 and ops["GatherBlockQuantized"] >= 1
    vocab = bundle.model.get_input_embeddings().weight.shape[0]
    tables = [p for p in bundle.model.parameters() if p.dim() == 2 and p.shape[0] == vocab]
    assert tables and all(torch.linalg.matrix_rank(t.detach()) == RANK for t in tables)   # BART's tied ones too
    if family == "bilm":
        assert ops["LSTM"] == 4 and record["lstm_quantization"].startswith("fp32")


@pytest.mark.parametrize("family", ["bart", "xlnet"])
def test_sensitivity_keeps_its_most_sensitive_layers_float(exports, family):
    _, path, record = exports(family, "sensitive-int8")
    within_gates(record)
    assert record["kept_layers"] and len(record["kept_in_float"]) >= 1
    # Each kept layer is still a float MatMul (a Gemm is one under the name ORT gives it).
    names = {n.name: n.op_type for n in graph(path).graph.node}
    for node in record["kept_in_float"]:
        assert names.get(node, names.get(f"{node}_MatMul")) in ("MatMul", "Gemm"), node
    assert op_counts(path)["MatMulInteger"] >= 4


@pytest.mark.parametrize("family", ["bart", "xlnet"])
def test_prune_ffn_narrows_every_layer_and_exports_behind_the_gates(runs, exports, tiny_task, family):
    """Half of the FFN neurons go, ranked across layers (BART: the encoder's; its decoder keeps
    its FFNs); the narrower model reloads from its dir to the same logits and its export passes
    the gates."""
    bundle, path, record = exports(family, "pruned-ffn")
    within_gates(record)
    widths = bundle.model.config.to_dict()["compressor_structure"]["intermediate_sizes"]
    full = teacher(runs, family, tiny_task).model.config
    width = full.encoder_ffn_dim if family == "bart" else full.d_inner
    assert len(widths) == (full.encoder_layers if family == "bart" else full.n_layer)
    assert sum(widths) == len(widths) * width // 2 and all(w >= 1 for w in widths)
    saved = path.parent / f"{family}-pruned-ffn-saved"
    bundle.save(saved)
    reloaded = ModelBundle.load(saved).model.eval()
    data = encode(bundle.tokenizer, tiny_task.split("test").head(8))
    np.testing.assert_allclose(predict_logits(reloaded, data), predict_logits(bundle.model.eval(), data), atol=1e-5)


def test_inc_on_bart_evaluates_the_model_itself(runs, tiny_task, tmp_path):
    """torch.export cannot trace BART's classifier (it branches on the EOS counts); INC tunes
    a traceable view of the same modules, whose baseline accuracy is the model's own."""
    from compressor.export.inc import BartLastEosLogits
    bundle = teacher(runs, "bart", tiny_task)
    data = encode(bundle.tokenizer, tiny_task.split("validation").head(16))
    batch = collate(data, np.arange(len(data)), with_token_types=False)
    view = BartLastEosLogits(bundle.model.eval(), ("input_ids", "attention_mask"))
    with torch.no_grad():
        np.testing.assert_allclose(view(batch["input_ids"], batch["attention_mask"]).numpy(),
                                   predict_logits(bundle.model, data), atol=1e-5)
    quantized = bundle.replace(deploy={"quantize": QuantizeConfig(mode="inc", max_trials=1,
                                                                  calibration_samples=16).model_dump()})
    record = export_bundle(quantized, tmp_path / "inc", UNFUSED_GATES, tiny_task).record
    within_gates(record)
    expected = np.mean(predict_logits(bundle.model, data).argmax(1) == data.labels)
    assert record["inc"]["baseline_accuracy"] == pytest.approx(expected)
    assert len(record["inc"]["trials"]) == 1 and record["precision"] == "inc"
    assert op_counts(tmp_path / "inc")["MatMulInteger"] >= 4


def test_bilm_refuses_sensitivity_and_inc_before_writing(runs, tiny_task, tmp_path):
    bundle = teacher(runs, "bilm", tiny_task)
    ctx = Context(task=tiny_task, show_progress=False)
    with pytest.raises(UserError, match=r"sensitivity: a 'bilm' model has no Linear layers to rank.*LSTMs") as err:
        apply_pass(bundle, "sensitivity", SensitivityConfig(samples=32), ctx)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="inc: .*cannot quantize a 'bilm' model.*expected quantize mode dynamic-int8"):
        apply_pass(bundle, "quantize", QuantizeConfig(mode="inc"), ctx)
    inc = bundle.replace(deploy={"quantize": QuantizeConfig(mode="inc").model_dump()})
    with pytest.raises(UserError, match="cannot quantize a 'bilm' model"):
        export_bundle(inc, tmp_path / "inc", GATES, tiny_task)
    assert not (tmp_path / "inc").exists()


@pytest.mark.parametrize("passes, message", [
    ((SensitivityConfig(samples=32), QuantizeConfig(mode="dynamic-int8")),
     r"variants\.v\[0\]: sensitivity: a 'bilm' model has no Linear layers to rank"),
    ((QuantizeConfig(mode="inc"),), r"variants\.v\[0\]: inc: Intel Neural Compressor cannot quantize a 'bilm' model"),
    ((FinetuneConfig(epochs=1), DropLayers(keep=(0,))), r"variants\.v\[1\]: this step needs Transformer layers"),
])
def test_a_bilm_recipe_is_refused_before_its_teacher_trains(pretrained, tiny_csv, tmp_path, monkeypatch,
                                                            passes, message):
    from compressor.pipeline import run as pipeline_run
    monkeypatch.setattr(pipeline_run, "teacher_stage", lambda *a, **k: pytest.fail("the teacher stage ran"))
    pipe = Pipeline("bilm-refused", teacher=str(pretrained("bilm")), task={"path": str(tiny_csv)},
                    finetune=FinetuneConfig(epochs=1))
    pipe.variant("v", *passes)
    with pytest.raises(UserError, match=message) as err:
        pipe.run(tmp_path / "out", show_progress=False)
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()
