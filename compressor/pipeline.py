"""Recipe -> stages -> report.json (+ report.md, report.html, pareto.png).

Stages, in order: the teacher (load, optionally fine-tune); each variant (the teacher with
the variant's passes applied in order); one ONNX export per model when the recipe has
`export: {onnx: true}` (DIR/<name>-onnx/, or DIR/<name>-torch-int8/ for a torch-dynamic-int8
deployment; gated for parity and accuracy); the baselines and
one benchmark of every deployable model on the recipe's hardware profiles when it has
`benchmark:`. Every stage goes through `cached`: its output dir is written atomically
(temporary name, then rename) and carries `stage.json` with a content key (the key of its
input, its config, the tool's version). Rerunning a recipe reuses every stage whose key is
unchanged; an interrupted run (even `kill -9`) resumes after the last finished stage.

Variants that begin with the same passes share them: after a pass that trains, the
intermediate model is kept under DIR/prefixes/<key>/ and a later variant with the same
prefix starts from it instead of training again.

Passes get a Context with the teacher stage's model (loaded only if a pass asks for it) and,
per step, a work dir DIR/.work/<key>/ for checkpoints (same key as the step's prefix, so a
rerun resumes there); the work dirs of a variant go once its stage is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from compressor import __version__
from compressor.atomic import atomic_dir, write_json
from compressor.baselines import (BUILDERS, OPTIMUM, baseline_kind, check_baselines, model_file, optimum_preset,
                                  preset_for_this_cpu, preset_settings)
from compressor.bench import Deployable
from compressor.benchmark_stage import run_benchmarks
from compressor.bundle import ModelBundle, read_provenance
from compressor.environment import environment
from compressor.evaluate import load_predictor, predict_classes
from compressor.export.onnx import EXPORT_FILE, ONNX_FILE, ExportSettings, export_into
from compressor.export.torch_int8 import is_int8_dir
from compressor.passes import Context, LazyTeacher, apply_pass, check_pass_family, get_pass
from compressor.profiles import unavailable_reason
from compressor.recipe import (BASELINES_DIR, BENCHMARK_DIR, PREFIXES_DIR, RUN_FILE, WORK_DIR, Recipe, Step,
                               export_dir_name)
from compressor.report import pareto_fronts, runtime_warnings, write_human_reports
from pretrain.batching import usable_length
from pretrain.data import TaskData, load_task
from pretrain.errors import UserError
from pretrain.finetune import evaluate, finetune, with_run_defaults
from pretrain.metrics import agreement, classification_metrics
from pretrain.models import BUNDLED_MODELS, check_model_ref, load_classifier, read_model_type, set_threads

STAGE_FILE = "stage.json"


class WriteError(UserError):
    """The disk refused a write (full, read-only, permissions): finished stages stay usable."""


@dataclass(frozen=True)
class Stage:
    """A finished model stage: where it lives, its cache key and its test metrics."""

    name: str
    path: Path
    key: str
    metrics: dict[str, Any]
    predictions: np.ndarray
    params: int
    history: list[dict]


def run_recipe(recipe: Recipe, steps: dict[str, list[Step]], out_dir: Path, *,
               base_dir: Path = Path("."), show_progress: bool = True, force: bool = False,
               rebenchmark: bool = False) -> dict:
    """Run every stage of a validated recipe into out_dir and return the report."""
    set_threads(None)
    teacher_ref = resolve_path(recipe.teacher.model, base_dir, keep=BUNDLED_MODELS)
    teacher_path = check_model_ref(teacher_ref)
    family = read_model_type(teacher_path)
    presets: dict[str, str] = {}
    if recipe.benchmark is not None:
        check_baselines(recipe.benchmark.baselines, family)
        if OPTIMUM in recipe.benchmark.baselines:
            presets = optimum_presets(recipe.benchmark)     # a preset this CPU cannot run stops here
    check_steps_fit(steps, family)
    task = load_task(resolve_task_paths(recipe.teacher.task, base_dir), seed=recipe.seed)
    steps = {name: [resolve_step_paths(step, base_dir) for step in variant_steps]
             for name, variant_steps in steps.items()}
    created = claim_out_dir(out_dir, recipe, force)
    try:
        teacher = teacher_stage(recipe, teacher_ref, teacher_path, task, out_dir, show_progress)
        ctx = pass_context(recipe, task, teacher, show_progress)
        variants: list[Stage] = []
        for name, variant_steps in steps.items():
            variants.append(variant_stage(name, variant_steps, teacher, variants, recipe, task, out_dir, ctx))
        exports = {}
        if recipe.export is not None and recipe.export.onnx:
            exports = {stage.name: export_stage(stage, recipe.export, recipe, task, out_dir)
                       for stage in [teacher, *variants]}
        baselines, benchmark = [], None
        if recipe.benchmark is not None:
            baselines = [baseline_stage(name, teacher, recipe, task, out_dir, presets)
                         for name in recipe.benchmark.baselines]
            deployables = [baseline_deployable(b) for b in baselines] + \
                [variant_deployable(stage, exports.get(stage.name)) for stage in variants]
            benchmark = benchmark_stage(deployables, teacher, recipe, task, out_dir, rebenchmark)
    except WriteError:
        raise   # finished stages are complete and cached: keep them for the rerun
    except UserError:
        # Bad input found late (e.g. a layer index out of range for this model) leaves
        # nothing behind in a dir this run created. An interrupted run keeps its finished
        # stages so that rerunning resumes after them.
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    report = build_report(recipe, teacher, variants, exports, baselines, benchmark)
    with disk_errors(out_dir):
        write_json(out_dir / "report.json", report)
        write_human_reports(report, out_dir)
    return report


def optimum_presets(settings) -> dict[str, str]:
    """The Optimum preset of every profile this machine measures, by profile name."""
    return {profile.name: optimum_preset(profile) for profile in settings.profile_objects()
            if unavailable_reason(profile) is None}


def check_steps_fit(steps: dict[str, list[Step]], family: str) -> None:
    """Refuse, before any stage runs, a pass that cannot apply to the teacher's family."""
    for name, variant_steps in steps.items():
        for i, step in enumerate(variant_steps):
            try:
                check_pass_family(step.name, step.config, family)
            except UserError as err:
                raise UserError(f"variants.{name}[{i}]: {err}") from None


