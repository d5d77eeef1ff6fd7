"""report.json from the finished stages: one entry per model, scored against the teacher.

The Pareto fronts and warnings come from compressor/report/analysis.py; report.md and
report.html are rendered from the finished JSON (compressor/report/render.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from compressor.bench.environment import environment
from compressor.bundle import WEIGHT_FILES, ModelBundle, weights_size
from compressor.export.onnx import ONNX_FILE
from compressor.modeling.cost import SPARSE_THRESHOLD, compressed_size, encoder_sparsity, multiply_adds
from compressor.pipeline.recipe import Recipe
from compressor.pipeline.stages import Stage
from compressor.report.analysis import data_warnings, pareto_fronts, recipe_warnings, runtime_warnings
from pretrain.batching import encode
from pretrain.data import TaskData
from pretrain.data.overlap import texts_in_train
from pretrain.metrics import agreement, classification_metrics


def build_report(recipe: Recipe, teacher: Stage, variants: list[Stage], exports: dict[str, dict] | None = None,
                 baselines: list[dict] | None = None, benchmark: dict | None = None,
                 task: TaskData | None = None) -> dict:
    """`task`: the run's task, whose test texts give the length FLOPs are counted at when
    the benchmark times real batches (without it, the longest length the teacher takes)."""
    exports, baselines = exports or {}, baselines or []
    latency = latency_by_model(benchmark)
    teacher_acc = teacher.metrics["accuracy"]
    teacher_bundle = ModelBundle.load(teacher.path)
    length = flops_sequence_length(benchmark, teacher_bundle, task, recipe.data.max_eval_samples)
    teacher_cost = model_cost(teacher_bundle, length)

    def scores(accuracy: float, predictions) -> dict:
        return {"retention": accuracy / teacher_acc if teacher_acc else None,
                "agreement": agreement(np.asarray(predictions), teacher.predictions)}

    def scored(entry: dict, predictions: np.ndarray) -> dict:
        entry.update(scores(entry["accuracy"], predictions))
        entry["latency"] = latency.get(entry["name"], [])
        return entry

    def costed(stage: Stage) -> dict:
        cost = model_cost(ModelBundle.load(stage.path), length)
        return with_cost(variant_entry(stage, exports.get(stage.name)), cost)

    models = [scored(costed(stage), deployed_predictions(stage, exports)) for stage in variants]
    # Baselines are built from the teacher: its compute, in another runtime.
    models += [scored({**baseline_entry(b, scores), "flops": teacher_cost["flops"]}, np.asarray(b["predictions"]))
               for b in baselines]
    report = {
        "recipe": recipe.model_dump(mode="json"),
        "environment": environment(),
        "teacher": {"path": str(teacher.path), "accuracy": teacher_acc,
                    "macro_f1": teacher.metrics["macro_f1"], "eval_samples": teacher.metrics["samples"],
                    "params": teacher.params, "flops": teacher_cost["flops"],
                    "size_bytes": weights_size(teacher.path), **onnx_entry(exports, "teacher")},
        "flops_sequence_length": length,
        **({"data": data_entry(task, recipe.data.max_eval_samples)} if task is not None else {}),
        "models": models,
    }
    if benchmark is not None:
        # Latencies may come from a cached stage: `environment` above is when the report was written,
        # this one where and when the latencies were measured.
        report["benchmark"] = {"harness_version": benchmark["harness_version"],
                               "environment": benchmark.get("environment"), "profiles": benchmark["profiles"],
                               "skipped": benchmark["skipped"], "rankings": benchmark.get("rankings", []),
                               **({"time_limited": benchmark["time_limited"]} if "time_limited" in benchmark else {})}
        if not benchmark["profiles"]:     # every profile skipped: the baselines were not built
            built = {b["name"] for b in baselines}
            report["benchmark"]["baselines_not_built"] = [n for n in recipe.benchmark.baselines if n not in built]
        report["pareto"] = pareto_fronts(models, report["benchmark"]["rankings"])
    report["warnings"] = data_warnings(report) + recipe_warnings(models) + \
        (runtime_warnings(report) if benchmark is not None else [])
    return report


def data_entry(task: TaskData, max_eval_samples: int | None) -> dict:
    """The task's split sizes, its labels and how the scored test examples fall among them,
    and how many held-out examples have a text (text pair) that the train split also holds
    (pretrain/data/overlap.py): test's as scored (its first `max_eval_samples`), validation's whole."""
    overlap = {"test": texts_in_train(task, "test", max_eval_samples).as_dict()}
    if "validation" in task.splits:
        overlap["validation"] = texts_in_train(task, "validation").as_dict()
    scored = np.asarray(task.split("test").head(max_eval_samples).labels)
    return {"task": task.name, "pair_task": task.is_pair_task,
            "examples": {name: len(split) for name, split in task.splits.items()}, "texts_in_train": overlap,
            "labels": list(task.label_names),
            "test_labels": {name: int(np.sum(scored == i)) for i, name in enumerate(task.label_names)},
            "most_frequent": most_frequent_scores(scored, task.label_names)}


def most_frequent_scores(labels: np.ndarray, label_names: tuple[str, ...]) -> dict:
    """What always predicting the commonest scored label scores: the floor a model's accuracy
    must clear on imbalanced labels (a model that learnt nothing but the prior sits on it)."""
    commonest = int(np.argmax(np.bincount(labels, minlength=len(label_names))))
    scores = classification_metrics(labels, np.full_like(labels, commonest))
    return {"label": label_names[commonest], "accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"]}


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


def baseline_entry(b: dict, scores: Callable[[float, list], dict]) -> dict:
    return {"name": b["name"], "baseline": True, "path": b["path"], "kind": b["kind"],
            "precision": b["precision"], "accuracy": b["metrics"]["accuracy"],
            "macro_f1": b["metrics"]["macro_f1"], "params": b["params"], "size_bytes": b["size_bytes"],
            "passes": [], **({"optimum": scored_builds(b["optimum"], scores)} if "optimum" in b else {})}


def scored_builds(optimum: dict, scores: Callable[[float, list], dict]) -> dict:
    """The Optimum record with every preset's build scored against the teacher (retention,
    agreement), as the entry is: a profile timed against another preset's build than the
    entry's is judged by that build (compressor/report/analysis.py: as_timed_on)."""
    builds = {preset: {**{k: v for k, v in build.items() if k != "predictions"},
                       **scores(build["accuracy"], build["predictions"])}
              for preset, build in optimum["builds"].items()}
    return {**optimum, "builds": builds}


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



