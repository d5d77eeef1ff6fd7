"""prune-heads and prune-ffn: units really removed, per-layer counts, reload in a fresh process,
ORT fusion with per-layer head counts, taylor finding the heads that matter, refusals, layers
shared by `share-layers` pruned as one; and drop-layers choosing layers by importance (`count`).

The tiny BERT of the conftest: 4 layers, 4 heads of width 8, FFN 64.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from compressor.bundle import ModelBundle
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.modeling.importance import encode_for_model, mean_loss, train_rows
from compressor.passes import Context, apply_pass, get_pass
from compressor.passes.sharing import ShareLayers
from compressor.pipeline.recipe import parse_step
from pretrain.errors import UserError
from pretrain.models import encoder_layers, keep_encoder_layers
from tests.compressor.modeling.test_structure import example_ids, load_in_plain_process, logits, shared_pairs


def run(bundle, name: str, task, **config) -> ModelBundle:
    cfg = get_pass(name).config_type.model_validate({"samples": 32, **config})
    return apply_pass(bundle, name, cfg, Context(task=task, seed=0, show_progress=False))


def heads(model) -> list[int]:
    return [layer.attention.self.num_attention_heads for layer in encoder_layers(model)]


def test_heads_are_removed_from_the_weights(bert_bundle, tiny_task):
    out = run(bert_bundle, "prune-heads", tiny_task, fraction=0.5)
    assert sum(heads(out.model)) == 8 and min(heads(out.model)) >= 1
    for layer, n in zip(encoder_layers(out.model), heads(out.model)):
        attention = layer.attention
        assert attention.self.query.weight.shape == (8 * n, 32) == attention.self.value.weight.shape
        assert attention.output.dense.weight.shape == (32, 8 * n)
    assert out.params < bert_bundle.params
    assert heads(bert_bundle.model) == [4, 4, 4, 4]


@pytest.mark.parametrize("config, expected", [({"per_layer": [1, 2, 0, 3]}, [3, 2, 4, 1]),
                                              ({"count": 6, "importance": "magnitude"}, None)])
def test_per_layer_and_count_selection(bert_bundle, tiny_task, config, expected):
    out = run(bert_bundle, "prune-heads", tiny_task, **config)
    assert heads(out.model) == expected if expected else sum(heads(out.model)) == 10


def test_pruning_twice_numbers_heads_as_they_are_now(bert_bundle, tiny_task):
    once = run(bert_bundle, "prune-heads", tiny_task, per_layer=[1, 2, 0, 3], importance="random")
    twice = run(once, "prune-heads", tiny_task, per_layer=[1, 1, 0, 0], importance="random")
    assert heads(twice.model) == [2, 1, 4, 1]
    pruned = twice.model.config.pruned_heads
    assert [len(pruned.get(i, [])) for i in range(4)] == [2, 3, 0, 3]


def test_taylor_finds_the_heads_that_matter(bert_bundle, tiny_task):
    """Heads 1-3 of every layer are made nearly silent (output columns x 1e-3) but heavy (Q/K/V
    x 10): taylor keeps head 0 of each layer and the function; magnitude keeps a silent head."""
    model = bert_bundle.copy_model()
    with torch.no_grad():
        for layer in encoder_layers(model):
            layer.attention.output.dense.weight[:, 8:] *= 1e-3
            for linear in (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value):
                linear.weight[8:] *= 10
    bundle = bert_bundle.replace(model=model)
    inputs = example_ids(bundle)
    expected = logits(model, inputs)
    errors, removed = {}, {}
    for kind in ("taylor", "magnitude"):
        out = run(bundle, "prune-heads", tiny_task, fraction=0.75, importance=kind)
        assert heads(out.model) == [1, 1, 1, 1]
        errors[kind] = np.abs(logits(out.model, inputs) - expected).max()
        removed[kind] = {layer: sorted(hs) for layer, hs in out.model.config.pruned_heads.items()}
    assert removed["taylor"] == {layer: [1, 2, 3] for layer in range(4)}
    assert removed["magnitude"] != removed["taylor"]
    assert errors["magnitude"] > 20 * errors["taylor"], errors


def test_emptied_layer_is_dropped_and_the_result_reloads_and_fuses(bert_bundle, tiny_task, tmp_path):
    """Head counts 4, 3, 1 after dropping layer 0, FFN widths per layer: saved, loaded by plain
    Transformers in a fresh process, and exported with every attention fused."""
    pruned = run(bert_bundle, "prune-heads", tiny_task, per_layer=[4, 0, 1, 3], allow_drop_layers=True)
    assert heads(pruned.model) == [4, 3, 1] and pruned.model.config.num_hidden_layers == 3
    out = run(pruned, "prune-ffn", tiny_task, fraction=0.5, scope="per_layer")
    assert out.model.config.compressor_structure["intermediate_sizes"] == [32, 32, 32]
    inputs = example_ids(out)
    directory = out.save(tmp_path / "m")
    plain = load_in_plain_process(directory, inputs, tmp_path)
    np.testing.assert_allclose(np.array(plain["logits"]), logits(out.model, inputs), atol=1e-5)
    record = export_bundle(out, tmp_path / "onnx", ExportSettings(), tiny_task).record
    # every layer but the last, which runs the first token alone (pretrain/first_token.py)
    assert record["optimized"] and record["fusions"].get("Attention") == 2, record.get("fusion_fallback")


def test_ffn_global_scope_keeps_a_neuron_in_every_layer(bert_bundle, tiny_task):
    out = run(bert_bundle, "prune-ffn", tiny_task, fraction=0.9)
    widths = [layer.intermediate.dense.out_features for layer in encoder_layers(out.model)]
    assert sum(widths) == round(0.1 * 256) and min(widths) >= 1
    assert [layer.output.dense.in_features for layer in encoder_layers(out.model)] == widths


@pytest.mark.parametrize("name, width", [("prune-ffn", lambda layer: layer.intermediate.dense.out_features),
                                         ("prune-heads", lambda layer: layer.attention.self.num_attention_heads)])
def test_cost_aware_ranking_spares_the_first_token_last_layer(bert_bundle, tiny_task, name, width):
    """The export runs the last layer on the first token only, so its units cost least: ranked
    per multiply-add, the same share of units goes from the other layers instead."""
    plain = [width(layer) for layer in encoder_layers(run(bert_bundle, name, tiny_task, fraction=0.5,
                                                          importance="magnitude").model)]
    aware = [width(layer) for layer in encoder_layers(run(bert_bundle, name, tiny_task, fraction=0.5,
                                                          importance="magnitude", cost_aware=True).model)]
    assert sum(aware) == sum(plain)
    assert aware[-1] > plain[-1] and aware[-1] == width(encoder_layers(bert_bundle.model)[-1])


@pytest.mark.parametrize("config, why", [
    ({"fraction": 1.0}, r"expected a number in \[0, 1\) \(got 1.0\)"),
    ({"fraction": -0.1}, r"expected a number in \[0, 1\) \(got -0.1\)"),
    ({}, "exactly one of"), ({"fraction": 0.5, "count": 3}, "exactly one of"),
    ({"iterative": True, "count": 3}, "at most `fraction`")])
def test_prune_heads_config_refusals(config, why):
    with pytest.raises(UserError, match=why) as err:
        parse_step({"prune-heads": config}, "variants.v[0]")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("config, why", [
    ({"count": 17}, "more heads than the model has"), ({"count": 13}, "at most 12"),
    ({"per_layer": [1, 1, 1]}, "3 entries but the model has 4 layers"),
    ({"per_layer": [4, 0, 0, 0]}, "allow_drop_layers")])
def test_prune_heads_refuses_what_the_model_cannot_give(bert_bundle, tiny_task, config, why, monkeypatch):
    from compressor.modeling import importance
    monkeypatch.setattr(importance, "taylor_scores", lambda *a, **k: pytest.fail("scored before refusing"))
    with pytest.raises(UserError, match=why):
        run(bert_bundle, "prune-heads", tiny_task, **config)


def test_iterative_stops_before_accuracy_falls(bert_bundle, tiny_task):
    """With min_retention 1.0 on an untrained model a step is kept only if held-out accuracy
    does not drop: the result is between nothing and everything removable, each step 2 heads."""
    out = run(bert_bundle, "prune-heads", tiny_task, iterative=True, min_retention=1.0, step=0.125,
              validation_samples=64)
    assert 4 <= sum(heads(out.model)) <= 16 and sum(heads(out.model)) % 2 == 0
    everything = run(bert_bundle, "prune-heads", tiny_task, iterative=True, min_retention=0.01, fraction=0.5,
                     validation_samples=64)
    assert sum(heads(everything.model)) == 8


# --- after share-layers: a group of layers is one set of weights ---

def share(bundle, task, **config) -> ModelBundle:
    return apply_pass(bundle, "share-layers", ShareLayers(**config), Context(task=task, seed=0, show_progress=False))


def widths(model) -> list[int]:
    return [layer.intermediate.dense.out_features for layer in encoder_layers(model)]


SUBLAYER_PREFIXES = {"all": ("",), "attention": ("attention.",), "ffn": ("intermediate.", "output.")}


@pytest.mark.parametrize("name, mode", [("prune-heads", "all"), ("prune-heads", "attention"),
                                        ("prune-ffn", "all"), ("prune-ffn", "ffn")])
def test_pruning_shared_layers_keeps_each_group_shared(bert_bundle, tiny_task, name, mode, tmp_path):
    """Pruning the shared sublayer: every layer of a group loses the same units and the group
    still holds one set of tensors (LayerNorms and the outer bias included, which pruning layer
    by layer left tied to a leader whose record no longer said so); the record is the one
    share-layers wrote but the widths, and the dir reloads with the same sharing and logits."""
    shared = share(bert_bundle, tiny_task, mode=mode, groups=2)            # layers [0, 1] and [2, 3]
    out = run(shared, name, tiny_task, fraction=0.5)
    model = out.model
    if name == "prune-heads":
        assert sum(heads(model)) == 8 and heads(model)[0] == heads(model)[1] and heads(model)[2] == heads(model)[3]
        pruned = model.config.pruned_heads
        assert pruned.get(0) == pruned.get(1) and pruned.get(2) == pruned.get(3)
    else:
        width = widths(model)
        assert sum(width) == 128 and width[0] == width[1] and width[2] == width[3]
    assert all(shared_pairs(model, prefix=prefix) for prefix in SUBLAYER_PREFIXES[mode])
    before, after = shared.model.config.compressor_structure, model.config.compressor_structure
    assert {**after, "intermediate_sizes": None} == {**before, "intermediate_sizes": None}
    assert after["intermediate_sizes"] == widths(model)

    inputs = example_ids(out)
    loaded = ModelBundle.load(out.save(tmp_path / "m")).model
    assert heads(loaded) == heads(model) and widths(loaded) == widths(model)
    assert all(shared_pairs(loaded, prefix=prefix) for prefix in SUBLAYER_PREFIXES[mode])
    np.testing.assert_allclose(logits(loaded, inputs), logits(model, inputs), atol=1e-5)


def test_heads_and_ffn_pruned_after_sharing_export_behind_the_parity_gate(bert_bundle, tiny_task, tmp_path):
    """The tester's combination (share whole layers, then prune heads and FFN neurons): loaded
    by plain Transformers in a fresh process with nothing missing, exported and fused."""
    shared = share(bert_bundle, tiny_task, mode="all", groups=2)
    out = run(run(shared, "prune-heads", tiny_task, fraction=0.5), "prune-ffn", tiny_task, fraction=0.5)
    assert shared_pairs(out.model)
    inputs = example_ids(out)
    plain = load_in_plain_process(out.save(tmp_path / "m"), inputs, tmp_path)
    ptrs = plain["same_storage"]
    assert ptrs[0] == ptrs[1] and ptrs[2] == ptrs[3] and ptrs[0] != ptrs[2]
    np.testing.assert_allclose(np.array(plain["logits"]), logits(out.model, inputs), atol=1e-5)
    record = export_bundle(out, tmp_path / "onnx", ExportSettings(), tiny_task).record
    assert record["parity_max_abs_diff"] <= record["parity_tolerance"]
    assert record["optimized"], record.get("fusion_fallback")


def test_a_groups_scores_are_summed_over_its_layers(bert_bundle, tiny_task, monkeypatch):
    """Layers 0 and 1 share their heads: the heads that go are the lowest by the sum of the two
    layers' scores (heads 3 and 0), not either layer's own lowest (0 and 1; 2 and 3); a head of
    the group counts twice towards `count`."""
    from compressor.modeling import importance
    scores = [torch.tensor([0.1, 0.3, 0.9, 0.5]), torch.tensor([0.7, 0.6, 0.0, 0.2]),
              torch.ones(4), torch.ones(4)]
    monkeypatch.setattr(importance, "head_importance", lambda *args: [row.clone() for row in scores])
    shared = share(bert_bundle, tiny_task, mode="attention", groups=2)
    out = run(shared, "prune-heads", tiny_task, count=4, importance="random")
    assert {layer: sorted(hs) for layer, hs in out.model.config.pruned_heads.items()} == {0: [0, 3], 1: [0, 3]}
    assert heads(out.model) == [2, 2, 4, 4]


def test_per_layer_counts_must_agree_within_a_group(bert_bundle, tiny_task, monkeypatch):
    from compressor.modeling import importance
    monkeypatch.setattr(importance, "taylor_scores", lambda *a, **k: pytest.fail("scored before refusing"))
    shared = share(bert_bundle, tiny_task, mode="all", groups=2)
    with pytest.raises(UserError, match=r"per_layer asks layers \[0, 1\] to lose \[1, 2\] heads, but they share "
                                        r"their attention weights") as err:
        run(shared, "prune-heads", tiny_task, per_layer=[1, 2, 0, 0])
    assert "\n" not in str(err.value)
    agreed = run(shared, "prune-heads", tiny_task, per_layer=[2, 2, 1, 1], importance="random")
    assert heads(agreed.model) == [2, 2, 3, 3]


def test_per_layer_counts_that_split_a_shared_group_are_refused_up_front():
    """The run-time refusal above came after the steps before had trained: the groups are
    followed through the variant's steps, so `compressor run` refuses before any stage."""
    from compressor.passes.distillation import StudentConfig
    from compressor.passes.layers import DropLayers
    from compressor.passes.pruning import PruneHeads
    from compressor.passes.registry import Known, Shape, shape_after
    from compressor.passes.theseus import TheseusConfig
    from pretrain.finetune import FinetuneConfig
    teacher = Shape("bert", layers=4, heads=(4,) * 4, hidden=32)

    def after(*steps) -> Known:
        known = Known(model=teacher, teacher=teacher)
        for name, config in steps:
            known = shape_after(name, config, known)
        return known
    shared = after(("share-layers", ShareLayers(groups=2)), ("finetune", FinetuneConfig()))
    assert shared.model.shared_attention == ((0, 1), (2, 3))
    with pytest.raises(UserError, match=r"^prune-heads: per_layer asks layers \[0, 1\] to lose \[1, 2\] heads, "
                                        r"but they share their attention weights \(share-layers\)") as err:
        shape_after("prune-heads", PruneHeads(per_layer=(1, 2, 0, 0)), shared)
    assert "\n" not in str(err.value)
    assert shape_after("prune-heads", PruneHeads(per_layer=(2, 2, 1, 1)), shared).model.heads == (2, 2, 3, 3)
    shape_after("prune-heads", PruneHeads(per_layer=(1, 2, 0, 0)), after(("share-layers", ShareLayers(mode="ffn"))))
    # renumbered by the layers kept (in their order), a group left with one layer shares nothing
    kept = after(("share-layers", ShareLayers(groups=2, mode="attention")), ("drop-layers", DropLayers(keep=(3, 0, 2))))
    assert kept.model.shared_attention == ((0, 2),)
    student = after(("share-layers", ShareLayers(groups=1)),
                    ("student", StudentConfig.model_validate({"layers": [0, 2], "from": "bundle"})))
    with pytest.raises(UserError, match=r"layers \[0, 1\] to lose \[0, 1\]"):
        shape_after("prune-heads", PruneHeads(per_layer=(0, 1)), student)
    # where only the run tells (successors trained from shared layers, a layer emptied whole,
    # layers chosen by measurement), the pass's own check decides
    for unknown in (after(("share-layers", ShareLayers(groups=1)), ("theseus", TheseusConfig(successor_layers=2))),
                    after(("share-layers", ShareLayers(groups=1)), ("drop-layers", DropLayers(count=2))),
                    after(("share-layers", ShareLayers(groups=2)),
                          ("prune-heads", PruneHeads(per_layer=(0, 0, 4, 4), allow_drop_layers=True)))):
        assert unknown.model.shared_attention is None
        shape_after("prune-heads", PruneHeads(per_layer=(1, 0)), unknown)


