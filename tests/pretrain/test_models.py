"""Resolving model references, loading classifiers, and restructuring encoder layers."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from pretrain.errors import UserError
from pretrain.models import (SUPPORTED_FAMILIES, check_head_for, check_model_ref, count_params, encoder_layers,
                             keep_encoder_layers, label_names_of, load_classifier,
                             load_saved_classifier, read_model_type, resolve_model_path)


def _inputs(tokenizer, texts=("a small green house", "engine", "the river walks slowly near the old road")):
    return tokenizer(list(texts), padding=True, return_tensors="pt")


# --- resolving references ---

def test_resolve_bundled_minilm():
    path = resolve_model_path("minilm")
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "bert"
    assert config["num_hidden_layers"] == 6 and config["hidden_size"] == 384
    assert (path / "model.safetensors").is_file()
    assert check_model_ref("minilm") == path


def test_unknown_model_dir_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found") as err:
        resolve_model_path(str(tmp_path / "nope"))
    assert "minilm" in str(err.value)        # says what would have been accepted


def test_dir_without_config_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="no config.json"):
        check_model_ref(str(tmp_path))


def test_unsupported_family_lists_supported_ones(gpt2_dir):
    with pytest.raises(UserError) as err:
        load_classifier(str(gpt2_dir), ("a", "b"))
    message = str(err.value)
    assert "'gpt2'" in message and "not supported" in message
    assert all(family in message for family in SUPPORTED_FAMILIES)
    assert "\n" not in message


def test_invalid_config_json_is_a_user_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        read_model_type(tmp_path)


def test_dir_without_weights(tmp_path, tiny_bert_dir):
    shutil.copy(tiny_bert_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(UserError, match="no weights"):
        check_model_ref(str(tmp_path))


def test_an_onnx_export_where_a_pytorch_model_is_expected_is_named(tmp_path, tiny_bert_dir):
    shutil.copy(tiny_bert_dir / "config.json", tmp_path / "config.json")
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(UserError, match="holds an ONNX export, not a PyTorch model"):
        check_model_ref(str(tmp_path))


def copy_with(tiny_bert_dir, tmp_path, **config_changes):
    """The tiny model dir copied, its config.json changed (the weights left as saved)."""
    target = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **config_changes}))
    return target


@pytest.mark.parametrize("layers, message", [(6, "missing .*encoder.layer.4"), (2, "no place in it .*encoder.layer.2")])
def test_weights_that_do_not_fit_the_config_are_refused(tiny_bert_dir, tiny_task, tmp_path, layers, message):
    """Transformers would fill missing layers with random values (or drop extra ones) with a
    warning at most; either way the model would be silently broken."""
    broken = copy_with(tiny_bert_dir, tmp_path, num_hidden_layers=layers)   # the weights hold 4 layers
    with pytest.raises(UserError, match=f"do not fit its config.json: .*{message}"):
        load_saved_classifier(broken)
    with pytest.raises(UserError, match=f"do not fit its config.json: .*{message}"):
        load_classifier(str(broken), tiny_task.label_names)


def test_weights_of_another_width_name_the_tensor_and_its_shapes(tiny_bert_dir, tmp_path):
    """torch's message puts the tensor on its second line: the first alone ended at a colon."""
    broken = copy_with(tiny_bert_dir, tmp_path, hidden_size=64, intermediate_size=128)   # saved at hidden 32
    with pytest.raises(UserError) as err:
        load_saved_classifier(broken)
    message = str(err.value)
    assert "\n" not in message and "size mismatch for" in message and "torch.Size([32" in message
    assert message.endswith("expected weights of the shapes its config.json gives")


def test_a_truncated_weights_file_is_a_user_error(tiny_bert_dir, tiny_task, tmp_path):
    broken = copy_with(tiny_bert_dir, tmp_path)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    for load in (load_saved_classifier, lambda path: load_classifier(str(path), tiny_task.label_names)):
        with pytest.raises(UserError, match="cannot load model weights .*truncated or corrupt"):
            load(broken)


def test_a_dir_without_tokenizer_files_is_a_user_error(tiny_bert_dir, tmp_path):
    broken = copy_with(tiny_bert_dir, tmp_path)
    for name in ("tokenizer.json", "vocab.txt"):
        (broken / name).unlink(missing_ok=True)
    with pytest.raises(UserError, match="cannot load a tokenizer .*no tokenizer files"):
        load_saved_classifier(broken)


# --- loading classifiers ---

def test_a_head_for_other_labels_is_named_with_the_labels_quoted_and_no_ellipsis_for_all(tmp_path):
    # Labels may hold commas; "(0, 1, 2, ...)" read as if more labels followed.
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {"0": "0", "1": "1", "2": "2"}}))
    with pytest.raises(UserError) as err:
        check_head_for(tmp_path, ("yes, sure", "no", "maybe", "later"), "answers")
    assert "its head has 3 labels ('0', '1', '2'); expected a model fine-tuned on 'answers' " \
        "(4 labels: 'yes, sure', 'no', 'maybe', ...)" in str(err.value)


