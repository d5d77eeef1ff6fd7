"""The Python API builds the same recipe as YAML and runs the same pipeline."""

from __future__ import annotations

import pytest
import torch
import yaml
from pydantic import ValidationError

from compressor import Pipeline
from compressor.export.quantize import (DynamicInt8Config, Fp16Config, IncConfig, Int4WeightOnlyConfig, QuantizeConfig,
                                         StaticInt8Config, TorchDynamicInt8Config)
from compressor.passes.layers import DropLayers
from compressor.pipeline import run as pipeline_run
from compressor.pipeline import run_recipe, stages
from compressor.pipeline.recipe import parse_recipe
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig


def build(model_dir, csv_path) -> Pipeline:
    pipe = Pipeline("api", teacher=str(model_dir), task={"path": str(csv_path)},
                    finetune=FinetuneConfig(epochs=1, batch_size=16), max_train_samples=200)
    return (pipe.variant("same")
                .variant("two-layers", DropLayers(keep=(0, 2)), FinetuneConfig(epochs=1, batch_size=16))
                .variant("int8", ("quantize", {"mode": "dynamic-int8"})))


def test_pipeline_is_the_recipe_it_prints(tiny_bert_dir, tiny_csv):
    pipe = build(tiny_bert_dir, tiny_csv)
    raw = yaml.safe_load(pipe.to_yaml())
    assert raw["variants"] == {"same": [], "two-layers": [{"drop-layers": {"keep": [0, 2]}},
                                                         {"finetune": {"epochs": 1.0, "batch_size": 16}}],
                               "int8": [{"quantize": {"mode": "dynamic-int8"}}]}
    assert raw["teacher"]["finetune"] == {"epochs": 1.0, "batch_size": 16}
    recipe, steps = parse_recipe(raw)
    assert recipe == pipe.validate()[0]
    assert [s.name for s in steps["two-layers"]] == ["drop-layers", "finetune"]


