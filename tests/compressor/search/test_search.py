"""The whole search on a tiny teacher: proxies in an Optuna study, finals through the pipeline,
the report and recipe it leaves, resume, two workers on one storage, and bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from compressor.bench import measure
from compressor.cli.commands import main
from compressor.pipeline import run as pipeline_run
from compressor.pipeline.recipe import load_recipe
from compressor.search import SearchSettings, run_search
from compressor.search import structures as structures_module
from compressor.search import study as study_module
from compressor.search.run import measured_front, outcome
from pretrain import models as models_module

ROOT = Path(__file__).resolve().parents[3]
TINY = dict(time_budget_min=10, finalists=2, proxy_train_samples=32, validation_samples=30, train_samples=64,
            scoring_samples=16, latency_structures=2, latency_held_out=1, max_eval_samples=30,
            precisions=("fp32",), baselines=["onnxruntime-fp32"])

# A hand-written variant measured in the finals beside the finalists.
COMPARED = {"two-layers": [{"drop-layers": {"keep": [0, 2]}}, {"finetune": {"max_train_samples": 32}}]}


def no_memory_probe(model, profile, batch_sets, *args, **kwargs) -> list[float]:
    """Memory is probed in a child process per model; the search's tests are about the search."""
    return [100.0] * len(batch_sets)


@pytest.fixture(scope="module")
def quick_profile(tmp_path_factory) -> Path:
    """The cpu profile with few timed calls (this is about behaviour, not speed)."""
    raw = yaml.safe_load((ROOT / "profiles" / "cpu.yaml").read_text())
    path = tmp_path_factory.mktemp("profiles") / "quick-cpu.yaml"
    path.write_text(yaml.safe_dump({**raw, "name": "quick-cpu", "warmup": 1, "iterations": 10}))
    return path


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def searched(tiny_bert_dir, tiny_csv, quick_profile, cache_dir, tmp_path_factory):
    """One search (a loose budget: something must meet it) and its result."""
    patch = pytest.MonkeyPatch()
    patch.setenv("COMPRESSOR_CACHE", str(cache_dir))
    patch.setattr(structures_module, "BATCHES", 2)
    patch.setattr(structures_module, "CALLS_PER_BATCH", 2)
    patch.setattr(measure, "peak_rss_mb", no_memory_probe)
    # "every core" made more than the one thread asked for, so that a phase that drops --threads shows
    patch.setattr(models_module, "usable_cpus", lambda: 3)
    threads = ThreadsSeen()
    patch.setattr(pipeline_run, "variant_stage", threads.recorded(pipeline_run.variant_stage, "finals"))
    patch.setattr(study_module.ProxyRunner, "train_proxy", threads.recorded(study_module.ProxyRunner.train_proxy,
                                                                             "proxies"))
    out = tmp_path_factory.mktemp("search") / "run"
    settings = SearchSettings(latency_budget_ms=1000, min_retention=0.5, max_trials=4, compare=COMPARED, **TINY)
    result = run_search(tiny_bert_dir, {"path": str(tiny_csv)}, str(quick_profile), settings, out,
                        threads=1, show_progress=False, log=lambda _: None)
    yield out, settings, result, threads.seen
    patch.undo()


class ThreadsSeen:
    """torch's thread count when each phase's work starts."""

    def __init__(self) -> None:
        self.seen: dict[str, set[int]] = {}

    def recorded(self, function, phase: str):
        def counted(*args, **kwargs):
            self.seen.setdefault(phase, set()).add(torch.get_num_threads())
            return function(*args, **kwargs)
        return counted


def test_threads_asked_for_hold_in_every_phase(searched):
    """`--threads 1` held for the proxies, then the finals' run reset torch to every core."""
    assert searched[3] == {"proxies": {1}, "finals": {1}}


def test_search_meets_a_loose_budget_and_reports_it(searched):
    out, settings, result, _ = searched
    assert result["chosen"] and result["outcome"].startswith("met:")
    report = json.loads((out / "report.json").read_text())
    assert report["search"]["chosen"] == result["chosen"]
    names = {m["name"] for m in report["models"]}
    finalists = report["search"]["finalists"]
    assert 1 <= len(finalists) <= 2 and {r["name"] for r in finalists} <= names
    assert "onnxruntime-fp32" in names                                # measured beside the baseline
    for row in finalists:
        assert row["measured_p50_ms"] > 0 and row["predicted_p50_ms"] > 0 and 0 <= row["proxy_accuracy"] <= 1
        model = next(m for m in report["models"] if m["name"] == row["name"])
        assert model["predicted_p50_ms"] == row["predicted_p50_ms"]   # predicted beside measured
        assert model["onnx"]["parity"]["passed"] if "parity" in model["onnx"] else model["onnx"]
    assert result["chosen"] in report["search"]["front"]
    assert report["search"]["trials"]["complete"] >= 4
    assert "Search finalists" in (out / "report.md").read_text()
    assert (out / "latency_model.json").is_file() and (out / "study.db").is_file()
    assert not (out / ".latency-structures").exists()      # the timed exports go once the model is fitted
    # How much of the CPUs other processes took while its structures were timed, as fitted.
    contention = report["search"]["latency_model"]["contention"]
    assert contention == json.loads((out / "latency_model.json").read_text())["contention"]
    assert 0 <= contention["median"] <= contention["worst"] <= 1


