"""Export as a recipe stage: DIR/<name>-onnx/ per model, `onnx` entries in report.json, caching."""

from __future__ import annotations

import json
import shutil

import pytest

from compressor.evaluate import evaluate_path
from compressor.pipeline import stages

ONNX_FIELDS = {"path", "accuracy", "size_bytes", "fusions", "fusion_fallback", "optimized", "precision",
               "parity_max_abs_diff", "agreement_with_fp32", "accuracy_change", "fp32_size_bytes"}


def raw_recipe(model_dir, csv_path) -> dict:
    return {"name": "tiny-export", "seed": 0,
            "teacher": {"model": str(model_dir), "task": {"path": str(csv_path)}},
            "variants": {"same": [], "int8": [{"drop-layers": {"keep": [0, 2]}},
                                              {"quantize": {"mode": "dynamic-int8", "per_channel": True}}]},
            # A random tiny model has near-ties everywhere: int8 may flip a few of 30 items.
            "export": {"onnx": True, "optimize": True, "accuracy_tolerance": 1.0}}


def refuse(*args, **kwargs):
    raise AssertionError("a cached stage was rebuilt")


@pytest.fixture(scope="module")
def done(tiny_bert_dir, tiny_csv, tmp_path_factory, run_raw):
    out = tmp_path_factory.mktemp("export-run") / "run"
    raw = raw_recipe(tiny_bert_dir, tiny_csv)
    return raw, out, run_raw(raw, out)


def test_every_model_is_exported_and_reported(done):
    _, out, report = done
    assert sorted(p.name for p in out.iterdir()) == [".lock", "int8", "int8-onnx", "report.html", "report.json",
                                                     "report.md", "run.json", "same", "same-onnx",
                                                     "teacher", "teacher-onnx"]
    entries = {"teacher": report["teacher"], **{m["name"]: m for m in report["models"]}}
    for name, entry in entries.items():
        onnx_entry = entry["onnx"]
        assert ONNX_FIELDS <= set(onnx_entry)
        assert onnx_entry["path"] == str(out / f"{name}-onnx")
        assert onnx_entry["parity_max_abs_diff"] <= 1e-4 and onnx_entry["optimized"]
        # every layer but the last, which runs the first token alone (pretrain/first_token.py)
        assert onnx_entry["fusions"]["Attention"] == (1 if name == "int8" else 3)
        assert evaluate_path(onnx_entry["path"], None)["accuracy"] == onnx_entry["accuracy"]
        if name == "teacher":
            assert entry["path"] == str(out / "teacher")
            continue
        # A variant's entry describes what ships: the export dir, its kind, precision, accuracy, size.
        assert entry["path"] == onnx_entry["path"] and entry["model_dir"] == str(out / name)
        assert entry["kind"] == "onnx" and entry["precision"] == onnx_entry["precision"]
        assert entry["accuracy"] == onnx_entry["accuracy"] and entry["size_bytes"] == onnx_entry["size_bytes"]
        assert entry["torch_size_bytes"] == (out / name / "model.safetensors").stat().st_size
    assert entries["same"]["onnx"]["precision"] == "fp32"
    assert entries["same"]["onnx"]["accuracy"] == entries["same"]["accuracy"]
    int8 = entries["int8"]["onnx"]
    assert int8["precision"] == "dynamic-int8" and int8["quantization"]["per_channel"] is True
    assert 0 <= int8["agreement_with_fp32"] <= 1 and int8["size_bytes"] < 0.3 * int8["fp32_size_bytes"]
    assert json.loads((out / "int8" / "compressor.json").read_text())["deploy"]["quantize"]["mode"] == "dynamic-int8"


def test_rerun_reuses_the_exports(done, monkeypatch, run_raw):
    raw, out, report = done
    monkeypatch.setattr(stages, "export_into", refuse)
    again = run_raw(raw, out)
    assert [m["onnx"] for m in again["models"]] == [m["onnx"] for m in report["models"]]


def test_export_settings_change_rebuilds_only_the_exports(done, tmp_path, monkeypatch, run_raw):
    raw, out, _ = done
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    monkeypatch.setattr(stages, "apply_pass", refuse)
    # The gate's scoring of the test split is the only one: the stage reuses its predictions.
    monkeypatch.setattr(stages, "predict_classes", refuse)
    report = run_raw({**raw, "export": {**raw["export"], "optimize": False}}, copy)
    assert all(not m["onnx"]["optimized"] and m["onnx"]["fusions"] == {} for m in report["models"])


def test_export_stage_predictions_are_the_shipped_models(done, tiny_task):
    """The predictions the stage keeps (from the gate) equal scoring the written dir afresh."""
    from compressor.evaluate import load_predictor, predict_classes
    _, out, _ = done
    for name in ("teacher", "same", "int8"):
        kept = json.loads((out / f"{name}-onnx" / "stage.json").read_text())["predictions"]
        fresh = predict_classes(load_predictor(out / f"{name}-onnx"), tiny_task.split("test"), tiny_task)
        assert kept == fresh.tolist()


def test_summary_table_lists_every_export(done):
    from compressor.report.render import exports_table
    _, _, report = done
    lines = exports_table(report).splitlines()
    assert len(lines) == 2 + 3
    assert lines[2].startswith("| teacher | fp32 | yes |")
    assert lines[4].startswith("| int8 | dynamic-int8 | yes |")
