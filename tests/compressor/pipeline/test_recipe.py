"""Recipe parsing and validation: every error is one UserError line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from compressor.passes import pass_names
from compressor.pipeline.recipe import Recipe, load_recipe, parse_recipe
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig
from pretrain.limits import MAX_SEED

DEMO = Path(__file__).resolve().parents[3] / "recipes" / "demo.yaml"

TEACHER = "teacher:\n  model: minilm\n  task: wordnet-supersense\n"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def error_of(tmp_path, text: str) -> str:
    with pytest.raises(UserError) as err:
        load_recipe(write(tmp_path, text))
    message = str(err.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


def test_demo_recipe_parses():
    recipe, steps = load_recipe(DEMO)
    assert isinstance(recipe, Recipe) and recipe.name == "demo"
    assert recipe.teacher.model == "minilm" and recipe.teacher.task == "wordnet-supersense"
    assert isinstance(recipe.teacher.finetune, FinetuneConfig)
    assert recipe.teacher.finetune.epochs == 2 and recipe.teacher.finetune.max_train_samples == 30000
    assert recipe.data.max_eval_samples == 5000
    assert {"teacher-as-is", "three-layers", "int8", "three-layers-int8"} <= set(steps)
    assert recipe.export is not None and recipe.export.onnx
    assert steps["teacher-as-is"] == []
    drop, finetune = steps["three-layers"]
    assert (drop.name, drop.config.keep) == ("drop-layers", (0, 2, 4))
    assert (finetune.name, finetune.config.epochs, finetune.config.lr) == ("finetune", 1, 2e-4)
    fields = finetune.config.model_fields_set     # what the recipe sets, not the defaults
    assert {"epochs", "lr"} <= fields and "batch_size" not in fields


def test_passes_shorthand_is_variant_main(tmp_path):
    recipe, steps = load_recipe(write(tmp_path, "name: r\n" + TEACHER +
                                      "passes:\n  - drop-layers: {keep: [0, 1]}\n  - finetune\n"))
    assert list(steps) == ["main"]
    assert [s.name for s in steps["main"]] == ["drop-layers", "finetune"]
    assert steps["main"][1].config == FinetuneConfig()        # a bare name means default config
    assert recipe.seed == 0 and recipe.data.max_train_samples is None


def test_passes_beside_a_variant_named_main_is_refused(tmp_path):
    with pytest.raises(UserError, match="passes: is shorthand for a variant named main"):
        load_recipe(write(tmp_path, "name: r\n" + TEACHER + "passes: [finetune]\nvariants:\n  main: []\n"))
    _, steps = load_recipe(write(tmp_path, "name: r\n" + TEACHER + "passes: [finetune]\nvariants:\n  same: []\n"))
    assert list(steps) == ["same", "main"]


def test_passes_beside_a_variant_named_main_in_another_case_is_refused(tmp_path):
    # `Main` and passes:' `main` are one dir on a case-insensitive file system (macOS, Windows).
    message = error_of(tmp_path, "name: r\n" + TEACHER + "passes: [finetune]\nvariants:\n  Main: []\n")
    assert message.endswith("passes: is shorthand for a variant named main, which variants: defines as 'Main' (one "
                            "dir on a case-insensitive file system); expected one of them (or another name for the "
                            "variant)"), message


def test_empty_variant_is_the_teacher_itself(tmp_path):
    _, steps = load_recipe(write(tmp_path, "name: r\n" + TEACHER + "variants:\n  same: []\n"))
    assert steps == {"same": []}


def test_task_may_be_a_data_file_spec(tmp_path):
    recipe, _ = load_recipe(write(tmp_path, "name: r\nteacher:\n  task: {path: d.csv, text: sentence}\n"
                                            "passes: []\n"))
    assert recipe.teacher.task == {"path": "d.csv", "text": "sentence"}
    assert recipe.teacher.model == "minilm"                   # the default teacher


def test_wrong_type_names_field_and_expected_type(tmp_path):
    message = error_of(tmp_path, "name: r\nteacher:\n  task: wordnet-supersense\n  finetune: {epochs: two}\n"
                                 "passes: []\n")
    assert "teacher.finetune.epochs" in message
    assert message.endswith("teacher.finetune.epochs: expected a positive number (got 'two')")
    assert str(tmp_path / "recipe.yaml") in message


def test_wrong_type_inside_a_pass_config(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants:\n  small:\n    - drop-layers: {keep: all}\n")
    assert "variants.small[0].drop-layers.keep" in message and "valid tuple" in message


def test_unknown_field_inside_a_pass_config(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER + "passes:\n  - finetune: {epoch: 1}\n")
    assert "variants.main[0].finetune.epoch" in message and "Extra inputs" in message


def test_unknown_pass_lists_known_passes(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants:\n  v:\n    - prune-everything: {}\n")
    assert "unknown pass 'prune-everything'" in message
    assert all(name in message for name in pass_names())


def test_unknown_pass_names_its_field_path(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants:\n  v:\n    - finetune\n    - prune-everything\n")
    assert "variants.v[1]" in message


def test_unknown_top_level_field(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER + "passes: []\nexprot: {onnx: true}\n")
    assert "exprot" in message and "Extra inputs are not permitted" in message


def test_export_section(tmp_path):
    recipe, _ = load_recipe(write(tmp_path, "name: r\n" + TEACHER + "passes: []\nexport: {onnx: true}\n"))
    assert recipe.export.onnx and recipe.export.optimize and recipe.export.parity_tolerance == 1e-4
    assert load_recipe(write(tmp_path, "name: r\n" + TEACHER + "passes: []\n"))[0].export is None
    message = error_of(tmp_path, "name: r\n" + TEACHER + "passes: []\nexport: {accuracy_tolerance: 2}\n")
    assert "export.accuracy_tolerance" in message
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants: {a: [], a-onnx: []}\nexport: {onnx: true}\n")
    assert "'a-onnx' is where 'a' may be exported" in message
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants: {a: [], a-torch-int8: []}\nexport: {onnx: true}\n")
    assert "'a-torch-int8' is where 'a' may be exported" in message


def test_export_dir_names_say_what_the_dir_holds():
    from compressor.pipeline.recipe import export_dir_name
    assert export_dir_name("int8") == "int8-onnx"
    assert export_dir_name("int8", "dynamic-int8") == "int8-onnx"
    assert export_dir_name("int8", "torch-dynamic-int8") == "int8-torch-int8"


def test_missing_required_field(tmp_path):
    message = error_of(tmp_path, "name: r\npasses: []\n")
    assert "teacher" in message and "required" in message


@pytest.mark.parametrize("name", ["bad name", "-dash-first", "..", ".hidden", "teacher", "report.json", "a/b"])
def test_bad_variant_name(tmp_path, name):
    message = error_of(tmp_path, "name: r\n" + TEACHER + f"variants:\n  '{name}': []\n")
    assert "variants" in message and repr(name) in message
    assert "letters, digits" in message


@pytest.mark.parametrize("variants, clash", [
    ("{int8: [], Int8: []}", "'int8' and 'Int8' differ only in case"),
    ("{Teacher: []}", "'Teacher' must be"),
    ("{Report.JSON: []}", "'Report.JSON' must be"),
])
def test_variant_names_that_are_one_dir_on_a_case_insensitive_disk(tmp_path, variants, clash):
    # macOS and Windows file systems fold case by default: the two would write one dir.
    message = error_of(tmp_path, "name: r\n" + TEACHER + f"variants: {variants}\n")
    assert clash in message and "\n" not in message


def test_an_export_dir_that_clashes_in_another_case(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants: {A: [], a-ONNX: []}\nexport: {onnx: true}\n")
    assert "'a-ONNX' is where 'A' may be exported" in message


def test_step_mapping_with_two_keys(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER +
                       "variants:\n  v:\n    - {drop-layers: {keep: [0]}, finetune: {epochs: 1}}\n")
    assert "variants.v[0]" in message and "one key" in message
    assert "drop-layers" in message and "finetune" in message


@pytest.mark.parametrize("text, where", [
    ("variants:\n  a:\n", "variants.a"), ("variants:\n  same: []\n  b:\n", "variants.b"), ("passes:\n", "passes")])
def test_a_variant_with_nothing_under_it_says_what_a_variant_takes(tmp_path, text, where):
    """`a:` with nothing under it is null in YAML: pydantic's `Input should be a valid list
    (got None)` did not say that an empty variant is written []."""
    assert error_of(tmp_path, "name: r\n" + TEACHER + text) == \
        f"{tmp_path / 'recipe.yaml'}: {where}: no steps under it; expected a list of steps, or [] for the teacher as it is"


def test_no_variants_at_all(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER)
    assert "variants" in message and "passes" in message


@pytest.mark.parametrize("text, line", [
    ("name: r\n" + TEACHER + "variants:\n  v: [drop-layers\n  w: []\n", 7),   # unclosed list
    ("name: r\nseed: 0\nteacher: {model: minilm\n", 4),                       # unclosed mapping at the end
    ("name: r\n  bad: indent\n", 2),
])
def test_invalid_yaml_gives_the_line(tmp_path, text, line):
    message = error_of(tmp_path, text)
    assert f"not valid YAML at line {line}:" in message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", ""])
def test_non_mapping_recipe(tmp_path, text):
    message = error_of(tmp_path, text)
    assert "expected a mapping" in message


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_parse_recipe_from_a_dict():
    recipe, steps = parse_recipe({"name": "r", "seed": 3, "teacher": {"task": "wordnet-wsd"},
                                  "data": {"max_eval_samples": 10},
                                  "variants": {"a": ["finetune"], "b": [{"drop-layers": {"keep": [1]}}]}})
    assert recipe.seed == 3 and recipe.data.max_eval_samples == 10
    assert [s.name for s in steps["a"]] == ["finetune"] and steps["b"][0].config.keep == (1,)


def test_finetune_lr_defaults_to_the_strategys_and_an_explicit_lr_wins(tmp_path):
    recipe, steps = load_recipe(write(tmp_path, "name: r\nteacher:\n  model: minilm\n  task: wordnet-supersense\n"
                                      "  finetune: {strategy: adapters}\n"
                                      "variants:\n  a:\n    - finetune: {strategy: frozen}\n"
                                      "    - finetune: {strategy: frozen, lr: 3.0e-4}\n    - qat: {}\n"))
    assert recipe.teacher.finetune.lr == 1e-3
    assert [s.config.lr for s in steps["a"]] == [FinetuneConfig(strategy="frozen").lr, 3e-4, 2e-5]


def test_cache_key_of_an_explicit_lr_equal_to_the_default_is_the_defaults():
    from compressor.pipeline.cache import key_fields
    assert key_fields(FinetuneConfig(lr=1e-4)) == key_fields(FinetuneConfig())
    assert key_fields(FinetuneConfig(strategy="adapters", lr=1e-3)) == key_fields(FinetuneConfig(strategy="adapters"))
    # the rate is in the key, so a run at another rate is another stage
    assert key_fields(FinetuneConfig(lr=2e-4)) != key_fields(FinetuneConfig())
    assert key_fields(FinetuneConfig(strategy="adapters", lr=1e-4))["lr"] == 1e-4


def test_cache_keys_leave_out_a_rate_at_its_strategy_default():
    """Keys written before the per-strategy defaults (lr 1e-4 was the field default) stay valid."""
    from compressor.passes.quantization import QATConfig
    from compressor.pipeline.cache import key_fields
    assert "lr" not in key_fields(FinetuneConfig(lr=1e-4)) and "lr" not in key_fields(FinetuneConfig())
    assert "lr" not in key_fields(QATConfig(epochs=1)) and "lr" not in key_fields(QATConfig(lr=2e-5))
    assert key_fields(QATConfig(lr=1e-4))["lr"] == 1e-4
    assert key_fields(FinetuneConfig(strategy="frozen"))["strategy"] == "frozen"


@pytest.mark.parametrize("benchmark, why", [
    ({"sequence_lengths": [0]}, "fixed lengths >= 2"),
    ({"sequence_lengths": []}, "at least one"),
    ({"batch_sizes": [1, 1]}, "distinct"),
    ({"profiles": ["cpu", "cpu"]}, "profiles named 'cpu' more than once"),
    ({"baselines": ["onnxruntime-fp32", "onnxruntime-fp32"]}, "baseline onnxruntime-fp32 listed more than once"),
])
def test_a_benchmark_section_that_could_not_measure_is_refused(benchmark, why):
    from pydantic import ValidationError

    from compressor.pipeline.recipe import BenchmarkSettings
    with pytest.raises(ValidationError, match=why):
        BenchmarkSettings.model_validate(benchmark)


def test_a_variant_name_too_long_for_a_dir_is_refused(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER + f"variants:\n  {'a' * 201}: []\n")
    assert "has 201 characters; expected at most 200" in message
    parse_recipe({"name": "r", "teacher": {"task": "wordnet-wsd"}, "variants": {"a" * 200: []}})


def test_a_negative_seed_is_refused_before_anything_runs(tmp_path):
    assert error_of(tmp_path, "name: r\nseed: -1\n" + TEACHER + "variants:\n  v: []\n").endswith(
        f"seed: expected an integer from 0 to {MAX_SEED} (got -1)")
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants:\n  v: [{finetune: {seed: -1}}]\n")
    assert message.endswith(f"variants.v[0].finetune.seed: expected an integer from 0 to {MAX_SEED} (got -1)")


def test_yaml_true_or_false_for_a_number_is_refused_not_read_as_1_or_0(tmp_path):
    message = error_of(tmp_path, "name: r\n" + TEACHER + "  finetune: {epochs: true}\nvariants:\n  v: []\n")
    assert message.endswith("teacher.finetune.epochs: expected a number, got true")
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants:\n  v: [{drop-layers: {keep: [0, true]}}]\n")
    assert message.endswith("variants.v[0].drop-layers.keep[1]: expected a number, got true")
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants:\n  v: [{distill: {losses: [soft], weights: {soft: true}}}]\n")
    assert "distill.weights.soft: expected a number, got true" in message
    # A list whose own validator runs first is refused as written, not as [1, 128].
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants:\n  v: []\nbenchmark: {sequence_lengths: [true, 128]}\n")
    assert message.endswith("benchmark.sequence_lengths: expected numbers or 'real', got [true, 128]")


def test_a_profile_file_is_found_beside_the_recipe_as_its_other_paths_are(tmp_path, monkeypatch):
    import yaml

    from compressor.bench.profiles import PROFILE_DIR
    (tmp_path / "prof").mkdir()
    profile = yaml.safe_load((PROFILE_DIR / "cpu.yaml").read_text()) | {"name": "mine"}
    (tmp_path / "prof" / "mine.yaml").write_text(yaml.safe_dump(profile))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)     # not the recipe's dir
    recipe, _ = load_recipe(write(tmp_path, "name: r\n" + TEACHER + "variants:\n  v: []\n"
                                  "benchmark: {profiles: [prof/mine.yaml, cpu]}\n"))
    assert recipe.benchmark.profiles == [str(tmp_path / "prof" / "mine.yaml"), "cpu"]
    assert [p.name for p in recipe.benchmark.profile_objects()] == ["mine", "cpu"]


def test_numbers_pyyaml_reads_as_strings_stay_numbers(tmp_path):
    # PyYAML reads `1e-4` (no dot) as a string; the user meant the number.
    _, steps = load_recipe(write(tmp_path, "name: r\n" + TEACHER + "variants:\n  v: [{finetune: {lr: 1e-4}}]\n"))
    assert steps["v"][0].config.lr == 1e-4
    _, steps = load_recipe(write(tmp_path, "name: r\n" + TEACHER +
                                 "variants:\n  v: [{prune-heads: {fraction: 0.5, allow_drop_layers: true}}]\n"))
    assert steps["v"][0].config.allow_drop_layers is True      # a real bool field keeps its bool


def test_a_misspelt_required_field_is_named_with_a_hint(tmp_path):
    message = error_of(tmp_path, "nmae: r\n" + TEACHER + "variants:\n  v: []\n")
    assert message.startswith(f"{tmp_path / 'recipe.yaml'}: nmae:") and "did you mean 'name'" in message


def test_an_empty_recipe_name_is_refused(tmp_path):
    assert "name: String should have at least 1 character" in error_of(tmp_path, "name: ''\n" + TEACHER +
                                                                        "variants:\n  v: []\n")


@pytest.mark.parametrize("section, message", [
    ("variants:\n  v: []\nbenchmark: {sequence_lengths: [real, foo]}\n",
     "benchmark.sequence_lengths[1]: expected an integer >= 2 or 'real' (got 'foo')"),
    ("variants:\n  v: []\nbenchmark: {sequence_lengths: [2.5]}\n",
     "benchmark.sequence_lengths[0]: expected an integer >= 2 or 'real' (got 2.5)"),
    ("variants:\n  d: [finetune, 42]\n", "variants.d[1]: expected a mapping or a string (got 42)"),
    ("variants:\n  d: [finetune, 42, 43]\n", "variants.d[1]: expected a mapping or a string (got 42) [and 2 more]"),
])
def test_a_value_no_branch_of_a_union_takes_says_what_each_takes_at_an_indexed_location(tmp_path, section, message):
    # Not pydantic's branch tags (`sequence_lengths.1.int: Input should be a valid integer`).
    assert error_of(tmp_path, "name: r\n" + TEACHER + section) == f"{tmp_path / 'recipe.yaml'}: {message}"


TEACHER_FINETUNE = "teacher:\n  model: minilm\n  task: wordnet-supersense\n  finetune: {%s}\nvariants:\n  v: []\n"


@pytest.mark.parametrize("section, message", [
    # Both bounds: pydantic's "greater than or equal to 8" named only the one crossed.
    (TEACHER_FINETUNE % "max_length: 0", "teacher.finetune.max_length: expected an integer from 8 to 512 (got 0)"),
    (TEACHER_FINETUNE % "max_length: 513", "teacher.finetune.max_length: expected an integer from 8 to 512 (got 513)"),
    # A lower bound only.
    ("variants:\n  v: [{finetune: {batch_size: -1}}]\n",
     "variants.v[0].finetune.batch_size: expected a positive integer (got -1)"),
    ("variants:\n  v: [{quantize: {mode: int4-weight-only, block_size: 8}}]\n",
     "variants.v[0].quantize.block_size: expected an integer >= 16 (got 8)"),
    # Exclusive bounds (gt, lt): the interval's round bracket, or "positive" for > 0.
    ("variants:\n  v: [{prune-heads: {fraction: 1.5}}]\n",
     "variants.v[0].prune-heads.fraction: expected a number in [0, 1) (got 1.5)"),
    ("variants:\n  v: [{qat: {ema_decay: 1}}]\n", "variants.v[0].qat.ema_decay: expected a number in (0, 1) (got 1)"),
    ("variants:\n  v: [{theseus: {successor_layers: 2, p: 0}}]\n",
     "variants.v[0].theseus.p: expected a number in (0, 1] (got 0)"),
    ("variants:\n  v: [{finetune: {epochs: 0}}]\n",
     "variants.v[0].finetune.epochs: expected a positive number (got 0)"),
    ("variants:\n  v: [{finetune: {lr: -1}}]\n", "variants.v[0].finetune.lr: expected a positive number (got -1)"),
    ("variants:\n  v: [{finetune: {lr: .inf}}]\n", "variants.v[0].finetune.lr: expected a positive number (got inf)"),
    # A float with both bounds taken.
    ("variants:\n  v: [{quantize: {mode: inc, tolerable_loss: 1.5}}]\n",
     "variants.v[0].quantize.tolerable_loss: expected a number in [0, 1] (got 1.5)"),
    ("variants:\n  v: []\nexport: {accuracy_tolerance: 2}\n",
     "export.accuracy_tolerance: expected a number in [0, 1] (got 2)"),
])
def test_a_number_out_of_its_fields_range_says_both_bounds(tmp_path, section, message):
    assert section_error(tmp_path, section) == f"{tmp_path / 'recipe.yaml'}: {message}"


def section_error(tmp_path, section: str) -> str:
    """The error of a recipe made of `section` (with the usual teacher unless it is one)."""
    text = "name: r\n" + section if section.startswith("teacher") else "name: r\n" + TEACHER + section
    return error_of(tmp_path, text)


@pytest.mark.parametrize("section, message", [
    ("variants:\n  v: [{quantize: {mode: inc, tolerable_loss: lots}}]\n",
     "variants.v[0].quantize.tolerable_loss: expected a number in [0, 1] (got 'lots')"),
    ("variants:\n  v: [{finetune: {lr: [0.1]}}]\n",
     "variants.v[0].finetune.lr: expected a positive number (got a list)"),
    ("variants:\n  v: [{distill: {temperature: hot}}]\n",
     "variants.v[0].distill.temperature: expected a positive number (got 'hot')"),
    ("variants:\n  v: []\nsearch: {latency_budget_ms: fast}\n",
     "search.latency_budget_ms: expected a positive number (got 'fast')"),
])
def test_a_float_of_the_wrong_type_says_which_numbers_it_takes(tmp_path, section, message):
    # Not pydantic's "Input should be a valid number, unable to parse string as a number".
    assert error_of(tmp_path, "name: r\n" + TEACHER + section) == f"{tmp_path / 'recipe.yaml'}: {message}"


STUDENT = "{student: {layers: [0]}}"


@pytest.mark.parametrize("distill, message", [
    # Not pydantic's "Input should be a valid number" nor the pass's own "loss weights must be >= 0"
    # (which named no weight): the weight, what a weight takes, the value.
    ("{weights: {soft: x}}", "distill.weights.soft: expected a number >= 0 (got 'x')"),
    ("{losses: [soft, hard], weights: {soft: 1, hard: -0.5}}", "distill.weights.hard: expected a number >= 0 (got -0.5)"),
    ("{weights: {soft: .inf}}", "distill.weights.soft: expected a number >= 0 (got inf)"),
    ("{weights: {soft: [1]}}", "distill.weights.soft: expected a number >= 0 (got a list)"),
    ("{weights: [1]}", "distill.weights: expected a mapping, each value a number >= 0 (got a list)"),
])
def test_a_number_in_a_mapping_says_what_each_value_takes(tmp_path, distill, message):
    text = "name: r\n" + TEACHER + f"variants:\n  v: [{STUDENT}, {{distill: {distill}}}]\n"
    assert error_of(tmp_path, text) == f"{tmp_path / 'recipe.yaml'}: variants.v[1].{message}"


def test_benchmark_iterations_are_bounded_as_a_profiles_are(tmp_path):
    """The override replaces the profile's iterations: unbounded, a recipe asking for a billion
    passed its validation and failed at the benchmark stage, after every variant was built."""
    assert section_error(tmp_path, "variants:\n  v: []\nbenchmark: {iterations: 20000}\n") == \
        f"{tmp_path / 'recipe.yaml'}: benchmark.iterations: expected an integer from 1 to 10000 (got 20000)"


@pytest.mark.parametrize("section, message", [
    # Not pydantic's "Input should be 'soft', 'hard', ...": which name, the ones taken, the nearest.
    (f"variants:\n  v: [{STUDENT}, {{distill: {{weights: {{sofft: 1.0}}}}}}]\n",
     "variants.v[1].distill.weights: unknown name 'sofft'; expected one of soft, hard, cosine, hidden, attention, "
     "value-relation, progressive; did you mean 'soft'?"),
    (f"variants:\n  v: [{STUDENT}, {{distill: {{losses: [soft, hidn]}}}}]\n",
     "variants.v[1].distill.losses[1]: expected one of soft, hard, cosine, hidden, attention, value-relation, "
     "progressive (got 'hidn'); did you mean 'hidden'?"),
    ("variants:\n  v: [{finetune: {strategy: zzz}}]\n",          # nothing close: no guess
     "variants.v[0].finetune.strategy: expected one of full, frozen, scalar-mix, adapters (got 'zzz')"),
    ("variants:\n  v: []\nbenchmark: {baselines: [onnxruntime-fp33]}\n",
     "benchmark.baselines[0]: expected one of pytorch-eager-fp32, onnxruntime-fp32, optimum-default-int8 (got "
     "'onnxruntime-fp33'); did you mean 'onnxruntime-fp32'?"),
])
def test_a_name_a_field_does_not_take_gets_the_names_it_takes_and_the_nearest(tmp_path, section, message):
    assert section_error(tmp_path, section) == f"{tmp_path / 'recipe.yaml'}: {message}"


@pytest.mark.parametrize("section, message", [
    ("variants:\n  v: [{finetune: {max_length: abc}}]\n", "variants.v[0].finetune.max_length: expected an integer "
                                                         "from 8 to 512 (got 'abc')"),
    ("teacher:\n  model: minilm\n  task: wordnet-supersense\n  finetune: {max_length: 64.5}\nvariants:\n  v: []\n",
     "teacher.finetune.max_length: expected an integer from 8 to 512 (got 64.5)"),
    ("data: {max_eval_samples: many}\nvariants:\n  v: []\n",
     "data.max_eval_samples: expected a positive integer (got 'many')"),
])
def test_a_bounded_integer_of_the_wrong_type_says_which_integers_it_takes(tmp_path, section, message):
    # Not pydantic's "Input should be a valid integer": 7 and 513 are integers too, and refused.
    assert section_error(tmp_path, section) == f"{tmp_path / 'recipe.yaml'}: {message}"


@pytest.mark.parametrize("step, message", [
    ("{quantize: {mode: static-int8, calibration_samples: x}}",
     "quantize.calibration_samples: expected a positive integer (got 'x')"),
    ("{quantize: {mode: int4-weight-only, block_size: 32.5}}",
     "quantize.block_size: expected an integer >= 16 (got 32.5)"),
    ("{quantize: {mode: inc, max_trials: many}}", "quantize.max_trials: expected a positive integer (got 'many')"),
    ("{quantize: {mode: static-int8, calibraton_samples: 64}}",
     "quantize.calibraton_samples: Extra inputs are not permitted (got 64); did you mean 'calibration_samples'?"),
    ("{quantize: {per_chanel: true}}",          # no mode: dynamic-int8's fields
     "quantize.per_chanel: Extra inputs are not permitted (got True); did you mean 'per_channel'?"),
])
def test_a_setting_of_one_quantize_mode_is_looked_up_on_that_modes_config(tmp_path, step, message):
    # The base quantize config has `mode` alone: a mode's own field was not found there, so its
    # errors kept pydantic's "Input should be a valid integer" and misspellings got no hint.
    text = "name: r\n" + TEACHER + f"variants:\n  q: [{step}]\n"
    assert error_of(tmp_path, text) == f"{tmp_path / 'recipe.yaml'}: variants.q[0].{message}"


@pytest.mark.parametrize("section, message", [
    # A step search.compare copies is parsed inside the recipe's validation (a UserError, not pydantic's).
    ("variants:\n  a: [{nope: {}}]\nsearch: {latency_budget_ms: 5, compare: [a]}\n",
     "variants.a[0]: unknown pass 'nope'"),
    ("passes: [quantize]\nvariants:\n  main: []\nsearch: {latency_budget_ms: 5, compare: [main]}\n",
     "passes: is shorthand for a variant named main"),
    # Once `search.compare:`, not `search: search.compare:`; an item that is no name is no crash.
    ("variants:\n  a: []\nsearch: {latency_budget_ms: 5, compare: [nope]}\n",
     "search.compare: no variant 'nope' in the recipe; expected one of ['a']"),
    ("variants:\n  a: []\nsearch: {latency_budget_ms: 5, compare: [{a: 1}]}\n",
     "search.compare: no variant {'a': 1} in the recipe; expected one of ['a']"),
])
def test_an_error_raised_inside_the_recipes_validation_starts_with_the_file(tmp_path, section, message):
    assert error_of(tmp_path, "name: r\n" + TEACHER + section).startswith(f"{tmp_path / 'recipe.yaml'}: {message}")


def test_a_bare_pass_name_is_the_pass_with_its_defaults(tmp_path):
    from compressor.export.quantize import DynamicInt8Config
    _, steps = load_recipe(write(tmp_path, "name: r\n" + TEACHER + "variants: {int8: [quantize]}\n"))
    assert [(s.name, s.config) for s in steps["int8"]] == [("quantize", DynamicInt8Config())]
    message = error_of(tmp_path, "name: r\n" + TEACHER + "variants: {a: [theseus]}\n")
    assert message.endswith("variants.a[0].theseus.successor_layers: Field required")