def test_one_trial_trains_the_fastest_plan_first(searched, tiny_bert_dir, tiny_csv, quick_profile, cache_dir,
                                                tmp_path, monkeypatch):
    """With a budget only the fastest plans meet and one trial, the sampler's random draw was
    predicted over it and the search ended with "no plan was trained": the lead queues the
    plan the latency model predicts fastest first (the latency model from the cache the first
    search filled)."""
    monkeypatch.setenv("COMPRESSOR_CACHE", str(cache_dir))
    monkeypatch.setattr(measure, "peak_rss_mb", no_memory_probe)
    settings = SearchSettings(latency_budget_ms=0.001, min_retention=0.5, max_trials=1,
                              **{**TINY, "finalists": 1})
    out = tmp_path / "run"
    result = run_search(tiny_bert_dir, {"path": str(tiny_csv)}, str(quick_profile), settings, out, threads=1,
                        show_progress=False, log=lambda _: None)
    (row,) = result["finalists"]
    assert row["plan"]["layers"] == 1 and row["plan"]["ffn_removed"] == 0.9 and result["best_effort"] == row["name"]
    assert result["trials"]["total"] == result["trials"]["trained"] == 1     # the queued largest plan never ran
    trials = optuna.load_study(study_name="search", storage=f"sqlite:///{out / 'study.db'}").trials
    assert [t.user_attrs.get("seed") for t in trials] == ["fastest", "largest"]


def test_a_latency_model_fitted_under_contention_is_warned_about(searched, tiny_bert_dir, tiny_csv, quick_profile,
                                                                   cache_dir, tmp_path, monkeypatch, capsys):
    """Its predictions run high (2-3x fitted under load, against a quiet machine later), and
    nothing said so: one line on stderr, and in the report's warnings."""
    from compressor.search import run as run_module
    monkeypatch.setenv("COMPRESSOR_CACHE", str(cache_dir))
    monkeypatch.setattr(measure, "peak_rss_mb", no_memory_probe)
    busy = {"median": 0.45, "worst": 0.62, "measurements": 3}
    fitted = run_module.fit_latency_model
    monkeypatch.setattr(run_module, "fit_latency_model",
                        lambda *a, **k: fitted(*a, **k).model_copy(update={"contention": busy}))
    settings = SearchSettings(latency_budget_ms=0.001, min_retention=0.5, max_trials=1, **{**TINY, "finalists": 1})
    out = tmp_path / "run"
    run_search(tiny_bert_dir, {"path": str(tiny_csv)}, str(quick_profile), settings, out, threads=1,
               show_progress=False, log=lambda _: None)
    line = ("the search's latency model was fitted while other processes used the CPUs (median 45%, worst 62% "
            "of the CPUs' time over its timed structures)")
    err = capsys.readouterr().err.splitlines()
    report = json.loads((out / "report.json").read_text())
    assert report["search"]["latency_model"]["contention"] == busy
    (warning,) = [w for w in report["warnings"] if w.startswith(line)]
    assert "rerun on a quiet machine" in warning and err.count(f"warning: {warning}") == 1
    assert line in (out / "report.md").read_text()


def test_hand_written_variants_are_measured_in_the_same_run_against_the_searched_model(searched):
    out, _, result, _ = searched
    report = json.loads((out / "report.json").read_text())
    assert "two-layers" in {m["name"] for m in report["models"]}
    (row,) = report["search"]["compared"]
    picked = next(r for r in report["search"]["finalists"] if r["name"] == result["chosen"])
    assert row["name"] == "two-layers" and row["searched"] == result["chosen"] and row["measured_p50_ms"] > 0
    assert row["searched_as_fast"] == (picked["measured_p50_ms"] <= row["measured_p50_ms"])
    assert row["searched_as_accurate"] == (picked["accuracy"] >= row["accuracy"])
    assert row["dominated"] == (row["searched_as_fast"] and row["searched_as_accurate"])
    assert "two-layers" not in load_recipe(out / result["recipe_file"])[1]      # rebuilds the searched model only
    assert "against hand-written variants" in (out / "report.md").read_text()


