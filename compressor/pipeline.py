"""Recipe -> stages -> report.json.

Stages: the teacher (load, optionally fine-tune), then each variant (the teacher with the
variant's passes applied in order), then, when the recipe has `export: {onnx: true}`, one
ONNX export per model (DIR/<name>-onnx/, gated for parity and accuracy). Each stage's
output dir is written atomically and carries `stage.json` with a content key (its input's
key, its config, the tool's version): rerunning a recipe reuses every stage whose key is
unchanged, and an interrupted run picks up after the last finished stage.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compressor import __version__
from compressor.atomic import atomic_dir, write_json
from compressor.bundle import ModelBundle
from compressor.environment import environment
from compressor.export.onnx import EXPORT_FILE, ExportSettings, export_into
from compressor.passes import Context, apply_pass
from compressor.recipe import Recipe, Step, export_dir_name
from pretrain.data import TaskData, load_task
from pretrain.errors import UserError
from pretrain.finetune import evaluate, finetune
from pretrain.models import BUNDLED_MODELS, check_model_ref, load_classifier, set_threads

STAGE_FILE = "stage.json"


@dataclass(frozen=True)
class Stage:
    """A finished stage: where it lives, its cache key and its test metrics."""

    name: str
    path: Path
    key: str
    metrics: dict[str, Any]
    predictions: np.ndarray
    params: int
    history: list[dict]


def run_recipe(recipe: Recipe, steps: dict[str, list[Step]], out_dir: Path, *,
               base_dir: Path = Path("."), show_progress: bool = True) -> dict:
    """Run every stage of a validated recipe into out_dir and return the report."""
    set_threads(None)
    teacher_ref = resolve_path(recipe.teacher.model, base_dir, keep=BUNDLED_MODELS)
    teacher_path = check_model_ref(teacher_ref)
    task_spec = resolve_task_paths(recipe.teacher.task, base_dir)
    task = load_task(task_spec, seed=recipe.seed)
    created = not out_dir.exists()
    try:
        teacher = teacher_stage(recipe, teacher_ref, teacher_path, task, out_dir, show_progress)
        variants = [variant_stage(name, variant_steps, teacher, recipe, task, out_dir, show_progress)
                    for name, variant_steps in steps.items()]
        exports = {}
        if recipe.export is not None and recipe.export.onnx:
            exports = {stage.name: export_stage(stage, recipe.export, recipe, task, out_dir)
                       for stage in [teacher, *variants]}
    except UserError:
        # Bad input found late (e.g. a layer index out of range for this model) leaves
        # nothing behind in a dir this run created. An interrupted run keeps its finished
        # stages so that rerunning resumes after them.
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    report = build_report(recipe, teacher, variants, exports)
    write_json(out_dir / "report.json", report)
    return report


def teacher_stage(recipe: Recipe, ref: str, path: Path, task: TaskData, out_dir: Path,
                  show_progress: bool) -> Stage:
    finetune_cfg = recipe.teacher.finetune
    if finetune_cfg is not None and "seed" not in finetune_cfg.model_fields_set:
        finetune_cfg = finetune_cfg.model_copy(update={"seed": recipe.seed})
    key = content_key({"model": fingerprint(path), "task": task_fingerprint(task),
                       "finetune": finetune_cfg.model_dump(mode="json") if finetune_cfg else None,
                       "eval": recipe.data.max_eval_samples})

    def build() -> ModelBundle:
        model, tokenizer = load_classifier(ref, task.label_names, seed=recipe.seed)
        if finetune_cfg is not None:
            finetune(model, tokenizer, task, finetune_cfg, desc="teacher finetune", show_progress=show_progress)
        return ModelBundle(model=model, tokenizer=tokenizer, task=task.spec)
    return cached_stage("teacher", key, build, task, recipe, out_dir)


def variant_stage(name: str, steps: list[Step], teacher: Stage, recipe: Recipe, task: TaskData,
                  out_dir: Path, show_progress: bool) -> Stage:
    ctx = Context(task=task, seed=recipe.seed, max_train_samples=recipe.data.max_train_samples,
                  show_progress=show_progress)
    key = content_key({"input": teacher.key, "seed": recipe.seed,
                       "max_train_samples": recipe.data.max_train_samples,
                       "steps": [[s.name, s.config.model_dump(mode="json")] for s in steps]})

    def build() -> ModelBundle:
        bundle = ModelBundle.load(teacher.path)
        for step in steps:
            bundle = apply_pass(bundle, step.name, step.config, ctx)
        return bundle
    return cached_stage(name, key, build, task, recipe, out_dir)


def cached_stage(name: str, key: str, build, task: TaskData, recipe: Recipe, out_dir: Path) -> Stage:
    """Reuse out_dir/name if its key matches; otherwise build, evaluate and write it atomically."""
    path = out_dir / name
    record = read_stage_record(path)
    if record.get("key") != key:
        bundle = build()
        test = task.split("test").head(recipe.data.max_eval_samples)
        metrics, predictions = evaluate(bundle.model, bundle.tokenizer, test)
        record = {"key": key, "metrics": metrics, "params": bundle.params,
                  "history": list(bundle.history), "predictions": predictions.tolist()}
        with atomic_dir(path) as tmp:
            bundle.save_into(tmp)
            write_json(tmp / STAGE_FILE, record)
    return Stage(name, path, key, record["metrics"], np.asarray(record["predictions"]),
                 record["params"], record["history"])


def export_stage(stage: Stage, settings: ExportSettings, recipe: Recipe, task: TaskData,
                 out_dir: Path) -> dict:
    """Export a finished stage to DIR/<name>-onnx/ unless an export with the same key is there.

    The key covers the stage's own key (its weights, passes and deploy settings), the export
    settings and the test-sample limit the gate evaluates on.
    """
    path = out_dir / export_dir_name(stage.name)
    key = content_key({"input": stage.key, "export": settings.model_dump(mode="json"),
                       "eval": recipe.data.max_eval_samples})
    record = read_stage_record(path)
    if record.get("key") != key:
        bundle = ModelBundle.load(stage.path)
        with atomic_dir(path) as tmp:
            export = export_into(tmp, bundle, settings, task, recipe.data.max_eval_samples)
            record = {"key": key, "export": export}
            write_json(tmp / EXPORT_FILE, {**export, "path": str(path)})
            write_json(tmp / STAGE_FILE, record)
    return {"path": str(path), **record["export"]}


def read_stage_record(path: Path) -> dict:
    try:
        return json.loads((path / STAGE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def build_report(recipe: Recipe, teacher: Stage, variants: list[Stage],
                 exports: dict[str, dict] | None = None) -> dict:
    exports = exports or {}
    teacher_acc = teacher.metrics["accuracy"]
    models = []
    for stage in variants:
        models.append({
            "name": stage.name, "path": str(stage.path),
            "accuracy": stage.metrics["accuracy"], "macro_f1": stage.metrics["macro_f1"],
            "retention": stage.metrics["accuracy"] / teacher_acc if teacher_acc else None,
            "agreement": float(np.mean(stage.predictions == teacher.predictions)),
            "params": stage.params, "size_bytes": weights_size(stage.path),
            "passes": stage.history, **onnx_entry(exports, stage.name)})
    return {
        "recipe": recipe.model_dump(mode="json"),
        "environment": environment(),
        "teacher": {"path": str(teacher.path), "accuracy": teacher_acc,
                    "macro_f1": teacher.metrics["macro_f1"], "eval_samples": teacher.metrics["samples"],
                    "params": teacher.params,
                    "size_bytes": weights_size(teacher.path), **onnx_entry(exports, "teacher")},
        "models": models,
    }


def onnx_entry(exports: dict[str, dict], name: str) -> dict:
    """{"onnx": export record} for a model that was exported; nothing when export is off."""
    return {"onnx": exports[name]} if name in exports else {}


def weights_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def content_key(parts: dict) -> str:
    payload = json.dumps({"code": code_version(), **parts}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def code_version() -> str:
    """The tool's version: part of every cache key.

    A release that changes what a stage computes bumps the version, which invalidates
    cached stages. (Hashing the source itself would throw away a 20-minute teacher
    fine-tuning for every unrelated edit.)
    """
    return __version__


def fingerprint(path: Path) -> str:
    """Content hash of a model dir's config and weights."""
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()):
        if file.is_file() and file.suffix in (".json", ".safetensors", ".bin", ".txt"):
            digest.update(file.name.encode())
            with open(file, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:20]


def task_fingerprint(task: TaskData) -> str:
    digest = hashlib.sha256(json.dumps([task.name, task.label_names], default=str).encode())
    for split_name in sorted(task.splits):
        split = task.splits[split_name]
        digest.update(json.dumps([split.texts, split.text_pairs, split.labels]).encode())
    return digest.hexdigest()[:20]


def resolve_path(ref: str, base_dir: Path, keep: tuple[str, ...] = ()) -> str:
    """A relative path in a recipe means the working dir first, then the recipe's dir.

    Paths come back absolute: they are recorded with the models, which may be used from
    another working dir later.
    """
    if ref in keep:
        return ref
    path = Path(ref)
    if not path.is_absolute() and not path.exists() and (base_dir / path).exists():
        path = base_dir / path
    return str(path.resolve()) if path.exists() else ref


def resolve_task_paths(spec: str | dict, base_dir: Path) -> str | dict:
    if isinstance(spec, str):
        return spec
    return {k: resolve_path(v, base_dir) if k in ("path", "validation", "test") and isinstance(v, str) else v
            for k, v in spec.items()}