def test_pipeline_runs_like_a_recipe(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    # The run sets its own thread count (one, here: tiny models on a shared machine) and
    # gives the caller's back.
    monkeypatch.setattr(pipeline_run, "set_threads", lambda threads: torch.set_num_threads(1))
    torch.set_num_threads(3)
    pipe = build(tiny_bert_dir, tiny_csv)
    planned = pipe.plan(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert {s["stage"]: s["state"] for s in planned["stages"]} == dict.fromkeys(
        ["teacher", "same", "two-layers", "int8"], "build")
    report = pipe.run(tmp_path / "out", show_progress=False)
    assert torch.get_num_threads() == 3
    assert {s["state"] for s in pipe.plan(tmp_path / "out")["stages"]} == {"cached"}
    assert [m["name"] for m in report["models"]] == ["same", "two-layers", "int8"]
    assert report["models"][1]["params"] < report["teacher"]["params"]
    # The same pipeline as YAML reuses every stage the script built.
    recipe, steps = parse_recipe(yaml.safe_load(pipe.to_yaml()))
    monkeypatch.setattr(stages, "apply_pass", lambda *a, **k: pytest.fail("a stage was rebuilt"))
    again = run_recipe(recipe, steps, tmp_path / "out", show_progress=False)
    assert [m["accuracy"] for m in again["models"]] == [m["accuracy"] for m in report["models"]]


def test_an_object_that_is_not_a_pass_config_is_refused(tiny_bert_dir, tiny_csv):
    with pytest.raises(UserError, match=r"ExportSettings is not a pass config; pass configs: .*DropLayers \(drop-layers\)"):
        from compressor.export.onnx import ExportSettings
        build(tiny_bert_dir, tiny_csv).variant("bad", ExportSettings())


def test_a_bad_field_fails_like_a_bad_recipe(tiny_bert_dir, tiny_csv):
    pipe = build(tiny_bert_dir, tiny_csv).benchmark(profiles=["tpu"])
    with pytest.raises(UserError, match="pipeline 'api': benchmark.profiles: .*unknown profile 'tpu'"):
        pipe.validate()
    # The configs themselves validate on construction, before any pipeline sees them...
    with pytest.raises(ValidationError, match="block_size applies to quantize mode int4-weight-only, not dynamic-int8"):
        QuantizeConfig(mode="dynamic-int8", block_size=64)
    # ...and a valid one enters the recipe as the fields it was given, under its pass's name.
    pipe = build(tiny_bert_dir, tiny_csv).variant("int8-pc", QuantizeConfig(mode="dynamic-int8", per_channel=True))
    assert pipe.to_dict()["variants"]["int8-pc"] == [{"quantize": {"mode": "dynamic-int8", "per_channel": True}}]


def test_to_yaml_refuses_what_run_would_refuse(tiny_bert_dir, tiny_csv, tmp_path):
    # It wrote any pipeline, and `compressor run` then refused the file it wrote.
    for pipe in (build(tiny_bert_dir, tiny_csv).benchmark(profiles=["tpu"]),
                 Pipeline("api", teacher=str(tiny_bert_dir), task={"path": str(tiny_csv)})):    # no variants
        with pytest.raises(UserError) as planned:
            pipe.plan(tmp_path / "out")
        with pytest.raises(UserError) as written:
            pipe.to_yaml()
        assert str(written.value) == str(planned.value) and len(str(written.value).splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_variant_name_given_twice_is_refused(tiny_bert_dir, tiny_csv):
    pipe = build(tiny_bert_dir, tiny_csv).variant("small", DropLayers(keep=(0,)))
    with pytest.raises(UserError, match="variant 'small' is already defined"):
        pipe.variant("small", DropLayers(keep=(0, 1)))
    assert pipe.to_dict()["variants"]["small"] == [{"drop-layers": {"keep": [0]}}]   # the first stays


def test_importing_the_api_prints_nothing_and_leaves_logging_as_it_was():
    """torchao (installed with neural-compressor-pt) logs CUDA kernels it cannot load when
    Transformers imports it; the front door mutes that while it imports, then restores."""
    import subprocess
    import sys
    code = ("import logging; from compressor import Pipeline; import sys; "
            "assert 'torchao' in sys.modules, 'nothing to mute'; "
            "print(logging.getLogger('torchao').level, logging.getLogger('torch.utils._pytree').level)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout.split() == ["0", "0"]


def test_a_settings_object_of_another_section_is_refused(tiny_bert_dir, tiny_csv):
    from compressor.export.onnx import ExportSettings
    from pretrain.finetune import FinetuneConfig
    pipe = build(tiny_bert_dir, tiny_csv)
    with pytest.raises(UserError, match="export: expected ExportSettings .*got FinetuneConfig"):
        pipe.export(FinetuneConfig())
    with pytest.raises(UserError, match="benchmark: expected BenchmarkSettings .*got ExportSettings"):
        pipe.benchmark(ExportSettings())
    with pytest.raises(UserError, match="a step given as a tuple is \\(pass name, config\\), got 3 items"):
        pipe.variant("odd", ("drop-layers", {"keep": [0]}, 1))
    pipe.export(ExportSettings(optimize=False))              # its own type is taken
    assert pipe.to_dict()["export"] == {"optimize": False}


@pytest.mark.parametrize("config", [DynamicInt8Config(), StaticInt8Config(calibration="minmax"), Fp16Config(),
                                    Int4WeightOnlyConfig(), TorchDynamicInt8Config(), IncConfig()],
                         ids=lambda c: c.mode)
def test_every_quantize_mode_reads_back_as_itself(config, tiny_bert_dir, tiny_csv):
    # The mode is the config's type, never "a default the user did not set": without it the
    # written recipe would read back as dynamic-int8 (or be refused for another mode's option).
    pipe = Pipeline("api", teacher=str(tiny_bert_dir), task={"path": str(tiny_csv)}).variant("q", config)
    assert pipe.to_dict()["variants"]["q"] == [{"quantize": {**config.model_dump(mode="json", exclude_unset=True),
                                                            "mode": config.mode}}]
    assert pipe.validate()[1]["q"][0].config == config
    assert parse_recipe(yaml.safe_load(pipe.to_yaml()))[1]["q"][0].config == config


def test_a_config_object_under_another_pass_name_is_refused(tiny_bert_dir, tiny_csv):
    # Its fields would otherwise be read as the named pass's: a FinetuneConfig given as
    # `distill` ran a distillation, a QATConfig given as `finetune` plain fine-tuning.
    from compressor.passes.quantization import QATConfig
    pipe = build(tiny_bert_dir, tiny_csv)
    for step, expected in [(("distill", FinetuneConfig(epochs=1)), "pass 'distill' takes a DistillConfig"),
                           (("finetune", QATConfig(epochs=1)), "pass 'finetune' takes a FinetuneConfig"),
                           (("drop-layers", DynamicInt8Config()), "pass 'drop-layers' takes a DropLayers")]:
        with pytest.raises(UserError, match=f"variant 'v': {expected}, not {type(step[1]).__name__}.*; expected "
                                            "a .* or a dict of its fields$"):
            pipe.variant("v", step)
    with pytest.raises(UserError, match="variant 'v': unknown pass 'nope'"):
        pipe.variant("v", ("nope", DropLayers(keep=(0,))))
    assert "v" not in pipe.to_dict()["variants"]
    # A config of the named pass's own type (a quantize mode's too), a dict or None is taken.
    pipe.variant("v", ("quantize", DynamicInt8Config()), ("drop-layers", {"keep": [0]}), ("finetune", None))
    assert [s.name for s in pipe.validate()[1]["v"]] == ["quantize", "drop-layers", "finetune"]


@pytest.mark.parametrize("misuse, expected", [
    (lambda pipe: pipe.variant("v", ("drop-layers", 5)), "pass 'drop-layers' takes a DropLayers or a dict of its fields, not int 5"),
    (lambda pipe: pipe.variant("v", (5, {})), "a step's pass name is a int; expected a string"),
    (lambda pipe: pipe.variant("v", DropLayers), r"a step is the class DropLayers \(expected an instance"),
    (lambda pipe: pipe.export({"optimize": False}, onnx=True), "export: given both a settings object and the fields onnx"),
    (lambda pipe: pipe.benchmark("cpu"), "benchmark: expected BenchmarkSettings .*got str 'cpu'"),
    (lambda pipe: pipe.plan(5), "out_dir: expected a directory path .*got int 5"),
    (lambda pipe: pipe.run(None), "out_dir: expected a directory path .*got NoneType"),
], ids=["config-not-a-config", "name-not-a-string", "a-class", "settings-and-fields", "settings-not-settings",
        "out-dir-int", "out-dir-none"])
def test_arguments_of_the_wrong_kind_are_one_line_errors(tiny_bert_dir, tiny_csv, misuse, expected):
    with pytest.raises(UserError, match=expected):
        misuse(build(tiny_bert_dir, tiny_csv))


@pytest.mark.parametrize("kwargs, expected", [
    ({"finetune": "full"}, "finetune: expected FinetuneConfig .*got str 'full'"),
    ({"teacher": 5}, "teacher: expected minilm or a model dir .*got int 5"),
])
def test_constructor_arguments_of_the_wrong_kind_are_one_line_errors(tiny_csv, kwargs, expected):
    with pytest.raises(UserError, match=expected):
        Pipeline("api", task={"path": str(tiny_csv)}, **kwargs)


def test_a_teacher_path_object_is_written_as_its_path(tiny_bert_dir, tiny_csv):
    pipe = Pipeline("api", teacher=tiny_bert_dir, task={"path": str(tiny_csv)}).variant("same")
    assert pipe.to_dict()["teacher"]["model"] == str(tiny_bert_dir)