def test_compared_variants_keep_their_recipe_training_cap(tmp_path):
    from compressor.pipeline.recipe import compared_variant, parse_recipe
    raw = {"name": "r", "teacher": {"model": "minilm", "task": "wordnet-supersense"},
           "data": {"max_train_samples": 300},
           "variants": {"small": [{"drop-layers": {"keep": [0, 2]}}, {"finetune": {"epochs": 2}}, "quantize"],
                        "capped": [{"finetune": {"max_train_samples": 50}}]},
           "search": {"latency_budget_ms": 5, "compare": ["small", "capped"]}}
    recipe, _ = parse_recipe(raw)
    assert recipe.search.compare == {
        "small": [{"drop-layers": {"keep": [0, 2]}}, {"finetune": {"epochs": 2, "max_train_samples": 300}},
                  {"quantize": {"mode": "dynamic-int8"}}],
        "capped": [{"finetune": {"max_train_samples": 50}}]}
    with pytest.raises(Exception, match="no variant 'nope'"):
        parse_recipe({**raw, "search": {"latency_budget_ms": 5, "compare": ["nope"]}})
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert compared_variant(f"{path}:small") == ("small", recipe.search.compare["small"])


@pytest.mark.parametrize("spec, message", [
    ("no-colon", "expected RECIPE:VARIANT"),
    ("recipes/demo.yaml:nope", "no variant 'nope'"),
    ("recipes/demo.yaml:L3-h0.25", "no variant"),
])
def test_bad_compare_is_one_line_and_exit_2(spec, message, tiny_bert_dir, tiny_csv, tmp_path, capsys):
    out = tmp_path / "never"
    code = main(["search", "--teacher", str(tiny_bert_dir), "--task", str(tiny_csv), "--latency-budget-ms", "5",
                 "--out", str(out), "--compare", str(ROOT / spec) if ":" in spec else spec])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


@pytest.mark.parametrize("names, message", [
    # One name from two recipes: the second replaced the first without a word.
    (("small", "small"), "b.yaml:small: variant 'small' is compared already (--compare {a}:small); expected each "
                         "variant name once"),
    # One dir on a case-insensitive file system.
    (("Small", "small"), "--compare {a}:Small, --compare {b}:small: variant names 'Small' and 'small' differ only "
                         "in case"),
])
def test_compared_variants_of_one_dir_are_refused(names, message, tiny_bert_dir, tiny_csv, tmp_path, capsys):
    specs = []
    for recipe, name in zip(("a.yaml", "b.yaml"), names):
        path = tmp_path / recipe
        path.write_text(yaml.safe_dump({"name": "r", "teacher": {"model": "minilm", "task": "wordnet-supersense"},
                                        "variants": {name: [{"drop-layers": {"keep": [0]}}]}}))
        specs += ["--compare", f"{path}:{name}"]
    out = tmp_path / "never"     # a short time budget: a compare not refused fails soon, not after a search
    code = main(["search", "--teacher", str(tiny_bert_dir), "--task", str(tiny_csv), "--latency-budget-ms", "5",
                 "--time-budget-min", "0.02", "--out", str(out), *specs])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert message.format(a=tmp_path / "a.yaml", b=tmp_path / "b.yaml") in err, err
    assert not out.exists()


@pytest.mark.parametrize("compare, message", [
    ({"Mine": [{"finetune": {}}], "mine": [{"finetune": {}}]}, "variant names 'Mine' and 'mine' differ only in case"),
    ({"l3-mine": [{"finetune": {}}]}, "'l3-mine' is taken by the search's own names"),   # beside plan L3-...
    ({"Teacher": [{"finetune": {}}]}, "'Teacher' is taken by the search's own names"),
])
def test_a_compared_name_is_compared_in_any_case(compare, message, tiny_bert_dir, tiny_csv, tmp_path):
    from pretrain.errors import UserError
    settings = SearchSettings(latency_budget_ms=5, time_budget_min=0.02, compare=compare)
    with pytest.raises(UserError, match=message):
        run_search(tiny_bert_dir, {"path": str(tiny_csv)}, "cpu", settings, tmp_path / "never", log=lambda _: None)
    assert not (tmp_path / "never").exists()


def test_a_compared_variant_may_not_take_a_plan_name(tiny_bert_dir, tiny_csv, tmp_path):
    from pretrain.errors import UserError
    settings = SearchSettings(latency_budget_ms=5, compare={"L3-mine": [{"finetune": {}}]})
    with pytest.raises(UserError, match="taken by the search's own names"):
        run_search(tiny_bert_dir, {"path": str(tiny_csv)}, "cpu", settings, tmp_path / "never", log=lambda _: None)
    assert not (tmp_path / "never").exists()


