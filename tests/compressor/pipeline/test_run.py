"""run_recipe end to end on the tiny BERT and the tiny CSV task: stages, report, caching."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from compressor.bundle import ModelBundle
from compressor.evaluate import evaluate_path
from compressor.passes import registry
from compressor.passes.registry import PassConfig
from compressor.pipeline import cache, outdir, paths, run_recipe, stages
from compressor.pipeline import run as pipeline_run
from compressor.pipeline.recipe import parse_recipe
from pretrain.errors import UserError

VARIANTS = {"same": [], "two-layers": [{"drop-layers": {"keep": [0, 1]}}, {"finetune": {"epochs": 1}}]}


def raw_recipe(model_dir, csv_path, variants=VARIANTS) -> dict:
    return {"name": "tiny", "seed": 0,
            "teacher": {"model": str(model_dir), "task": {"path": str(csv_path)},
                        "finetune": {"epochs": 1, "batch_size": 16, "lr": 1e-3}},
            "data": {"max_train_samples": 200},
            "variants": copy.deepcopy(variants)}


def run(raw: dict, out_dir):
    recipe, steps = parse_recipe(raw)
    return run_recipe(recipe, steps, out_dir, show_progress=False)


@pytest.fixture(scope="module", autouse=True)
def keep_one_thread():
    """run_recipe sets torch to every core; on a shared machine one thread is faster for tiny models."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline_run, "set_threads", lambda threads: None)
        yield


@pytest.fixture(scope="module")
def done(tiny_bert_dir, tiny_csv, tmp_path_factory):
    """One finished run: (raw recipe, out dir, returned report)."""
    out = tmp_path_factory.mktemp("pipeline") / "run"
    raw = raw_recipe(tiny_bert_dir, tiny_csv)
    return raw, out, run(raw, out)


@pytest.fixture
def rerun_dir(done, tmp_path):
    """A copy of the finished run's out dir, for tests that run again into it."""
    copy_dir = tmp_path / "run"
    shutil.copytree(done[1], copy_dir)
    return copy_dir


def stamps(out_dir) -> dict[str, int]:
    """mtime of every stage's stage.json and weights: a rebuilt stage rewrites both."""
    return {str(p.relative_to(out_dir)): p.stat().st_mtime_ns
            for p in sorted(out_dir.glob("*/*")) if p.name in ("stage.json", "model.safetensors")}


def forbid_building(monkeypatch, *, teacher: bool = True, passes: bool = True):
    def fail(*args, **kwargs):
        raise AssertionError("a cached stage was rebuilt")
    if teacher:
        monkeypatch.setattr(stages, "load_classifier", fail)
        monkeypatch.setattr(stages, "finetune", fail)
    if passes:
        monkeypatch.setattr(stages, "apply_pass", fail)


def test_writes_teacher_variants_and_report(done):
    _, out, report = done
    assert sorted(p.name for p in out.iterdir()) == [".lock", "report.html", "report.json", "report.md",
                                                     "run.json", "same", "teacher", "two-layers"]
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report))
    for name in ("teacher", "same", "two-layers"):
        stage_dir = out / name
        assert (stage_dir / "stage.json").is_file() and (stage_dir / "compressor.json").is_file()
        model = AutoModelForSequenceClassification.from_pretrained(str(stage_dir))   # plain HF dirs
        AutoTokenizer.from_pretrained(str(stage_dir))
        assert model.config.id2label == {0: "adj.all", 1: "noun.animal", 2: "noun.person", 3: "noun.plant"}
    layers = {name: AutoModelForSequenceClassification.from_pretrained(str(out / name)).config.num_hidden_layers
              for name in ("teacher", "same", "two-layers")}
    assert layers == {"teacher": 4, "same": 4, "two-layers": 2}


def test_report_schema_and_values(done, tiny_task):
    raw, out, report = done
    assert report["recipe"]["name"] == "tiny" and report["recipe"]["variants"] == raw["variants"]
    env = report["environment"]
    assert env["packages"]["torch"] and env["packages"]["transformers"]
    assert env["cpu"]["cores"] >= 1 and "flags" in env["cpu"]

    teacher = report["teacher"]
    assert 0 < teacher["accuracy"] <= 1
    assert teacher["eval_samples"] == len(tiny_task.split("test"))
    assert teacher["params"] > 0
    assert teacher["size_bytes"] == (out / "teacher" / "model.safetensors").stat().st_size

    models = {m["name"]: m for m in report["models"]}
    assert list(models) == ["same", "two-layers"]
    for name, m in models.items():
        assert {"name", "accuracy", "retention", "params", "size_bytes", "path", "agreement", "macro_f1",
                "passes"} <= set(m)
        assert m["path"] == str(out / name)
        assert 0 <= m["accuracy"] <= 1
        assert m["retention"] == pytest.approx(m["accuracy"] / teacher["accuracy"])
        assert m["size_bytes"] == (out / name / "model.safetensors").stat().st_size

    same, small = models["same"], models["two-layers"]
    assert same["accuracy"] == teacher["accuracy"] and same["agreement"] == 1.0
    assert same["retention"] == 1.0 and same["params"] == teacher["params"] and same["passes"] == []
    assert small["params"] < teacher["params"] and small["size_bytes"] < teacher["size_bytes"]
    assert [p["pass"] for p in small["passes"]] == ["drop-layers", "finetune"]
    assert small["passes"][0]["config"]["keep"] == [0, 1] and small["passes"][0]["config"]["count"] is None
    assert small["passes"][1]["config"]["epochs"] == 1
    # analytic cost at the test examples' mean length; dense models have no sparsity fields
    assert teacher["flops"] > 0 and report["flops_sequence_length"] >= 1
    assert same["flops"] == teacher["flops"] and small["flops"] < 0.6 * teacher["flops"]
    assert not any("sparsity" in m or "compressed_size_bytes" in m for m in models.values())


def test_stage_metrics_match_an_independent_evaluation(done, tiny_csv):
    _, out, report = done
    result = evaluate_path(str(out / "two-layers"), None)     # the task recorded in the dir
    assert result["task"] == "tiny" and result["samples"] == report["teacher"]["eval_samples"]
    assert result["accuracy"] == pytest.approx(report["models"][1]["accuracy"])
    assert evaluate_path(str(out / "teacher"), {"path": str(tiny_csv)})["accuracy"] == \
        pytest.approx(report["teacher"]["accuracy"])


