"""ALBERT as a recipe teacher: a tiny AlbertConfig classifier (3 layers applying one shared
layer group, a factorized 16-wide embedding) fine-tuned by the recipe, ranked by `sensitivity`
and quantized (dynamic int8), exported with ORT's 'bert' fusions behind the parity gate and benchmarked; and the
passes that act on one layer's weights refused up front, with the reason, writing nothing.
"""

from __future__ import annotations

import json

import onnx
import pytest
import torch
from transformers import AlbertConfig, AlbertForSequenceClassification

from compressor import Pipeline
from compressor.bench.baselines import check_baselines
from compressor.export.quantize import QuantizeConfig
from compressor.modeling.structure import prune_heads, set_intermediate_size
from compressor.passes.layers import DropLayers
from compressor.passes.quantization import SensitivityConfig
from compressor.passes.sharing import ShareLayers
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig

pytestmark = pytest.mark.usefixtures("family_test_size")   # one torch thread for the recipe

LAYERS = 3


@pytest.fixture(scope="module")
def albert_dir(tokenizer, tmp_path_factory):
    torch.manual_seed(0)
    model = AlbertForSequenceClassification(AlbertConfig(
        vocab_size=len(tokenizer), embedding_size=16, hidden_size=32, num_hidden_layers=LAYERS,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=128))
    path = tmp_path_factory.mktemp("tiny-albert")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def test_albert_teacher_fine_tunes_exports_fused_quantizes_and_benchmarks(albert_dir, tiny_csv, tmp_path):
    pipe = Pipeline("albert-teacher", teacher=str(albert_dir), task={"path": str(tiny_csv)},
                    finetune=FinetuneConfig(epochs=1, batch_size=16, lr=1e-3), max_train_samples=120)
    # sensitivity ranks each shared Linear once; the export keeps it in float at every depth
    pipe.variant("int8", SensitivityConfig(keep_fraction=0.5, samples=16),
                 QuantizeConfig(mode="dynamic-int8")).export(accuracy_tolerance=0.2)
    pipe.benchmark(profiles=["cpu"], batch_sizes=[2], iterations=2, baselines=["onnxruntime-fp32"])
    report = pipe.run(tmp_path / "out", show_progress=False)
    teacher = report["teacher"]
    assert 0 <= teacher["accuracy"] <= 1 and teacher["eval_samples"] == 30
    shared = AlbertForSequenceClassification.from_pretrained(str(tmp_path / "out" / "teacher"))
    assert teacher["params"] == sum(p.numel() for p in shared.parameters())   # one layer group, counted once
    fp32 = json.loads((tmp_path / "out" / "teacher-onnx" / "export.json").read_text())
    int8 = json.loads((tmp_path / "out" / "int8-onnx" / "export.json").read_text())
    for record in (fp32, int8):
        assert record["parity_max_abs_diff"] <= record["parity_tolerance"]
    # ORT's 'bert' patterns fuse every attention but the first (it reads the embedding
    # projection, not a LayerNorm) and no EmbedLayerNormalization (the projection sits
    # between the embedding LayerNorm and the encoder); the per-layer copies that fusion and
    # quantization make of the one shared layer are merged back.
    assert fp32["fusions"]["Attention"] == LAYERS - 1 and "EmbedLayerNormalization" not in fp32["fusions"]
    # two residual LayerNorms per layer, plus the embedding sum's (no EmbedLayerNormalization here)
    assert fp32["fusions"]["residual Sum + LayerNormalization"] == 2 * LAYERS + 1
    assert fp32["fused_duplicates_merged"] > 0 and int8["quantized_duplicates_merged"] > 0
    assert len(set(int8["kept_in_float"])) > len(int8["kept_layers"]) == 5   # of 9 Linear modules
    ops = {node.op_type for node in onnx.load(str(tmp_path / "out" / "int8-onnx" / "model.onnx")).graph.node}
    assert "MatMulInteger" in ops or "QAttention" in ops
    latencies = {m["name"]: m["latency"] for m in report["models"]}
    assert {"int8", "onnxruntime-fp32"} <= set(latencies)
    check_baselines(["optimum-default-int8"], "albert")   # Optimum exports ALBERT: that baseline is allowed


@pytest.mark.parametrize("name, config, reason", [
    ("share-layers", ShareLayers(), "ALBERT's layers already share one set of weights"),
    ("drop-layers", DropLayers(keep=(0,)), "no per-layer weights to drop"),
])
def test_passes_on_one_layers_weights_are_refused_before_anything_runs(albert_dir, tiny_csv, tmp_path,
                                                                       name, config, reason):
    pipe = Pipeline("albert-refused", teacher=str(albert_dir), task={"path": str(tiny_csv)},
                    finetune=FinetuneConfig(epochs=1, batch_size=16, lr=1e-3))
    pipe.variant("v", config)
    with pytest.raises(UserError, match=f"{name} on model family 'albert': .*{reason}") as err:
        pipe.run(tmp_path / "out", show_progress=False)
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_structured_pruning_names_albert_s_reason(albert_dir):
    """What the pruning passes' checks read: the family record refuses both capabilities."""
    model = AlbertForSequenceClassification.from_pretrained(str(albert_dir))
    with pytest.raises(UserError, match="prune-heads is not available for model family 'albert': ALBERT's layers"):
        prune_heads(model, {0: [0]})
    with pytest.raises(UserError, match="prune-ffn is not available for model family 'albert'"):
        set_intermediate_size(model, 0, [0, 1])


