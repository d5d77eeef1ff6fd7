"""`distill-structure`: BiLSTM and CNN students trained on the teacher's logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from compressor.bundle import ModelBundle
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.passes import Context, LazyTeacher, apply_pass, get_pass
from compressor.passes.shallow_students import initial_embeddings, principal_projection
from pretrain.batching import encode
from pretrain.errors import UserError
from pretrain.finetune import predict_logits
from pretrain.static_embeddings import save_embeddings

SMALL = {"embedding_dim": 16, "hidden_size": 24, "filters": 8, "batch_size": 16}


def config(**fields):
    return get_pass("distill-structure").config_type.model_validate({**SMALL, "kind": "cnn", **fields})


def copied(bundle: ModelBundle) -> LazyTeacher:
    return LazyTeacher(lambda: bundle.replace(model=bundle.copy_model()))


def ctx(task, teacher: LazyTeacher | None) -> Context:
    return Context(task=task, seed=0, show_progress=False, teacher_source=teacher)


def mse_to_teacher(student: ModelBundle, teacher: ModelBundle, split) -> float:
    encoded = encode(teacher.tokenizer, split)
    return float(np.mean((predict_logits(student.model, encoded) - predict_logits(teacher.model, encoded)) ** 2))


def test_the_student_moves_towards_the_teachers_logits(bert_bundle, tiny_task):
    train = tiny_task.split("train")
    untrained = apply_pass(bert_bundle, "distill-structure", config(epochs=0.05), ctx(tiny_task, copied(bert_bundle)))
    trained = apply_pass(bert_bundle, "distill-structure", config(epochs=4, lr=3e-3),
                         ctx(tiny_task, copied(bert_bundle)))
    assert mse_to_teacher(trained, bert_bundle, train) < 0.5 * mse_to_teacher(untrained, bert_bundle, train)


def test_labels_only_never_loads_the_teacher(bert_bundle, tiny_task):
    def refuse():
        raise AssertionError("the teacher was loaded")
    teacher = LazyTeacher(refuse)
    out = apply_pass(bert_bundle, "distill-structure", config(alpha=1.0, epochs=1), ctx(tiny_task, teacher))
    assert not teacher.loaded and out.model.config.model_type == "textcnn"


@pytest.mark.parametrize("kind, family", [("bilstm", "bilm"), ("cnn", "textcnn")])
def test_students_save_reload_and_export_behind_the_parity_gate(bert_bundle, tiny_task, tmp_path, kind, family):
    out = apply_pass(bert_bundle.replace(deploy={"quantize": {"mode": "dynamic-int8"}, "qat": {"x": 1}}),
                     "distill-structure", config(kind=kind, epochs=1), ctx(tiny_task, copied(bert_bundle)))
    assert out.model.config.model_type == family and out.deploy == {"quantize": {"mode": "dynamic-int8"}}
    assert out.params < bert_bundle.params
    loaded = ModelBundle.load(out.save(tmp_path / kind))
    assert type(loaded.model) is type(out.model) and loaded.label_names == bert_bundle.label_names
    record = export_bundle(out.replace(deploy={}), tmp_path / f"{kind}-onnx", ExportSettings(optimize=True),
                           tiny_task).record
    assert record["parity_max_abs_diff"] <= ExportSettings().parity_tolerance
    assert not record["optimized"] and record["fusion_fallback"]      # no Transformer fusion applies
    assert not {"fusions_left_out", "skip_layernorm", "skip_layernorm_reason"} & set(record)
    assert json.loads((tmp_path / f"{kind}-onnx" / "export.json").read_text())["accuracy"] == record["accuracy"]
    loads_without_this_package(tmp_path / kind, tmp_path / f"{kind}-onnx", out, tiny_task)


# A user's process: plain Transformers and Optimum, the modeling file the dir ships.
LOAD_ELSEWHERE = """
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from optimum.onnxruntime import ORTModelForSequenceClassification
saved, onnx_dir, text = sys.argv[1:4]
tokenizer = AutoTokenizer.from_pretrained(saved)
inputs = tokenizer([text], return_tensors="pt")
inputs.pop("token_type_ids", None)
model = AutoModelForSequenceClassification.from_pretrained(saved, trust_remote_code=True).eval()
ort = ORTModelForSequenceClassification.from_pretrained(onnx_dir, trust_remote_code=True)
with torch.no_grad():
    logits = model(**inputs).logits
print(json.dumps({"torch": logits[0].tolist(), "onnx": ort(**inputs).logits[0].tolist(),
                  "ours_imported": any(name.split(".")[0] in ("pretrain", "compressor") for name in sys.modules)}))