def test_rerun_reuses_every_stage(done, rerun_dir, monkeypatch):
    raw, _, report = done
    before = stamps(rerun_dir)
    assert len(before) == 6
    forbid_building(monkeypatch)
    again = run(raw, rerun_dir)
    assert stamps(rerun_dir) == before
    strip = lambda r: {k: v for k, v in r.items() if k not in ("environment",)}  # noqa: E731
    assert json.dumps(strip(again)).replace(str(rerun_dir), "OUT") == \
        json.dumps(strip(report)).replace(str(done[1]), "OUT")


def test_another_test_sample_limit_re_evaluates_without_training_again(done, rerun_dir, monkeypatch):
    """The limit changes what is measured, not the weights: the teacher's fine-tune and every
    variant are reused and only scored again (what changes is in the report)."""
    raw, _, report = done
    weights = {k: v for k, v in stamps(rerun_dir).items() if k.endswith("model.safetensors")}
    forbid_building(monkeypatch)
    fewer = run({**raw, "data": {**raw["data"], "max_eval_samples": 10}}, rerun_dir)
    assert {k: v for k, v in stamps(rerun_dir).items() if k.endswith("model.safetensors")} == weights
    assert fewer["teacher"]["eval_samples"] == 10
    assert report["teacher"]["eval_samples"] > 10
    again = run(raw, rerun_dir)                      # and back: the full test split once more
    assert again["teacher"]["accuracy"] == report["teacher"]["accuracy"]


def test_a_rerun_that_rescores_then_stops_leaves_no_report_of_the_old_scores(done, rerun_dir, monkeypatch):
    raw = done[0]
    assert (rerun_dir / "report.json").is_file()

    def stop(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(pipeline_run, "build_report", stop)
    with pytest.raises(KeyboardInterrupt):
        run({**raw, "data": {**raw["data"], "max_eval_samples": 10}}, rerun_dir)
    assert not [f for f in stages.REPORT_FILES if (rerun_dir / f).exists()]


def test_a_rerun_stopped_while_its_report_replaces_the_old_one_leaves_no_report_json_of_another_set(
        done, rerun_dir, monkeypatch):
    """The report files were renamed over the earlier ones one by one, report.json last: a stop
    after the first rename left the new report.md beside the report.json of the run before, a
    set that looked complete. Now no report.json is left until the next run writes the set."""
    raw = done[0]
    forbid_building(monkeypatch)
    real_replace, renamed = os.replace, []

    def stop_after_the_first_report_file(src, dst):
        if Path(dst).name in stages.REPORT_FILES:
            if renamed:
                raise KeyboardInterrupt
            renamed.append(Path(dst).name)
        real_replace(src, dst)
    monkeypatch.setattr(os, "replace", stop_after_the_first_report_file)
    with pytest.raises(KeyboardInterrupt):
        run(raw, rerun_dir)
    assert renamed and not (rerun_dir / "report.json").exists()
    assert not [p.name for p in rerun_dir.iterdir() if ".tmp-" in p.name]
    monkeypatch.setattr(os, "replace", real_replace)
    report = run(raw, rerun_dir)                               # the next run writes the whole set
    assert sorted(f for f in stages.REPORT_FILES if (rerun_dir / f).exists()) == ["report.html", "report.json",
                                                                                 "report.md"]
    assert json.loads((rerun_dir / "report.json").read_text()) == json.loads(json.dumps(report, default=str))


def test_changing_one_variant_rebuilds_only_it(done, rerun_dir, monkeypatch):
    raw, _, _ = done
    changed = copy.deepcopy(raw)
    changed["variants"]["two-layers"][1]["finetune"]["epochs"] = 2
    before = stamps(rerun_dir)
    forbid_building(monkeypatch, passes=False)              # the teacher must be reused
    report = run(changed, rerun_dir)
    after = stamps(rerun_dir)
    for stage in ("teacher", "same"):
        assert {k: v for k, v in after.items() if k.startswith(stage + "/")} == \
            {k: v for k, v in before.items() if k.startswith(stage + "/")}
    assert after["two-layers/stage.json"] != before["two-layers/stage.json"]
    assert report["models"][1]["passes"][1]["config"]["epochs"] == 2
    record = json.loads((rerun_dir / "two-layers" / "stage.json").read_text())
    assert record["history"][1]["config"]["epochs"] == 2


def test_a_rebuilt_stage_retires_its_export_and_the_report_before_it_trains(tiny_bert_dir, tiny_csv, tmp_path,
                                                                             monkeypatch):
    """Stopped after an edited variant was rebuilt but before its export: the old export (of
    the replaced model) and the old report are gone, not left looking current."""
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"same": [], "ft": [{"finetune": {"epochs": 1}}]})
    raw["export"] = {"onnx": True, "optimize": False}
    out = tmp_path / "run"
    run(raw, out)
    assert {"ft-onnx", "same-onnx", "report.json", "report.md"} <= {p.name for p in out.iterdir()}
    raw["variants"]["ft"][0]["finetune"]["epochs"] = 2

    def stop(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(pipeline_run, "export_stage", stop)
    with pytest.raises(KeyboardInterrupt):
        run(raw, out)
    names = {p.name for p in out.iterdir()}
    assert "ft" in names and "ft-onnx" not in names and not names & set(stages.REPORT_FILES)
    assert {"teacher-onnx", "same-onnx"} <= names               # of stages that did not change


def test_an_interrupted_run_resumes_after_finished_stages(done, rerun_dir, monkeypatch):
    raw, _, report = done
    shutil.rmtree(rerun_dir / "two-layers")
    (rerun_dir / "report.json").unlink()
    before = stamps(rerun_dir)
    forbid_building(monkeypatch, passes=False)
    again = run(raw, rerun_dir)
    assert {k: v for k, v in stamps(rerun_dir).items() if not k.startswith("two-layers/")} == before
    assert (rerun_dir / "two-layers" / "model.safetensors").is_file()
    assert again["models"][1]["accuracy"] == report["models"][1]["accuracy"]   # seeded: same result


# Which heads a count removes is known only once they are scored: a second count is checked late.
TOO_MANY_HEADS = [{"prune-heads": {"count": 10, "importance": "magnitude"}},     # 16 heads, then 6
                  {"prune-heads": {"count": 5, "importance": "magnitude"}}]


def test_late_user_error_in_a_fresh_out_dir_keeps_the_finished_stages_for_the_rerun(tiny_bert_dir, tiny_csv,
                                                                                     tmp_path, monkeypatch):
    out = tmp_path / "fresh"
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"same": [], "too-many": TOO_MANY_HEADS})
    with pytest.raises(UserError, match=r"variants.too-many\[1\]: prune-heads: removing 5 of 6 heads would "
                                        r"empty a layer.*finished before it are kept in"):
        run(raw, out)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["run.json", "same", "teacher"]
    fixed = raw_recipe(tiny_bert_dir, tiny_csv, {"same": [], "too-many": TOO_MANY_HEADS[:1]})
    forbid_building(monkeypatch, passes=False)                  # the teacher is not trained again
    run(fixed, out)
    assert (out / "report.json").is_file()


