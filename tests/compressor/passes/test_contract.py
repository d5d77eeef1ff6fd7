"""The pass contract, checked over every registered pass, plus each pass's own behaviour.

A new pass is covered by `test_pass_contract` as soon as it is registered; it only needs an
entry in EXAMPLE_CONFIGS (a config that runs quickly on the tiny 4-layer models), and, if it
registers a family check, an entry in FAMILY_CHECKS.
"""

from __future__ import annotations

import typing

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from compressor.bundle import ModelBundle
from compressor.export.onnx import ONNX_FILE, ExportSettings, export_bundle
from compressor.passes import Context, LazyTeacher, apply_pass, check_pass_family, get_pass, pass_names
from compressor.passes import training as training_passes
from compressor.pipeline.recipe import parse_step
from pretrain.batching import encode
from pretrain.errors import UserError
from pretrain.families import FAMILIES, TRANSFORMER_FAMILIES
from pretrain.finetune import predict_logits
from pretrain.models import encoder_layers

# pass name -> config kwargs that suit the tiny models (4-layer BERT, 3-layer DistilBERT).
EXAMPLE_CONFIGS: dict[str, dict] = {
    "drop-layers": {"keep": [0, 2]},
    "finetune": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_train_samples": 48},
    "quantize": {"mode": "dynamic-int8", "per_channel": True},
    "qat": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_train_samples": 48},
    "sensitivity": {"keep_fraction": 0.25, "samples": 32},
    "factorize-embedding": {"rank": 8},
    "trim-vocab": {},
    "distill-structure": {"kind": "cnn", "embedding_dim": 16, "filters": 8, "epochs": 1, "batch_size": 16,
                          "max_train_samples": 48},
    "prune-heads": {"fraction": 0.5, "samples": 32},
    "prune-ffn": {"fraction": 0.5, "samples": 32},
    "prune-magnitude": {"sparsity": 0.5, "epochs": 1, "batch_size": 16, "lr": 1e-3, "max_train_samples": 48},
    "prune-movement": {"sparsity": 0.5, "epochs": 1, "batch_size": 16, "lr": 1e-3, "max_train_samples": 48},
    "share-layers": {"mode": "all", "groups": 1},
    "student": {"layers": [0, 2]},
    "distill": {"losses": ["soft", "hidden", "attention"], "epochs": 1, "batch_size": 16, "lr": 1e-3,
                "max_train_samples": 48},
    # one successor for the whole encoder: divides both tiny depths (4 and 3)
    "theseus": {"successor_layers": 1, "epochs": 1, "batch_size": 16, "lr": 1e-3, "max_train_samples": 48},
}

# pass name -> (a config, the model families its registered check must refuse for it).
NO_TRANSFORMER_LAYERS = frozenset(FAMILIES) - set(TRANSFORMER_FAMILIES)
FAMILY_CHECKS: dict[str, tuple[dict, frozenset[str]]] = {
    "drop-layers": (EXAMPLE_CONFIGS["drop-layers"], NO_TRANSFORMER_LAYERS),
    # ALBERT's shared layers are Linear layers too (each ranked once, for every depth)
    **{name: (EXAMPLE_CONFIGS[name], frozenset(f for f in NO_TRANSFORMER_LAYERS if not FAMILIES[f].layer_groups))
       for name in ("sensitivity", "qat")},
    # ALBERT: its layers are shared already
    "share-layers": (EXAMPLE_CONFIGS["share-layers"], NO_TRANSFORMER_LAYERS),
    "theseus": (EXAMPLE_CONFIGS["theseus"], NO_TRANSFORMER_LAYERS),
    "quantize": ({"mode": "inc"}, frozenset(f for f, record in FAMILIES.items() if not record.supports("inc"))),
    **{name: (EXAMPLE_CONFIGS[name], frozenset(f for f, record in FAMILIES.items() if not record.supports(name)))
       for name in ("prune-heads", "prune-ffn")},
    # XLNet's attention projections are einsum weights, not Linear layers
    **{name: (EXAMPLE_CONFIGS[name], NO_TRANSFORMER_LAYERS | {"xlnet"})
       for name in ("prune-magnitude", "prune-movement")},
    "student": (EXAMPLE_CONFIGS["student"], NO_TRANSFORMER_LAYERS),
    # layer losses read q/k/v modules: none in a BiLM, einsum weights in XLNet
    "distill": (EXAMPLE_CONFIGS["distill"], NO_TRANSFORMER_LAYERS | {"xlnet"}),
}