def flops_sequence_length(benchmark: dict | None, teacher: ModelBundle, task: TaskData | None,
                          max_eval_samples: int | None) -> int:
    """The length `flops` are counted at: the benchmark's first fixed sequence length; for
    real test batches, the test examples' mean token count (rounded)."""
    for row in (benchmark or {}).get("measurements", []):
        if isinstance(row["sequence_length"], int):
            return row["sequence_length"]
    max_length = teacher.usable_length
    if task is None:
        return max_length
    lengths = encode(teacher.tokenizer, task.split("test").head(max_eval_samples), max_length).lengths()
    return max(1, round(float(np.mean(lengths))))


def model_cost(bundle: ModelBundle, sequence_length: int) -> dict:
    """`flops` (multiply-adds per example) of a model, and its `sparsity` when its encoder
    Linears hold more than SPARSE_THRESHOLD zeros (unstructured pruning)."""
    cost: dict = {"flops": multiply_adds(bundle.model, sequence_length, bundle.deploy.get("embedding_rank"))}
    sparsity = encoder_sparsity(bundle.model)
    if sparsity is not None and sparsity > SPARSE_THRESHOLD:
        cost["sparsity"] = round(sparsity, 4)
    return cost


def with_cost(entry: dict, cost: dict) -> dict:
    """The entry with its cost; a sparse model's deployed file also compressed, its only saving."""
    entry["flops"] = cost["flops"]
    if "sparsity" in cost:
        entry["sparsity"] = cost["sparsity"]
        entry["compressed_size_bytes"] = compressed_size(deployed_files(Path(entry["path"])))
    return entry


def deployed_files(path: Path) -> list[Path]:
    """The weight files of a deployed model: its ONNX graph, else its torch weights."""
    if (path / ONNX_FILE).is_file():
        return [path / ONNX_FILE]
    return sorted(f for pattern in WEIGHT_FILES for f in path.glob(pattern))
