"""The baselines and the benchmark stage of a run.

Baselines are built from the teacher stage (compressor/bench/baselines.py says what each
one is); the benchmark stage hands every deployable model to the measurement
(compressor/bench/measure.py) and caches its result as a whole.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compressor.bench.baselines import (BUILDERS, OPTIMUM, baseline_kind, describe_baseline, is_described,
                                        model_file, optimum_preset, preset_for_this_cpu, preset_settings)
from compressor.bench.environment import cpu_info, isa_limits_entry, package_versions, quota_entry
from compressor.bench.measure import run_benchmarks
from compressor.bench.profiles import unavailable_reason
from compressor.bench.runners import Deployable
from compressor.bench.timing import HARNESS_VERSION
from compressor.bundle import ModelBundle, weights_size
from compressor.export.onnx import ONNX_FILE
from compressor.pipeline.cache import STAGE_FILE, cached, content_key, fingerprint_file, key_fields, log
from compressor.pipeline.recipe import BASELINES_DIR, BENCHMARK_DIR, Recipe
from compressor.pipeline.outdir import disk_errors, read_json
from compressor.pipeline.stages import Stage, retire_reports, test_predictions
from pretrain.atomic import write_json
from pretrain.batching import model_positions
from pretrain.data import TaskData
from pretrain.errors import UserError
from pretrain.metrics import classification_metrics


def optimum_presets(settings) -> dict[str, str]:
    """The Optimum preset of every profile this machine measures, by profile name."""
    return {profile.name: optimum_preset(profile) for profile in settings.profile_objects()
            if unavailable_reason(profile) is None}


def baselines_to_build(settings) -> list[str]:
    """The benchmark's baselines, or none when every profile is skipped here (its hardware is
    absent): a baseline is built (exported, quantized) only to be measured beside the variants."""
    if any(unavailable_reason(profile) is None for profile in settings.profile_objects()):
        return list(settings.baselines)
    return []


def check_sequence_lengths(settings, teacher_path: Path) -> None:
    """A fixed benchmark length the teacher (and so every variant) cannot embed stops the
    run before it trains anything, not at the benchmark stage."""
    from transformers import AutoConfig
    positions = model_positions(AutoConfig.from_pretrained(teacher_path))
    for profile in settings.profile_objects():
        for length in profile.sequence_lengths:
            if length != "real" and int(length) > positions:
                raise UserError(f"benchmark profile {profile.name}: sequence length {length} is longer than the "
                                f"teacher's {positions} positions; expected at most {positions} (or 'real')")


def check_batches_fit(settings, test_rows: int, capped: bool) -> None:
    """A batch larger than the scored test rows could not be formed: say so before any
    stage trains, not at the benchmark after hours of them. A profile this machine cannot
    run is skipped at the benchmark, so its batches do not count."""
    for profile in settings.profile_objects():
        largest = max(profile.batch_sizes)
        if largest > test_rows and unavailable_reason(profile) is None:
            more = " (or a larger data.max_eval_samples)" if capped else ""
            raise UserError(f"benchmark profile {profile.name}: batch size {largest} is larger than the {test_rows} "
                            f"test examples scored; expected batch sizes of at most {test_rows}{more}")


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
    # Each build keeps its test predictions, for the report to score it against the teacher.
    optimum = {"preset": wanted[0], "settings": preset_settings(wanted[0]), "profiles": presets,
               "builds": {preset: {"path": b["path"], "accuracy": b["metrics"]["accuracy"],
                                   "macro_f1": b["metrics"]["macro_f1"], "size_bytes": b["size_bytes"],
                                   "settings": preset_settings(preset), "predictions": b["predictions"]}
                          for preset, b in builds.items()}}
    return {"name": name, "kind": kind, "precision": precision, "params": teacher.params, **primary,
            "optimum": optimum, "profile_files": {p: builds[preset]["file"] for p, preset in presets.items()}}


def built_baseline(name: str, preset: str | None, teacher: Stage, recipe: Recipe, task: TaskData,
                   out_dir: Path) -> dict:
    """One built baseline dir (per Optimum preset for the Optimum baseline), cached by key."""
    path = baseline_dir(out_dir, name, preset)
    key = baseline_key(name, preset, teacher.key, recipe)

    def write(tmp: Path) -> dict:
        BUILDERS[name](teacher.path, tmp, preset)
        describe_baseline(tmp, teacher.path, name, preset)
        predictions = test_predictions(tmp, task, recipe)
        labels = np.asarray(task.split("test").head(recipe.data.max_eval_samples).labels)
        return {"metrics": classification_metrics(labels, predictions), "predictions": predictions.tolist(),
                "size_bytes": model_file(name, tmp).stat().st_size}
    record = cached(path, key, write)
    if not is_described(path):
        # Cached before baselines described themselves: the description is added, not the
        # baseline rebuilt (its files, and so the benchmark's key, stay as they are).
        with disk_errors(path.parent):
            describe_baseline(path, teacher.path, name, preset)
    return {"path": str(path), "file": str(model_file(name, path)), **record}


def baseline_dir(out_dir: Path, name: str, preset: str | None) -> Path:
    return out_dir / BASELINES_DIR / (name if preset is None else f"{name}-{preset}")


def baseline_key(name: str, preset: str | None, teacher_key: str, recipe: Recipe) -> str:
    return content_key({"baseline": name, "input": teacher_key, "eval": recipe.data.max_eval_samples,
                        "optimum": preset_settings(preset) if preset else None})


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
                    out_dir: Path, rebenchmark: bool, deadline: float | None = None) -> dict:
    """Measure every deployable model on every profile in one run (cached as a whole); by
    `deadline` (time.monotonic()), with fewer timed calls where the profiles' would run past it
    (measure.run_benchmarks). A benchmark so cut is measured again by the next run, which may
    have the time for all of them."""
    settings = recipe.benchmark
    key = benchmark_key(models, recipe)
    path = out_dir / BENCHMARK_DIR
    test = task.split("test").head(recipe.data.max_eval_samples)
    teacher_bundle = ModelBundle.load(teacher.path)

    def write(tmp: Path) -> dict:
        # Progress goes where the stage lines go (stderr, hidden by --quiet), never to stdout.
        results = run_benchmarks(models, settings, teacher_bundle.tokenizer, test, log=log.info,
                                 max_length=teacher_bundle.usable_length,
                                 positions=model_positions(teacher_bundle.model), deadline=deadline)
        write_json(tmp / "benchmark.json", results)
        return results
    if read_json(path / STAGE_FILE).get("key") not in (None, key):
        # Other settings or models: the report holds measurements of what the recipe no longer
        # asks for. (--rebenchmark of the same ones keeps it until the new one is written.)
        retire_reports(out_dir)
    record = cached(path, key, write, force=rebenchmark or "time_limited" in read_json(path / STAGE_FILE))
    return {k: v for k, v in record.items() if k != "key"}


def benchmark_key(models: list[Deployable], recipe: Recipe) -> str:
    """What the measurements depend on: every model's deployed files (by content), the
    benchmark settings and profiles, the test-sample limit, the timing harness, and the
    machine and runtimes that time them (a run dir copied to another machine, or a runtime
    upgraded, measures again rather than report timings it did not take)."""
    return content_key({"models": [[m.name, m.kind, m.precision, fingerprint_file(m.path),
                                    [[p, fingerprint_file(f)] for p, f in m.on_profiles]] for m in models],
                        "benchmark": key_fields(recipe.benchmark), "eval": recipe.data.max_eval_samples,
                        "profiles": recipe.benchmark.resolved_profiles(), "harness": HARNESS_VERSION,
                        "measured_on": measuring_machine()})


def measuring_machine() -> dict:
    """The part of the environment that timings depend on (not the date or the thread count
    torch happens to have: profiles set the threads); a cgroup quota and instruction-set
    limits (ONEDNN_MAX_CPU_ISA, ...) where set, as both change what the same CPU runs."""
    return {"cpu": cpu_info(), "packages": package_versions(), **quota_entry(), **isa_limits_entry()}