def test_soft_target_distillation_needs_no_layers(albert_dir, tiny_task):
    """`soft` and `hard` read logits only: the losses ALBERT's refusals leave it (and what the
    up-front check tells a user to use) train it, with ALBERT as its own teacher."""
    from compressor.bundle import ModelBundle
    from compressor.passes import Context, LazyTeacher, apply_pass, get_pass
    from pretrain.models import load_classifier
    model, tokenizer = load_classifier(str(albert_dir), tiny_task.label_names)
    bundle = ModelBundle(model.eval(), tokenizer, task=tiny_task.spec)
    teacher = LazyTeacher(lambda: bundle.replace(model=bundle.copy_model()))
    cfg = get_pass("distill").config_type.model_validate(
        {"losses": ["soft", "hard"], "epochs": 1, "max_train_samples": 32, "batch_size": 16})
    out = apply_pass(bundle, "distill", cfg, Context(task=tiny_task, seed=0, show_progress=False,
                                                     teacher_source=teacher))
    assert type(out.model) is AlbertForSequenceClassification
    assert not torch.equal(out.model.classifier.weight, bundle.model.classifier.weight)


@pytest.mark.parametrize("name, raw", [
    ("student", {"layers": [0]}), ("theseus", {"successor_layers": 1}), ("prune-magnitude", {"sparsity": 0.5}),
    ("prune-movement", {"sparsity": 0.5}), ("distill", {"losses": ["soft", "hidden"]}),
])
def test_passes_on_per_layer_weights_say_why_albert_is_refused(name, raw):
    """ALBERT has Transformer layers, but one shared group of them: the refusal says that."""
    from compressor.passes import check_pass_family, get_pass
    with pytest.raises(UserError, match="ALBERT's layers are one shared layer group") as err:
        check_pass_family(name, get_pass(name).config_type.model_validate(raw), "albert")
    assert "does not have" not in str(err.value)


def test_qat_and_inc_quantize_albert_behind_the_gates(albert_dir, tiny_task, tmp_path):
    """The two quantizations that train or tune, on the shared layer group: `qat` trains the
    one group with fake quantization, and its export puts int8 and the learned ranges on that
    group's Linears at every depth; INC tunes the model itself."""
    from compressor.bundle import ModelBundle
    from compressor.export.onnx import ExportSettings, export_bundle
    from compressor.passes import Context, apply_pass
    from compressor.passes.quantization import QATConfig
    from pretrain.models import load_classifier
    model, tokenizer = load_classifier(str(albert_dir), tiny_task.label_names)
    bundle = ModelBundle(model.eval(), tokenizer, task=tiny_task.spec)
    gates = ExportSettings(accuracy_tolerance=0.2, optimize=False)
    trained = apply_pass(bundle, "qat", QATConfig(epochs=1, batch_size=16, lr=1e-3, max_train_samples=48),
                         Context(task=tiny_task, seed=0, show_progress=False))
    group = "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight"
    assert not torch.equal(trained.model.state_dict()[group], bundle.model.state_dict()[group])
    qat = export_bundle(trained, tmp_path / "qat", gates, tiny_task).record
    assert qat["parity_max_abs_diff"] <= qat["parity_tolerance"] and qat["accuracy_change"] >= -0.2
    # 6 shared Linears at each of 3 depths, plus the embedding projection, pooler and classifier;
    # one range per tensor they read (Q, K and V read one): 4 per depth plus those 3.
    assert qat["quantized_linears"] == 6 * LAYERS + 3 and qat["quantized_embedding_lookups"] == 1
    assert qat["qat_ranges_applied"] == 4 * LAYERS + 3
    tuned = bundle.replace(deploy={"quantize": QuantizeConfig(mode="inc", max_trials=1,
                                                              calibration_samples=16).model_dump()})
    inc = export_bundle(tuned, tmp_path / "inc", gates, tiny_task).record
    assert inc["parity_max_abs_diff"] <= inc["parity_tolerance"] and inc["precision"] == "inc"
    assert len(inc["inc"]["trials"]) == 1 and 0 <= inc["inc"]["baseline_accuracy"] <= 1
    ops = [node.op_type for node in onnx.load(str(tmp_path / "inc" / "model.onnx")).graph.node]
    assert ops.count("MatMulInteger") >= 6 * LAYERS