def test_a_step_refused_while_it_runs_names_the_recipe_file_as_one_refused_before_does(tiny_bert_dir, tiny_csv,
                                                                                         tmp_path):
    """The README promises every error about the recipe starts with its file: a step's refusal
    found only when it ran started at `variants.`, without it."""
    recipe, steps = parse_recipe(raw_recipe(tiny_bert_dir, tiny_csv, {"too-many": TOO_MANY_HEADS}))
    with pytest.raises(UserError, match=r"^r\.yaml: variants\.too-many\[1\]: prune-heads: removing 5 of 6 heads"):
        run_recipe(recipe, steps, tmp_path / "out", show_progress=False, source="r.yaml")


def test_late_user_error_before_any_stage_finished_leaves_no_dir(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    out = tmp_path / "fresh"
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"same": []})
    monkeypatch.setattr(stages, "finetune", lambda *a, **k: (_ for _ in ()).throw(UserError("found late")))
    with pytest.raises(UserError, match="^found late$"):
        run(raw, out)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("variant, message", [
    ([{"drop-layers": {"keep": [0, 7]}}], r"variants.v\[0\]: drop-layers: layer index 7 out of range; the model has 4"),
    ([{"drop-layers": {"keep": [0, 1]}}, {"drop-layers": {"keep": [2]}}], r"v\[1\]: drop-layers: layer index 2"),
    ([{"student": {"layers": [0, 9]}}], "student: layer index 9 out of range; the teacher has 4"),
    ([{"student": {"layers": [0, 2]}}, {"distill": {"losses": ["soft", "hidden"], "layer_map": [0, 4]}}],
     "layer_map names teacher layer 4, past the teacher's 4 layers"),
    ([{"student": {"layers": [0, 2]}}, {"distill": {"losses": ["soft", "hidden"], "layer_map": [1]}}],
     "layer_map has 1 entries for a student of 2 layers"),
    ([{"theseus": {"successor_layers": 3}}], "successor_layers 3 does not split the model's 4 layers"),
    ([{"drop-layers": {"count": 2, "samples": 8}}, {"prune-heads": {"per_layer": [1, 1, 1]}}],
     "per_layer has 3 entries but the model has 2"),
    # heads per layer, followed through the steps before (4 layers of 4 heads)
    ([{"prune-heads": {"per_layer": [1, 1, 1, 4]}}], "per_layer asks layer 3 to lose 4 heads but it has 4"),
    ([{"drop-layers": {"keep": [0, 1]}}, {"prune-heads": {"count": 9}}], "count 9 is more heads than the model has \\(8\\)"),
    ([{"prune-heads": {"per_layer": [1, 1, 1, 1], "samples": 8}}, {"prune-heads": {"per_layer": [3, 0, 0, 0]}}],
     "per_layer asks layer 0 to lose 3 heads but it has 3"),
    ([{"share-layers": {"groups": 4}}], "groups=4 shares nothing in a model of 4 layers"),
    ([{"student": {"layers": [0, 1]}}, {"share-layers": {"groups": 1, "init": 2}}], "init=2 is no position"),
    # per_layer counts within a group of shared attention, followed through the steps between
    ([{"share-layers": {"groups": 2}}, {"finetune": {"epochs": 1}},
      {"prune-heads": {"per_layer": [1, 2, 0, 0], "samples": 8}}],
     r"v\[2\]: prune-heads: per_layer asks layers \[0, 1\] to lose \[1, 2\] heads, but they share their attention"),
    ([{"share-layers": {"groups": 1, "mode": "attention"}}, {"drop-layers": {"keep": [3, 0, 2]}},
      {"prune-heads": {"per_layer": [1, 1, 0], "samples": 8}}], r"layers \[0, 1, 2\] to lose \[1, 1, 0\] heads"),
    ([{"prune-heads": {"fraction": 0.5, "samples": 8}}, {"finetune": {"epochs": 1}}, {"share-layers": {"groups": 2}}],
     r"v\[2\]: share-layers: layers 0 to 1 may keep different head counts"),
    ([{"prune-ffn": {"fraction": 0.5, "samples": 8}}, {"finetune": {"epochs": 1}}, {"share-layers": {"mode": "ffn"}}],
     r"v\[2\]: share-layers: layers 0 to 3 may have different FFN widths"),
    # widths and families
    ([{"student": {"shape": {"layers": 2, "hidden": 30}}}], "hidden width 30 is not a multiple of the 4 heads"),
    ([{"student": {"shape": {"layers": 2, "hidden": 64}}}, {"distill": {"losses": ["hidden"], "projection": False}}],
     "width 64 \\(student\\) and 32 \\(teacher\\), and projection is off"),
    ([{"distill-structure": {"kind": "cnn", "embedding_dim": 16}}, {"drop-layers": {"keep": [0]}}],
     "model family 'textcnn'"),
    ([{"student": {"shape": {"layers": 2, "heads": 2}}}, {"distill": {"losses": ["attention"]}}],
     "student layer 1 has 2 heads and teacher layer 3 has 4"),
])
def test_layer_indices_and_counts_that_cannot_fit_stop_the_run_before_the_teacher_trains(
        variant, message, tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    """Each step's depth follows from the teacher's through the steps before it, so a bad index
    in the last variant is refused before the teacher's fine-tuning, not after it."""
    forbid_building(monkeypatch)
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"same": [], "v": variant})
    with pytest.raises(UserError, match=message):
        run(raw, tmp_path / "fresh")
    assert list(tmp_path.iterdir()) == []


