"""The recipes in recipes/: each validates as shipped, and each family recipe runs end to end.

The family recipes read the demo's fine-tuned teacher (runs/demo/teacher), which a test run
does not have, so the end-to-end test runs each one as written but on a tiny 6-layer BERT
and the tiny task, with the training and scoring budgets cut (`shrink`): the same variants,
the same passes in the same order with the same structural settings (every budget field a
pass has, written or defaulted, is cut), the real export and benchmark stages.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from transformers import BertConfig, BertForSequenceClassification

from compressor.passes import get_pass
from compressor.pipeline import run as pipeline_run
from compressor.pipeline import run_recipe
from compressor.pipeline.recipe import load_recipe, parse_recipe

RECIPES = Path(__file__).parents[2] / "recipes"
FAMILY_RECIPES = ("pruning", "sparsity", "sharing", "distillation")

# Budget fields of a pass config -> their value in the tiny run; structure fields stay as written.
TINY_BUDGET = {"max_train_samples": 48, "samples": 32, "validation_samples": 32, "map_samples": 32,
               "calibration_samples": 32, "batch_size": 16, "rank": 16, "embedding_dim": 16,
               "hidden_size": 24, "filters": 8}


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_recipe_validates(path):
    recipe, steps = load_recipe(path)
    assert recipe.name == path.stem
    assert steps, f"{path.name} has no variants"


def test_every_family_has_a_recipe():
    assert {p.stem for p in RECIPES.glob("*.yaml")} >= {"demo", "quantization", *FAMILY_RECIPES}


def test_family_recipes_use_the_issues_contract_forms():
    """The forms the pruning and distillation issues fix for scripts and checks, as written."""
    passes = {name: [step for variant in raw_recipe(name)["variants"].values() for step in variant]
              for name in FAMILY_RECIPES}
    assert {"prune-heads": {"fraction": 0.5}} in passes["pruning"]
    assert {"prune-ffn": {"fraction": 0.5}} in passes["pruning"]
    assert {"drop-layers": {"count": 3}} in passes["pruning"]
    assert {"share-layers": {"mode": "all", "groups": 1}} in passes["sharing"]
    assert {"trim-vocab": {}} in passes["sharing"]
    assert {"student": {"layers": [0, 2, 4]}} in passes["distillation"]
    assert {"theseus": {"successor_layers": 3, "schedule": "linear", "epochs": 2}} in passes["distillation"]
    kinds = {step["distill-structure"]["kind"] for step in passes["distillation"] if "distill-structure" in step}
    assert kinds == {"bilstm", "cnn"}


def raw_recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / f"{name}.yaml").read_text(encoding="utf-8"))


def shrink(step: dict) -> dict:
    """The step with every budget field its pass has (written or defaulted) set to TINY_BUDGET's."""
    (name, config), = step.items()
    fields = get_pass(name).config_type.model_fields
    return {name: {**(config or {}), **{key: value for key, value in TINY_BUDGET.items() if key in fields}}}


@pytest.fixture(scope="module")
def tiny_six_layer_dir(tmp_path_factory, tokenizer, tiny_task) -> Path:
    """A random 6-layer tiny BERT: the depth the recipes' layer lists and Theseus blocks assume."""
    labels = tiny_task.label_names
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128, num_labels=len(labels),
                        id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)})
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    path = tmp_path_factory.mktemp("tiny-bert-6")
    model.eval().save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("name", FAMILY_RECIPES)
def test_family_recipe_runs_end_to_end_on_a_tiny_teacher(name, tiny_six_layer_dir, tiny_csv, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline_run, "set_threads", lambda threads: None)
    raw = raw_recipe(name)
    raw["teacher"] = {"model": str(tiny_six_layer_dir), "task": {"path": str(tiny_csv)}}
    raw["data"] = {"max_train_samples": 48}
    raw["export"]["accuracy_tolerance"] = 1.0       # a random tiny teacher: the gate checks parity only
    raw["benchmark"].update(batch_sizes=[2], iterations=2)
    raw["variants"] = {variant: [shrink(step) for step in steps] for variant, steps in raw["variants"].items()}
    recipe, steps = parse_recipe(raw)

    report = run_recipe(recipe, steps, tmp_path / "run", show_progress=False)

    models = {m["name"]: m for m in report["models"]}
    assert set(steps) <= set(models)
    teacher_params = models["teacher-as-is"]["params"]
    for variant, variant_steps in steps.items():
        entry = models[variant]
        assert entry["kind"] == "onnx" and entry["accuracy"] is not None, variant
        wants_int8 = any(s.name == "quantize" for s in variant_steps)
        assert (entry["precision"] == "dynamic-int8") == wants_int8, variant
        assert entry["latency"], f"{variant} was not benchmarked"
        if any(removes_parameters(s) for s in variant_steps):
            assert entry["params"] < teacher_params, variant


def removes_parameters(step) -> bool:
    """Whether the step always leaves fewer (unique) parameters. Iterative head pruning stops
    before validation accuracy falls, which on a random tiny teacher may be before any head."""
    if step.name == "prune-heads":
        return not step.config.iterative
    return step.name in {"prune-ffn", "drop-layers", "student", "theseus", "share-layers", "trim-vocab"}
