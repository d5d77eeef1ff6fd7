"""The benchmark stage of a recipe: baselines, latency entries, Pareto front, human reports, caching."""

from __future__ import annotations

import json

import numpy as np
import pytest

from compressor.bench import measure
from compressor.bench.baselines import preset_for_this_cpu
from compressor.bench.timing import HARNESS_VERSION
from compressor.pipeline.recipe import parse_recipe
from pretrain.errors import UserError
from tests.compressor.pipeline.test_report_data import undocumented_keys, unwritten_keys

LATENCY_FIELDS = {"profile", "batch_size", "sequence_length", "p50_ms", "p90_ms", "p99_ms", "throughput",
                  "peak_rss_mb", "kind", "precision"}


def raw_recipe(model_dir, csv_path, name="tiny-bench") -> dict:
    return {"name": name, "seed": 0,
            "teacher": {"model": str(model_dir), "task": {"path": str(csv_path)}},
            "variants": {"same": [], "two-layers-int8": [{"drop-layers": {"keep": [0, 2]}},
                                                         {"quantize": {"mode": "dynamic-int8"}}]},
            "export": {"onnx": True, "optimize": True, "accuracy_tolerance": 1.0},
            "benchmark": {"profiles": ["cpu", "gpu-cuda-fp16"], "batch_sizes": [1, 4], "iterations": 10}}


@pytest.fixture(scope="module")
def done(tiny_bert_dir, tiny_csv, tmp_path_factory, run_raw):
    out = tmp_path_factory.mktemp("bench-run") / "run"
    raw = raw_recipe(tiny_bert_dir, tiny_csv)
    return raw, out, run_raw(raw, out)


def test_every_model_and_baseline_is_measured_in_one_run(done):
    _, out, report = done
    models = {m["name"]: m for m in report["models"]}
    assert list(models) == ["same", "two-layers-int8", "pytorch-eager-fp32", "onnxruntime-fp32",
                            "optimum-default-int8"]
    for name, m in models.items():
        assert m["baseline"] == (name in ("pytorch-eager-fp32", "onnxruntime-fp32", "optimum-default-int8"))
        assert [(r["profile"], r["batch_size"]) for r in m["latency"]] == [("cpu", 1), ("cpu", 4)]
        for row in m["latency"]:
            assert LATENCY_FIELDS <= set(row) and row["sequence_length"] == "real"
            assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
            assert row["throughput"] > 0 and row["peak_rss_mb"] > 10
        assert 0 <= m["accuracy"] <= 1
    assert models["pytorch-eager-fp32"]["kind"] == "torch"
    assert models["pytorch-eager-fp32"]["accuracy"] == report["teacher"]["accuracy"]
    assert models["onnxruntime-fp32"]["agreement"] == 1.0          # the same function, exported
    assert models["optimum-default-int8"]["precision"] == "dynamic-int8"
    assert models["optimum-default-int8"]["size_bytes"] < models["onnxruntime-fp32"]["size_bytes"]
    preset = models["optimum-default-int8"]["optimum"]["preset"]
    assert preset == preset_for_this_cpu()
    assert models["optimum-default-int8"]["optimum"]["profiles"] == {"cpu": preset}   # the GPU profile is skipped
    assert (out / "baselines" / f"optimum-default-int8-{preset}" / "model_optimized_quantized.onnx").is_file()


def test_absent_hardware_is_skipped_with_its_reason(done):
    _, _, report = done
    assert report["benchmark"]["skipped"] == [{"profile": "gpu-cuda-fp16", "reason": "no CUDA device is visible"}]
    assert [p["name"] for p in report["benchmark"]["profiles"]] == ["cpu"]
    assert report["benchmark"]["harness_version"] == HARNESS_VERSION