def test_late_user_error_in_an_existing_out_dir_keeps_finished_stages(done, rerun_dir, monkeypatch):
    raw, _, _ = done
    bad = copy.deepcopy(raw)
    bad["variants"]["too-many"] = TOO_MANY_HEADS
    before = stamps(rerun_dir)
    forbid_building(monkeypatch, passes=False)
    with pytest.raises(UserError, match="would empty a layer"):
        run(bad, rerun_dir)
    assert stamps(rerun_dir) == before
    assert not (rerun_dir / "too-many").exists()
    assert not [p for p in rerun_dir.iterdir() if p.name.startswith(".") and p.name != outdir.LOCK_FILE]   # no temporaries


@pytest.mark.parametrize("bare", [False, True])          # `task: local.csv` as --task takes it, or {path: ...}
def test_a_relative_task_path_resolves_against_the_recipe_dir(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch,
                                                              bare):
    recipe_dir = tmp_path / "recipes"
    recipe_dir.mkdir()
    shutil.copy(tiny_csv, recipe_dir / "local.csv")
    monkeypatch.chdir(tmp_path)                            # not the recipe's dir
    raw = raw_recipe(tiny_bert_dir, "local.csv", {"same": []})
    raw["teacher"].pop("finetune")
    if bare:
        raw["teacher"]["task"] = "local.csv"
    recipe, steps = parse_recipe(raw)
    report = run_recipe(recipe, steps, tmp_path / "out", base_dir=recipe_dir, show_progress=False)
    assert report["models"][0]["agreement"] == 1.0
    assert report["teacher"]["eval_samples"] == 30


def test_pass_data_paths_resolve_against_the_recipe_dir_too(tiny_csv, tmp_path, monkeypatch):
    recipe_dir = tmp_path / "recipes"
    recipe_dir.mkdir()
    shutil.copy(tiny_csv, recipe_dir / "other.csv")
    (recipe_dir / "domain.txt").write_text("some text\n")
    monkeypatch.chdir(tmp_path)
    raw = raw_recipe("minilm", "wordnet-supersense", {"v": [{"finetune": {
        "intermediate_task": {"path": "other.csv"}, "tasks": [{"path": "other.csv"}, "wordnet-wsd"],
        "domain_corpus": "domain.txt"}}]})
    _, steps = parse_recipe(raw)
    config = paths.resolve_step_paths(steps["v"][0], recipe_dir).config
    assert config.intermediate_task == {"path": str(recipe_dir / "other.csv")}
    assert config.tasks == ({"path": str(recipe_dir / "other.csv")}, "wordnet-wsd")   # names stay names
    assert config.domain_corpus == str(recipe_dir / "domain.txt")
    untouched = parse_recipe(raw_recipe("minilm", "wordnet-supersense", {"v": [{"finetune": {}}]}))[1]["v"][0]
    assert paths.resolve_step_paths(untouched, recipe_dir) is untouched


def count_finetunes(count_calls) -> list[int]:
    from compressor.passes import training
    return count_calls(training, "finetune")


def test_only_models_exported_more_than_once_keep_their_fp32_graph(tiny_bert_dir, tiny_csv, tmp_path, count_calls):
    """The teacher and its int8 variant are one model: its graph is kept for the second export
    (one trace for two exports); the fine-tuned variant's is traced and not kept."""
    from compressor.export import graph_cache
    from compressor.export import onnx as export_onnx
    kept = count_calls(graph_cache.Fp32Graphs, "keep")
    traces = count_calls(export_onnx, "write_onnx")
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"int8": [{"quantize": {"mode": "dynamic-int8"}}],
                                               "tuned": [{"finetune": {"epochs": 1}}]})
    raw["export"] = {"onnx": True}
    run(raw, tmp_path / "out")
    assert (len(kept), len(traces)) == (1, 2)     # without the store 3 traces; unbounded, 2 graphs kept


@pytest.mark.parametrize("order", [("short", "long"), ("long", "short")])
def test_variants_share_a_common_trained_prefix(tiny_bert_dir, tiny_csv, tmp_path, count_calls, order):
    prefix = [{"drop-layers": {"keep": [0, 1]}}, {"finetune": {"epochs": 1}}]
    variants = {"short": prefix, "long": prefix + [{"quantize": {"mode": "dynamic-int8"}}]}
    calls = count_finetunes(count_calls)
    report = run(raw_recipe(tiny_bert_dir, tiny_csv, {name: variants[name] for name in order}), tmp_path / "out")
    assert len(calls) == 1                                   # the prefix trained once
    by_name = {m["name"]: m for m in report["models"]}
    assert by_name["short"]["accuracy"] == by_name["long"]["accuracy"]   # same weights (int8 is at export)
    assert [p["pass"] for p in by_name["long"]["passes"]] == ["drop-layers", "finetune", "quantize"]
    assert (tmp_path / "out" / "prefixes").is_dir() == (order[0] == "long")