# -- the output dir --------------------------------------------------------------------

def claim_out_dir(out_dir: Path, recipe: Recipe, force: bool) -> bool:
    """Check that out_dir is free or holds this recipe's results; True if it is new.

    A dir holding another recipe's results (or anything not written by a run) is refused
    unless `force`, which replaces its contents.
    """
    if not out_dir.exists():
        with disk_errors(out_dir):
            out_dir.mkdir(parents=True)
            write_json(out_dir / RUN_FILE, {"recipe": recipe.name, "tool_version": __version__})
        return True
    if not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file; expected a directory for the run's results")
    remove_stale_temporaries(out_dir)
    # Dirs written before run.json existed still name their recipe in report.json.
    owner = read_json(out_dir / RUN_FILE).get("recipe") or \
        read_json(out_dir / "report.json").get("recipe", {}).get("name")
    contents = [p for p in out_dir.iterdir() if p.name != RUN_FILE]
    if contents and owner != recipe.name:
        if not force:
            holder = f"results of recipe {owner!r}" if owner else "files not written by `compressor run`"
            raise UserError(f"{out_dir} holds {holder}; refusing to mix them with recipe "
                            f"{recipe.name!r} (choose another --out, or pass --force to replace them)")
        for path in contents:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    with disk_errors(out_dir):
        write_json(out_dir / RUN_FILE, {"recipe": recipe.name, "tool_version": __version__})
    return False


