"""The quantization passes and modes in a recipe, in the contract's forms, end to end."""

from __future__ import annotations

from pathlib import Path

from compressor.evaluate import evaluate_path
from compressor.pipeline import run as pipeline_run
from compressor.pipeline import run_recipe, stages
from compressor.pipeline.recipe import load_recipe, parse_recipe


def test_recipe_with_qat_sensitivity_and_every_mode_exports_each_variant(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline_run, "set_threads", lambda threads: None)
    raw = {"name": "tiny-quant", "seed": 0,
           "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
           "data": {"max_train_samples": 32},
           "variants": {
               "static": [{"quantize": {"mode": "static-int8", "calibration": "entropy", "calibration_samples": 64}}],
               "qat": [{"qat": {"epochs": 1, "max_train_samples": 32, "batch_size": 16}}],
               "sensitive": [{"sensitivity": {"keep_fraction": 0.1, "samples": 32}},
                             {"quantize": {"mode": "dynamic-int8"}}],
               "torch8": [{"quantize": {"mode": "torch-dynamic-int8"}}],
               "int4": [{"quantize": {"mode": "int4-weight-only", "block_size": 16}}],
               # modes at their defaults only: once all one cache key, built as copies of the first
               "fp16": [{"quantize": {"mode": "fp16"}}],
               "torch8-plain": [{"quantize": {"mode": "torch-dynamic-int8"}}]},
           "export": {"onnx": True, "optimize": True, "accuracy_tolerance": 1.0}}
    recipe, steps = parse_recipe(raw)
    report = run_recipe(recipe, steps, tmp_path / "run", show_progress=False)
    entries = {m["name"]: m["onnx"] for m in report["models"]}
    assert entries["static"]["precision"] == "static-int8"
    assert entries["qat"]["precision"] == "static-int8" and entries["qat"]["qat_ranges_applied"] >= 4
    assert entries["sensitive"]["kept_in_float"] and entries["sensitive"]["precision"] == "dynamic-int8"
    assert entries["torch8"]["format"] == "torch" and entries["int4"]["precision"] == "int4-weight-only"
    assert entries["fp16"]["precision"] == "fp16" and entries["torch8-plain"]["format"] == "torch"
    deployed = {m["name"]: (m["kind"], m["precision"]) for m in report["models"]}
    for name, entry in entries.items():
        if name != "fp16":
            assert entry["size_ratio_to_fp32"] < 0.45   # every int mode shrinks the embedding with the rest
        evaluated = evaluate_path(entry["path"], None)
        assert evaluated["accuracy"] == entry["accuracy"]
        # `compressor evaluate` names what it scored as the report does (torch-dynamic-int8: kind torch)
        assert (evaluated["kind"], evaluated["precision"]) == deployed[name]
    # A PyTorch deployment is not named as an ONNX one.
    assert Path(entries["torch8"]["path"]).name == "torch8-torch-int8"
    assert Path(entries["static"]["path"]).name == "static-onnx" and not (tmp_path / "run" / "torch8-onnx").exists()

    # A rerun reuses every export.
    monkeypatch.setattr(stages, "export_into", refuse)
    again = run_recipe(recipe, steps, tmp_path / "run", show_progress=False)
    assert {m["name"]: m["onnx"]["path"] for m in again["models"]} == {n: e["path"] for n, e in entries.items()}


def refuse(*args, **kwargs):
    raise AssertionError("a cached export was rebuilt")


def test_the_shipped_quantization_recipe_validates():
    recipe, steps = load_recipe(Path(__file__).parents[3] / "recipes" / "quantization.yaml")
    names = {name: [s.name for s in variant] for name, variant in steps.items()}
    assert names["qat-int8"] == ["qat"] and names["sensitive-static-int8"] == ["sensitivity", "quantize"]