def test_the_written_recipe_rebuilds_the_chosen_model(searched):
    out, _, result, _ = searched
    recipe, steps = load_recipe(out / result["recipe_file"])
    assert list(steps) == [result["chosen"]]
    assert recipe.benchmark.batch_sizes == [8] and recipe.export.onnx
    report = json.loads((out / "report.json").read_text())
    chosen_plan = next(r["plan"] for r in report["search"]["finalists"] if r["name"] == result["chosen"])
    trains = [s.name for s in steps[result["chosen"]] if s.name in ("finetune", "distill", "theseus")]
    assert trains == [chosen_plan["recovery"]]


def test_rerun_resumes_from_the_storage_without_training_again(searched, tiny_bert_dir, tiny_csv, quick_profile,
                                                               monkeypatch, cache_dir):
    out, settings, result, _ = searched
    monkeypatch.setenv("COMPRESSOR_CACHE", str(cache_dir))
    monkeypatch.setattr(study_module.ProxyRunner, "train_proxy", lambda *a: pytest.fail("a proxy trained again"))
    monkeypatch.setattr(structures_module, "measure", lambda *a, **k: pytest.fail("latency measured again"))
    again = run_search(tiny_bert_dir, {"path": str(tiny_csv)}, str(quick_profile), settings, out, threads=1,
                       show_progress=False, log=lambda _: None)
    assert again["chosen"] == result["chosen"] and again["finalists"] == result["finalists"]


