"""report.json's cost fields from real saved models: flops, sparsity, compressed size; and
its keys against the README's documentation of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from compressor.bench.timing import HARNESS_VERSION
from compressor.bundle import ModelBundle
from compressor.modeling.cost import compressed_size, multiply_adds
from compressor.passes import Context, apply_pass, get_pass
from compressor.pipeline.recipe import parse_recipe
from compressor.pipeline.report_data import build_report
from compressor.pipeline.stages import Stage
from pretrain.batching import encode
from pretrain.data import Split, TaskData


def stage(name: str, path, bundle: ModelBundle, test_size: int) -> Stage:
    metrics = {"accuracy": 0.5, "macro_f1": 0.4, "samples": test_size}
    return Stage(name, path, name, metrics, np.zeros(test_size, dtype=int), bundle.params, list(bundle.history))


def latency(model: str, p50: float) -> dict:
    return {"model": model, "profile": "cpu", "batch_size": 8, "sequence_length": "real", "p50_ms": p50,
            "p90_ms": p50, "p99_ms": p50, "throughput": 8e3 / p50}


@pytest.fixture
def report(bert_bundle, tiny_bert_dir, tiny_csv, tiny_task, tmp_path):
    sparse = apply_pass(bert_bundle, "prune-magnitude",
                        get_pass("prune-magnitude").config_type.model_validate({"sparsity": 0.9, "epochs": 0}),
                        Context(task=tiny_task, show_progress=False))
    n = len(tiny_task.split("test"))
    recipe, _ = parse_recipe({"name": "r", "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
                              "variants": {"sparse": [{"prune-magnitude": {"sparsity": 0.9, "epochs": 0}}]}})
    baseline = {"name": "onnxruntime-fp32", "path": "b", "kind": "onnx", "precision": "fp32", "params": 1,
                "metrics": {"accuracy": 0.5, "macro_f1": 0.4}, "size_bytes": 10, "predictions": [0] * n}
    benchmark = {"harness_version": HARNESS_VERSION, "profiles": [{"name": "cpu", "precisions": ["fp32", "int8"]}],
                 "skipped": [],
                 "measurements": [latency("sparse", 9.5), latency("onnxruntime-fp32", 10.0)]}
    return build_report(recipe, stage("teacher", tiny_bert_dir, bert_bundle, n),
                        [stage("sparse", sparse.save(tmp_path / "sparse"), sparse, n)],
                        baselines=[baseline], benchmark=benchmark, task=tiny_task)


def test_every_entry_has_its_flops_at_the_mean_test_length(report, bert_bundle, tiny_task):
    length = report["flops_sequence_length"]
    lengths = encode(bert_bundle.tokenizer, tiny_task.split("test")).lengths()
    assert length == round(float(np.mean(lengths)))
    teacher_flops = multiply_adds(bert_bundle.model, length)
    assert report["teacher"]["flops"] == teacher_flops
    sparse, baseline = report["models"]
    assert baseline["flops"] == teacher_flops and "sparsity" not in baseline
    assert sparse["flops"] == teacher_flops       # the zeros are multiplied all the same


def test_a_sparse_model_reports_its_sparsity_compressed_size_and_a_warning(report, tmp_path):
    sparse = report["models"][0]
    assert sparse["sparsity"] == pytest.approx(0.9, abs=1e-3)
    files = sorted((tmp_path / "sparse").glob("*.safetensors"))
    assert sparse["compressed_size_bytes"] == compressed_size(files) < sparse["size_bytes"]
    (warning,) = [w for w in report["warnings"] if w.startswith("sparse ")]
    assert "dense runtimes do not run it faster" in warning and "1.05x as fast" in warning


def test_every_optimum_build_is_scored_and_each_profile_judged_by_its_own(bert_bundle, tiny_bert_dir, tiny_csv,
                                                                         tiny_task):
    """Two profiles timed against two presets' builds: each build gets its retention and
    agreement, and each profile's front uses its own build's accuracy."""
    n = len(tiny_task.split("test"))
    recipe, _ = parse_recipe({"name": "r", "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
                              "variants": {"as-is": []}})

    def build(accuracy, predictions):
        return {"path": "b", "accuracy": accuracy, "macro_f1": 0.1, "size_bytes": 10, "settings": {},
                "predictions": predictions}
    builds = {"avx2": build(0.5, [0] * n), "avx512_vnni": build(0.25, [1] * (n // 2) + [0] * (n - n // 2))}
    optimum = {"name": "optimum-default-int8", "path": "b", "kind": "onnx", "precision": "dynamic-int8", "params": 1,
               "metrics": {"accuracy": 0.5, "macro_f1": 0.1}, "size_bytes": 10, "predictions": [0] * n,
               "optimum": {"preset": "avx2", "profiles": {"a": "avx2", "b": "avx512_vnni"}, "builds": builds}}
    onnx = {"name": "onnxruntime-fp32", "path": "f", "kind": "onnx", "precision": "fp32", "params": 1,
            "metrics": {"accuracy": 0.4, "macro_f1": 0.1}, "size_bytes": 40, "predictions": [0] * n}
    rows = [{**latency(model, p50), "profile": profile} for profile in ("a", "b")
            for model, p50 in (("optimum-default-int8", 5.0), ("onnxruntime-fp32", 10.0))]
    benchmark = {"harness_version": HARNESS_VERSION, "profiles": [{"name": "a"}, {"name": "b"}], "skipped": [],
                 "measurements": rows}
    report = build_report(recipe, stage("teacher", tiny_bert_dir, bert_bundle, n), [],
                          baselines=[optimum, onnx], benchmark=benchmark, task=tiny_task)
    scored = report["models"][0]["optimum"]["builds"]
    assert {preset: (b["retention"], b["agreement"]) for preset, b in scored.items()} == {
        "avx2": (1.0, 1.0), "avx512_vnni": (0.5, (n - n // 2) / n)}      # the teacher predicts 0, at 0.5
    assert not any("predictions" in b for b in scored.values())
    assert {f["profile"]: f["models"] for f in report["pareto"]} == {
        "a": ["optimum-default-int8"], "b": ["optimum-default-int8", "onnxruntime-fp32"]}


def test_the_data_section_counts_no_shared_text_for_distinct_splits(report, tiny_task):
    n = {name: len(split) for name, split in tiny_task.splits.items()}
    none = {"in_train": 0, "other_label": 0}
    assert {k: v for k, v in report["data"].items() if k in ("task", "pair_task", "examples", "texts_in_train")} == \
        {"task": "tiny", "pair_task": False, "examples": n,
         "texts_in_train": {"test": {"examples": n["test"], **none}, "validation": {"examples": n["validation"], **none}}}
    assert not any("train split also holds" in w for w in report["warnings"])


def test_the_data_section_names_the_labels_the_scored_test_examples_hold_and_the_commonest_ones_scores(
        bert_bundle, tiny_bert_dir, tiny_csv, tiny_task):
    """report.json named no label: an imbalanced task whose models all predict the commonest
    label read as a good accuracy, with nothing to compare it with."""
    names = tiny_task.label_names
    test = Split([f"text {i}" for i in range(10)], [1] * 7 + [0] * 2 + [2])
    task = TaskData("tiny", names, {**tiny_task.splits, "test": test}, tiny_task.spec)
    recipe, _ = parse_recipe({"name": "r", "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
                              "data": {"max_eval_samples": 9}, "variants": {"as-is": []}})
    report = build_report(recipe, stage("teacher", tiny_bert_dir, bert_bundle, 9), [], task=task)
    data = report["data"]
    assert data["labels"] == list(names)
    assert data["test_labels"] == {names[0]: 2, names[1]: 7, names[2]: 0, names[3]: 0}   # the 9 scored
    # always names[1]: 7 of 9 right; its F1 2*7/(2*7+2) = 0.875, names[0]'s 0: macro-F1 over the two present
    assert data["most_frequent"] == {"label": names[1], "accuracy": pytest.approx(7 / 9),
                                     "macro_f1": pytest.approx(0.875 / 2)}
    assert report["warnings"][-1].startswith(f"teacher: accuracy no higher than always predicting the commonest test "
                                             f"label {names[1]!r} (0.7778, macro-F1 0.4375)")


def test_scored_test_texts_that_train_holds_are_counted_and_warned_about_first(bert_bundle, tiny_bert_dir,
                                                                              tiny_csv, tiny_task):
    """A run scored test rows its teacher trained on, and report.json said nothing of them."""
    train, test = tiny_task.split("train"), tiny_task.split("test")
    # The first two scored test rows become train's first two texts, the second under another label.
    texts = train.texts[:2] + test.texts[2:]
    labels = [train.labels[0], (train.labels[1] + 1) % len(tiny_task.label_names)] + test.labels[2:]
    task = TaskData("tiny", tiny_task.label_names, {**tiny_task.splits, "test": Split(texts, labels)}, tiny_task.spec)
    recipe, _ = parse_recipe({"name": "r", "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
                              "data": {"max_eval_samples": 20}, "variants": {"as-is": []}})
    report = build_report(recipe, stage("teacher", tiny_bert_dir, bert_bundle, 20), [], task=task)
    assert report["data"]["texts_in_train"]["test"] == {"examples": 20, "in_train": 2, "other_label": 1}
    assert report["warnings"][0].startswith("2 of the 20 test examples scored have a text that the train split "
                                            "also holds, 1 of them under another label there: ")


README = Path(__file__).resolve().parents[3] / "README.md"
# Parts of report.json documented in other README sections, or holding other tools' settings:
# their keys are not walked.
ELSEWHERE = {"recipe",                                   # the recipe ("Recipe format")
             "teacher.onnx", "models[].onnx",            # the export record ("ONNX export")
             "models[].passes[].config",                 # each pass's own config
             "benchmark.profiles[]",                     # the profiles ("Hardware profiles")
             "benchmark.environment",                    # environment's fields, compared on their own
             "models[].optimum.settings", "models[].optimum.builds.*.settings"}   # Optimum's settings
# Objects whose keys are names (packages, labels, profiles, presets) rather than fields.
KEYED_BY_NAME = {"environment.packages", "data.test_labels", "models[].optimum.profiles", "models[].optimum.builds"}


def report_section() -> str:
    return README.read_text().split("## Output of `compressor run`")[1].split("\n## ")[0]


def documented_report() -> dict:
    """The README's report.json example as JSON, its `{...}` and `[...]` placeholders empty."""
    example = re.search(r"```json\n(.*?)```", report_section(), re.S)[1]
    return json.loads(example.replace("{...}", "{}").replace("[...]", "[]"))