"""


def loads_without_this_package(saved, onnx_dir, bundle: ModelBundle, task) -> None:
    """Transformers and Optimum load the dirs from the modeling file they ship (remote code),
    in a process that never imports this tool, and compute the tool's logits."""
    import subprocess
    import sys
    text = task.split("test").texts[0]
    done = subprocess.run([sys.executable, "-c", LOAD_ELSEWHERE, str(saved), str(onnx_dir), text],
                          capture_output=True, text=True, timeout=600, cwd=saved.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = predict_logits(bundle.model, encode(bundle.tokenizer, task.split("test").head(1)))[0]
    assert not result["ours_imported"]
    np.testing.assert_allclose(result["torch"], expected, atol=1e-5)
    np.testing.assert_allclose(result["onnx"], expected, atol=1e-4)


def test_a_cnn_student_learns_more_from_soft_targets_alone(bert_bundle, tiny_task):
    """`distill` with logits-only losses after `distill-structure`: no Transformer layers read."""
    cnn = apply_pass(bert_bundle, "distill-structure", config(epochs=0.2), ctx(tiny_task, copied(bert_bundle)))
    soft = get_pass("distill").config_type.model_validate(
        {"losses": ["soft"], "epochs": 1, "max_train_samples": 32, "batch_size": 16})
    out = apply_pass(cnn, "distill", soft, ctx(tiny_task, copied(bert_bundle)))
    assert out.model.config.model_type == "textcnn"
    assert not torch.equal(out.model.classifier.weight, cnn.model.classifier.weight)


def test_teacher_embeddings_are_its_principal_directions(bert_bundle):
    weight = bert_bundle.model.get_input_embeddings().weight.detach()
    torch.testing.assert_close(principal_projection(weight, weight.shape[1]), weight)
    projected = principal_projection(weight, 4)
    variances = projected.var(0)
    assert projected.shape == (weight.shape[0], 4) and torch.all(variances[:-1] >= variances[1:])
    # Orthogonal directions: the projected columns are uncorrelated.
    cov = torch.cov(projected.T)
    assert torch.allclose(cov - torch.diag(torch.diag(cov)), torch.zeros_like(cov), atol=1e-5)
    with pytest.raises(UserError, match="exceeds the model's embedding width"):
        principal_projection(weight, weight.shape[1] + 1)


def test_static_embeddings_fill_whole_word_tokens(bert_bundle, tmp_path):
    vocab = bert_bundle.tokenizer.get_vocab()
    vectors = np.arange(2 * 16, dtype=np.float32).reshape(2, 16)
    (tmp_path / "emb").mkdir()
    save_embeddings(tmp_path / "emb", [("dog", 5), ("walked", 3)], vectors)
    table = initial_embeddings(bert_bundle.model, bert_bundle.tokenizer, config(embeddings=str(tmp_path / "emb")))
    np.testing.assert_array_equal(table[vocab["dog"]].numpy(), vectors[0])
    np.testing.assert_array_equal(table[vocab["walked"]].numpy(), vectors[1])
    assert not torch.equal(table[vocab["##s"]], table[vocab["cat"]])   # random rows, not one shared row
    assert torch.all(table[bert_bundle.tokenizer.pad_token_id] == 0)
    with pytest.raises(UserError, match="16-dimensional; expected embedding_dim: 16"):
        initial_embeddings(bert_bundle.model, bert_bundle.tokenizer,
                           config(embeddings=str(tmp_path / "emb"), embedding_dim=8, hidden_size=12))
    with pytest.raises(UserError, match="neither 'teacher', 'random'"):
        initial_embeddings(bert_bundle.model, bert_bundle.tokenizer, config(embeddings=str(tmp_path / "nope")))


def test_embeddings_of_another_width_are_refused_before_anything_runs(tiny_bert_dir, tiny_csv, tmp_path):
    from compressor import Pipeline
    (tmp_path / "emb").mkdir()
    save_embeddings(tmp_path / "emb", [("dog", 5), ("walked", 3)], np.zeros((2, 16), dtype=np.float32))
    pipe = Pipeline("emb", teacher=str(tiny_bert_dir), task={"path": str(tiny_csv)}).variant(
        "v", config(embeddings=str(tmp_path / "emb"), embedding_dim=8, hidden_size=12))
    with pytest.raises(UserError, match=r"variants\.v\[0\]: distill-structure: the embeddings in .* are "
                                        r"16-dimensional; expected embedding_dim: 16"):
        pipe.plan(tmp_path / "out")
    (tmp_path / "model").mkdir()                                    # a dir that holds no embeddings
    pipe = Pipeline("emb", teacher=str(tiny_bert_dir), task={"path": str(tiny_csv)}).variant(
        "v", config(embeddings=str(tmp_path / "model")))
    with pytest.raises(UserError, match="is not an embeddings dir"):
        pipe.plan(tmp_path / "out")


def test_a_teacher_of_other_labels_is_refused_before_training(bert_bundle, tiny_task, monkeypatch):
    other = bert_bundle.model.config.__class__.from_dict(bert_bundle.model.config.to_dict())
    other.id2label = {i: f"x{i}" for i in range(other.num_labels)}
    other.label2id = {v: k for k, v in other.id2label.items()}
    model = bert_bundle.copy_model()
    model.config = other
    teacher = LazyTeacher(lambda: bert_bundle.replace(model=model))
    import compressor.passes.shallow_students as module
    monkeypatch.setattr(module, "finetune", lambda *a, **k: pytest.fail("trained before refusing"))
    with pytest.raises(UserError, match="teacher's labels"):
        apply_pass(bert_bundle, "distill-structure", config(epochs=1), ctx(tiny_task, teacher))


@pytest.mark.parametrize("fields, why", [
    ({"strategy": "adapters"}, "new student network"),
    ({"kind": "bilstm", "embedding_dim": 32, "hidden_size": 32}, "must exceed embedding_dim"),
    ({"kind": "rnn"}, "bilstm"),
    ({"alpha": 1.5}, "less than or equal to 1"),
    ({"kernel_sizes": [3, 0]}, "positive"),
])
def test_config_validation(fields, why):
    with pytest.raises(ValidationError, match=why):
        config(**fields)


def test_default_rate_is_the_students_not_the_fine_tunes():
    assert config().lr == 1e-3 and config(lr=5e-4).lr == 5e-4