def test_each_measurement_has_a_ranking_of_every_model(done):
    out, report = done[1], done[2]
    rankings = report["benchmark"]["rankings"]
    assert [(r["profile"], r["batch_size"]) for r in rankings] == [("cpu", 1), ("cpu", 4)]
    names = sorted(m["name"] for m in report["models"])
    for r in rankings:
        assert sorted(n for g in r["groups"] for n in g["models"]) == names
        p50 = {m["name"]: next(x["p50_ms"] for x in m["latency"] if x["batch_size"] == r["batch_size"])
               for m in report["models"]}
        firsts = [p50[g["models"][0]] for g in r["groups"]]
        assert firsts == sorted(firsts)
    assert "## Ranking by latency" in (out / "report.md").read_text()
    timings = json.loads((out / "benchmark" / "benchmark.json").read_text())["timings"]
    assert [t["batch_size"] for t in timings] == [1, 4]
    for t in timings:   # every timed call is kept, so the statistics can be recomputed
        assert sorted(t["times_ms"]) == names
        assert {len(v) for v in t["times_ms"].values()} == {t["rounds"][-1][1]}


def test_pareto_front_is_the_undominated_set(done):
    _, _, report = done
    assert [(f["profile"], f["batch_size"]) for f in report["pareto"]] == [("cpu", 1), ("cpu", 4)]
    for front in report["pareto"]:
        points = {m["name"]: (m["accuracy"], next(r["p50_ms"] for r in m["latency"]
                                                  if r["batch_size"] == front["batch_size"]))
                  for m in report["models"]}
        # Two models the ranking ties are equally fast: of them, the more accurate one wins.
        tied = {frozenset(pair) for r in report["benchmark"]["rankings"] if r["batch_size"] == front["batch_size"]
                for pair in r["ties"]}
        for name, (acc, lat) in points.items():
            dominated = any(a >= acc and (t <= lat or frozenset((o, name)) in tied)
                            and (a > acc or (t < lat and frozenset((o, name)) not in tied))
                            for o, (a, t) in points.items() if o != name)
            assert (name in front["models"]) == (not dominated), (name, front, tied)


def test_human_reports_are_written_and_self_contained(done):
    _, out, report = done
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for text in (md, page):
        for name in ("two-layers-int8", "optimum-default-int8", "speedup vs pytorch-eager-fp32",
                     "gpu-cuda-fp16: no CUDA device is visible", report["environment"]["cpu"]["model"]):
            assert name in text
    assert "data:image/png;base64," in page
    assert "http://" not in page and "https://" not in page and "<script" not in page