# Every pass output must export behind the real gate: parity for fp32 graphs; a quantized
# graph's accuracy is only checked to be measured (the tiny models are untrained).
EXPORT_GATE = ExportSettings(optimize=True, accuracy_tolerance=1.0)

# A bundle that already has a history, so that appending (not replacing) is checked.
PRIOR_HISTORY = ({"pass": "finetune", "config": {"epochs": 2.0}},)


def _ctx(task, **kw) -> Context:
    return Context(task=task, seed=0, show_progress=False, **kw)


def _config(name: str):
    return get_pass(name).config_type.model_validate(EXAMPLE_CONFIGS[name])


def _logits(bundle: ModelBundle, split) -> np.ndarray:
    return predict_logits(bundle.model, encode(bundle.tokenizer, split))


@pytest.fixture(params=["bert", "distilbert"])
def bundle(request, model_dirs, tiny_task) -> ModelBundle:
    loaded = ModelBundle.load(model_dirs[request.param])
    return loaded.replace(task=tiny_task.spec, history=PRIOR_HISTORY)


def test_every_example_config_names_a_registered_pass():
    stale = sorted(set(EXAMPLE_CONFIGS) - set(pass_names()))
    assert not stale, f"EXAMPLE_CONFIGS has entries for passes that are not registered: {stale}"


@pytest.mark.parametrize("name", pass_names())
def test_pass_contract(name, bundle, tiny_task, model_dirs, tmp_path):
    if name not in EXAMPLE_CONFIGS:
        pytest.fail(f"pass {name!r} is registered but has no example config: add one to "
                    f"EXAMPLE_CONFIGS in {__file__} so the contract test can run it")
    spec = get_pass(name)
    cfg = _config(name)
    # Configs are frozen and serialise to JSON that validates back to the same config.
    assert spec.config_type.model_validate(cfg.model_dump(mode="json")) == cfg
    for field in type(cfg).model_fields:
        with pytest.raises(ValidationError, match="frozen"):
            setattr(cfg, field, None)

    test = tiny_task.split("test")
    before_state = {k: v.detach().clone() for k, v in bundle.model.state_dict().items()}
    before_history = tuple(dict(h) for h in bundle.history)
    before_logits = _logits(bundle, test)

    # Passes that learn from the teacher get the input's own model, loaded apart.
    teacher = LazyTeacher.from_dir(model_dirs[bundle.model.config.model_type])
    out = apply_pass(bundle, name, cfg, _ctx(tiny_task, teacher_source=teacher))

    # The input bundle is untouched.
    state = bundle.model.state_dict()
    assert state.keys() == before_state.keys()
    changed = [k for k in state if not torch.equal(state[k], before_state[k])]
    assert not changed, f"{name} changed its input model: {changed[:5]}"
    assert bundle.history == before_history
    np.testing.assert_array_equal(_logits(bundle, test), before_logits)

    # The output is a new model, sharing no parameter storage with the input.
    assert isinstance(out, ModelBundle)
    assert out.model is not bundle.model
    input_ptrs = {p.data_ptr() for p in bundle.model.parameters()}
    shared = [n for n, p in out.model.named_parameters() if p.data_ptr() in input_ptrs]
    assert not shared, f"{name} output shares parameters with its input: {shared[:5]}"
    assert out.history == before_history + ({"pass": name, "config": cfg.model_dump(mode="json")},)
    assert out.task == bundle.task and out.label_names == bundle.label_names

    # It saves, loads and predicts.
    loaded = ModelBundle.load(out.save(tmp_path / name))
    assert loaded.history == out.history
    logits = _logits(loaded, test)
    assert logits.shape == (len(test), len(tiny_task.label_names))
    assert np.isfinite(logits).all()
    np.testing.assert_allclose(logits, _logits(out, test), atol=1e-5)

    if spec.preserves_function:
        np.testing.assert_allclose(logits, before_logits, atol=1e-4,
                                   err_msg=f"{name} declares preserves_function but changed the outputs")

    # It exports to ONNX behind the gate (on the tiny BERT: one family keeps the suite short).
    if out.model.config.model_type == "bert":
        record = export_bundle(out, tmp_path / f"{name}-onnx", EXPORT_GATE, tiny_task).record
        assert (tmp_path / f"{name}-onnx" / ONNX_FILE).is_file() or record["format"] == "torch"
        assert 0 <= record["accuracy"] <= 1 and record["eval_samples"] == len(test)


