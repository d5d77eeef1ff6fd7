"""Structures the config cannot express survive save, reload, ONNX export and ORT fusion.

A 3-layer tiny BERT with per-layer FFN widths [37, 64, 20] and per-layer pruned heads
(3, 2, 4 heads left), and a 4-layer one whose layers 0-1 and 2-3 share parameters (also
pruned: a group loses its units together and keeps sharing). Each is saved by ModelBundle,
reloaded by this tool and by plain Transformers in a fresh process (trust_remote_code,
without this tool's packages), and exported behind the parity gate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from compressor.bundle import ModelBundle
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.modeling.structure import (prune_heads, record_for, remove_current_heads, set_intermediate_size,
                                           tie_layers)
from pretrain.errors import UserError
from pretrain.models import encoder_layers, keep_encoder_layers
from pretrain.structured import RECORD_FIELD

WIDTHS = [37, 64, 20]
PRUNED = {0: [1], 1: [0, 2]}          # heads left per layer: 3, 2, 4


def tiny_bert(labels: tuple[str, ...], vocab: int, layers: int) -> BertForSequenceClassification:
    """The conftest's tiny BERT shape (hidden 32, 4 heads, FFN 64) with `layers` layers."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128, num_labels=len(labels),
                        id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    return BertForSequenceClassification(config).eval()


@pytest.fixture
def pruned(tokenizer, tiny_task) -> ModelBundle:
    model = tiny_bert(tiny_task.label_names, len(tokenizer), layers=3)
    generator = torch.Generator().manual_seed(0)
    for layer, width in enumerate(WIDTHS):
        if width != 64:
            set_intermediate_size(model, layer, torch.randperm(64, generator=generator)[:width].tolist())
    prune_heads(model, PRUNED)
    return ModelBundle(model=model, tokenizer=tokenizer, task=tiny_task.spec)


@pytest.fixture
def shared(tokenizer, tiny_task) -> ModelBundle:
    model = tiny_bert(tiny_task.label_names, len(tokenizer), layers=4)
    tie_layers(model, [[0, 1], [2, 3]])
    return ModelBundle(model=model, tokenizer=tokenizer, task=tiny_task.spec)


def shapes(model) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def example_ids(bundle: ModelBundle) -> dict[str, torch.Tensor]:
    return dict(bundle.tokenizer(["a small green plant", "the dog barked at a tall man"], padding=True,
                                 return_tensors="pt"))


@torch.no_grad()
def logits(model, inputs) -> np.ndarray:
    return model.eval()(**inputs).logits.numpy()


PLAIN_LOAD = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import AutoModelForSequenceClassification
    directory, inputs_file, out_file = sys.argv[1:]
    model = AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True).eval()
    inputs = {k: torch.tensor(v) for k, v in json.load(open(inputs_file)).items()}
    with torch.no_grad():
        logits = model(**inputs).logits.tolist()
    layers = model.base_model.encoder.layer
    json.dump({"logits": logits, "shapes": {k: list(v.shape) for k, v in model.state_dict().items()},
               "same_storage": [layers[i].attention.self.query.weight.data_ptr() for i in range(len(layers))],
               "ours_imported": [m for m in ("compressor", "pretrain") if m in sys.modules]}, open(out_file, "w"))