def test_kill_9_at_any_point_then_rerun_gives_the_same_results(done, tiny_bert_dir, tiny_csv, tmp_path):
    """A run killed with SIGKILL leaves only finished stages visible; rerunning completes it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw_recipe(tiny_bert_dir, tiny_csv)))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "compressor", "run", str(recipe), "--out", str(out), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (out / "teacher" / "stage.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)        # mid-run: the teacher is done, the variants are not
    proc.wait()
    for path in out.iterdir():               # every visible stage dir is complete
        if path.is_dir() and not path.name.startswith("."):
            assert (path / "stage.json").is_file() and (path / "model.safetensors").is_file()
    assert subprocess.run(command, env=env, capture_output=True).returncode == 0
    assert not [p for p in out.iterdir() if p.name.startswith(".") and p.name != outdir.LOCK_FILE]   # stale temporaries cleared
    report = json.loads((out / "report.json").read_text())
    assert [(m["name"], m["accuracy"]) for m in report["models"]] == \
        [(m["name"], m["accuracy"]) for m in done[2]["models"]]
    assert report["teacher"]["accuracy"] == done[2]["teacher"]["accuracy"]


def test_a_full_disk_mid_run_is_one_clear_error_and_finished_stages_stay(done, rerun_dir, monkeypatch):
    """ENOSPC while writing a stage: a WriteError naming the problem; what was finished stays usable."""
    import errno

    from pretrain import atomic
    raw, _, report = done
    shutil.rmtree(rerun_dir / "two-layers")
    before = stamps(rerun_dir)
    real = atomic.atomic_dir

    def full_disk(target):
        if target.name == "two-layers":
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        return real(target)
    monkeypatch.setattr(cache, "atomic_dir", full_disk)
    with pytest.raises(outdir.WriteError, match=r"No space left on device .*two-layers.*rerun the same command"):
        run(raw, rerun_dir)
    assert stamps(rerun_dir) == before and not (rerun_dir / "two-layers").exists()
    monkeypatch.setattr(cache, "atomic_dir", real)
    forbid_building(monkeypatch, passes=False)             # the teacher is reused, not rebuilt
    assert run(raw, rerun_dir)["models"][1]["accuracy"] == report["models"][1]["accuracy"]


def test_a_finished_run_clears_checkpoints_of_settings_it_no_longer_has(done, rerun_dir):
    stale = rerun_dir / ".work" / "0123abcd"             # a teacher fine-tune stopped, then the recipe edited
    stale.mkdir(parents=True)
    (stale / "checkpoint.pt").write_bytes(b"x" * 1000)
    run(done[0], rerun_dir)
    assert not (rerun_dir / ".work").exists()


def test_force_replaces_another_recipes_results_but_never_a_users_files(done, rerun_dir, tmp_path):
    other = copy.deepcopy(done[0])
    other["name"] = "other"
    recipe, steps = parse_recipe(other)
    (rerun_dir / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"neither `compressor run` nor `compressor search` wrote \(notes.txt\).*not even by `run --force`"):
        run_recipe(recipe, steps, rerun_dir, show_progress=False, force=True)
    assert (rerun_dir / "notes.txt").read_text() == "mine" and (rerun_dir / "teacher" / "stage.json").is_file()
    (rerun_dir / "notes.txt").unlink()
    report = run_recipe(recipe, steps, rerun_dir, show_progress=False, force=True)   # a run's results only
    assert report["recipe"]["name"] == "other" and json.loads((rerun_dir / "run.json").read_text())["recipe"] == "other"
    # A user's dir is refused without touching it, temporaries-like names included.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".draft.tmp-1").write_text("editor")
    (home / "thesis.tex").write_text("years")
    with pytest.raises(UserError, match=r"\(.draft.tmp-1, thesis.tex\)|\(thesis.tex\)"):
        run_recipe(recipe, steps, home, show_progress=False, force=True)
    assert sorted(p.name for p in home.iterdir()) == [".draft.tmp-1", "thesis.tex"]


def test_a_second_run_into_a_dir_in_use_is_refused_and_touches_nothing(done, rerun_dir):
    raw = done[0]
    working = rerun_dir / ".two-layers.tmp-1234"          # the other run's stage, half written
    working.mkdir()
    before = stamps(rerun_dir)
    with outdir.exclusive_use(rerun_dir):                   # the other run holds the dir
        with pytest.raises(UserError, match=r"in use by another run \(pid \d+ on .+\); wait for it"):
            run(raw, rerun_dir)
        assert working.is_dir() and stamps(rerun_dir) == before
    assert run(raw, rerun_dir)["teacher"]["accuracy"] == done[2]["teacher"]["accuracy"]   # free again: it runs
    assert not working.exists()                             # its claim clears what a dead run left


def test_an_interrupted_teacher_finetune_resumes_from_its_checkpoint(done, tmp_path, monkeypatch):
    """The teacher's fine-tune (the longest stage of most recipes) checkpoints into the run's
    work dir; a rerun continues from there, to the weights of an uninterrupted run."""
    raw, finished, report = done
    real, calls = stages.finetune, []

    class Stop(Exception):
        pass

    def stop_at_step_3(log):
        if log.step == 3:
            raise Stop

    def finetune_interrupted_once(*args, checkpoint, callbacks=(), **kwargs):
        checkpoint = checkpoint.model_copy(update={"every_steps": 2})   # the tiny run has a few steps
        steps: list[int] = []
        calls.append((checkpoint.directory, steps))
        stop = (stop_at_step_3,) if len(calls) == 1 else ()
        return real(*args, checkpoint=checkpoint, callbacks=(*callbacks, lambda log: steps.append(log.step), *stop),
                    **kwargs)
    monkeypatch.setattr(stages, "finetune", finetune_interrupted_once)
    out = tmp_path / "out"
    with pytest.raises(Stop):
        run(raw, out)
    assert not (out / "teacher").exists() and (calls[0][0] / "checkpoint.pt").is_file()
    rerun = run(raw, out)
    assert [c[0] for c in calls] == [calls[0][0]] * 2 and calls[0][0].parent == out / ".work"
    first, second = calls[0][1], calls[1][1]
    assert first == [1, 2, 3] and second[0] == 3 and len(second) > 1   # continued after step 2's checkpoint
    assert not (out / ".work").exists()                      # gone once the teacher was written
    assert rerun["teacher"]["accuracy"] == report["teacher"]["accuracy"]
    expected = ModelBundle.load(finished / "teacher").model.state_dict()
    resumed = ModelBundle.load(out / "teacher").model.state_dict()
    for name, value in resumed.items():    # the uninterrupted run's weights, to float rounding (2 threads)
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-5, msg=name)


# --- what the pipeline gives passes: the teacher (lazily) and a work dir per step ---

class ProbeConfig(PassConfig):
    use_teacher: bool = False


class Interrupted(Exception):
    pass


@pytest.fixture
def probe():
    """A pass `probe` (this test only) that records its context; the first call per work dir
    leaves a marker there and stops, as a kill in the middle of training would."""
    seen: list[dict] = []

    def run_probe(bundle, cfg, ctx):
        marker = ctx.work_dir / "marker"
        seen.append({"work_dir": ctx.work_dir, "resumed": marker.exists(),
                     "teacher_loaded": ctx.teacher_source.loaded})
        if not marker.exists():
            ctx.work_dir.mkdir(parents=True)
            marker.write_text("half done")
            raise Interrupted
        if cfg.use_teacher:
            seen[-1]["teacher"] = ctx.teacher
        return bundle.replace(model=bundle.copy_model())
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry._REGISTRY, "probe", registry.PassSpec("probe", ProbeConfig, run_probe, False, True))
        yield seen
    assert "probe" not in registry.pass_names()


def test_each_step_gets_a_work_dir_that_a_rerun_finds_and_that_goes_once_written(tiny_bert_dir, tiny_csv,
                                                                                  tmp_path, probe):
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"v": [{"probe": {}}, {"probe": {"use_teacher": True}}]})
    del raw["teacher"]["finetune"]
    out = tmp_path / "out"
    for _ in range(2):                       # each step is interrupted once, then resumes
        with pytest.raises(Interrupted):
            run(raw, out)
        assert (probe[-1]["work_dir"] / "marker").is_file()
    report = run(raw, out)
    # run 1: step 1 stops; run 2: step 1 resumes (and is kept as a prefix), step 2 stops;
    # run 3: starts from the kept prefix, step 2 resumes
    first, second = probe[0]["work_dir"], probe[2]["work_dir"]
    assert [p["work_dir"] for p in probe] == [first, first, second, second]
    assert first != second and first.parent == second.parent == out / ".work"
    assert [p["resumed"] for p in probe] == [False, True, False, True]
    assert not (out / ".work").exists()                      # removed once the stage was written
    assert [m["name"] for m in report["models"]] == ["v"]
    assert not any(p["teacher_loaded"] for p in probe)       # nothing loaded it before it was asked for
    teacher = probe[-1]["teacher"]
    assert not teacher.model.training and not any(p.requires_grad for p in teacher.model.parameters())
    expected = ModelBundle.load(out / "teacher").model.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in teacher.model.state_dict().items())


def test_a_distill_teacher_of_another_task_and_a_calibration_set_too_large_stop_before_training(
        tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    other = tmp_path / "other-task"
    shutil.copytree(tiny_bert_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["id2label"] = {str(i): f"other-{i}" for i in range(len(config["id2label"]))}
    config["label2id"] = {v: int(k) for k, v in config["id2label"].items()}
    (other / "config.json").write_text(json.dumps(config))
    forbid_building(monkeypatch)
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"same": [], "v": [{"distill": {"losses": ["soft"], "teacher": str(other)}}]})
    with pytest.raises(UserError, match=r"variants.v\[0\]: distill: the teacher's labels \(other-0"):
        run(raw, tmp_path / "a")
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"same": [], "v": [{"quantize": {"mode": "static-int8",
                                                                              "calibration_samples": 5000}}]})
    raw["export"] = {"onnx": True}
    with pytest.raises(UserError, match=r"variants.v\[0\]: calibration set too small"):
        run(raw, tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-task"]


@pytest.mark.parametrize("labels, why", [
    (lambda names: ["x0", "x1"], "2 labels \\('x0', 'x1'\\)"),
    (lambda names: list(reversed(names)), "the same labels in another order"),
])
def test_a_teacher_used_as_saved_must_have_the_tasks_head(labels, why, bert_bundle, tiny_csv, tmp_path, monkeypatch):
    """Without `finetune`, the teacher is the model as saved: a head for other labels would be
    replaced by a fresh, untrained one (reported as the teacher's accuracy), so it is refused."""
    forbid_building(monkeypatch)
    names = labels(list(bert_bundle.label_names))
    model = bert_bundle.copy_model()
    model.config.id2label = dict(enumerate(names))
    model.config.label2id = {n: i for i, n in enumerate(names)}
    model.config.num_labels = len(names)
    other = tmp_path / "other-head"
    model.save_pretrained(str(other))
    bert_bundle.tokenizer.save_pretrained(str(other))
    raw = raw_recipe(other, tiny_csv, {"as-is": []})
    del raw["teacher"]["finetune"]
    with pytest.raises(UserError, match=f"used as saved \\(no finetune\\) but its head has {why}; expected a model"):
        run(raw, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()
    raw["teacher"]["finetune"] = {"epochs": 1}          # a head to train: accepted
    from compressor.pipeline.plan import plan_recipe
    assert plan_recipe(*parse_recipe(raw), tmp_path / "fresh")["stages"]


def test_a_steps_extra_task_file_is_checked_before_the_teacher_trains(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    forbid_building(monkeypatch)
    bad = tmp_path / "sentiment.csv"
    bad.write_text("text,sentiment\nfine,pos\n")
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"v": [{"finetune": {"tasks": [{"path": str(bad)}]}}]})
    with pytest.raises(UserError, match=r"variants\.v\[0\]: .*sentiment\.csv: line 1 \(the header\): no column 'label'"):
        run(raw, tmp_path / "fresh")
    missing = {"intermediate_task": {"path": str(tmp_path / "no.csv")}}
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"v": [{"finetune": missing}]})
    with pytest.raises(UserError, match=r"variants\.v\[0\]: .*no\.csv: data file not found"):
        run(raw, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_a_dir_a_step_names_must_exist_before_anything_runs(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    forbid_building(monkeypatch)
    missing = str(tmp_path / "no-embeddings")
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"v": [{"distill-structure": {"kind": "cnn", "embeddings": missing}}]})
    with pytest.raises(UserError, match=rf"variants\.v\[0\]: distill-structure: {missing} not found"):
        run(raw, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_the_data_files_a_step_or_the_teacher_reads_are_in_their_keys(tiny_bert_dir, tiny_csv, tiny_task, tmp_path):
    """An edited corpus or extra-task file is a new key (the result depends on its content),
    as a dir a step names is; the same content keeps the key."""
    corpus, extra = tmp_path / "domain.txt", tmp_path / "extra.csv"
    corpus.write_text("first text\n")
    shutil.copy(tiny_csv, extra)
    settings = {"domain_corpus": str(corpus), "domain_steps": 1, "tasks": [{"path": str(extra)}]}
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"v": [{"finetune": dict(settings)}]})
    raw["teacher"]["finetune"]["domain_corpus"] = str(corpus)

    def keys():
        recipe, steps = parse_recipe(raw)
        return stages.teacher_key(recipe, tiny_bert_dir, tiny_task), stages.step_key(steps["v"][0])
    before = keys()
    assert keys() == before
    corpus.write_text("other text\n")
    after_corpus = keys()
    assert after_corpus[0] != before[0] and after_corpus[1] != before[1]
    extra.write_text(extra.read_text().replace("noun.", "noun.x", 1))
    assert keys()[1] != after_corpus[1] and keys()[0] == after_corpus[0]    # the teacher reads no extra task
    plain = parse_recipe(raw_recipe(tiny_bert_dir, tiny_csv, {"v": [{"finetune": {}}]}))[1]["v"][0]
    assert stages.step_key(plain) == ["finetune", {}]                         # no data files: the old key
    moved = tmp_path / "moved"                                                # the same files elsewhere
    moved.mkdir()
    shutil.copy(corpus, moved / "domain.txt")
    shutil.copy(extra, moved / "extra.csv")
    before_move = keys()
    settings.update(domain_corpus=str(moved / "domain.txt"), tasks=[{"path": str(moved / "extra.csv")}])
    raw["variants"] = {"v": [{"finetune": dict(settings)}]}
    raw["teacher"]["finetune"]["domain_corpus"] = str(moved / "domain.txt")
    assert keys() == before_move