@pytest.mark.parametrize("name", pass_names())
def test_no_float_setting_takes_inf_or_nan(name):
    """inf passes every `gt=0` bound: refused at validation, not mid-run (a recipe's `.inf`)."""
    config_type = get_pass(name).config_type
    floats = [f for f, info in config_type.model_fields.items() if float in typing.get_args(info.annotation)
              or info.annotation is float]
    for field in floats:
        with pytest.raises(ValidationError, match=field):
            config_type.model_validate({field: float("inf")})


@pytest.mark.parametrize("name", pass_names())
def test_family_check_refuses_what_it_should(name):
    """A pass's registered check refuses exactly the families it cannot apply to, in one line,
    and accepts the others (what `compressor run` relies on to refuse a recipe up front)."""
    spec = get_pass(name)
    if spec.check_family is None:
        assert name not in FAMILY_CHECKS, f"{name} has no family check but FAMILY_CHECKS lists it"
        return
    assert name in FAMILY_CHECKS, f"pass {name!r} registers a family check: add it to FAMILY_CHECKS in {__file__}"
    raw, refused = FAMILY_CHECKS[name]
    assert refused, f"FAMILY_CHECKS[{name!r}] names no family to refuse"
    refusing = spec.config_type.model_validate(raw)
    for family in FAMILIES:
        if family in refused:
            with pytest.raises(UserError) as err:
                check_pass_family(name, refusing, family)
            assert "\n" not in str(err.value) and repr(family) in str(err.value)
        else:
            check_pass_family(name, refusing, family)
            check_pass_family(name, _config(name), family)


# --- drop-layers ---

def test_drop_layers_keeps_the_listed_layers(bert_bundle, tiny_task):
    original = [{k: v.clone() for k, v in layer.state_dict().items()} for layer in encoder_layers(bert_bundle.model)]
    out = apply_pass(bert_bundle, "drop-layers", _config("drop-layers"), _ctx(tiny_task))
    layers = encoder_layers(out.model)
    assert len(layers) == 2 and out.model.config.num_hidden_layers == 2
    for new, old in enumerate([0, 2]):
        state = layers[new].state_dict()
        assert all(torch.equal(state[k], original[old][k]) for k in original[old])
    assert out.params < bert_bundle.params
    assert len(encoder_layers(bert_bundle.model)) == 4


@pytest.mark.parametrize("keep", [[0, 4], [7], [-1, 0]])
def test_drop_layers_index_out_of_range_names_the_layer_count(bert_bundle, tiny_task, keep):
    cfg = get_pass("drop-layers").config_type.model_validate({"keep": keep})
    with pytest.raises(UserError) as err:
        apply_pass(bert_bundle, "drop-layers", cfg, _ctx(tiny_task))
    message = str(err.value)
    assert "4 layers" in message and "out of range" in message
    assert str([i for i in keep if not 0 <= i < 4][0]) in message


