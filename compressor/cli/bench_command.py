"""`compressor bench`: one saved model on one hardware profile, printed as JSON."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compressor.bench.environment import environment
from compressor.bench.measure import measure_models
from compressor.bench.profiles import load_profile, unavailable_reason
from compressor.bench.runners import Deployable
from compressor.bundle import weights_size
from compressor.evaluate import find_onnx, load_predictor, predict_classes
from compressor.export.onnx import read_export_record
from pretrain.data import load_task
from pretrain.errors import UserError
from pretrain.metrics import classification_metrics


def deployable_at(path: Path) -> Deployable:
    """What a path holds: an ONNX file, an export dir, or an HF model dir."""
    onnx_file = path if path.suffix == ".onnx" else find_onnx(path)
    if onnx_file is not None:
        precision = read_export_record(onnx_file.parent).get("precision", "fp32")
        return Deployable(path.name, "onnx", onnx_file, precision)
    precision = read_export_record(path).get("precision", "fp32")   # torch-dynamic-int8 dirs have one
    return Deployable(path.name, "torch", path, precision)


def model_size(model: Deployable) -> int:
    if model.kind == "onnx":
        return model.path.stat().st_size
    return weights_size(model.path)


def bench_command(model_ref: str, profile_ref: str, *, batch_sizes: list[int] | None = None,
                  sequence_lengths: list | None = None, iterations: int | None = None,
                  task_spec: str | dict | None = None, max_eval_samples: int | None = None,
                  seed: int = 0) -> dict:
    overrides = {k: v for k, v in (("batch_sizes", batch_sizes), ("sequence_lengths", sequence_lengths),
                                     ("iterations", iterations)) if v}
    profile = load_profile(profile_ref).model_copy(update=overrides)
    predictor = load_predictor(model_ref)          # validates the model before any timing
    model = deployable_at(Path(model_ref))
    result = {"model": str(model_ref), "profile": profile.model_dump(mode="json"), "kind": model.kind,
              "precision": model.precision, "size_bytes": model_size(model), "environment": environment()}
    reason = unavailable_reason(profile)
    if reason is not None:
        return {**result, "skipped": reason}
    spec = task_spec if task_spec is not None else predictor.task
    if spec is None:
        raise UserError(f"no --task given and {model_ref} records no task; pass --task")
    task = load_task(spec, seed=seed)
    test = task.split("test").head(max_eval_samples)
    predictions = predict_classes(predictor, test, task)
    result.update(task=task.name, **classification_metrics(np.asarray(test.labels), predictions))
    measured = measure_models([model], profile, predictor.tokenizer, test, log=lambda message: None,
                              max_length=predictor.max_length)   # stdout is the JSON result
    result["latency"] = [{k: v for k, v in row.items() if k not in ("model", "kind", "precision")}
                         for row in measured.rows]
    return result