def test_rescoring_a_stage_is_no_new_model_for_a_recipe_that_uses_it(done, tmp_path):
    """A recipe's teacher may be another run's stage: its stage.json changes with every
    re-scoring, its weights do not."""
    stage = tmp_path / "teacher"
    shutil.copytree(done[1] / "teacher", stage)
    before = cache.fingerprint(stage)
    record = json.loads((stage / "stage.json").read_text())
    (stage / "stage.json").write_text(json.dumps({**record, "eval_limit": 7}))
    assert cache.fingerprint(stage) == before


def test_a_dir_fingerprint_covers_word_vectors_and_int8_weights(tmp_path):
    for name in ("embeddings.npy", "model.int8.pt", "spiece.model", "modeling_textcnn.py"):
        (tmp_path / name).write_bytes(b"one")
        before = cache.fingerprint(tmp_path)
        (tmp_path / name).write_bytes(b"two")
        assert cache.fingerprint(tmp_path) != before, name


def test_the_built_in_corpus_is_no_file_and_the_teachers_inputs_are_checked(tiny_bert_dir, tiny_csv, tmp_path,
                                                                           monkeypatch):
    forbid_building(monkeypatch)
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"v": [{"finetune": {"domain_corpus": "wordnet", "domain_steps": 1}}]})
    recipe, steps = parse_recipe(raw)
    pipeline_run.prepare(recipe, steps, tmp_path / "fresh", tmp_path)           # accepted: a built-in name
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"same": []})
    raw["teacher"]["finetune"]["domain_corpus"] = "no-such-corpus.txt"
    with pytest.raises(UserError, match=r"^teacher\.finetune: no-such-corpus\.txt not found; expected an existing"):
        run(raw, tmp_path / "fresh")
    raw["teacher"]["finetune"].pop("domain_corpus")
    raw["teacher"]["finetune"]["tasks"] = [{"path": str(tmp_path / "no.csv")}]
    with pytest.raises(UserError, match=r"^teacher\.finetune: .*no\.csv"):
        run(raw, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_the_teachers_data_paths_resolve_against_the_recipe_dir(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch):
    recipe_dir = tmp_path / "recipes"
    recipe_dir.mkdir()
    (recipe_dir / "domain.txt").write_text("some text\n")
    monkeypatch.chdir(tmp_path)                            # not the recipe's dir
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"same": []})
    raw["teacher"]["finetune"]["domain_corpus"] = "domain.txt"
    recipe, steps = parse_recipe(raw)
    prepared = pipeline_run.prepare(recipe, steps, tmp_path / "fresh", recipe_dir)
    assert prepared.recipe.teacher.finetune.domain_corpus == str(recipe_dir / "domain.txt")