def key_paths(value, path: str = "") -> tuple[set[str], set[str]]:
    """Every key of a report as a path (`models[].latency[].p50_ms`; `.*` for a name), and the
    paths of the objects whose keys were read (the root is "")."""
    keys: set[str] = set()
    objects: set[str] = set()
    if path in ELSEWHERE:
        return keys, objects
    items = []
    if isinstance(value, dict):
        objects.add(path)
        for key, item in value.items():
            if key != "...":            # the README's "and more"
                child = f"{path}.*" if path in KEYED_BY_NAME else f"{path}.{key}".lstrip(".")
                keys.add(child)
                items.append((child, item))
    elif isinstance(value, list):
        items = [(f"{path}[]", item) for item in value]
    for child, item in items:
        more_keys, more_objects = key_paths(item, child)
        keys |= more_keys
        objects |= more_objects
    return keys, objects


def undocumented_keys(report: dict) -> list[str]:
    """Keys of `report` that the README's example lacks and its prose never names (as `key`)."""
    documented, section = key_paths(documented_report())[0], report_section()
    return sorted(path for path in key_paths(report)[0] - documented
                  if f"`{path.rsplit('.', 1)[-1]}`" not in section)


def unwritten_keys(report: dict, conditional: set[str] = frozenset()) -> list[str]:
    """Keys of the README's example that `report` lacks where it has the object holding them
    (`conditional`: written only with a part of the recipe `report`'s run had not)."""
    written, objects = key_paths(report)
    return sorted(path for path in key_paths(documented_report())[0] - written - conditional
                  if path.rpartition(".")[0] in objects)


def test_every_key_of_a_report_is_documented(report):
    """The README is how users and other tools learn report.json; its sparse fields here."""
    assert {"models[].sparsity", "models[].compressed_size_bytes"} <= key_paths(report)[0]
    assert undocumented_keys(report) == []


def test_the_readme_comparison_finds_an_undocumented_and_an_unwritten_key(report):
    report = json.loads(json.dumps(report))
    report["models"][0]["latency"] = [{"p50_ms": 1.0, "made_up_ms": 2.0}]
    report["teacher"]["made_up_count"] = 3
    del report["teacher"]["macro_f1"]
    assert undocumented_keys(report) == ["models[].latency[].made_up_ms", "teacher.made_up_count"]
    assert "teacher.macro_f1" in unwritten_keys(report)