def test_iterative_steps_remove_whole_groups(bert_bundle, tiny_task):
    """All four layers share one attention: each step removes one head from all of them (a
    step of 1 head is raised to the group's 4), and the sharing stays."""
    shared = share(bert_bundle, tiny_task, mode="attention", groups=1)
    out = run(shared, "prune-heads", tiny_task, iterative=True, min_retention=0.01, fraction=0.5, step=0.05,
              validation_samples=64)
    assert heads(out.model) == [2, 2, 2, 2]
    assert shared_pairs(out.model, ((0, 1), (1, 2), (2, 3)), "attention.")


# --- drop-layers: count ---

def test_drop_layers_count_drops_the_layer_whose_removal_costs_least(bert_bundle, tiny_task):
    """Greedy selection against brute force, on a trained model (a random tiny classifier
    predicts the same loss without any of its layers, so nothing would tell them apart): each
    round drops the layer whose removal gives the lowest loss, measured again after each drop,
    and the record says which layers stayed and the losses it chose by."""
    finetune = get_pass("finetune").config_type.model_validate({"epochs": 10, "lr": 5e-3, "batch_size": 16})
    bundle = apply_pass(bert_bundle, "finetune", finetune, Context(task=tiny_task, seed=0, show_progress=False))
    data = encode_for_model(bundle.model, bundle.tokenizer, tiny_task, train_rows(tiny_task, 0, 128, "test"))

    out = run(bundle, "drop-layers", tiny_task, count=2, samples=128)

    record, keep = out.deploy["drop_layers"], [0, 1, 2, 3]
    for round_ in record["rounds"]:
        losses = {layer: mean_loss(with_layers(bundle.model, [i for i in keep if i != layer]), data) for layer in keep}
        # the layers differ (a random tiny model's do not: spread ~0), well beyond the 1e-3 below
        assert max(losses.values()) - min(losses.values()) > 0.02, losses
        assert round_["loss_without"] == pytest.approx({str(k): v for k, v in losses.items()}, abs=1e-3)
        assert round_["dropped"] == min(losses, key=losses.get)
        keep.remove(round_["dropped"])
    assert record["kept"] == keep and len(keep) == 2 and out.model.config.num_hidden_layers == 2
    inputs = example_ids(bundle)
    np.testing.assert_allclose(logits(out.model, inputs), logits(with_layers(bundle.model, keep), inputs), atol=1e-5)