@pytest.mark.parametrize("keep, why", [([0, 2, 0], "distinct"), ([], "at least 1"), ("all", "tuple")])
def test_drop_layers_config_validation(keep, why):
    with pytest.raises(ValidationError, match=why):
        get_pass("drop-layers").config_type.model_validate({"keep": keep})
    with pytest.raises(UserError, match=r"variants\.v\[0\]\.drop-layers\.keep"):
        parse_step({"drop-layers": {"keep": keep}}, "variants.v[0]")


# --- finetune ---

def test_finetune_changes_weights(bert_bundle, tiny_task):
    out = apply_pass(bert_bundle, "finetune", _config("finetune"), _ctx(tiny_task))
    before, after = bert_bundle.model.state_dict(), out.model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "classifier.weight" in changed
    assert any(k.startswith("bert.encoder.layer.3.") for k in changed)


@pytest.fixture
def finetune_spy(monkeypatch):
    """Record the config and TrainResult of every fine-tuning run the pass starts."""
    calls = []
    real = training_passes.finetune

    def spy(model, tokenizer, task, cfg, **kw):
        result = real(model, tokenizer, task, cfg, **kw)
        calls.append((cfg, result.train))
        return result
    monkeypatch.setattr(training_passes, "finetune", spy)
    return calls


def test_finetune_respects_the_context_sample_limit(bert_bundle, tiny_task, finetune_spy):
    cfg = get_pass("finetune").config_type.model_validate({"epochs": 1, "batch_size": 8})
    apply_pass(bert_bundle, "finetune", cfg, _ctx(tiny_task, max_train_samples=24))
    (used, result), = finetune_spy
    assert used.max_train_samples == 24
    assert result.samples == 24 and result.steps == 3


def test_finetune_own_limit_wins_over_the_context(bert_bundle, tiny_task, finetune_spy):
    cfg = get_pass("finetune").config_type.model_validate({"epochs": 1, "batch_size": 8, "max_train_samples": 16})
    out = apply_pass(bert_bundle, "finetune", cfg, _ctx(tiny_task, max_train_samples=24))
    (used, result), = finetune_spy
    assert result.samples == 16
    assert out.history[-1]["config"]["max_train_samples"] == 16


def test_finetune_takes_the_context_seed_unless_set(bert_bundle, tiny_task, finetune_spy):
    base = {"epochs": 1, "batch_size": 16, "max_train_samples": 16}
    spec = get_pass("finetune")
    apply_pass(bert_bundle, "finetune", spec.config_type.model_validate(base), Context(task=tiny_task, seed=5, show_progress=False))
    apply_pass(bert_bundle, "finetune", spec.config_type.model_validate({**base, "seed": 3}),
               Context(task=tiny_task, seed=5, show_progress=False))
    assert [cfg.seed for cfg, _ in finetune_spy] == [5, 3]


def test_finetune_without_limits_uses_the_whole_train_split(bert_bundle, tiny_task, finetune_spy):
    cfg = get_pass("finetune").config_type.model_validate({"epochs": 1, "batch_size": 64})
    apply_pass(bert_bundle, "finetune", cfg, _ctx(tiny_task))
    (_, result), = finetune_spy
    assert result.samples == len(tiny_task.split("train"))


def test_unknown_pass_lists_known_passes():
    with pytest.raises(UserError) as err:
        get_pass("prune-everything")
    assert all(name in str(err.value) for name in pass_names())


def test_a_pass_that_returns_its_input_is_rejected(bert_bundle, tiny_task, monkeypatch):
    from compressor.passes import registry
    lazy = registry.PassSpec("lazy", registry.PassConfig, lambda b, c, x: b, False, False)
    monkeypatch.setitem(registry._REGISTRY, "lazy", lazy)
    with pytest.raises(RuntimeError, match="returned its input"):
        apply_pass(bert_bundle, "lazy", registry.PassConfig(), _ctx(tiny_task))
