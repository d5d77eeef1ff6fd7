"""Recipes and profiles refuse a key given twice, which PyYAML would drop without a word."""

from __future__ import annotations

import pytest
import yaml

from compressor.bench.profiles import load_profile
from compressor.pipeline.recipe import load_recipe
from compressor.yamlfile import load_yaml, location
from pretrain.errors import UserError


def test_a_key_given_twice_is_an_error_naming_both_lines():
    with pytest.raises(yaml.YAMLError, match=r"duplicate key 'epochs' \(first given at line 2\)") as caught:
        load_yaml("finetune:\n  epochs: 1\n  lr: 1.0e-4\n  epochs: 3\n")
    assert caught.value.problem_mark.line + 1 == 4


def test_valid_yaml_reads_as_the_safe_loader_reads_it():
    text = "base: &b {epochs: 1, lr: 0.1}\nrun:\n  <<: *b\n  epochs: 2\nlist: [1, 1, {a: 1}]\n"
    assert load_yaml(text) == yaml.safe_load(text) == {
        "base": {"epochs": 1, "lr": 0.1}, "run": {"epochs": 2, "lr": 0.1}, "list": [1, 1, {"a": 1}]}
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object:os.system {}")          # still the safe loader


def test_a_recipe_naming_a_variant_twice_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nteacher: {task: wordnet-supersense}\nvariants:\n  a: []\n"
                    "  a: [{drop-layers: {keep: [0]}}]\n")
    with pytest.raises(UserError, match=r"r.yaml: not valid YAML at line 5: duplicate key 'a' \(first given at line 4\)"):
        load_recipe(path)


def test_a_profile_with_a_field_twice_is_refused(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("provider: CPUExecutionProvider\nthreads: 2\nthreads: 4\n")
    with pytest.raises(UserError, match="duplicate key 'threads'"):
        load_profile(str(path))


@pytest.mark.parametrize("body, message", [
    ("teacher: {task: wordnet-supersense, finetun: {epochs: 1}}\nvariants: {a: []}\n",
     "teacher.finetun: Extra inputs are not permitted; did you mean 'finetune'?"),
    ("teacher: {task: wordnet-supersense}\nvariants:\n  a: [{finetune: {epoch: 1}}]\n",
     "variants.a[0].finetune.epoch: Extra inputs are not permitted (got 1); did you mean 'epochs'?"),
    ("teacher: {task: wordnet-supersense}\nexport: {onnx: true, optimise: true}\nvariants: {a: []}\n",
     "export.optimise: Extra inputs are not permitted (got True); did you mean 'optimize'?"),
    ("teacher: {task: wordnet-supersense}\nvariants: {a: []}\nzzz: 1\n",
     "zzz: Extra inputs are not permitted (got 1)"),                   # nothing close: no guess
])
def test_a_misspelt_recipe_field_gets_the_nearest_name(tmp_path, body, message):
    path = tmp_path / "r.yaml"
    path.write_text("name: r\n" + body)
    with pytest.raises(UserError) as caught:
        load_recipe(path)
    assert str(caught.value).endswith(message)


def test_a_misspelt_profile_field_gets_the_nearest_name(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("provider: CPUExecutionProvider\nthread: 2\n")
    with pytest.raises(UserError, match=r"thread: Extra inputs are not permitted \(got 2\); did you mean 'threads'\?"):
        load_profile(str(path))


@pytest.mark.parametrize("loc, text", [
    (("variants", "d", 0, "dict[str,any]"), "variants.d[0]"),
    (("benchmark", "sequence_lengths", 1, "int"), "benchmark.sequence_lengths[1]"),
    (("threads", "literal['cores']"), "threads"),
    (("variants", "v", 0, "drop-layers", "keep", 1), "variants.v[0].drop-layers.keep[1]"),
])
def test_a_location_reads_as_a_recipe_writes_it(loc, text):
    assert location(loc) == text