def test_a_study_made_for_another_search_is_refused(searched, tiny_bert_dir, tiny_csv, quick_profile, capsys):
    out = searched[0]
    code = main(["search", "--teacher", str(tiny_bert_dir), "--task", str(tiny_csv), "--profile", str(quick_profile),
                 "--latency-budget-ms", "2", "--out", str(out), "--precisions", "fp32"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "made for another search" in err and "latency_budget_ms" in err


def test_a_resumed_search_asking_for_a_precision_its_latency_model_lacks_is_refused(searched, tiny_bert_dir, tiny_csv,
                                                                                     quick_profile, cache_dir,
                                                                                     monkeypatch):
    from pretrain.errors import UserError
    out, settings, _, _ = searched
    monkeypatch.setenv("COMPRESSOR_CACHE", str(cache_dir))
    wider = settings.model_copy(update={"precisions": ("fp32", "int8")})
    with pytest.raises(UserError, match="fitted for fp32 and has no int8 measurements; expected --precisions") as err:
        run_search(tiny_bert_dir, {"path": str(tiny_csv)}, str(quick_profile), wider, out, threads=1,
                   show_progress=False, log=lambda _: None)
    assert "\n" not in str(err.value)


def test_a_second_search_into_a_dir_in_use_is_refused_before_touching_it(searched, tiny_bert_dir, tiny_csv,
                                                                          quick_profile, capsys):
    """The lead holds its out_dir from its claim to its finals: a second lead's claim would
    clear the first one's temporary exports under its feet (it crashed that way)."""
    from compressor.pipeline.outdir import exclusive_use
    out = searched[0]
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".lock"}
    with exclusive_use(out):             # as a running search holds it
        (out / ".an-export.tmp-x").mkdir()                # a temporary of the running search
        code = main(["search", "--teacher", str(tiny_bert_dir), "--task", str(tiny_csv), "--profile",
                     str(quick_profile), "--latency-budget-ms", "1000", "--out", str(out), "--precisions", "fp32"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "is in use by another run" in err, err
        assert (out / ".an-export.tmp-x").is_dir()         # a claim would have cleared it
    (out / ".an-export.tmp-x").rmdir()
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".lock" and p.exists()} == before


@pytest.mark.parametrize("args, message", [
    (["--min-retention", "1.5"], "argument --min-retention: expected a number in (0, 1] (got 1.5)"),
    (["--min-retention", "0"], "argument --min-retention: expected a number in (0, 1] (got 0)"),
    (["--profile", "gpu-cuda-fp16"], "cannot be measured on this machine"),
    (["--storage", "postgresql://nobody@127.0.0.1:1/none"], "cannot reach the study storage"),
    (["--storage", "notaurl"], "cannot reach the study storage"),
    (["--recoveries", "finetune,magic"], "--recoveries: "),
    (["--teacher", "minilm"], "without a trained classifier"),    # the bundled encoder: not fine-tuned
    (["--task", "wordnet-wsd"], "model labels do not match"),       # a teacher of another task
    (["--latency-budget-ms", "inf"], "argument --latency-budget-ms: expected a positive number (got inf)"),
    (["--latency-structures", "100000"],
     "argument --latency-structures: expected an integer from 2 to 500 (got 100000)"),
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(args, message, tiny_bert_dir, tiny_csv, tmp_path, capsys):
    out = tmp_path / "never"
    code = main(["search", "--teacher", str(tiny_bert_dir), "--task", str(tiny_csv), "--latency-budget-ms", "5",
                 "--out", str(out), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()             # not even the dir: a storage it could not reach included


def test_theseus_alone_on_a_one_layer_teacher_is_refused(make_tiny_bert, tokenizer, tiny_task, tiny_csv, tmp_path,
                                                          capsys):
    """No plan of the space exists: the seed plans (and the sampler) would have nothing to pick."""
    teacher = tmp_path / "one-layer"
    model = make_tiny_bert(num_labels=len(tiny_task.label_names), layers=1)
    model.config.id2label = dict(enumerate(tiny_task.label_names))
    model.config.label2id = {name: i for i, name in enumerate(tiny_task.label_names)}
    model.save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    out = tmp_path / "never"
    code = main(["search", "--teacher", str(teacher), "--task", str(tiny_csv), "--latency-budget-ms", "5",
                 "--out", str(out), "--recoveries", "theseus"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "theseus needs a teacher of two or more layers" in err, err
    assert not out.exists()


def test_join_without_a_study_says_how_to_start_one(tiny_bert_dir, tiny_csv, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(study_module, "JOIN_WAIT_S", 0.5)
    code = main(["search", "--teacher", str(tiny_bert_dir), "--task", str(tiny_csv), "--latency-budget-ms", "5",
                 "--out", str(tmp_path / "w"), "--storage", f"sqlite:///{tmp_path / 's.db'}", "--join"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "start the search without --join first" in err
    assert "waiting up to" in err.splitlines()[0]          # said before the wait, not only after


def test_outcome_says_which_constraint_failed_and_by_how_much():
    settings = SearchSettings(latency_budget_ms=10, min_retention=0.97)
    slow = {"name": "a", "measured_p50_ms": 12.0, "retention": 0.99, "meets_budget": False, "meets_retention": True,
            "accuracy": 0.8}
    weak = {"name": "b", "measured_p50_ms": 9.0, "retention": 0.95, "meets_budget": True, "meets_retention": False,
            "accuracy": 0.78}
    assert outcome(None, slow, settings) == "not met: best effort a: latency 12.00 ms is 20.0% over the 10.00 ms budget"
    assert "retention 95.0% is 2.0 points under the 97% floor" in outcome(None, weak, settings)
    assert measured_front([slow, weak]) == ["a", "b"]
    assert measured_front([slow, {**weak, "accuracy": 0.9}]) == ["b"]
    # b's 9 ms against a's 12 ms is within noise when the benchmark ties them: the more accurate a wins
    assert measured_front([slow, weak], ties=[["b", "a"]]) == ["a"]


def read_db(db: Path, query: str) -> list[tuple]:
    """Rows of `query` on the study's SQLite file, [] while it is missing, being made or locked
    (this test only watches; the workers own the storage)."""
    if not db.exists():
        return []
    con = sqlite3.connect(db, timeout=1)
    try:
        return con.execute(query).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def study_ready(db: Path) -> bool:
    """The lead has stored the latency model and teacher score: workers can start trials."""
    keys = {row[0] for row in read_db(db, "SELECT key FROM study_user_attributes")}
    return {"latency_model", "teacher_validation_accuracy"} <= keys


def completed_by(db: Path) -> list[str]:
    """The worker of each completed trial."""
    rows = read_db(db, "SELECT a.value_json FROM trials t JOIN trial_user_attributes a ON a.trial_id = t.trial_id "
                       "WHERE t.state = 'COMPLETE' AND a.key = 'worker'")
    return [json.loads(value) for (value,) in rows]


def pause_outside_a_write(proc: subprocess.Popen, db: Path) -> None:
    """SIGSTOP `proc` at a moment it holds no SQLite lock: a stopped writer would block the
    other worker's writes, and a stopped reader its commits (hence EXCLUSIVE, which waits for
    readers too)."""
    for _ in range(100):
        os.kill(proc.pid, signal.SIGSTOP)
        con = sqlite3.connect(db, timeout=0.2, isolation_level=None)
        try:
            con.execute("BEGIN EXCLUSIVE")
            con.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            con.close()
    raise AssertionError("the lead held a lock on the study for 100 tries")


def wait_until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(0.1)


def test_two_workers_share_one_storage(tiny_bert_dir, tiny_csv, quick_profile, cache_dir, searched, tmp_path):
    """A lead and a joined worker, two processes, one SQLite study: together they run the
    study's trial limit, and both ran some of them. (The latency model comes from the cache
    the first search filled: same machine, profile and teacher.) Tiny trials take a second, so
    the lead is paused once the study is ready until the worker has finished a trial: otherwise
    the lead may run all six while the worker starts up, and the test would prove nothing."""
    db = tmp_path / "shared.db"
    storage = f"sqlite:///{db}"
    common = ["search", "--teacher", str(tiny_bert_dir), "--task", str(tiny_csv), "--profile", str(quick_profile),
              "--latency-budget-ms", "1000", "--min-retention", "0.5", "--storage", storage, "--study-name", "shared",
              "--max-trials", "6", "--finalists", "1", "--proxy-train-samples", "32", "--validation-samples", "30",
              "--train-samples", "64", "--precisions", "fp32", "--max-eval-samples", "30", "--threads", "1",
              "--scoring-samples", "16", "--latency-structures", "2", "--latency-held-out", "1",
              "--baselines", "onnxruntime-fp32", "--quiet", "--time-budget-min", "10"]
    env = {**os.environ, "COMPRESSOR_CACHE": str(cache_dir), "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen([sys.executable, "-m", "compressor", *common, "--out", str(tmp_path / "worker"),
                               "--join"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lead = subprocess.Popen([sys.executable, "-m", "compressor", *common, "--out", str(tmp_path / "lead")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    worker_name = f"{socket.gethostname()}:{worker.pid}"

    try:
        wait_until(lambda: study_ready(db) or lead.poll() is not None, 300, "the lead to create the study")
        pause_outside_a_write(lead, db)
        try:    # well inside the storage's 120 s grace period for the lead's silent heartbeat
            wait_until(lambda: worker_name in completed_by(db) or worker.poll() is not None, 90,
                       "the worker's first trial")
        finally:
            os.kill(lead.pid, signal.SIGCONT)
        lead_out, _ = lead.communicate(timeout=600)
        worker_out, _ = worker.communicate(timeout=600)
    finally:
        for proc in (lead, worker):
            if proc.poll() is None:     # a failed wait: leave no process behind
                proc.kill()
    assert lead.returncode == 0, lead_out[-2000:]
    assert worker.returncode == 0, worker_out[-2000:]
    study = optuna.load_study(study_name="shared", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 6
    ran = {t.user_attrs["worker"] for t in done}
    assert worker_name in ran and len(ran) == 2, f"trials ran by {sorted(ran)}"
    assert (tmp_path / "lead" / "report.json").is_file() and not (tmp_path / "worker" / "report.json").exists()


def test_a_recipe_search_section_runs_from_the_teacher_stage(searched, tiny_bert_dir, tiny_csv, quick_profile,
                                                              cache_dir, tmp_path, monkeypatch):
    """`search:` in a recipe without variants: the teacher stage, then the search into DIR/search/
    (the latency model from the cache the first search filled)."""
    from compressor.pipeline.recipe import parse_recipe
    from compressor.pipeline.run import run_recipe
    monkeypatch.setenv("COMPRESSOR_CACHE", str(cache_dir))
    monkeypatch.setattr(measure, "peak_rss_mb", no_memory_probe)
    tiny = {k: list(v) if isinstance(v, tuple) else v for k, v in TINY.items()}
    raw = {"name": "with-search", "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
           "data": {"max_eval_samples": 30},
           "benchmark": {"profiles": [str(quick_profile)], "batch_sizes": [8], "baselines": ["onnxruntime-fp32"]},
           "search": {**tiny, "latency_budget_ms": 1000, "min_retention": 0.5, "max_trials": 2, "finalists": 1}}
    recipe, steps = parse_recipe(raw)
    assert steps == {} and recipe.search.max_trials == 2
    report = run_recipe(recipe, steps, tmp_path / "run", show_progress=False)
    assert report["search"]["dir"] == "search" and report["search"]["outcome"].startswith("met:")
    assert report["search"]["met"] is True                 # machine-readable, beside the outcome line
    inner = json.loads((tmp_path / "run" / "search" / "report.json").read_text())
    assert inner["search"]["chosen"] == report["search"]["chosen"]
    for human in ("report.md", "report.html"):      # the run's own reports show the search too
        assert "Search to a latency budget" in (tmp_path / "run" / human).read_text()
    with pytest.raises(Exception, match="min_retention"):
        parse_recipe({**raw, "search": {"latency_budget_ms": 5, "min_retention": 2}})


def test_the_latency_cache_file_names_every_setting_the_fit_depends_on(bert_bundle, monkeypatch, tmp_path):
    """The file was named by profile and teacher shape only: searches with other precisions or
    batch sizes overwrote each other's model."""
    from compressor.bench.profiles import load_profile
    from compressor.search.run import latency_cache
    monkeypatch.setenv("COMPRESSOR_CACHE", str(tmp_path))
    settings = SearchSettings(latency_budget_ms=5, **TINY)
    path = latency_cache(load_profile("cpu"), bert_bundle, settings)
    assert path.parent == tmp_path / "latency" and path == latency_cache(load_profile("cpu"), bert_bundle, settings)
    others = [{"precisions": ("fp32", "int8")}, {"batch_size": 4}, {"latency_structures": 3},
              {"latency_held_out": 2}, {"seed": 1}]
    paths = {latency_cache(load_profile("cpu"), bert_bundle, settings.model_copy(update=change)) for change in others}
    assert len(paths) == len(others) and path not in paths


def test_a_baseline_listed_twice_is_refused():
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="baseline onnxruntime-fp32 listed more than once"):
        SearchSettings(latency_budget_ms=5, baselines=["onnxruntime-fp32", "onnxruntime-fp32"])



def test_a_recovery_or_precision_listed_twice_is_named():
    """Not `a value is listed twice in ['int8', 'int8']`, which `--precisions` showed beside the
    list again: the name, which the flag's error follows with the value as typed."""
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="int8 listed more than once; expected each once"):
        SearchSettings(latency_budget_ms=5, precisions=("fp32", "int8", "int8"))
    with pytest.raises(ValidationError, match="distill, theseus listed more than once"):
        SearchSettings(latency_budget_ms=5, recoveries=("theseus", "distill", "theseus", "distill"))


def test_a_search_draws_the_splits_with_the_seed_its_teacher_records(bert_bundle, tiny_csv, quick_profile, tmp_path,
                                                                      monkeypatch):
    """The search uses its teacher as is: splits drawn with another seed would score (and pick
    plans by) rows the teacher trained on."""
    from compressor.search import run as search_run
    teacher = bert_bundle.replace(task={"path": str(tiny_csv)}, task_seed=3).save(tmp_path / "teacher")
    seeds, lines = [], []

    def stop_at_load(spec, seed=0):
        seeds.append(seed)
        raise KeyboardInterrupt
    monkeypatch.setattr(search_run, "load_task", stop_at_load)
    settings = SearchSettings(latency_budget_ms=1000, min_retention=0.5, max_trials=1, seed=1, **TINY)
    for task in ({"path": str(tiny_csv)}, {"path": str(tmp_path / "other.csv")}):
        with pytest.raises(KeyboardInterrupt):
            run_search(teacher, task, str(quick_profile), settings, tmp_path / "out", threads=1, show_progress=False,
                       log=lines.append)
    assert seeds == [3, 1]                              # another task: the search's own seed
    assert len(lines) == 1 and "drawn with seed 3, not the search's seed 1" in lines[0]


def test_a_teacher_fine_tuned_on_the_other_shape_of_input_is_refused(shape_tuned, tiny_csv, tmp_path, capsys):
    """Its plans would be trained and scored on inputs of a shape the teacher never saw."""
    out, teacher = tmp_path / "never", shape_tuned["pairs"]
    code = main(["search", "--teacher", str(teacher), "--task", str(tiny_csv), "--latency-budget-ms", "5",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (f"error: {teacher} was fine-tuned on text pairs (text, text_pair); task 'tiny' gives "
                                 "single texts: expected a task with a text_pair column, or a model fine-tuned on "
                                 "single texts"), err
    assert not out.exists()


def test_finalists_the_time_left_cannot_fit_are_left_out_but_never_the_first():
    from compressor.search.budget import FinalsRates, finals_seconds
    from compressor.search.run import fitting_finalists
    from compressor.search.plans import Plan
    from compressor.search.study import completed
    from tests.compressor.search.test_study import study_of, trial
    settings = SearchSettings(latency_budget_ms=10, finalists=3, proxy_train_samples=100, train_samples=1000)
    rates = FinalsRates(benchmark_calls=100, scoring_calls=10, teacher_torch_ms=50.0, teacher_onnx_ms={"fp32": 20.0})
    picks = list(completed(study_of(trial(Plan(layers=3), 0.6, 9.0), trial(Plan(layers=2), 0.5, 8.0),
                                    trial(Plan(layers=1), 0.4, 5.0))))
    two = finals_seconds(picks[:2], settings, rates, [], count=2)
    kept, seconds = fitting_finalists(picks, settings, rates, [], time.monotonic() + two + 5)
    assert kept == picks[:2] and seconds == two
    assert fitting_finalists(picks, settings, rates, [], time.monotonic() + 1e6)[0] == picks
    assert fitting_finalists(picks, settings, rates, [], time.monotonic() - 1)[0] == picks[:1]


def test_the_time_budget_cuts_the_finals_benchmark_and_the_report_says_so(searched, tiny_bert_dir, tiny_csv,
                                                                          quick_profile, cache_dir, tmp_path,
                                                                          monkeypatch):
    """The finals had no deadline: a benchmark of the profile's calls ran on past the budget (14
    minutes on a loaded 2-core machine). A profile of 10,000 calls a model, a budget of half a
    minute, the finals estimated at nothing (so that the proxies run): the benchmark is cut."""
    from compressor.search import run as search_run
    monkeypatch.setenv("COMPRESSOR_CACHE", str(cache_dir))       # the latency model of the first search
    monkeypatch.setattr(measure, "peak_rss_mb", no_memory_probe)
    monkeypatch.setattr(search_run, "finals_seconds", lambda *a, **k: 0.0)
    slow = tmp_path / "slow-cpu.yaml"
    slow.write_text(yaml.safe_dump({**yaml.safe_load(quick_profile.read_text()), "iterations": 10_000}))
    settings = SearchSettings(latency_budget_ms=1000, min_retention=0.5, max_trials=1,
                              **{**TINY, "finalists": 1, "time_budget_min": 0.5})
    out = tmp_path / "run"
    start = time.monotonic()
    result = run_search(tiny_bert_dir, {"path": str(tiny_csv)}, str(slow), settings, out, threads=1,
                        show_progress=False, log=lambda _: None)
    assert time.monotonic() - start < 30 + 30     # 10,000 calls of each of 3 models alone take a minute or more
    assert result["time"]["benchmark_time_limited"] and result["time"]["finalists_dropped"] == []
    report = json.loads((out / "report.json").read_text())
    (cut,) = report["benchmark"]["time_limited"]["timing"]
    assert cut["iterations"] == 10_000 and 3 <= cut["timed"] < 10_000
    assert any(w.startswith("the time budget cut the benchmark on quick-cpu") for w in report["warnings"])
    assert "the time budget cut the finals' benchmark short" in (out / "report.md").read_text()


def test_the_search_section_says_what_was_searched_and_every_key_is_documented(searched):
    """report.json's `search` had neither the space searched nor a row per trial (only study.db
    held them), and the README's list of its fields missed some it wrote."""
    out, settings, result, _ = searched
    space = result["space"]
    assert space["recoveries"] == list(settings.recoveries) and space["precisions"] == ["fp32"]
    assert space["layers"] == [1, 4] and space["heads_removed"] == [0.0, 0.75] and space["ffn_removed"] == [0.0, 0.9]
    assert space["max_trials"] == 4 and space["finalists"] == 2
    table = result["trial_table"]
    assert len(table) == result["trials"]["total"] and [r["number"] for r in table] == sorted(r["number"] for r in table)
    plans = {r["number"]: r["plan"] for r in table}
    assert all(plans[f["trial"]] == f["name"] for f in result["finalists"])      # a row per trial, finalists too
    assert result["met"] is True and result["time"]["finalists_dropped"] == []
    md = (out / "report.md").read_text()
    assert "Search trials" in md and "space: recoveries" in md
    section = (ROOT / "README.md").read_text().split("## Search to a latency budget")[1].split("\n## ")[0]
    nested = [result, result["budget"], result["space"], result["trials"], result["time"], result["finalists"][0],
              table[0]]
    undocumented = sorted({key for part in nested for key in part if f"`{key}`" not in section})
    assert undocumented == []


def test_a_time_budget_the_finals_alone_exceed_says_what_they_need(searched, tiny_bert_dir, tiny_csv, quick_profile,
                                                                   cache_dir, tmp_path, monkeypatch):
    """Nothing fits: the error says how long the finals' fixed part was estimated at, measured here."""
    from compressor.search import budget
    from pretrain.errors import UserError
    monkeypatch.setenv("COMPRESSOR_CACHE", str(cache_dir))
    monkeypatch.setattr(budget, "EXPORT_S", 600.0)          # the teacher's export alone is over the budget
    settings = SearchSettings(latency_budget_ms=1000, min_retention=0.5, max_trials=1,
                              **{**TINY, "time_budget_min": 1.0})
    with pytest.raises(UserError, match=r"no plan was trained within the time budget \(1 min\): the finals' teacher, "
                                        r"baselines and benchmark alone are estimated at \d+\.\d min"):
        run_search(tiny_bert_dir, {"path": str(tiny_csv)}, str(quick_profile), settings, tmp_path / "run", threads=1,
                   show_progress=False, log=lambda _: None)
