"""`share-layers`: ALBERT's group assignment, which tensors each mode shares, the initial
weights, sharing that survives fine-tuning, saving (here and in a fresh process) and the ONNX
export (each shared tensor stored once, fused and int8), and the refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from compressor.bundle import ModelBundle
from compressor.export.onnx import ONNX_FILE, ExportSettings, export_bundle
from compressor.export.quantize import QuantizeConfig
from compressor.modeling.structure import set_intermediate_size
from compressor.passes import Context, apply_pass, check_pass_family
from compressor.passes.sharing import ShareLayers, layer_groups
from pretrain.batching import encode
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig, predict_logits
from pretrain.models import count_params, encoder_layers

ATTENTION = "attention.self.query.weight"   # one tensor of each sublayer, as seen from a layer
FFN = "intermediate.dense.weight"
LAYER_NORMS = {"attention": "attention.output.LayerNorm.weight", "ffn": "output.LayerNorm.weight"}


def ctx(task) -> Context:
    return Context(task=task, seed=0, show_progress=False)


def share(bundle: ModelBundle, task, **config) -> ModelBundle:
    return apply_pass(bundle, "share-layers", ShareLayers(**config), ctx(task))


def tensor(layer: torch.nn.Module, name: str) -> torch.Tensor:
    return layer.get_parameter(name)


def same(layers, i: int, j: int, name: str) -> bool:
    return tensor(layers[i], name).data_ptr() == tensor(layers[j], name).data_ptr()


@pytest.mark.parametrize("layers, groups, expected", [
    (6, 1, [[0, 1, 2, 3, 4, 5]]),
    (6, 2, [[0, 1, 2], [3, 4, 5]]),
    (6, 4, [[0, 1], [2], [3, 4], [5]]),          # floor(i * G / L)
    (12, 3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]),
])
def test_layer_i_joins_group_floor_i_g_over_l(layers, groups, expected):
    assert layer_groups(layers, groups) == expected


@pytest.mark.parametrize("mode", ["all", "attention", "ffn"])
def test_each_mode_shares_exactly_its_tensors(bert_bundle, tiny_task, mode):
    before = bert_bundle.params
    out = share(bert_bundle, tiny_task, mode=mode, groups=2)          # groups [0, 1] and [2, 3]
    layers = encoder_layers(out.model)
    shares = {"attention": mode in ("all", "attention"), "ffn": mode in ("all", "ffn")}
    for part, name in (("attention", ATTENTION), ("ffn", FFN)):
        assert same(layers, 0, 1, name) == shares[part] and same(layers, 2, 3, name) == shares[part]
        assert same(layers, 0, 1, LAYER_NORMS[part]) == shares[part]   # the sublayer's LayerNorm with it
        assert not same(layers, 1, 2, name)                            # groups stay apart
    # Unique parameters: each shared tensor counted once, by the bundle and the report.
    per_layer = {part: sum(p.numel() for path in modules for p in layers[0].get_submodule(path).parameters())
                 for part, modules in (("attention", ["attention"]), ("ffn", ["intermediate", "output"]))}
    saved = sum(per_layer[part] for part, on in shares.items() if on) * 2   # one layer per group goes
    assert out.params == before - saved == count_params(out.model)
    assert bert_bundle.params == before                                 # the input keeps its layers
    assert not same(encoder_layers(bert_bundle.model), 0, 1, ATTENTION)


def test_groups_of_one_layer_stay_unshared(bert_bundle, tiny_task):
    layers = encoder_layers(share(bert_bundle, tiny_task, groups=3).model)   # [0, 1], [2], [3]
    assert same(layers, 0, 1, FFN) and not same(layers, 1, 2, FFN) and not same(layers, 2, 3, FFN)


def test_init_first_average_or_a_position(bert_bundle, tiny_task):
    layers = encoder_layers(bert_bundle.model)
    original = [tensor(layer, FFN).detach().clone() for layer in layers]
    first = encoder_layers(share(bert_bundle, tiny_task, groups=1).model)
    assert torch.equal(tensor(first[3], FFN), original[0])
    average = encoder_layers(share(bert_bundle, tiny_task, groups=2, init="average").model)
    torch.testing.assert_close(tensor(average[1], FFN), (original[0] + original[1]) / 2)
    torch.testing.assert_close(tensor(average[3], FFN), (original[2] + original[3]) / 2)
    second = encoder_layers(share(bert_bundle, tiny_task, groups=2, init=1).model)
    assert torch.equal(tensor(second[0], FFN), original[1]) and torch.equal(tensor(second[2], FFN), original[3])


def test_sharing_survives_finetune(bert_bundle, tiny_task):
    shared = share(bert_bundle, tiny_task, groups=1)
    start = tensor(encoder_layers(shared.model)[0], FFN).detach().clone()
    tuned = apply_pass(shared, "finetune", FinetuneConfig(epochs=1, batch_size=16, lr=1e-3, max_train_samples=32),
                       ctx(tiny_task))
    layers = encoder_layers(tuned.model)
    assert all(same(layers, 0, i, name) for i in range(1, 4) for name in (ATTENTION, FFN))
    assert not torch.equal(tensor(layers[0], FFN), start)     # trained, as one tensor
    assert tuned.params == shared.params


PLAIN_LOAD = """
import json, sys, torch
from transformers import AutoModelForSequenceClassification
directory, ids = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True).eval()
layers = model.base_model.encoder.layer
with torch.no_grad():
    logits = model(torch.tensor(ids)).logits.tolist()
