"""`compressor bench`: one saved model on one hardware profile, printed as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from compressor.bench.measure import measure_models, measuring_environment
from compressor.bench.profiles import Profile, load_profile, unavailable_reason, with_overrides
from compressor.bench.runners import Deployable
from compressor.bundle import weights_size
from compressor.evaluate import (Predictor, check_holds_text, check_pair_task, find_onnx, load_predictor,
                                 predict_classes, split_seed, task_or_recorded)
from compressor.report.analysis import contention_warnings
from pretrain.atomic import check_output, claimed_output, write_json
from pretrain.data import load_task, task_files
from pretrain.errors import UserError
from pretrain.metrics import classification_metrics


# Every bench result has these keys: an existing --out file without them is not one.
RESULT_KEYS = ("model", "profile", "kind", "precision", "size_bytes", "environment")


def check_earlier_result(out: Path) -> None:
    """An existing --out file is replaced only when it is an earlier `compressor bench` result:
    a user's own file is never overwritten."""
    if not out.is_file():
        return
    try:
        earlier = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        earlier = None
    if not (isinstance(earlier, dict) and all(key in earlier for key in RESULT_KEYS)):
        raise UserError(f"--out {out} is a file `compressor bench` did not write; expected a new path, or an "
                        f"earlier bench result to replace")


def deployable_at(path: Path, predictor: Predictor) -> Deployable:
    """What a path holds, as `load_predictor` read it (kind and precision named as evaluate and
    report.json name them): an ONNX file (given, or in an export dir) or a PyTorch dir."""
    onnx_file = path if path.suffix == ".onnx" else find_onnx(path)
    return Deployable(path.name, predictor.kind, onnx_file if predictor.kind == "onnx" else path,
                      predictor.precision)


def model_size(model: Deployable) -> int:
    if model.kind == "onnx":
        return model.path.stat().st_size
    return weights_size(model.path)


def bench_command(model_ref: str, profile_ref: str, *, batch_sizes: list[int] | None = None,
                  sequence_lengths: list | None = None, iterations: int | None = None,
                  task_spec: str | dict | None = None, max_eval_samples: int | None = None,
                  seed: int | None = None, out: Path | None = None, max_length: int | None = None) -> dict:
    """Measure the model (texts cut at `max_length`, else at the length it records); the result
    is also written to `out` (a JSON file) when given."""
    overrides = {k: v for k, v in (("batch_sizes", batch_sizes), ("sequence_lengths", sequence_lengths),
                                     ("iterations", iterations)) if v}
    profile = with_overrides(load_profile(profile_ref), overrides)   # validated as a profile file is
    predictor = load_predictor(model_ref, max_length)     # validates the model before any timing
    seed = split_seed(seed, predictor.task_seed, task_spec, predictor.task)
    spec = task_or_recorded(task_spec, predictor.task, model_ref)
    if out is not None:
        check_output(out, [model_ref, *task_files(spec)], owner_files=None)
        if Path(out).is_dir():
            raise UserError(f"--out {out} is a directory; expected the path of a JSON file to write")
        check_earlier_result(Path(out))
    if out is None:
        return bench_result(model_ref, profile, predictor, spec, max_eval_samples, seed, max_length)
    with claimed_output(Path(out)):       # a second bench writing `out` meanwhile is refused
        result = bench_result(model_ref, profile, predictor, spec, max_eval_samples, seed, max_length)
        write_json(Path(out), result)
    return result


def bench_result(model_ref: str, profile: Profile, predictor: Predictor, spec: str | dict | None,
                 max_eval_samples: int | None, seed: int, max_length: int | None = None) -> dict:
    """Accuracy on the test split, size and latency of the model on the profile (or why skipped);
    `max_length`: the --max-length given, if any (the predictor already cuts there)."""
    model = deployable_at(Path(model_ref), predictor)
    result = {"model": str(model_ref), "profile": profile.model_dump(mode="json"), "kind": model.kind,
              "precision": model.precision, "max_length": predictor.max_length, "size_bytes": model_size(model),
              "environment": measuring_environment([profile])}
    reason = unavailable_reason(profile)
    if reason is not None:
        return {**result, "skipped": reason}
    if not profile.suits(model.precision):       # measured all the same, as the report does
        result["warning"] = (f"profile {profile.name} suits {', '.join(profile.precisions)}, not "
                             f"{model.precision}: the latency says little about a deployment there")
        print(f"warning: {result['warning']}", file=sys.stderr)
    if spec is None:
        raise UserError(f"no --task given and {model_ref} records no task; pass --task")
    task = load_task(spec, seed=seed)
    check_pair_task(predictor.pair_task, task, model_ref)
    check_holds_text(max_length, predictor.tokenizer, task, model_ref)
    test = task.split("test").head(max_eval_samples)
    predictions = predict_classes(predictor, test, task)
    result.update(task=task.name, **classification_metrics(np.asarray(test.labels), predictions))
    measured = measure_models([model], profile, predictor.tokenizer, test, log=lambda message: None,
                              max_length=predictor.max_length, positions=predictor.positions)   # stdout: the JSON
    result["latency"] = [{k: v for k, v in row.items() if k not in ("model", "kind", "precision")}
                         for row in measured.rows]
    contended = contention_warnings([{"name": model.name, "latency": result["latency"]}])
    for line in contended:
        print(f"warning: {line}", file=sys.stderr)
    # Every warning, the precision's included (`warning` keeps that one alone, as before).
    result["warnings"] = [w for w in (result.get("warning"),) if w] + contended
    return result