def remove_stale_temporaries(out_dir: Path) -> None:
    """Temporary dirs and files a killed run left behind (hidden `.<name>.tmp-*` / `.old-*`)."""
    for pattern in (".*.tmp-*", ".*.old-*", "*/.*.tmp-*", "*/.*.old-*"):
        for path in out_dir.glob(pattern):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


# The disk refusing a write: full, over quota, read-only, or not ours to write.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


@contextlib.contextmanager
def disk_errors(out_dir: Path) -> Iterator[None]:
    """Turn an OSError while writing under out_dir into a one-line WriteError."""
    try:
        yield
    except OSError as err:
        if err.errno not in WRITE_ERRNOS:
            raise
        what = err.strerror or str(err)
        where = f" ({err.filename})" if err.filename else ""
        raise WriteError(f"cannot write under {out_dir}: {what}{where}; finished stages are "
                         "kept, fix the disk or permissions and rerun the same command to resume") from None


def cached(path: Path, key: str, write: Callable[[Path], dict], force: bool = False) -> dict:
    """The record of the stage at `path` if its key matches (and not `force`); else build it atomically.

    `write(tmp_dir)` fills a temporary dir and returns the record, which is saved as
    stage.json beside what it wrote; the dir then replaces `path` in one rename.
    """
    record = read_json(path / STAGE_FILE)
    if record.get("key") == key and not force:
        return record
    with disk_errors(path.parent), atomic_dir(path) as tmp:
        record = {"key": key, **write(tmp)}
        write_json(tmp / STAGE_FILE, record)
    return record


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def read_stage_record(path: Path) -> dict:
    return read_json(Path(path) / STAGE_FILE)


# -- model stages ----------------------------------------------------------------------

def teacher_stage(recipe: Recipe, ref: str, path: Path, task: TaskData, out_dir: Path,
                  show_progress: bool) -> Stage:
    finetune_cfg = recipe.teacher.finetune
    if finetune_cfg is not None:
        # data.max_train_samples caps the passes, not the teacher: its fine-tuning sets its own.
        finetune_cfg = with_run_defaults(finetune_cfg, recipe.seed, max_train_samples=None)
    key = content_key({"model": fingerprint(path), "task": task_fingerprint(task),
                       "finetune": key_fields(finetune_cfg) if finetune_cfg else None,
                       "eval": recipe.data.max_eval_samples})

    def build() -> ModelBundle:
        model, tokenizer = load_classifier(ref, task.label_names, seed=recipe.seed)
        if finetune_cfg is not None:
            finetune(model, tokenizer, task, finetune_cfg, desc="teacher finetune", show_progress=show_progress)
        return ModelBundle(model=model, tokenizer=tokenizer, task=task.spec)
    return model_stage("teacher", key, build, task, recipe, out_dir)


def pass_context(recipe: Recipe, task: TaskData, teacher: Stage, show_progress: bool) -> Context:
    """What every variant's passes share; the teacher loads only if a pass asks for it."""
    return Context(task=task, seed=recipe.seed, max_train_samples=recipe.data.max_train_samples,
                   show_progress=show_progress, teacher_source=LazyTeacher.from_dir(teacher.path))


def variant_stage(name: str, steps: list[Step], teacher: Stage, earlier: list[Stage], recipe: Recipe,
                  task: TaskData, out_dir: Path, ctx: Context) -> Stage:
    def key_of(prefix: list[Step]) -> str:
        return content_key({"input": teacher.key, "seed": recipe.seed,
                            "max_train_samples": recipe.data.max_train_samples,
                            "steps": [[s.name, key_fields(s.config)] for s in prefix]})

    def build() -> ModelBundle:
        known = {stage.key: stage.path for stage in earlier}
        done, start = longest_finished_prefix(steps, key_of, known, out_dir)
        bundle = ModelBundle.load(start or teacher.path)
        for i in range(done, len(steps)):
            # Keyed like the prefix it produces: a rerun of this step finds its checkpoints.
            step_ctx = dataclasses.replace(ctx, work_dir=out_dir / WORK_DIR / key_of(steps[:i + 1]))
            bundle = apply_pass(bundle, steps[i].name, steps[i].config, step_ctx)
            if get_pass(steps[i].name).trains and i + 1 < len(steps):
                keep_prefix(bundle, out_dir / PREFIXES_DIR / key_of(steps[:i + 1]), out_dir)
        return bundle
    stage = model_stage(name, key_of(steps), build, task, recipe, out_dir)
    remove_work_dirs(out_dir, [key_of(steps[:n]) for n in range(1, len(steps) + 1)])
    return stage