@pytest.mark.parametrize("step, why", [
    ({"factorize-embedding": {"rank": 40}}, r"factorize-embedding: rank 40 saves nothing for a \d+ x 32 embedding"),
    ({"distill": {"losses": ["soft"], "unlabeled_samples": 100}},
     r"unlabeled_samples 100 asks for more train texts than the 40 after the 200 labelled ones"),
    ({"distill-structure": {"kind": "cnn", "unlabeled_samples": 100, "max_train_samples": 150}},
     r"unlabeled_samples 100 asks for more train texts than the 90 after the 150 labelled ones"),
])
def test_a_rank_or_transfer_set_that_cannot_fit_stops_before_the_teacher_trains(step, why, tiny_bert_dir, tiny_csv,
                                                                                tmp_path, monkeypatch):
    forbid_building(monkeypatch)
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"v": [step]})      # data.max_train_samples: 200 of 240 train rows
    with pytest.raises(UserError, match=rf"^variants\.v\[0\]: {why}"):
        run(raw, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_a_teacher_used_as_is_keeps_the_seed_its_splits_were_drawn_with(bert_bundle, tiny_csv, tmp_path):
    """A teacher fine-tuned elsewhere (`compressor finetune --seed 0`) records the seed of the
    splits it trained on: a recipe with another seed that uses it as is draws them with the
    teacher's, or rows it trained on would be scored as test rows; --plan says so."""
    from compressor.pipeline.plan import plan_recipe
    from pretrain.data import load_task
    teacher = bert_bundle.replace(task={"path": str(tiny_csv)}, task_seed=0).save(tmp_path / "teacher")
    raw = raw_recipe(teacher, tiny_csv, {"as-is": []})
    del raw["teacher"]["finetune"]
    raw["seed"] = 1
    raw["teacher"]["task"] = {"path": str(tiny_csv), "text": "text", "label": "label"}   # the defaults, named
    recipe, steps = parse_recipe(raw)
    prepared = pipeline_run.prepare(recipe, steps, tmp_path / "out", tmp_path)
    drawn = load_task({"path": str(tiny_csv)}, seed=0)
    assert prepared.split_seed == 0
    assert prepared.task.split("test").texts == drawn.split("test").texts
    assert set(prepared.task.split("test").texts) != set(load_task({"path": str(tiny_csv)}, seed=1).split("test").texts)
    notes = plan_recipe(recipe, steps, tmp_path / "out", base_dir=tmp_path)["notes"]
    assert any("drawn with seed 0, not the recipe's seed 1" in note for note in notes)
    run(raw, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "teacher" / "compressor.json").read_text())["task_seed"] == 0
    raw["teacher"]["finetune"] = {"epochs": 1}          # trained by the recipe: on the recipe's splits
    prepared = pipeline_run.prepare(*parse_recipe(raw), tmp_path / "other", tmp_path)
    assert (prepared.split_seed, prepared.notes) == (1, ())