def test_rerun_reuses_the_measurements_unless_asked(done, tmp_path, monkeypatch, run_raw):
    import shutil
    raw, out, report = done
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    monkeypatch.setattr(measure, "time_interleaved",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured again")))
    again = run_raw(raw, copy)
    assert [m["latency"] for m in again["models"]] == [m["latency"] for m in report["models"]]
    from compressor.bench.timing import Timings
    calls = []

    def counted(runners, batches, profile, **kwargs):
        calls.append(1)
        return Timings({name: np.array([1.0, 2.0]) for name in runners},
                       dict.fromkeys(runners, 2 * len(batches[0]["input_ids"])), [slice(0, 1), slice(1, 2)])
    monkeypatch.setattr(measure, "time_interleaved", counted)
    # Memory is probed in a child process per model: what counts here is that timing reruns.
    monkeypatch.setattr(measure, "peak_rss_mb", lambda model, profile, batch_sets, *a, **k: [100.0] * len(batch_sets))
    for expected in (2, 4):   # every rebenchmark measures (2 batch sizes), also right after another
        run_raw(raw, copy, rebenchmark=True)
        assert len(calls) == expected
    # A newer harness measures again without being asked; the same harness reuses.
    from compressor.pipeline import benchmark_stages
    monkeypatch.setattr(benchmark_stages, "HARNESS_VERSION", benchmark_stages.HARNESS_VERSION + 1)
    run_raw(raw, copy)
    run_raw(raw, copy)
    assert len(calls) == 6


def test_an_out_dir_of_another_recipe_is_refused_unless_forced(done, tiny_bert_dir, tiny_csv, tmp_path, run_raw):
    import shutil
    _, out, _ = done
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    other = raw_recipe(tiny_bert_dir, tiny_csv, name="other")
    other.pop("benchmark")
    with pytest.raises(UserError, match="holds results of recipe 'tiny-bench'.*--force"):
        run_raw(other, copy)
    assert json.loads((copy / "run.json").read_text())["recipe"] == "tiny-bench"   # nothing touched
    report = run_raw(other, copy, force=True)
    assert report["recipe"]["name"] == "other"
    assert not (copy / "baselines").exists() and not (copy / "benchmark").exists()


def test_the_report_has_the_keys_the_readme_documents_and_no_others(done):
    """report.json is a contract other tools read: a run with exports, baselines, a benchmark
    and a skipped profile writes every key of the README's example (but the search's, which
    needs a `search:` section) and none the README does not name."""
    report = json.loads((done[1] / "report.json").read_text())
    assert undocumented_keys(report) == []
    assert unwritten_keys(report, conditional={"search"}) == []
    # "the same fields, with `threads` ... instead of `torch_threads`"
    assert set(report["benchmark"]["environment"]) == set(report["environment"]) - {"torch_threads"} | {"threads"}


def test_unknown_profile_lists_the_known_ones(tiny_bert_dir, tiny_csv):
    raw = raw_recipe(tiny_bert_dir, tiny_csv)
    raw["benchmark"]["profiles"] = ["tpu"]
    with pytest.raises(UserError, match=r"benchmark.profiles: .*unknown profile 'tpu'; known profiles: arm64, cpu"):
        parse_recipe(raw)


def test_a_profile_file_with_a_wrong_field_names_it(tiny_bert_dir, tiny_csv, tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("provider: CPUExecutionProvider\nthreads: many\n")
    raw = raw_recipe(tiny_bert_dir, tiny_csv)
    raw["benchmark"]["profiles"] = [str(bad)]
    with pytest.raises(UserError,
                       match=r"mine.yaml: threads: expected an integer from 1 to 1024 or 'cores' \(got 'many'\)"):
        parse_recipe(raw)


def test_a_moved_run_dir_reports_and_measures_its_own_files(done, tmp_path, monkeypatch, run_raw):
    """Stage records hold the path they were built at; a run dir moved, then rerun, must point at
    (and benchmark) the files where they are now, not where they were."""
    import shutil
    raw, out, _ = done
    built_at, moved = tmp_path / "first", tmp_path / "moved"
    shutil.copytree(out, built_at)
    run_raw(raw, built_at)
    shutil.move(built_at, moved)
    report = run_raw(raw, moved)
    paths = [m["path"] for m in report["models"]] + [m["onnx"]["path"] for m in report["models"] if "onnx" in m]
    assert paths and all(p.startswith(str(moved)) for p in paths), paths
    assert str(built_at) not in json.dumps(report)
    measured = []
    monkeypatch.setattr(measure, "peak_rss_mb",
                        lambda model, profile, batch_sets, *a, **k: measured.append(model) or [1.0] * len(batch_sets))
    run_raw(raw, moved, rebenchmark=True)      # the first dir is gone: measuring its files would fail
    assert measured and all(str(model.path).startswith(str(moved)) for model in measured)


def test_timings_are_not_reused_on_another_machine_or_runtime(done, tmp_path, monkeypatch, run_raw):
    """A run dir copied to another machine, or rerun after a runtime upgrade, measures again;
    the report says where and when its latencies were measured."""
    import shutil
    from compressor.pipeline import benchmark_stages
    raw, out, report = done
    assert report["benchmark"]["environment"]["cpu"] == report["environment"]["cpu"]
    assert report["benchmark"]["environment"]["date"] <= report["environment"]["date"]
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    measured = []
    monkeypatch.setattr(measure, "peak_rss_mb",
                        lambda model, profile, batch_sets, *a, **k: measured.append(model) or [1.0] * len(batch_sets))
    run_raw(raw, copy)
    assert not measured                               # the same machine and runtimes: cached
    versions = benchmark_stages.package_versions()
    monkeypatch.setattr(benchmark_stages, "package_versions", lambda: {**versions, "onnxruntime": "9.9.9"})
    run_raw(raw, copy)
    assert measured
    measured.clear()
    monkeypatch.setattr(benchmark_stages, "package_versions", lambda: versions)
    cpu = benchmark_stages.cpu_info()
    monkeypatch.setattr(benchmark_stages, "cpu_info", lambda: {**cpu, "model": "another CPU"})
    run_raw(raw, copy)
    assert measured


def test_benchmark_progress_goes_to_stderr_and_quiet_hides_it(done, tmp_path, monkeypatch, capsys):
    """stdout carries the report table only (a script may parse it); progress lines go where
    the stage lines go, and --quiet hides both."""
    import shutil

    import yaml

    from compressor.cli import main
    from compressor.pipeline import run as pipeline_run
    raw, out, _ = done
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setattr(pipeline_run, "set_threads", lambda threads: None)
    monkeypatch.setattr(measure, "peak_rss_mb", lambda model, profile, batch_sets, *a, **k: [1.0] * len(batch_sets))
    argv = ["run", str(recipe), "--out", str(copy), "--rebenchmark"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "benchmark: cpu batch 1" in captured.err and "benchmark:" not in captured.out
    assert main([*argv, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "benchmark:" not in captured.out + captured.err


def test_with_every_profile_skipped_no_baseline_is_built_and_the_report_says_why(tiny_bert_dir, tiny_csv, tmp_path,
                                                                                run_raw, monkeypatch):
    """A GPU profile on a machine without one: the baselines were exported and quantized by
    Optimum for a benchmark that measures nothing."""
    from compressor.pipeline import benchmark_stages
    from compressor.pipeline.plan import plan_lines, plan_recipe
    monkeypatch.setattr(benchmark_stages, "BUILDERS", {name: lambda *a: pytest.fail("a baseline was built")
                                                       for name in benchmark_stages.BUILDERS})
    raw = {**raw_recipe(tiny_bert_dir, tiny_csv), "variants": {"same": []},
           "benchmark": {"profiles": ["gpu-cuda-fp16"], "batch_sizes": [1]}}
    recipe, steps = parse_recipe(raw)
    plan = plan_recipe(recipe, steps, tmp_path / "run")
    assert [s["kind"] for s in plan["stages"]] == ["teacher", "variant", "export", "export", "benchmark"]
    assert "note: every benchmark profile is skipped on this machine: nothing will be measured, and the baselines " \
           "(pytorch-eager-fp32, onnxruntime-fp32, optimum-default-int8) are not built" in plan_lines(plan)
    report = run_raw(raw, tmp_path / "run")
    assert [m["name"] for m in report["models"]] == ["same"] and not (tmp_path / "run" / "baselines").exists()
    assert report["benchmark"]["profiles"] == []
    assert report["benchmark"]["skipped"] == [{"profile": "gpu-cuda-fp16", "reason": "no CUDA device is visible"}]
    assert report["benchmark"]["baselines_not_built"] == ["pytorch-eager-fp32", "onnxruntime-fp32",
                                                         "optimum-default-int8"]
    md = (tmp_path / "run" / "report.md").read_text()
    assert "nothing was measured: every profile is skipped on this machine (below); the baselines " \
           "pytorch-eager-fp32, onnxruntime-fp32, optimum-default-int8 were not built" in md
    assert "gpu-cuda-fp16: no CUDA device is visible" in md


def baseline_dirs(report: dict) -> dict[str, str]:
    return {m["name"]: m["path"] for m in report["models"] if m["baseline"]}


def test_baseline_dirs_are_evaluated_and_benched_with_no_task_as_the_report_scored_them(done, tiny_task, monkeypatch):
    """A baseline's dir records the teacher's task and seed and its precision, as an export dir
    does: `compressor evaluate` and `bench` need no --task, score the rows the report scored,
    and name the model as the report does."""
    from compressor.cli import bench_command
    from compressor.evaluate import evaluate_path
    _, _, report = done
    monkeypatch.setattr(bench_command, "measure_models", lambda *a, **k: measure.Measurement([], [], []))
    for name, path in baseline_dirs(report).items():
        entry = next(m for m in report["models"] if m["name"] == name)
        evaluated = evaluate_path(path, None)
        assert evaluated["accuracy"] == entry["accuracy"], name
        benched = bench_command.bench_command(path, "cpu", batch_sizes=[1], iterations=2)
        for result in (evaluated, benched):
            assert (result["kind"], result["precision"], result["task"]) == (entry["kind"], entry["precision"],
                                                                        tiny_task.name)
        assert benched["accuracy"] == entry["accuracy"], name


def test_baseline_dirs_cached_without_a_description_get_one_without_a_rebuild(done, tiny_task, tmp_path, monkeypatch,
                                                                              run_raw):
    import shutil
    from compressor.pipeline import benchmark_stages
    from compressor.evaluate import evaluate_path
    raw, out, report = done
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    undescribed = [d for d in (copy / "baselines").iterdir() if d.is_dir()]
    for directory in undescribed:     # as an earlier version of the tool left them
        (directory / "compressor.json").unlink(missing_ok=True)
        (directory / "export.json").unlink(missing_ok=True)
        record = json.loads((directory / "stage.json").read_text())
        (directory / "stage.json").write_text(json.dumps({k: v for k, v in record.items() if k != "files"}))
    monkeypatch.setattr(benchmark_stages, "BUILDERS", {})        # a rebuild would fail
    monkeypatch.setattr(measure, "time_interleaved",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("measured again")))
    again = run_raw(raw, copy)
    assert [m["latency"] for m in again["models"]] == [m["latency"] for m in report["models"]]
    for name, path in baseline_dirs(again).items():
        assert evaluate_path(path, None)["task"] == tiny_task.name, name


def test_timings_taken_under_another_cgroup_quota_are_not_reused(monkeypatch):
    """A run dir rerun in a container held to fewer CPUs reused timings taken without the limit.
    A machine without a quota keys its timings as before."""
    from compressor.bench import environment
    from compressor.pipeline.benchmark_stages import measuring_machine
    monkeypatch.setattr(environment, "cpu_quota", lambda: None)
    assert set(measuring_machine()) == {"cpu", "packages"}
    monkeypatch.setattr(environment, "cpu_quota", lambda: 1.5)
    assert measuring_machine()["cpu_quota"] == 1.5


def test_timings_taken_under_other_instruction_set_limits_are_not_reused(monkeypatch):
    """A rerun with the libraries held to AVX2 (ONEDNN_MAX_CPU_ISA, ...) reused timings taken
    with every instruction set, under a report.json whose benchmark environment named no limit.
    Without a limit set, timings are keyed as before."""
    from compressor.bench import environment
    from compressor.pipeline.benchmark_stages import measuring_machine
    monkeypatch.setattr(environment, "cpu_quota", lambda: None)
    for name in environment.ISA_LIMIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert set(measuring_machine()) == {"cpu", "packages"}
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert measuring_machine()["isa_limits"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_a_benchmark_a_deadline_cut_says_so_and_is_measured_again_by_the_next_run(done, tmp_path, monkeypatch,
                                                                                   run_raw):
    """A search's finals pass their time budget's deadline: the calls that did not fit are
    cut, the report's benchmark and warnings say what was cut, and the cut benchmark is not
    the cache's answer to a rerun (which may have the time for every call)."""
    import shutil
    import time
    raw, out, _ = done
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    monkeypatch.setattr(measure, "peak_rss_mb", lambda model, profile, batch_sets, *a, **k: [100.0] * len(batch_sets))
    cut = run_raw(raw, copy, rebenchmark=True, deadline=time.monotonic() - 1)
    limited = cut["benchmark"]["time_limited"]
    assert [(e["profile"], e["batch_size"], e["iterations"], e["timed"]) for e in limited["timing"]] == \
        [("cpu", 1, 10, 3), ("cpu", 4, 10, 3)]
    assert len(limited["memory_not_probed"]) == 5          # past the deadline no probe starts
    assert all(row["iterations"] == 3 and row["peak_rss_mb"] is None for m in cut["models"] for row in m["latency"])
    assert sum("the time budget cut the benchmark on cpu" in w for w in cut["warnings"]) == 2
    assert any("no time to read the peak memory of" in w and "same (cpu)" in w for w in cut["warnings"])
    assert undocumented_keys(cut) == []
    whole = run_raw(raw, copy)
    assert "time_limited" not in whole["benchmark"]
    assert all(row["iterations"] == 10 for m in whole["models"] for row in m["latency"])