""")


def load_in_plain_process(directory: Path, inputs: dict, tmp_path: Path) -> dict:
    """Load `directory` with plain Transformers in a fresh Python that cannot import this tool."""
    (tmp_path / "inputs.json").write_text(json.dumps({k: v.tolist() for k, v in inputs.items()}))
    (tmp_path / "plain_load.py").write_text(PLAIN_LOAD)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, str(tmp_path / "plain_load.py"), str(directory), str(tmp_path / "inputs.json"),
                    str(tmp_path / "out.json")], check=True, cwd=tmp_path, env=env, timeout=300)
    return json.loads((tmp_path / "out.json").read_text())


def test_pruned_model_records_its_ffn_widths_and_transformers_its_heads(pruned, tmp_path):
    model = pruned.model
    assert model.config.compressor_structure["intermediate_sizes"] == WIDTHS
    assert [layer.attention.self.num_attention_heads for layer in encoder_layers(model)] == [3, 2, 4]
    saved = json.loads((pruned.save(tmp_path / "m") / "config.json").read_text())
    assert saved[RECORD_FIELD] == {"layers": "encoder.layer", "ffn": ["intermediate.dense", "output.dense"],
                                   "intermediate_sizes": WIDTHS, "shared_layers": []}
    assert saved["pruned_heads"] == {"0": [1], "1": [0, 2]}
    assert saved["auto_map"] == {"AutoModelForSequenceClassification":
                                 "compressor_structure.StructuredBertForSequenceClassification"}
    assert (tmp_path / "m" / "compressor_structure.py").is_file()


def test_pruned_model_reloads_here_and_in_plain_transformers(pruned, tmp_path):
    directory = pruned.save(tmp_path / "m")
    inputs = example_ids(pruned)
    expected = logits(pruned.model, inputs)

    loaded = ModelBundle.load(directory)
    assert shapes(loaded.model) == shapes(pruned.model)
    np.testing.assert_allclose(logits(loaded.model, inputs), expected, atol=1e-5)

    plain = load_in_plain_process(directory, inputs, tmp_path)
    assert plain["ours_imported"] == []
    assert plain["shapes"] == shapes(pruned.model)
    np.testing.assert_allclose(np.array(plain["logits"]), expected, atol=1e-5)

    # Saved again after reloading (a Structured class now): the same record, and the plain
    # class name in architectures while auto_map points at the structured one.
    again = json.loads((loaded.save(tmp_path / "again") / "config.json").read_text())
    assert again[RECORD_FIELD]["intermediate_sizes"] == WIDTHS
    assert type(loaded.model).__qualname__ == "StructuredBertForSequenceClassification"
    assert again["architectures"] == ["BertForSequenceClassification"]
    assert again["auto_map"] == {"AutoModelForSequenceClassification":
                                 "compressor_structure.StructuredBertForSequenceClassification"}


def test_pruned_model_exports_fuses_and_passes_parity(pruned, tiny_task, tmp_path):
    record = export_bundle(pruned, tmp_path / "onnx", ExportSettings(), tiny_task).record
    assert record["parity_max_abs_diff"] <= record["parity_tolerance"]
    # ORT reads each layer's head count from its Reshape nodes (num_heads=0): the first two
    # fuse (the last runs the first token alone, pretrain/first_token.py).
    assert record["optimized"], record["fusion_fallback"]
    assert record["fusions"].get("Attention") == 2 and record["cls_only_last_layer"]


def test_shared_layers_save_once_and_reload_shared(shared, bert_bundle, tmp_path):
    model = shared.model
    layers = encoder_layers(model)
    assert layers[0].attention.self.query.weight is layers[1].attention.self.query.weight
    assert layers[1] is not layers[0]             # parameters are shared, modules are not
    directory = shared.save(tmp_path / "shared")
    unshared = bert_bundle.save(tmp_path / "unshared")   # the same 4-layer model, no sharing
    size, full = ((d / "model.safetensors").stat().st_size for d in (directory, unshared))
    layer_bytes = sum(p.numel() for p in layers[0].parameters()) * 4
    assert size <= full - 2 * layer_bytes + 1024          # two layers' tensors not stored

    inputs = example_ids(shared)
    expected = logits(model, inputs)
    loaded = ModelBundle.load(directory).model
    reloaded = encoder_layers(loaded)
    assert reloaded[2].output.dense.weight is reloaded[3].output.dense.weight
    assert reloaded[0].attention.self.query.weight.data_ptr() != reloaded[2].attention.self.query.weight.data_ptr()
    np.testing.assert_allclose(logits(loaded, inputs), expected, atol=1e-5)

    plain = load_in_plain_process(directory, inputs, tmp_path)
    ptrs = plain["same_storage"]
    assert ptrs[0] == ptrs[1] and ptrs[2] == ptrs[3] and ptrs[0] != ptrs[2]
    np.testing.assert_allclose(np.array(plain["logits"]), expected, atol=1e-5)


def test_dropping_layers_renumbers_the_record(shared, tmp_path):
    keep_encoder_layers(shared.model, [1, 2, 3])       # layer 0 goes: 1 is alone, 2-3 still share
    assert shared.model.config.compressor_structure["shared_layers"] == [[1, 2]]
    loaded = ModelBundle.load(shared.save(tmp_path / "m")).model
    layers = encoder_layers(loaded)
    assert layers[1].output.dense.weight is layers[2].output.dense.weight
    assert layers[0].output.dense.weight is not layers[1].output.dense.weight


def test_unchanged_structure_writes_no_record(bert_bundle, tmp_path):
    assert record_for(bert_bundle.model) is None
    config = json.loads((bert_bundle.save(tmp_path / "m") / "config.json").read_text())
    assert RECORD_FIELD not in config and "auto_map" not in config
    assert not (tmp_path / "m" / "compressor_structure.py").exists()


@pytest.mark.parametrize("keep", [[], [0, 0], [64]])
def test_bad_ffn_indices_are_refused(bert_bundle, keep):
    with pytest.raises(UserError, match="distinct indices"):
        set_intermediate_size(bert_bundle.model, 0, keep)


def test_overlapping_share_groups_are_refused(bert_bundle):
    with pytest.raises(UserError, match="disjoint"):
        tie_layers(bert_bundle.model, [[0, 1], [1, 2]])


def shared_pairs(model, pairs=((0, 1), (2, 3)), prefix: str = "") -> bool:
    """Whether each pair of layers holds the very same tensors (those under `prefix`)."""
    layers = encoder_layers(model)
    named = [{k: v for k, v in layer.named_parameters(remove_duplicate=False) if k.startswith(prefix)}
             for layer in layers]
    return all(named[a].keys() == named[b].keys() and all(named[a][k] is named[b][k] for k in named[a])
               for a, b in pairs)


def test_pruning_shared_layers_prunes_the_group_and_round_trips(shared, tiny_task, tmp_path):
    """Heads given for one layer of a group and an FFN sliced in one go from the whole group,
    which keeps sharing every tensor (LayerNorms and biases included): the record says so, the
    file stores each once, and this tool, plain Transformers and the ONNX export read it back."""
    model = shared.model
    remove_current_heads(model, {0: [1, 3]})        # layer 1 computes with the same weights
    set_intermediate_size(model, 3, list(range(0, 64, 2)))
    layers = encoder_layers(model)
    assert [layer.attention.self.num_attention_heads for layer in layers] == [2, 2, 4, 4]
    assert [layer.intermediate.dense.out_features for layer in layers] == [64, 64, 32, 32]
    assert shared_pairs(model)
    assert model.config.compressor_structure == {
        "layers": "encoder.layer", "ffn": ["intermediate.dense", "output.dense"],
        "intermediate_sizes": [64, 64, 32, 32], "shared_layers": [[0, 1], [2, 3]]}

    directory = shared.save(tmp_path / "m")
    inputs = example_ids(shared)
    expected = logits(model, inputs)
    loaded = ModelBundle.load(directory).model
    assert shapes(loaded) == shapes(model) and shared_pairs(loaded)
    np.testing.assert_allclose(logits(loaded, inputs), expected, atol=1e-5)
    plain = load_in_plain_process(directory, inputs, tmp_path)
    ptrs = plain["same_storage"]
    assert ptrs[0] == ptrs[1] and ptrs[2] == ptrs[3] and ptrs[0] != ptrs[2]
    assert plain["shapes"] == shapes(model)
    np.testing.assert_allclose(np.array(plain["logits"]), expected, atol=1e-5)
    record = export_bundle(shared, tmp_path / "onnx", ExportSettings(), tiny_task).record
    assert record["parity_max_abs_diff"] <= record["parity_tolerance"]


def test_different_units_for_layers_of_one_group_are_refused(shared):
    before = {k: v.clone() for k, v in shared.model.state_dict().items()}
    with pytest.raises(UserError, match=r"layers 0 and 1 share their weights \(share-layers\), so they lose the "
                                        r"same heads to remove; got \[1\] and \[2\]") as err:
        remove_current_heads(shared.model, {0: [1], 1: [2]})
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="layers 2 and 3 share"):
        prune_heads(shared.model, {2: [0], 3: [1]})           # numbered as unpruned: the same check
    assert all(torch.equal(v, before[k]) for k, v in shared.model.state_dict().items())


def test_a_shared_sublayer_is_pruned_as_one_and_the_other_layer_by_layer(bert_bundle):
    """FFN shared by all layers, attention not: heads go layer by layer, the FFN in all four."""
    model = bert_bundle.model
    tie_layers(model, [[0, 1, 2, 3]], "ffn")
    remove_current_heads(model, {0: [0], 2: [1, 2]})
    set_intermediate_size(model, 1, list(range(40)))
    layers = encoder_layers(model)
    assert [layer.attention.self.num_attention_heads for layer in layers] == [3, 4, 2, 4]
    assert [layer.intermediate.dense.out_features for layer in layers] == [40] * 4
    everything = ((0, 1), (1, 2), (2, 3))
    assert shared_pairs(model, everything, "intermediate.") and shared_pairs(model, everything, "output.")
    assert not shared_pairs(model, ((0, 1),), "attention.")
    assert model.config.compressor_structure["shared_sublayers"] == {
        "ffn": {"modules": ["intermediate", "output"], "groups": [[0, 1, 2, 3]]}}