def test_augment_on_a_pair_task_or_from_a_classifier_stops_before_the_teacher_trains(tiny_bert_dir, tiny_csv,
                                                                                  tmp_path, monkeypatch):
    from compressor.pipeline.plan import plan_recipe
    forbid_building(monkeypatch)
    augment = {"copies": 1, "mlm": str(tiny_bert_dir)}                  # a classifier: no masked-LM head
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"v": [{"distill": {"losses": ["soft"], "augment": augment}}]})
    for check in (lambda: plan_recipe(*parse_recipe(raw), tmp_path / "fresh"), lambda: run(raw, tmp_path / "fresh")):
        with pytest.raises(UserError, match=r"^variants\.v\[0\]: augment\.mlm .* has no trained masked-LM head"):
            check()
    pairs = tmp_path / "pairs.csv"
    rows = tiny_csv.read_text().splitlines()
    pairs.write_text("\n".join([rows[0] + ",text_pair"] + [row + ",a second text" for row in rows[1:]]) + "\n")
    raw = raw_recipe(tiny_bert_dir, pairs, {"v": [{"distill-structure": {"kind": "cnn", "augment": augment}}]})
    with pytest.raises(UserError, match=r"^variants\.v\[0\]: augment noises single texts"):
        run(raw, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_an_export_the_gate_refuses_names_the_variant_and_the_recipe_key(tiny_bert_dir, tiny_csv, tiny_task, tmp_path,
                                                                         monkeypatch):
    from compressor.export.gate import GateFailure
    from compressor.export.onnx import ExportSettings

    def refused(*args, **kwargs):
        raise GateFailure("static-int8 model fails the accuracy gate: a drop of 1.56 points where accuracy_tolerance "
                          "allows 1.00; not written", "accuracy_tolerance")
    monkeypatch.setattr(stages, "export_into", refused)
    recipe, _ = parse_recipe(raw_recipe(tiny_bert_dir, tiny_csv))
    stage = stages.Stage("static-int8", tiny_bert_dir, "k", {}, None, 0, [])
    with pytest.raises(GateFailure, match=r"^export of static-int8: static-int8 model fails the accuracy gate: .*; "
                                          r"expected a larger export\.accuracy_tolerance \(now 0\.02\)"):
        stages.export_stage(stage, ExportSettings(accuracy_tolerance=0.02), recipe, tiny_task, tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("change, message", [
    (lambda raw: raw["variants"].update(v=[{"drop-layers": {"keep": [0, 7]}}]),
     "variants.v[0]: drop-layers: layer index 7 out of range; the model has 4 layers (0..3)"),
    (lambda raw: raw["teacher"]["task"].update(splt=[0.8, 0.1, 0.1]),
     "teacher.task: unknown data spec key(s) splt; allowed keys: path, text, label, text_pair, validation, test, "
     "split; did you mean 'split'?"),
    (lambda raw: raw["teacher"]["task"].update(split=[0.8, 0.1, 0.2]),
     "teacher.task: split fractions [0.8, 0.1, 0.2] sum to 1.1; they must sum to 1"),
])
def test_an_error_of_the_checks_against_inputs_names_the_recipe_file_and_where(
        change, message, tiny_bert_dir, tiny_csv, tmp_path, monkeypatch, capsys):
    # As a validation error does (`r.yaml: variants.v[0].drop-layers.keep: ...`).
    import yaml

    from compressor.cli import main
    forbid_building(monkeypatch)
    raw = raw_recipe(tiny_bert_dir, tiny_csv, {"same": []})
    change(raw)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    assert main(["run", str(recipe), "--out", str(tmp_path / "out"), "--plan"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {recipe}: {message}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]


@pytest.mark.parametrize("plan", [False, True])
@pytest.mark.parametrize("out, message", [
    ("a-file", "--out {out} is a file; expected a directory for the run's results"),
    ("users", "{out} holds files that neither `compressor run` nor `compressor search` wrote (notes.txt)"),
    ("other-run", "{out} holds results of recipe 'other'; refusing to mix them with recipe 'tiny'"),
    ("teacher", "--out {out} is the input {out}: the output would replace the input"),
])
def test_an_out_dir_the_run_refuses_is_named_after_the_recipe_file(out, message, plan, tiny_bert_dir, tiny_csv,
                                                                     tmp_path, monkeypatch, capsys):
    # As the recipe's own errors are (`r.yaml: ...`): one line, the recipe file first, exit 2.
    import yaml

    from compressor.cli import main
    forbid_building(monkeypatch)
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_bert_dir, teacher)
    raw = raw_recipe(teacher, tiny_csv, {"same": []})
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    (tmp_path / "a-file").write_text("mine")
    (tmp_path / "users").mkdir()
    (tmp_path / "users" / "notes.txt").write_text("mine")
    (tmp_path / "other-run" / "same").mkdir(parents=True)
    (tmp_path / "other-run" / "same" / "stage.json").write_text("{}")
    (tmp_path / "other-run" / "run.json").write_text(json.dumps({"recipe": "other"}))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    argv = ["run", str(recipe), "--out", str(tmp_path / out), *(["--plan"] if plan else [])]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {recipe}: {message.format(out=tmp_path / out)}"), line
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("benchmark, profile", [(None, "cpu"), ({"profiles": ["cpu-avx512-vnni", "cpu"]},
                                                                "cpu-avx512-vnni")])
def test_a_recipe_search_runs_on_the_benchmarks_first_profile_else_on_cpu(benchmark, profile, tmp_path, monkeypatch):
    # As README says: no benchmark section is the bundled cpu profile, not an error.
    from types import SimpleNamespace

    import compressor.search.run as search_run
    raw = {"name": "r", "teacher": {"task": "wordnet-supersense"}, "search": {"latency_budget_ms": 5},
           **({"benchmark": benchmark} if benchmark else {})}
    recipe, _ = parse_recipe(raw)
    asked = []
    monkeypatch.setattr(search_run, "run_search", lambda teacher, task, target, *args, **kwargs: asked.append(target)
                        or dict.fromkeys(("met", "outcome", "chosen", "best_effort", "recipe_file")))
    pipeline_run.recipe_search(recipe, SimpleNamespace(path=tmp_path), tmp_path, tmp_path / "out", False)
    assert asked == [profile]


def test_a_teacher_used_as_saved_must_have_been_fine_tuned_on_the_tasks_shape(shape_tuned, tiny_csv, tmp_path,
                                                                              monkeypatch):
    """A teacher fine-tuned on text pairs, used as saved on single texts of the same labels,
    was scored, distilled from and compressed on inputs of a shape it never saw."""
    forbid_building(monkeypatch)
    raw = raw_recipe(shape_tuned["pairs"], tiny_csv, {"as-is": []})
    del raw["teacher"]["finetune"]
    with pytest.raises(UserError, match=rf"^teacher.model: {shape_tuned['pairs']} was fine-tuned on text pairs "
                                        r"\(text, text_pair\); task 'tiny' gives single texts: expected a task with "
                                        "a text_pair column"):
        run(raw, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()
    raw["teacher"]["finetune"] = {"epochs": 1}          # fine-tuned here, on the task: accepted
    from compressor.pipeline.plan import plan_recipe
    assert plan_recipe(*parse_recipe(raw), tmp_path / "fresh")["stages"]