def remove_work_dirs(out_dir: Path, keys: list[str]) -> None:
    """Checkpoints of steps whose output is now written (a kept prefix or the stage itself)."""
    for key in keys:
        shutil.rmtree(out_dir / WORK_DIR / key, ignore_errors=True)
    with contextlib.suppress(OSError):   # still holding another variant's work, or never made
        (out_dir / WORK_DIR).rmdir()


def longest_finished_prefix(steps: list[Step], key_of: Callable[[list[Step]], str],
                            known: dict[str, Path], out_dir: Path) -> tuple[int, Path | None]:
    """(number of steps already done, dir of that model) for the longest finished prefix."""
    for n in range(len(steps), 0, -1):
        key = key_of(steps[:n])
        if key in known:
            return n, known[key]
        kept = out_dir / PREFIXES_DIR / key
        if read_json(kept / STAGE_FILE).get("key") == key:
            return n, kept
    return 0, None


def keep_prefix(bundle: ModelBundle, path: Path, out_dir: Path) -> None:
    def write(tmp: Path) -> dict:
        bundle.save_into(tmp)
        return {"history": list(bundle.history)}
    cached(path, path.name, write)


def model_stage(name: str, key: str, build: Callable[[], ModelBundle], task: TaskData, recipe: Recipe,
                out_dir: Path) -> Stage:
    """Reuse out_dir/name if its key matches; otherwise build, evaluate and write it."""
    def write(tmp: Path) -> dict:
        bundle = build()
        test = task.split("test").head(recipe.data.max_eval_samples)
        metrics, predictions = evaluate(bundle.model, bundle.tokenizer, test)
        bundle.save_into(tmp)
        return {"metrics": metrics, "params": bundle.params, "history": list(bundle.history),
                "predictions": predictions.tolist()}
    record = cached(out_dir / name, key, write)
    return Stage(name, out_dir / name, key, record["metrics"], np.asarray(record["predictions"]),
                 record["params"], record["history"])


def export_stage(stage: Stage, settings: ExportSettings, recipe: Recipe, task: TaskData,
                 out_dir: Path) -> dict:
    """Export a finished stage to DIR/<name>-onnx/ (DIR/<name>-torch-int8/ for torch-dynamic-int8),
    gated; the record plus test predictions.

    The key covers the stage's own key (its weights, passes and deploy settings), the export
    settings and the test-sample limit the gate evaluates on.
    """
    path = out_dir / export_dir_name(stage.name, quantize_mode(stage.path))
    key = content_key({"input": stage.key, "export": key_fields(settings),
                       "eval": recipe.data.max_eval_samples})
    adopt_legacy_export(path, out_dir / export_dir_name(stage.name), key)

    def write(tmp: Path) -> dict:
        exported = export_into(tmp, ModelBundle.load(stage.path), settings, task, recipe.data.max_eval_samples)
        write_json(tmp / EXPORT_FILE, {**exported.record, "path": str(path)})
        # The gate already scored the shipped model on these test examples: reuse its predictions.
        return {"export": exported.record, "predictions": exported.predictions.tolist()}
    record = cached(path, key, write)
    return {"path": str(path), **record["export"], "predictions": record["predictions"]}


def quantize_mode(model_dir: Path) -> str | None:
    """The quantize mode a stage's passes recorded (compressor.json deploy), if any."""
    return (read_provenance(model_dir).get("deploy", {}).get("quantize") or {}).get("mode")


