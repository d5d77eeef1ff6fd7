"""ONNX export: the graph's interface, parity with PyTorch, loading by Optimum and pipeline,
per-layer head counts and FFN widths, fusion and its fallback, and the parity gate."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from transformers import GPT2Config, GPT2ForSequenceClassification

from compressor.bundle import ModelBundle
from compressor.evaluate import evaluate_path, onnx_logits_fn
from compressor.export import gate as export_gate
from compressor.export import onnx as export_onnx
from compressor.export.gate import GateFailure
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.export.trace import write_onnx
from pretrain.batching import MAX_LENGTH, collate, encode
from pretrain.data import Split
from pretrain.errors import UserError
from pretrain.finetune import evaluate, predict_logits
from pretrain.models import encoder_layers

from .conftest import FFN_WIDTHS, PRUNED_HEADS

ROOT = Path(__file__).resolve().parents[3]
EXPORT_FILES = {"model.onnx", "config.json", "compressor.json", "export.json", "tokenizer.json",
                "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"}


def nothing_left(parent, name) -> bool:
    """No output dir and no temporary sibling of it."""
    return not [p for p in parent.iterdir() if name in p.name]


def tiny_bert_classifier(tokenizer, labels, layers: int, positions: int):
    """A seeded BERT classifier of `layers` tiny layers for the tokenizer and labels, in eval mode."""
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=positions, num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})).eval()


@pytest.mark.parametrize("family, inputs", [("bert", ["input_ids", "attention_mask", "token_type_ids"]),
                                            ("distilbert", ["input_ids", "attention_mask"])])
def test_export_interface_parity_and_accuracy(family, inputs, model_dirs, tiny_task, tmp_path):
    bundle = ModelBundle.load(model_dirs[family]).replace(task=tiny_task.spec)
    record = export_bundle(bundle, tmp_path / "out", ExportSettings(optimize=False), tiny_task).record
    out = tmp_path / "out"
    assert EXPORT_FILES <= {p.name for p in out.iterdir()}
    assert json.loads((out / "export.json").read_text()) == record
    assert json.loads((out / "compressor.json").read_text())["task"] == tiny_task.spec

    graph = onnx.load(str(out / "model.onnx"))
    assert max(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) >= 17
    assert [i.name for i in graph.graph.input] == inputs == record["inputs"]
    assert [o.name for o in graph.graph.output] == ["logits"]
    for tensor in graph.graph.input:      # batch and sequence are named (dynamic) axes
        assert [d.dim_param for d in tensor.type.tensor_type.shape.dim] == ["batch", "sequence"]

    torch_metrics, _ = evaluate(bundle.model, bundle.tokenizer, tiny_task.split("test"))
    assert record["parity_max_abs_diff"] <= 1e-4 and record["parity_samples"] == 30
    assert record["precision"] == "fp32" and record["accuracy"] == torch_metrics["accuracy"]
    assert record["size_bytes"] == (out / "model.onnx").stat().st_size
    assert evaluate_path(str(out), None)["accuracy"] == record["accuracy"]   # `compressor evaluate`


# Fused Attention nodes: every layer, whatever its head count; with the last layer on the
# first token only (pretrain/first_token.py) that layer's attention is its own small graph.
@pytest.mark.parametrize("cls_only, attention_fused", [(False, 4), (True, 3)])
def test_sliced_heads_and_ffn_export_fuse_and_match(cls_only, attention_fused, sliced_bundle, tiny_task, tmp_path):
    model = sliced_bundle.model
    assert [layer.attention.self.num_attention_heads for layer in encoder_layers(model)] == [3, 2, 1, 4]
    assert [layer.intermediate.dense.out_features for layer in encoder_layers(model)] == list(FFN_WIDTHS)
    assert {k: sorted(v) for k, v in model.config.pruned_heads.items()} == PRUNED_HEADS

    settings = ExportSettings(optimize=True, cls_only_last_layer=cls_only)
    record = export_bundle(sliced_bundle, tmp_path / "out", settings, tiny_task).record
    assert record["optimized"] and record["fusion_fallback"] is None
    assert record["cls_only_last_layer"] is cls_only
    assert record["fusions"]["Attention"] == attention_fused
    assert record["fusions"]["residual Sum + LayerNormalization"] == 8     # skip_layernorm auto, onnxruntime >= 1.30
    assert record["skip_layernorm"] == "unfused" and "SkipLayerNormalization" not in record["fusions"]
    assert record["parity_max_abs_diff"] <= 1e-4

    torch_logits = predict_logits(model, encode(sliced_bundle.tokenizer, tiny_task.split("test")))
    onnx_logits = onnx_logits_fn(tmp_path / "out" / "model.onnx")(
        encode(sliced_bundle.tokenizer, tiny_task.split("test")))
    np.testing.assert_allclose(onnx_logits, torch_logits, atol=1e-4)


def test_optimum_and_pipeline_load_the_export(sliced_bundle, tiny_task, tmp_path):
    from optimum.onnxruntime import ORTModelForSequenceClassification
    from transformers import pipeline
    bundle = sliced_bundle.replace(deploy={"quantize": {"mode": "dynamic-int8"}})
    export_bundle(bundle, tmp_path / "out", ExportSettings(accuracy_tolerance=1.0), tiny_task)
    ort_model = ORTModelForSequenceClassification.from_pretrained(str(tmp_path / "out"))
    classify = pipeline("text-classification", model=ort_model, tokenizer=bundle.tokenizer)
    texts = tiny_task.split("test").texts[:4]
    results = classify(texts)
    assert len(results) == 4 and all(r["label"] in bundle.label_names for r in results)

    # Optimum feeds the same graph the gate checked: its logits are the session's.
    batch = bundle.tokenizer(texts[:1], return_tensors="pt")
    expected = onnx_logits_fn(tmp_path / "out" / "model.onnx")(
        encode(bundle.tokenizer, tiny_task.split("test").head(1)))
    np.testing.assert_allclose(ort_model(**batch).logits.numpy(), expected, atol=1e-5)


def test_parity_failure_writes_nothing_and_says_by_how_much(tiny_bundle, tiny_task, tmp_path, monkeypatch):
    real = export_gate.predict_logits
    monkeypatch.setattr(export_gate, "predict_logits", lambda model, data: real(model, data) + 1e-3)
    with pytest.raises(GateFailure) as err:
        export_bundle(tiny_bundle, tmp_path / "out", ExportSettings(optimize=False), tiny_task)
    message = str(err.value)
    assert "does not match PyTorch" in message and "exceeds parity_tolerance 0.0001 by 0.0009" in message
    assert "\n" not in message
    assert nothing_left(tmp_path, "out")


def test_fusion_failure_falls_back_to_the_unfused_graph(tiny_bundle, tiny_task, tmp_path, monkeypatch):
    import onnxruntime.transformers.optimizer as ort_optimizer

    def broken(*args, **kwargs):
        raise RuntimeError("pattern matcher exploded\nsecond line")
    monkeypatch.setattr(ort_optimizer, "optimize_model", broken)
    record = export_bundle(tiny_bundle, tmp_path / "out", ExportSettings(optimize=True), tiny_task).record
    assert record["optimized"] is False and record["fusions"] == {}
    assert record["fusion_fallback"] == "fusion failed: pattern matcher exploded"
    ops = {node.op_type for node in onnx.load(str(tmp_path / "out" / "model.onnx")).graph.node}
    assert "Attention" not in ops and "MatMul" in ops


def test_fused_graph_that_breaks_parity_is_not_used(tiny_bundle, tiny_task, tmp_path, monkeypatch):
    other = tiny_bundle.copy_model()
    other.classifier.bias.data += 0.01    # logits off by 0.01 everywhere

    def wrong_fusion(source, target, unfused=(), config=None):   # "fuses" into another model's graph
        write_onnx(other, target)
        return export_onnx.Fusion(target, {"Attention": 4})
    monkeypatch.setattr(export_onnx, "fuse", wrong_fusion)
    record = export_bundle(tiny_bundle, tmp_path / "out", ExportSettings(optimize=True), tiny_task).record
    assert record["optimized"] is False and record["fusions"] == {}
    assert record["fusion_fallback"].startswith("fused graph failed parity: the fused graph does not match")
    assert record["parity_max_abs_diff"] <= 1e-4


def test_unsupported_family_is_named(tokenizer, tiny_task, tmp_path):
    labels = tiny_task.label_names
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2, n_positions=64,
                        num_labels=len(labels), id2label=dict(enumerate(labels)),
                        label2id={n: i for i, n in enumerate(labels)}, pad_token_id=0)
    bundle = ModelBundle(GPT2ForSequenceClassification(config), tokenizer, tiny_task.spec)
    with pytest.raises(UserError, match=r"cannot export model family 'gpt2'.*bert.*distilbert"):
        export_bundle(bundle, tmp_path / "out", ExportSettings(), tiny_task)
    assert nothing_left(tmp_path, "out")


def test_corrupted_onnx_is_a_user_error(tmp_path, tiny_bert_dir):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(UserError, match="cannot load ONNX model"):
        onnx_logits_fn(bad)


def test_no_token_type_input_when_the_tokenizer_makes_none(tiny_bundle, tiny_task, tmp_path):
    """RoBERTa-style tokenizers return no token_type_ids: the graph must not require them."""
    tokenizer = copy.deepcopy(tiny_bundle.tokenizer)
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    record = export_bundle(tiny_bundle.replace(tokenizer=tokenizer), tmp_path / "out",
                           ExportSettings(optimize=False), tiny_task).record
    assert record["inputs"] == ["input_ids", "attention_mask"]
    assert record["parity_max_abs_diff"] <= 1e-4
    assert evaluate_path(str(tmp_path / "out"), None)["accuracy"] == record["accuracy"]


def test_the_shipped_tokenizer_cuts_texts_where_the_accuracy_was_measured(tokenizer, tiny_task, tmp_path):
    """A model of 512 positions is evaluated (and gated) at MAX_LENGTH tokens: the export's
    tokenizer says so, so a user's `truncation=True` gets the tool's prediction for a long text
    rather than one over 512 tokens (or, without truncation, a graph error past 512)."""
    from transformers import AutoTokenizer
    labels = tiny_task.label_names
    model = tiny_bert_classifier(tokenizer, labels, layers=1, positions=512)
    model.save_pretrained(str(tmp_path / "hf"))
    tokenizer.save_pretrained(str(tmp_path / "hf"))
    bundle = ModelBundle.load(tmp_path / "hf").replace(task=tiny_task.spec)
    record = export_bundle(bundle, tmp_path / "out", ExportSettings(optimize=False), tiny_task).record
    shipped = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert shipped.model_max_length == record["max_length"] == MAX_LENGTH < 512
    assert bundle.tokenizer.model_max_length == 512          # the bundle's own is left as it was

    long_text = " ".join(tiny_task.split("test").texts * 3)
    assert len(tokenizer(long_text)["input_ids"]) > 512
    expected = onnx_logits_fn(tmp_path / "out" / "model.onnx")(encode(bundle.tokenizer, Split([long_text], [0])))
    batch = {k: v.numpy() for k, v in shipped([long_text], truncation=True, return_tensors="pt").items()}
    assert batch["input_ids"].shape[1] == MAX_LENGTH
    import onnxruntime
    session = onnxruntime.InferenceSession(str(tmp_path / "out" / "model.onnx"))
    inputs = {i.name: batch[i.name] for i in session.get_inputs()}
    np.testing.assert_allclose(session.run(["logits"], inputs)[0], expected, atol=1e-5)


def test_tokenizer_json_alone_cuts_and_pads_as_the_gate_does(tiny_bundle, tiny_task, tmp_path):
    """tokenizer.json read with the `tokenizers` package alone gives the gate's batches: cut at
    the shipped length, padded to the batch's longest. Transformers' fast tokenizer saves the
    truncation and padding its last call left (here: cut at 7, padded to 9), not the export's."""
    from tokenizers import Tokenizer
    tiny_bundle.tokenizer(["a"], truncation=True, max_length=7, padding="max_length")
    before = tiny_bundle.tokenizer.backend_tokenizer.truncation, tiny_bundle.tokenizer.backend_tokenizer.padding
    length = export_onnx.save_deployed_tokenizer(tiny_bundle, tmp_path)
    backend = tiny_bundle.tokenizer.backend_tokenizer
    assert (backend.truncation, backend.padding) == before        # the bundle's own is left as it was
    texts = [" ".join(tiny_task.split("test").texts), "", tiny_task.split("test").texts[0]]
    split = Split(texts, [0] * len(texts))
    expected = collate(encode(tiny_bundle.tokenizer, split, length), np.arange(len(texts)))
    assert expected["input_ids"].shape[1] == length
    rows = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode_batch(texts)
    for name, column in (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids")):
        np.testing.assert_array_equal(np.array([getattr(row, column) for row in rows]), expected[name].numpy())


# Run in a process without this tool: README's serving example, the texts from argv.
SERVE_ELSEWHERE = """
import json, sys
{snippet}
print(json.dumps({{"labels": classify(json.loads(sys.argv[1])),
                  "ours_imported": any(name.split(".")[0] in ("pretrain", "compressor") for name in sys.modules)}}))
"""


def readme_serving_example() -> str:
    """The python block after README's 'Serving an export' paragraph, without its demo call."""
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index("Serving an export needs only"):]
    start = after.index("```python\n") + len("```python\n")
    block = after[start:after.index("\n```", start)]
    return "\n".join(line for line in block.splitlines() if not line.startswith("print("))