def test_load_classifier_keeps_head_when_labels_match(tiny_bert_dir, tiny_task):
    saved = AutoModelForSequenceClassification.from_pretrained(str(tiny_bert_dir))
    model, tokenizer = load_classifier(str(tiny_bert_dir), tiny_task.label_names)
    assert label_names_of(model) == tiny_task.label_names
    assert torch.equal(model.classifier.weight, saved.classifier.weight)
    assert torch.equal(model.classifier.bias, saved.classifier.bias)
    assert tokenizer("a dog")["input_ids"][0] == tokenizer.cls_token_id


def test_load_classifier_reinitialises_head_for_other_labels(tiny_bert_dir, small_task):
    saved = AutoModelForSequenceClassification.from_pretrained(str(tiny_bert_dir))
    model, _ = load_classifier(str(tiny_bert_dir), small_task.label_names)     # 45 labels, not 4
    assert model.config.num_labels == 45
    assert label_names_of(model) == small_task.label_names
    assert model.config.label2id["noun.animal"] == small_task.label_names.index("noun.animal")
    assert model.classifier.weight.shape == (45, 32)
    # The encoder is the checkpoint's.
    assert torch.equal(model.bert.encoder.layer[0].output.dense.weight,
                       saved.bert.encoder.layer[0].output.dense.weight)


def test_load_classifier_reinitialises_head_for_same_number_of_other_labels(tiny_bert_dir, tiny_task):
    saved = AutoModelForSequenceClassification.from_pretrained(str(tiny_bert_dir))
    other = ("w", "x", "y", "z")
    assert len(other) == len(tiny_task.label_names)
    model, _ = load_classifier(str(tiny_bert_dir), other)
    assert label_names_of(model) == other
    assert not torch.equal(model.classifier.weight, saved.classifier.weight)


def test_load_classifier_gives_bare_encoder_a_head(minilm_dir):
    model, _ = load_classifier("minilm", ("a", "b", "c"))
    assert model.config.num_labels == 3 and label_names_of(model) == ("a", "b", "c")
    assert count_params(model) == pytest.approx(22.7e6, rel=0.01)


def test_load_saved_classifier_as_is(tiny_distilbert_dir, tiny_task):
    model, tokenizer = load_saved_classifier(tiny_distilbert_dir)
    assert model.config.model_type == "distilbert"
    assert label_names_of(model) == tiny_task.label_names
    assert len(encoder_layers(model)) == 3


# --- keeping a subset of layers ---

@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_keep_encoder_layers(family, model_dirs, tokenizer, tmp_path):
    model, _ = load_saved_classifier(model_dirs[family])
    original = [{k: v.clone() for k, v in layer.state_dict().items()} for layer in encoder_layers(model)]
    n_before = len(original)
    keep = [n_before - 1, 0]          # reordering is allowed too
    keep_encoder_layers(model, keep)

    layers = encoder_layers(model)
    assert len(layers) == 2
    layer_count = model.config.n_layers if family == "distilbert" else model.config.num_hidden_layers
    assert layer_count == 2
    for new, old in enumerate(keep):
        state = layers[new].state_dict()
        assert state.keys() == original[old].keys()
        assert all(torch.equal(state[k], original[old][k]) for k in state)
        indices = {m.layer_idx for m in layers[new].modules() if hasattr(m, "layer_idx")}
        assert indices <= {new}
    if family == "bert":
        assert layers[0].attention.self.layer_idx == 0 and layers[1].attention.self.layer_idx == 1

    with torch.no_grad():
        logits = model(**{k: v for k, v in _inputs(tokenizer).items()
                          if family == "bert" or k != "token_type_ids"}).logits
    assert logits.shape == (3, 4) and torch.isfinite(logits).all()

    # The config written out describes the new structure: it reloads without mismatches.
    model.save_pretrained(str(tmp_path))
    reloaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path))
    assert len(encoder_layers(reloaded)) == 2


def test_keep_all_layers_is_the_identity(tiny_bert_dir, tokenizer):
    model, _ = load_saved_classifier(tiny_bert_dir)
    inputs = _inputs(tokenizer)
    with torch.no_grad():
        before = model(**inputs).logits
        keep_encoder_layers(model, [0, 1, 2, 3])
        after = model(**inputs).logits
    assert torch.equal(before, after)


def test_keep_encoder_layers_renumbers_pruned_heads(tiny_bert_dir, tokenizer, tmp_path):
    model, _ = load_saved_classifier(tiny_bert_dir)
    model.prune_heads({2: [0], 3: [1, 2]})
    keep_encoder_layers(model, [0, 2])
    assert {int(k): sorted(v) for k, v in model.config.pruned_heads.items()} == {1: [0]}
    model.save_pretrained(str(tmp_path))
    reloaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path))
    with torch.no_grad():
        assert torch.allclose(reloaded(**_inputs(tokenizer)).logits, model(**_inputs(tokenizer)).logits, atol=1e-6)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_set_threads_uses_the_cores_this_process_may_run_on():
    from pretrain.models import set_threads
    allowed, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        os.sched_setaffinity(0, {min(allowed)})       # as under `taskset -c N`
        set_threads(None)
        assert torch.get_num_threads() == 1
        set_threads(3)                                # an explicit count wins
        assert torch.get_num_threads() == 3
    finally:
        os.sched_setaffinity(0, allowed)
        torch.set_num_threads(threads)