def adopt_legacy_export(path: Path, legacy: Path, key: str) -> None:
    """Move a torch-dynamic-int8 export cached under its old name (<name>-onnx) to `path`.

    Earlier versions named these dirs <name>-onnx although they hold model.int8.pt;
    renaming keeps their finished export instead of rebuilding it.
    """
    if path == legacy or path.exists() or not is_int8_dir(legacy) or read_stage_record(legacy).get("key") != key:
        return
    with disk_errors(path.parent):
        legacy.rename(path)
        record = read_json(path / EXPORT_FILE)
        if record:
            write_json(path / EXPORT_FILE, {**record, "path": str(path)})


def test_predictions(model_path: Path, task: TaskData, recipe: Recipe) -> np.ndarray:
    """Class predictions of a saved model (HF or ONNX dir) on the recipe's test examples."""
    return predict_classes(load_predictor(model_path), task.split("test").head(recipe.data.max_eval_samples), task)


# -- baselines and the benchmark ---------------------------------------------------------

def baseline_stage(name: str, teacher: Stage, recipe: Recipe, task: TaskData, out_dir: Path,
                   presets: dict[str, str]) -> dict:
    """Build (or reuse) one baseline from the teacher; its record with test metrics.

    `presets` maps each measured profile to its Optimum preset. The Optimum baseline is
    built once per distinct preset; its record is the first measured profile's build (the
    CPU's preset when no profile is measured here), and `optimum` tells which preset each
    profile is measured against.
    """
    kind, precision = baseline_kind(name)
    if name == "pytorch-eager-fp32":   # the teacher itself: nothing to build or re-evaluate
        return {"name": name, "path": str(teacher.path), "file": str(teacher.path), "kind": kind,
                "precision": precision, "metrics": teacher.metrics,
                "predictions": teacher.predictions.tolist(), "size_bytes": weights_size(teacher.path),
                "params": teacher.params}
    if name != OPTIMUM:
        return {"name": name, "kind": kind, "precision": precision, "params": teacher.params,
                **built_baseline(name, None, teacher, recipe, task, out_dir)}
    wanted = list(dict.fromkeys(presets.values())) or [preset_for_this_cpu()]
    builds = {preset: built_baseline(name, preset, teacher, recipe, task, out_dir) for preset in wanted}
    primary = builds[wanted[0]]
    optimum = {"preset": wanted[0], "settings": preset_settings(wanted[0]), "profiles": presets,
               "builds": {preset: {"path": b["path"], "accuracy": b["metrics"]["accuracy"],
                                   "macro_f1": b["metrics"]["macro_f1"], "size_bytes": b["size_bytes"],
                                   "settings": preset_settings(preset)} for preset, b in builds.items()}}
    return {"name": name, "kind": kind, "precision": precision, "params": teacher.params, **primary,
            "optimum": optimum, "profile_files": {p: builds[preset]["file"] for p, preset in presets.items()}}


def built_baseline(name: str, preset: str | None, teacher: Stage, recipe: Recipe, task: TaskData,
                   out_dir: Path) -> dict:
    """One built baseline dir (per Optimum preset for the Optimum baseline), cached by key."""
    path = out_dir / BASELINES_DIR / (name if preset is None else f"{name}-{preset}")
    key = content_key({"baseline": name, "input": teacher.key, "eval": recipe.data.max_eval_samples,
                       "optimum": preset_settings(preset) if preset else None})

    def write(tmp: Path) -> dict:
        BUILDERS[name](teacher.path, tmp, preset)
        predictions = test_predictions(tmp, task, recipe)
        labels = np.asarray(task.split("test").head(recipe.data.max_eval_samples).labels)
        return {"metrics": classification_metrics(labels, predictions), "predictions": predictions.tolist(),
                "size_bytes": model_file(name, tmp).stat().st_size}
    record = cached(path, key, write)
    return {"path": str(path), "file": str(model_file(name, path)), **record}