def with_layers(model, layers: list[int]):
    """A copy of `model` that keeps only `layers`."""
    trial = copy.deepcopy(model)
    keep_encoder_layers(trial, layers)
    return trial


@pytest.mark.parametrize("config, why", [({"keep": [0], "count": 1}, "exactly one of"), ({}, "exactly one of"),
                                         ({"count": 0}, "greater than or equal to 1")])
def test_drop_layers_needs_keep_or_count(config, why):
    with pytest.raises(ValidationError, match=why):
        get_pass("drop-layers").config_type.model_validate(config)


def test_drop_layers_count_above_the_layer_count_is_refused(bert_bundle, tiny_task):
    with pytest.raises(UserError, match="count 5 is more layers than the model has"):
        run(bert_bundle, "drop-layers", tiny_task, count=5)


@pytest.mark.parametrize("step, needed", [
    ({"prune-heads": {"fraction": 0.5, "samples": 5000}}, 5000),
    ({"prune-heads": {"iterative": True, "importance": "magnitude", "samples": 100, "validation_samples": 4900}}, 5000),
    ({"prune-ffn": {"fraction": 0.5, "samples": 5000}}, 5000),
    ({"drop-layers": {"count": 2, "samples": 5000}}, 5000),
])
def test_a_sample_larger_than_the_train_split_is_refused_before_anything_runs(step, needed, tiny_bert_dir, tiny_csv,
                                                                               tiny_task, tmp_path):
    from compressor import Pipeline
    parsed = parse_step(step, "v")
    pipe = Pipeline("big", teacher=str(tiny_bert_dir), task={"path": str(tiny_csv)}).variant(
        "v", (parsed.name, parsed.config))
    rows = len(tiny_task.split("train"))
    with pytest.raises(UserError, match=rf"variants\.v\[0\]: {parsed.name}: needs {needed} train examples but the "
                                        rf"task's train split has {rows}"):
        pipe.plan(tmp_path / "out")
    small = {key: 8 if key in ("samples", "validation_samples") else value for key, value in step[parsed.name].items()}
    fits = parse_step({parsed.name: small}, "v")
    assert Pipeline("fits", teacher=str(tiny_bert_dir), task={"path": str(tiny_csv)}).variant(
        "v", (fits.name, fits.config)).plan(tmp_path / "out")["stages"]