def test_the_readme_serving_example_gives_evaluates_labels(tokenizer, tiny_task, tmp_path):
    """README's example serves an export with ONNX Runtime and the tokenizer alone, and labels
    every text as `compressor evaluate` does: one batch of mixed lengths padded, an empty text,
    a text past the model's positions cut at the shipped length."""
    import os
    import subprocess
    import sys
    from compressor.evaluate import load_predictor, predict_classes
    labels = tiny_task.label_names
    model = tiny_bert_classifier(tokenizer, labels, layers=2, positions=64)
    bundle = ModelBundle(model=model, tokenizer=tokenizer, task=tiny_task.spec, max_length=32)
    export_bundle(bundle, tmp_path / "out", ExportSettings(optimize=False), tiny_task)
    test = tiny_task.split("test")
    texts = [*test.texts[:20], "", " ".join(test.texts)]
    assert len(tokenizer(texts[-1])["input_ids"]) > 64
    snippet = readme_serving_example().replace('"runs/demo/int8-onnx"', repr(str(tmp_path / "out")))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}     # this tool is not importable
    done = subprocess.run([sys.executable, "-c", SERVE_ELSEWHERE.format(snippet=snippet), json.dumps(texts)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    served = json.loads(done.stdout.splitlines()[-1])
    assert not served["ours_imported"]
    predictor = load_predictor(tmp_path / "out")
    tool = predict_classes(predictor, Split(texts, [0] * len(texts)), tiny_task)
    assert served["labels"] == [labels[i] for i in tool]


def test_a_model_with_few_positions_exports_evaluates_and_benchmarks_within_them(tokenizer, tiny_task, tmp_path):
    """A teacher pretrained here with `--max-length N` has N positions (ELECTRA, SpanBERT):
    evaluation, the export's parity gate and the benchmark inputs cut examples to fit
    (`usable_length`), instead of feeding 128 tokens past the position table."""
    from compressor.bench.runners import input_batches
    from compressor.evaluate import load_predictor
    positions, labels = 16, tiny_task.label_names
    test = tiny_task.split("test")
    assert max(len(ids) for ids in tokenizer(test.texts)["input_ids"]) > positions
    model = tiny_bert_classifier(tokenizer, labels, layers=1, positions=positions)
    model.save_pretrained(str(tmp_path / "hf"))
    tokenizer.save_pretrained(str(tmp_path / "hf"))
    bundle = ModelBundle.load(tmp_path / "hf").replace(task=tiny_task.spec)

    torch_metrics, _ = evaluate(bundle.model, bundle.tokenizer, test)
    assert evaluate_path(str(tmp_path / "hf"), tiny_task.spec)["accuracy"] == torch_metrics["accuracy"]
    record = export_bundle(bundle, tmp_path / "out", ExportSettings(optimize=False), tiny_task).record
    assert record["parity_max_abs_diff"] <= 1e-4 and record["accuracy"] == torch_metrics["accuracy"]
    assert evaluate_path(str(tmp_path / "out"), None)["accuracy"] == record["accuracy"]

    predictor = load_predictor(tmp_path / "out")
    assert predictor.max_length == positions
    batches = input_batches(predictor.tokenizer, test, 8, "real", max_length=predictor.max_length)
    assert max(b["input_ids"].shape[1] for b in batches) == positions
    assert predictor.positions == positions
    with pytest.raises(UserError, match=f"sequence length 32 is longer than the model's {positions}"):
        input_batches(predictor.tokenizer, test, 8, 32, max_length=predictor.max_length,
                      positions=predictor.positions)


@pytest.mark.parametrize("form", ["fused", "unfused"])
def test_residual_layernorms_stay_as_exported_when_a_session_loads_them(form, sliced_bundle, tiny_task, tmp_path):
    """ORT's session-time SkipLayerNormFusion matches Add + LayerNormalization; the unfused
    form writes the residual add as Sum, so a session with every optimization on (what
    Optimum's ORTModel and a plain InferenceSession use) runs it as exported."""
    import collections

    import onnxruntime as ort
    settings = ExportSettings(optimize=True, skip_layernorm=form)
    record = export_bundle(sliced_bundle, tmp_path / "out", settings, tiny_task).record
    assert record["skip_layernorm"] == form and record["skip_layernorm_reason"] == "asked (skip_layernorm)"
    assert record["parity_max_abs_diff"] <= 1e-4 and record["fusions"]["Attention"] == 3
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "as-loaded.onnx")
    ort.InferenceSession(str(tmp_path / "out" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    loaded = collections.Counter(node.op_type for node in onnx.load(str(tmp_path / "as-loaded.onnx")).graph.node)
    if form == "fused":
        assert record["fusions"]["SkipLayerNormalization"] == 8 and loaded["SkipLayerNormalization"] == 8
    else:
        assert record["fusions"]["residual Sum + LayerNormalization"] == 8
        assert loaded["SkipLayerNormalization"] == 0 and loaded["Sum"] == 8 and loaded["LayerNormalization"] == 8


def test_skip_layernorm_auto_follows_the_onnxruntime_release(monkeypatch):
    import onnxruntime as ort

    from compressor.export.onnx import skip_layernorm_choice
    from compressor.export.quantize import Fp16Config
    monkeypatch.setattr(ort, "__version__", "1.29.0")
    assert skip_layernorm_choice(ExportSettings(), None)[0] == "fused"
    monkeypatch.setattr(ort, "__version__", "1.30.1")
    assert skip_layernorm_choice(ExportSettings(), None)[0] == "unfused"
    assert skip_layernorm_choice(ExportSettings(), Fp16Config())[0] == "fused"            # GPU providers
    assert skip_layernorm_choice(ExportSettings(skip_layernorm="fused"), None) == ("fused", "asked (skip_layernorm)")


def test_exporting_into_a_users_dir_is_refused_and_leaves_it_untouched(tiny_bundle, tiny_task, tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("a user's own file")
    with pytest.raises(UserError, match="export path .* holds files this command did not write"):
        export_bundle(tiny_bundle, target, ExportSettings(optimize=False), tiny_task)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]


def test_export_bundle_names_the_task_it_expects(tiny_bundle, tiny_task, tmp_path):
    with pytest.raises(UserError, match="task must be loaded task data, got dict; expected pretrain.data.load_task"):
        export_bundle(tiny_bundle, tmp_path / "out", ExportSettings(), tiny_task.spec)
    assert not (tmp_path / "out").exists()


def test_a_model_fine_tuned_past_the_default_length_is_gated_shipped_and_evaluated_at_it(tokenizer, tiny_task,
                                                                                         tmp_path):
    """A model fine-tuned at 300 tokens: the gate, the shipped tokenizer, export.json and
    `compressor evaluate` (of the HF dir and of the export) all cut texts at 300, not at 128,
    the default (where a label decided past token 128 was lost)."""
    from transformers import AutoTokenizer
    from compressor.evaluate import load_predictor
    from pretrain.data import TaskData
    labels, length = tiny_task.label_names, 300
    model = tiny_bert_classifier(tokenizer, labels, layers=1, positions=512)
    test = tiny_task.split("test")
    long_texts = [" ".join([text] * 80) for text in test.texts[:12]]
    assert min(len(ids) for ids in tokenizer(long_texts)["input_ids"]) > length
    long_split = Split(long_texts, test.labels[:12])
    task = TaskData(tiny_task.name, labels, {name: long_split for name in ("train", "validation", "test")},
                    spec=tiny_task.spec)
    bundle = ModelBundle(model=model, tokenizer=tokenizer, task=tiny_task.spec, max_length=length)
    bundle.save(tmp_path / "hf")
    assert load_predictor(tmp_path / "hf").max_length == length

    gate = export_gate.Gate(ExportSettings(optimize=False), bundle, task, long_split)
    assert max(gate.data.lengths()) == length
    record = export_bundle(bundle, tmp_path / "out", ExportSettings(optimize=False), task).record
    assert record["max_length"] == length
    assert AutoTokenizer.from_pretrained(str(tmp_path / "out")).model_max_length == length
    # not MiniLM's max_length 128 beside it (its tokenizer_config.json has both)
    assert "max_length" in tokenizer.init_kwargs
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["max_length"] == length
    assert json.loads((tmp_path / "out" / "compressor.json").read_text())["max_length"] == length
    assert load_predictor(tmp_path / "out").max_length == length