def baseline_deployable(baseline: dict) -> Deployable:
    on_profiles = tuple((profile, Path(file)) for profile, file in baseline.get("profile_files", {}).items())
    return Deployable(baseline["name"], baseline["kind"], Path(baseline["file"]), baseline["precision"],
                      on_profiles)


def variant_deployable(stage: Stage, export: dict | None) -> Deployable:
    if export is None:
        return Deployable(stage.name, "torch", stage.path, "fp32")
    if export.get("format") == "torch":       # torch-dynamic-int8: a PyTorch deployment dir
        return Deployable(stage.name, "torch", Path(export["path"]), export["precision"])
    return Deployable(stage.name, "onnx", Path(export["path"]) / ONNX_FILE, export["precision"])


def benchmark_stage(models: list[Deployable], teacher: Stage, recipe: Recipe, task: TaskData,
                    out_dir: Path, rebenchmark: bool) -> dict:
    """Measure every deployable model on every profile in one run (cached as a whole)."""
    settings = recipe.benchmark
    key = content_key({"models": [[m.name, m.kind, m.precision, fingerprint_file(m.path),
                                   [[p, fingerprint_file(f)] for p, f in m.on_profiles]] for m in models],
                       "benchmark": key_fields(settings), "eval": recipe.data.max_eval_samples,
                       "profiles": settings.resolved_profiles()})
    path = out_dir / BENCHMARK_DIR
    test = task.split("test").head(recipe.data.max_eval_samples)
    teacher_bundle = ModelBundle.load(teacher.path)

    def write(tmp: Path) -> dict:
        results = run_benchmarks(models, settings, teacher_bundle.tokenizer, test,
                                 max_length=usable_length(teacher_bundle.model))
        write_json(tmp / "benchmark.json", results)
        return results
    record = cached(path, key, write, force=rebenchmark)
    return {k: v for k, v in record.items() if k != "key"}


# -- the report ------------------------------------------------------------------------

def build_report(recipe: Recipe, teacher: Stage, variants: list[Stage], exports: dict[str, dict] | None = None,
                 baselines: list[dict] | None = None, benchmark: dict | None = None) -> dict:
    exports, baselines = exports or {}, baselines or []
    latency = latency_by_model(benchmark)
    teacher_acc = teacher.metrics["accuracy"]

    def scored(entry: dict, predictions: np.ndarray) -> dict:
        entry["retention"] = entry["accuracy"] / teacher_acc if teacher_acc else None
        entry["agreement"] = agreement(np.asarray(predictions), teacher.predictions)
        entry["latency"] = latency.get(entry["name"], [])
        return entry

    models = [scored(variant_entry(stage, exports.get(stage.name)), deployed_predictions(stage, exports))
              for stage in variants]
    models += [scored(baseline_entry(b), np.asarray(b["predictions"])) for b in baselines]
    report = {
        "recipe": recipe.model_dump(mode="json"),
        "environment": environment(),
        "teacher": {"path": str(teacher.path), "accuracy": teacher_acc,
                    "macro_f1": teacher.metrics["macro_f1"], "eval_samples": teacher.metrics["samples"],
                    "params": teacher.params, "size_bytes": weights_size(teacher.path),
                    **onnx_entry(exports, "teacher")},
        "models": models,
    }
    if benchmark is not None:
        report["benchmark"] = {"profiles": benchmark["profiles"], "skipped": benchmark["skipped"],
                               "rankings": benchmark.get("rankings", [])}
        report["pareto"] = pareto_fronts(models)
        report["warnings"] = runtime_warnings(report)
    return report