ptrs = {name: [layer.get_parameter(name).data_ptr() for layer in layers] for name in sys.argv[3:]}
print(json.dumps({"logits": logits, "ptrs": ptrs}))
"""


def test_saved_once_and_reloaded_shared_in_a_fresh_process(bert_bundle, tiny_task, tmp_path):
    """Mode attention (the record's sublayer entry): the file loses 2 layers' attention, and
    plain Transformers in a new interpreter (trust_remote_code, without this tool's packages)
    loads the dir back with the same sharing and the same logits."""
    out = share(bert_bundle, tiny_task, mode="attention", groups=2)
    directory, full = out.save(tmp_path / "shared"), bert_bundle.save(tmp_path / "full")
    layer = encoder_layers(out.model)[0].attention
    attention_bytes = 4 * sum(p.numel() for p in layer.parameters())
    size, full_size = ((d / "model.safetensors").stat().st_size for d in (directory, full))
    assert full_size - 2 * attention_bytes - 4096 < size <= full_size - 2 * attention_bytes   # + header names
    ids = [list(row) for row in encode(out.tokenizer, tiny_task.split("test").head(1)).input_ids]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", PLAIN_LOAD, str(directory), json.dumps(ids), ATTENTION, FFN],
                          capture_output=True, text=True, check=True, cwd=tmp_path, env=env, timeout=600)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    attention, ffn = loaded["ptrs"][ATTENTION], loaded["ptrs"][FFN]
    assert attention[0] == attention[1] and attention[2] == attention[3] and attention[1] != attention[2]
    assert len(set(ffn)) == 4
    np.testing.assert_allclose(loaded["logits"], predict_logits(out.model, encode(out.tokenizer, tiny_task.split(
        "test").head(1))), atol=1e-5)


def duplicated_initializers(path) -> int:
    tensors = [numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer]
    keys = [(a.dtype.str, a.shape, a.tobytes()) for a in tensors]
    return len(keys) - len(set(keys))


def test_onnx_stores_each_shared_tensor_once_fused_and_int8(bert_bundle, tiny_task, tmp_path):
    shared = share(bert_bundle, tiny_task, groups=1)
    settings = ExportSettings(accuracy_tolerance=1.0)
    fp32 = export_bundle(shared, tmp_path / "fp32", settings, tiny_task).record
    # Fusion concatenates each fused layer's Q, K and V into a new constant: equal copies,
    # merged (3 fused layers: the last runs the first token alone, pretrain/first_token.py).
    assert fp32["fusions"]["Attention"] == 3 and fp32["fused_duplicates_merged"] >= 2
    assert duplicated_initializers(tmp_path / "fp32" / ONNX_FILE) == 0
    full = export_bundle(bert_bundle, tmp_path / "full", settings, tiny_task).record
    layer = encoder_layers(bert_bundle.model)[0]
    layer_bytes = 4 * count_params(layer)
    # The last layer runs unfused (the first token alone): it reads Q, K and V as they are,
    # beside the fused layers' one concatenation of them, so the file holds them twice.
    qkv_bytes = 4 * sum(count_params(getattr(layer.attention.self, name)) for name in ("query", "key", "value"))
    assert fp32["size_bytes"] <= full["size_bytes"] - 3 * layer_bytes + qkv_bytes + 4096
    int8 = apply_pass(shared, "quantize", QuantizeConfig(mode="dynamic-int8", per_channel=True), ctx(tiny_task))
    record = export_bundle(int8, tmp_path / "int8", settings, tiny_task).record
    graph = onnx.load(str(tmp_path / "int8" / ONNX_FILE)).graph
    assert {"QAttention", "MatMulInteger"} & {n.op_type for n in graph.node}
    assert duplicated_initializers(tmp_path / "int8" / ONNX_FILE) == 0 and record["quantized_duplicates_merged"] >= 0


def test_layers_of_different_shapes_are_refused_before_any_change(bert_bundle, tiny_task):
    set_intermediate_size(bert_bundle.model, 1, list(range(32)))       # FFN of layer 1 pruned to 32
    before = {k: v.clone() for k, v in bert_bundle.model.state_dict().items()}
    with pytest.raises(UserError, match=r"layers 0 and 1 differ in shape \(intermediate\.dense\.weight") as err:
        share(bert_bundle, tiny_task, mode="ffn", groups=1)
    assert "\n" not in str(err.value)
    share(bert_bundle, tiny_task, mode="attention", groups=1)           # the attention still has one shape
    assert all(torch.equal(v, before[k]) for k, v in bert_bundle.model.state_dict().items())


@pytest.mark.parametrize("config, message", [
    ({"groups": 4}, "groups=4 shares nothing in a model of 4 layers; expected 1 to 3"),
    ({"groups": 2, "init": 2}, "init=2 is no position in every group"),
])
def test_bad_settings_are_refused_in_one_line(bert_bundle, tiny_task, config, message):
    with pytest.raises(UserError, match=message) as err:
        share(bert_bundle, tiny_task, **config)
    assert "\n" not in str(err.value)


def test_families_without_layers_of_their_own_are_refused_up_front():
    with pytest.raises(UserError, match="share-layers on model family 'albert': ALBERT's layers already share"):
        check_pass_family("share-layers", ShareLayers(), "albert")
    with pytest.raises(UserError, match="Transformer layers.*'bilm'"):
        check_pass_family("share-layers", ShareLayers(mode="ffn"), "bilm")
    for family in ("bert", "distilbert", "bart", "xlnet"):
        check_pass_family("share-layers", ShareLayers(mode="attention"), family)


def test_int8_plans_reach_every_layer_that_applies_a_shared_linear(bert_bundle, tiny_task, tmp_path):
    """sensitivity, qat and static int8 `scope: linears` name torch Linears; with shared
    weights one Linear is a graph node per layer, and the plan must reach all of them."""
    from compressor.export.graph_map import linear_nodes
    from compressor.export.graph_surgery import read_initializers_directly
    from compressor.export.trace import write_onnx
    shared = share(bert_bundle, tiny_task, groups=1)
    write_onnx(shared.model, tmp_path / "graph.onnx")
    # the exporter hands layers 1-3 an Identity of layer 0's weight; the export reads it directly
    assert read_initializers_directly(tmp_path / "graph.onnx") >= 3 * 6   # + biases, LayerNorms
    found = linear_nodes(tmp_path / "graph.onnx", shared.model)
    assert len(found["bert.encoder.layer.2.intermediate.dense"]) == 4
    assert len({n.node for nodes in found.values() for n in nodes}) == 4 * 6 + 2   # + pooler, classifier


def test_layers_pruned_to_different_head_counts_are_refused_before_any_step_runs():
    """prune-heads then share-layers was refused only when share-layers ran, after the steps
    before it (and any training among them) had run: the counts `per_layer` gives are known up
    front, and scored ones may differ unless the layers already shared their attention."""
    from compressor.passes.pruning import PruneHeads
    from compressor.passes.registry import Known, Shape, shape_after
    shape = Shape("bert", layers=4, heads=(4,) * 4, hidden=32)
    start = Known(model=shape, teacher=shape)

    def steps(*chain) -> Known:
        known = start
        for name, config in chain:
            known = shape_after(name, config, known)
        return known

    uneven = ("prune-heads", PruneHeads(per_layer=(1, 2, 1, 2)))
    with pytest.raises(UserError, match=r"^share-layers: layers 0 to 1 keep different head counts \(3, 2\)") as err:
        steps(uneven, ("share-layers", ShareLayers(groups=2)))
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"^share-layers: layers 0 to 3 may keep different head counts: prune-heads"):
        steps(("prune-heads", PruneHeads(fraction=0.5)), ("share-layers", ShareLayers(mode="attention")))
    # what can share: the FFN alone, layers of one count, or groups that were one attention when scored
    steps(uneven, ("share-layers", ShareLayers(mode="ffn", groups=2)))
    steps(("prune-heads", PruneHeads(per_layer=(1, 1, 2, 2))), ("share-layers", ShareLayers(groups=2)))
    steps(("share-layers", ShareLayers(groups=2)), ("prune-heads", PruneHeads(fraction=0.5)),
          ("share-layers", ShareLayers(groups=2)))


def test_layers_pruned_to_different_ffn_widths_are_refused_before_any_step_runs():
    """prune-ffn then share-layers (mode all or ffn) was refused only when share-layers ran: a
    global prune-ffn may leave every layer its own width, and per_layer widths are known up
    front; a group that already shared its FFN when pruned stays one width."""
    from compressor.passes.pruning import PruneFFN
    from compressor.passes.registry import Known, Shape, shape_after
    shape = Shape("bert", layers=4, heads=(4,) * 4, hidden=32, ffn=(64, 64, 48, 48))
    start = Known(model=shape, teacher=shape, train_rows=1000)

    def steps(*chain) -> Known:
        known = start
        for name, config in chain:
            known = shape_after(name, config, known)
        return known

    scored = ("prune-ffn", PruneFFN(fraction=0.5))
    for mode in ("all", "ffn"):
        with pytest.raises(UserError, match=r"^share-layers: layers 0 to 3 may have different FFN widths: "
                                            r"prune-ffn before it with scope: global") as err:
            steps(scored, ("share-layers", ShareLayers(mode=mode)))
        assert "\n" not in str(err.value)
    per_layer = ("prune-ffn", PruneFFN(fraction=0.5, scope="per_layer"))
    with pytest.raises(UserError, match=r"^share-layers: layers 0 to 3 have different FFN widths \(32, 32, 24, 24\)"):
        steps(per_layer, ("share-layers", ShareLayers(mode="ffn")))
    # what can share: the attention alone, layers of one width, or groups that were one FFN when pruned
    steps(scored, ("share-layers", ShareLayers(mode="attention")))
    assert steps(per_layer).model.ffn == (32, 32, 24, 24)
    steps(per_layer, ("share-layers", ShareLayers(groups=2)))
    for mode in ("all", "ffn"):
        steps(("share-layers", ShareLayers(mode=mode, groups=2)), scored,
              ("share-layers", ShareLayers(mode=mode, groups=2)))
    steps(("share-layers", ShareLayers(mode="attention", groups=2)), scored,
          ("share-layers", ShareLayers(mode="attention")))
