"""Models pretrained here with `dae` (BART), `plm` (XLNet) and `bilm` (ELMo-style BiLM) as
recipe teachers: pretrained for a few steps with the real command, fine-tuned by the
recipe's `teacher.finetune`, quantized (dynamic int8), exported behind the parity gate.

Each family runs one tiny recipe through the Python API (the same stages as `compressor
run`): teacher fine-tune on 120 examples, a `dynamic-int8` variant, ONNX export of both.
Beside it: `compressor finetune` round trips, each family's input layout (BART's one EOS
per row, XLNet's left padding), drop-layers on BART's encoder and XLNet, the refusals
(drop-layers on a BiLM, scalar-mix on BART, Optimum's baseline on XLNet) and the PyTorch
int8 deployment.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from compressor import Pipeline
from compressor.bundle import ModelBundle
from compressor.export.quantize import QuantizeConfig
from compressor.passes import Context, apply_pass
from compressor.passes.layers import DropLayers
from pretrain.batching import encode
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig, predict_logits

FAMILIES = ("bart", "xlnet", "bilm")

pytestmark = pytest.mark.usefixtures("family_test_size")


@pytest.fixture(scope="module")
def runs(pretrained, tiny_csv, family_runs):
    """family -> (out dir, report) of one tiny recipe with that family as the teacher."""
    def recipe(family: str) -> Pipeline:
        pipe = Pipeline(f"{family}-teacher", teacher=str(pretrained(family)), task={"path": str(tiny_csv)},
                        finetune=FinetuneConfig(epochs=1, batch_size=16, lr=1e-3), max_train_samples=120)
        return pipe.variant("int8", QuantizeConfig(mode="dynamic-int8")).export(accuracy_tolerance=0.2)
    return family_runs(recipe)


@pytest.mark.parametrize("family", FAMILIES)
def test_pretrained_family_is_a_recipe_teacher(runs, family_objectives, family):
    out, report = runs(family)
    teacher = report["teacher"]
    assert 0 <= teacher["accuracy"] <= 1 and teacher["eval_samples"] == 30
    config = json.loads((out / "teacher" / "config.json").read_text())
    assert config["model_type"] == family and config["pretraining"]["objective"] == family_objectives[family]
    names = [m["name"] for m in report["models"]]
    assert "int8" in names
    for stage in ("teacher", "int8"):
        export = json.loads((out / f"{stage}-onnx" / "export.json").read_text())
        assert export["parity_max_abs_diff"] <= export["parity_tolerance"]
        assert (out / f"{stage}-onnx" / "model.onnx").is_file()
    int8 = json.loads((out / "int8-onnx" / "export.json").read_text())
    assert int8["precision"] == "dynamic-int8" and int8["size_bytes"] < 0.5 * int8["fp32_size_bytes"]
    if family == "bart":          # ORT's BART optimizer fuses it
        assert export["optimized"] and export["fusions"] and export["fusion_fallback"] is None
    else:                         # no ORT fusion for XLNet or LSTMs: the unfused graph, and why
        assert not export["optimized"] and f"family {family!r}" in export["fusion_fallback"]
    ops = {node.op_type for node in onnx.load(str(out / "int8-onnx" / "model.onnx")).graph.node}
    assert "MatMulInteger" in ops
    if family == "bilm":          # the LSTMs themselves are int8, not only the head
        assert "DynamicQuantizeLSTM" in ops and "LSTM" not in ops


def tiny_bundle(pretrained, family: str, tiny_task) -> ModelBundle:
    from pretrain.models import load_classifier
    model, tokenizer = load_classifier(str(pretrained(family)), tiny_task.label_names)
    return ModelBundle(model=model, tokenizer=tokenizer, task=tiny_task.spec)


def test_bart_rows_keep_one_eos_each(pretrained, tiny_task):
    """BART classifies from each row's last EOS and needs equal counts per row: truncation
    keeps the EOS, and a text that spells the EOS token does not add one."""
    bundle = tiny_bundle(pretrained, "bart", tiny_task)
    eos = bundle.model.config.eos_token_id
    split = tiny_task.split("test").head(4)
    split = type(split)(["a text with [SEP] inside", "word " * 100, *split.texts[2:]], split.labels)
    data = encode(bundle.tokenizer, split)
    assert [row.count(eos) for row in data.input_ids] == [1] * 4
    assert all(row[-1] == eos for row in data.input_ids)
    assert max(data.lengths()) == 32                         # the model's 32 positions, not 128
    assert predict_logits(bundle.model, data).shape == (4, len(tiny_task.label_names))


def test_xlnet_reads_its_summary_token_last(pretrained, tiny_task):
    """XLNet's layout: text [SEP] [CLS], padded on the left, so the last position (what
    XLNetForSequenceClassification summarises) is [CLS] in every row of a padded batch."""
    from pretrain.batching import collate
    bundle = tiny_bundle(pretrained, "xlnet", tiny_task)
    tokenizer = bundle.tokenizer
    data = encode(tokenizer, tiny_task.split("test").head(8))
    batch = collate(data, np.arange(8))
    assert len(set(data.lengths())) > 1                       # the batch really is padded
    assert (batch["input_ids"][:, -1] == tokenizer.cls_token_id).all()
    assert (batch["input_ids"][:, -2] == tokenizer.sep_token_id).all()
    assert (batch["attention_mask"][:, -1] == 1).all() and (batch["attention_mask"][:, 0] == 0).any()
    # Padding on the left changes nothing for a row: logits alone equal logits in the batch.
    alone = predict_logits(bundle.model, encode(tokenizer, tiny_task.split("test").head(1)))
    together = predict_logits(bundle.model, data)[:1]
    np.testing.assert_allclose(alone, together, atol=1e-5)


@pytest.mark.parametrize("family, layers_field", [("bart", "encoder_layers"), ("xlnet", "n_layer")])
def test_drop_layers_on_bart_encoder_and_xlnet(pretrained, tiny_task, tmp_path, family, layers_field):
    bundle = tiny_bundle(pretrained, family, tiny_task)
    dropped = apply_pass(bundle, "drop-layers", DropLayers(keep=(1,)), Context(task=tiny_task, show_progress=False))
    assert getattr(dropped.model.config, layers_field) == 1
    assert getattr(bundle.model.config, layers_field) == 2         # the input is untouched
    if family == "bart":
        assert dropped.model.config.decoder_layers == 2            # drop-layers acts on the encoder
    dropped.save(tmp_path / "m")
    again = ModelBundle.load(tmp_path / "m")
    data = encode(again.tokenizer, tiny_task.split("test").head(4))
    np.testing.assert_allclose(predict_logits(again.model, data), predict_logits(dropped.model, data), atol=1e-5)


def test_bilm_refuses_passes_that_need_transformer_layers(pretrained, tiny_task):
    bundle = tiny_bundle(pretrained, "bilm", tiny_task)
    with pytest.raises(UserError, match="Transformer layers.*'bilm'.*bert.*bart, xlnet") as err:
        apply_pass(bundle, "drop-layers", DropLayers(keep=(0,)), Context(task=tiny_task, show_progress=False))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family", FAMILIES)
def test_compressor_finetune_writes_a_teacher_that_reloads_alike(pretrained, tiny_csv, tiny_task, tmp_path, family):
    """`compressor finetune` on a pretrained dir; the written dir (tokenizer layout included)
    reloads to the same test predictions."""
    from compressor.cli.finetune_command import finetune_command
    from compressor.evaluate import evaluate_path
    metrics = finetune_command(str(pretrained(family)), {"path": str(tiny_csv)}, tmp_path / "ft",
                               {"epochs": 1, "batch_size": 16, "max_train_samples": 48, "lr": 1e-3},
                               show_progress=False)
    assert metrics["samples"] == 30 and 0 <= metrics["accuracy"] <= 1
    reloaded = evaluate_path(str(tmp_path / "ft"), {"path": str(tiny_csv)})
    assert reloaded["accuracy"] == pytest.approx(metrics["accuracy"])


def test_optimum_baseline_is_refused_for_an_xlnet_teacher_before_writing(pretrained, tiny_csv, tmp_path):
    pipe = Pipeline("xlnet-bench", teacher=str(pretrained("xlnet")), task={"path": str(tiny_csv)})
    pipe.variant("same").benchmark(profiles=["cpu"])
    with pytest.raises(UserError, match="optimum-default-int8 cannot be built for a 'xlnet' teacher") as err:
        pipe.run(tmp_path / "out", show_progress=False)
    assert "onnxruntime-fp32" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_scalar_mix_strategy_per_family(pretrained, tiny_task):
    """XLNet gets the strategy's mix; a BiLM classifier has ELMo's mix already and trains it
    with the encoder frozen; BART (classified from its decoder) refuses in one line."""
    from pretrain.strategies import prepare, trainable_for
    xlnet = tiny_bundle(pretrained, "xlnet", tiny_task).model
    prepare(xlnet, "scalar-mix")
    data = encode(tiny_bundle(pretrained, "xlnet", tiny_task).tokenizer, tiny_task.split("test").head(4))
    assert np.isfinite(predict_logits(xlnet, data)).all()
    bilm = tiny_bundle(pretrained, "bilm", tiny_task).model
    prepare(bilm, "scalar-mix")
    with trainable_for(bilm, "scalar-mix", bilm.base_model):
        trained = {n for n, p in bilm.named_parameters() if p.requires_grad}
    assert trained == {"scalar_mix.weights", "scalar_mix.gamma", "classifier.weight", "classifier.bias"}
    with pytest.raises(UserError, match="scalar-mix strategy is not available for model family 'bart'"):
        prepare(tiny_bundle(pretrained, "bart", tiny_task).model, "scalar-mix")


@pytest.mark.parametrize("family", FAMILIES)
def test_torch_dynamic_int8_export(pretrained, tiny_task, tmp_path, family):
    """The PyTorch int8 deployment too (BART's tied embedding tables included)."""
    from compressor.export.onnx import ExportSettings, export_bundle
    bundle = apply_pass(tiny_bundle(pretrained, family, tiny_task), "quantize", QuantizeConfig(mode="torch-dynamic-int8"),
                        Context(task=tiny_task, show_progress=False))
    record = export_bundle(bundle, tmp_path / "int8", ExportSettings(accuracy_tolerance=0.2), tiny_task).record
    assert record["format"] == "torch" and record["precision"] == "torch-dynamic-int8"
    assert record["size_bytes"] < record["fp32_size_bytes"] and (tmp_path / "int8" / "model.int8.pt").is_file()
    assert ("lstm_quantization" in record) == (family == "bilm")   # what happened to the LSTMs: fp32