def variant_entry(stage: Stage, export: dict | None) -> dict:
    """A variant as deployed: its ONNX export when there is one, else its HF dir.

    `path`, `kind`, `precision`, `accuracy` and `size_bytes` describe the deployed artifact;
    `model_dir`, `torch_accuracy` and `torch_size_bytes` the PyTorch model it came from.
    """
    torch_size = weights_size(stage.path)
    entry = {"name": stage.name, "baseline": False, "model_dir": str(stage.path),
             "params": stage.params, "passes": stage.history,
             "torch_accuracy": stage.metrics["accuracy"], "torch_size_bytes": torch_size}
    if export is None:
        entry.update(path=str(stage.path), kind="torch", precision="fp32",
                     accuracy=stage.metrics["accuracy"], macro_f1=stage.metrics["macro_f1"],
                     size_bytes=torch_size)
    else:
        entry.update(path=export["path"], kind="torch" if export.get("format") == "torch" else "onnx",
                     precision=export["precision"],
                     accuracy=export["accuracy"], macro_f1=export["macro_f1"],
                     size_bytes=export["size_bytes"],
                     onnx={k: v for k, v in export.items() if k != "predictions"})
    return entry


def deployed_predictions(stage: Stage, exports: dict[str, dict]) -> np.ndarray:
    export = exports.get(stage.name)
    return np.asarray(export["predictions"]) if export is not None else stage.predictions


def baseline_entry(b: dict) -> dict:
    return {"name": b["name"], "baseline": True, "path": b["path"], "kind": b["kind"],
            "precision": b["precision"], "accuracy": b["metrics"]["accuracy"],
            "macro_f1": b["metrics"]["macro_f1"], "params": b["params"], "size_bytes": b["size_bytes"],
            "passes": [], **({"optimum": b["optimum"]} if "optimum" in b else {})}


def latency_by_model(benchmark: dict | None) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in (benchmark or {}).get("measurements", []):
        out.setdefault(row["model"], []).append({k: v for k, v in row.items() if k != "model"})
    return out


def onnx_entry(exports: dict[str, dict], name: str) -> dict:
    """{"onnx": export record} for a model that was exported; nothing when export is off."""
    if name not in exports:
        return {}
    return {"onnx": {k: v for k, v in exports[name].items() if k != "predictions"}}


def weights_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


# -- cache keys --------------------------------------------------------------------------

def key_fields(config) -> dict:
    """A config as it enters a cache key: the fields that differ from their defaults.

    Config schemas only ever gain fields, with defaults that keep the old behaviour; leaving
    defaults out keeps such an addition from invalidating every cached stage (a 20-minute
    teacher fine-tuning among them). A default that depends on other fields (a fine-tuning
    strategy's learning rate: `derived_defaults()`) is left out likewise when the config
    holds it, so `lr: 1e-4` written out and the full strategy's default give one key.
    """
    fields = config.model_dump(mode="json", exclude_defaults=True)
    derived = config.derived_defaults() if hasattr(config, "derived_defaults") else {}
    return {k: v for k, v in fields.items() if k not in derived or v != derived[k]}


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
            digest.update(file_digest(file).encode())
    return digest.hexdigest()[:20]


def fingerprint_file(path: Path) -> str:
    return fingerprint(path) if path.is_dir() else file_digest(path)


def file_digest(file: Path) -> str:
    digest = hashlib.sha256()
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


def resolve_step_paths(step: Step, base_dir: Path) -> Step:
    """A pass's data paths (another task's files, a domain corpus) resolved like the teacher's."""
    config, update = step.config, {}
    if getattr(config, "intermediate_task", None) is not None:
        update["intermediate_task"] = resolve_task_paths(config.intermediate_task, base_dir)
    if getattr(config, "tasks", None):
        update["tasks"] = tuple(resolve_task_paths(t, base_dir) for t in config.tasks)
    if getattr(config, "domain_corpus", None) is not None:
        update["domain_corpus"] = resolve_path(config.domain_corpus, base_dir)
    changed = {k: v for k, v in update.items() if v != getattr(config, k)}
    return Step(name=step.name, config=config.model_copy(update=changed)) if changed else step


def resolve_task_paths(spec: str | dict, base_dir: Path) -> str | dict:
    if isinstance(spec, str):
        return spec
    return {k: resolve_path(v, base_dir) if k in ("path", "validation", "test") and isinstance(v, str) else v
            for k, v in spec.items()}
