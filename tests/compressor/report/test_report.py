"""Derived views of report.json: Pareto fronts and runtime warnings, on hand-made reports."""

from __future__ import annotations

import json

import pytest

from compressor.report.analysis import data_warnings, pareto_fronts, runtime_warnings
from compressor.report.render import (baseline_lines, latency_table, markdown_table, ranking_lines,
                                      render_report_md)


def entry(name, accuracy, p50, *, size=100, params=1000, precision="fp32", baseline=False, model_dir=None,
          profiles=("cpu",)):
    return {"name": name, "accuracy": accuracy, "size_bytes": size, "params": params, "precision": precision,
            "baseline": baseline, "kind": "onnx", "model_dir": model_dir, "retention": accuracy, "agreement": 1.0,
            "latency": [{"profile": profile, "batch_size": 8, "sequence_length": "real", "p50_ms": p50,
                         "p90_ms": p50, "p99_ms": p50, "throughput": 8e3 / p50, "peak_rss_mb": 100.0}
                        for profile in profiles]}


def test_pareto_front_keeps_only_undominated_models():
    models = [entry("slow-good", 0.9, 10), entry("fast-bad", 0.7, 2), entry("dominated", 0.7, 5),
              entry("middle", 0.8, 4), entry("tie", 0.8, 4)]
    (front,) = pareto_fronts(models)
    assert front["models"] == ["fast-bad", "middle", "tie", "slow-good"]   # sorted by latency


def test_pareto_front_treats_tied_timings_as_equally_fast():
    # "noisy" is 0.1 ms faster than "accurate" at p50, but the paired statistics tie them: the
    # p50 decides nothing, so the less accurate one is beaten; untied, the p50 still counts.
    models = [entry("accurate", 0.8, 4.1), entry("noisy", 0.7, 4.0), entry("fast", 0.6, 2), entry("same", 0.8, 4.2)]
    rankings = [{"profile": "cpu", "batch_size": 8, "sequence_length": "real",
                 "ties": [["noisy", "accurate"], ["accurate", "same"]]}]
    (front,) = pareto_fronts(models, rankings)
    assert front["models"] == ["fast", "accurate", "same"]     # tied at equal accuracy: both stay
    (untied,) = pareto_fronts(models)
    assert untied["models"] == ["fast", "noisy", "accurate"]
    other = [{**rankings[0], "batch_size": 1}]                  # another measurement's ties do not apply
    assert pareto_fronts(models, other) == [untied]


def config_dir(tmp_path, name, layers_params):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"hidden_size": 10, "vocab_size": 50, "max_position_embeddings": 10,
                                                  "type_vocab_size": 0}))
    return str(path)


def test_warnings_name_savings_the_runtime_did_not_turn_into_speed(tmp_path):
    teacher_dir = config_dir(tmp_path, "teacher", None)
    base = entry("onnxruntime-fp32", 0.8, 10.0, size=1000, params=1200, baseline=True)
    models = [base,
              # (embeddings: 60 rows x 10 = 600 params) 600 -> 200 encoder params (3x less compute) but only 1.1x faster: warned
              entry("shallow", 0.78, 9.0, params=800, size=700, model_dir=config_dir(tmp_path, "s", None)),
              # same compute, 4x smaller file, no faster: warned about bytes
              entry("int4", 0.8, 10.0, params=1200, size=250, precision="int4-weight-only",
                    model_dir=config_dir(tmp_path, "q", None)),
              # fp16 on a CPU profile that does not list fp16
              entry("half", 0.8, 5.0, params=1200, size=500, precision="fp16", model_dir=config_dir(tmp_path, "h", None)),
              # fewer params and as fast as expected: no warning
              entry("good", 0.78, 3.5, params=800, size=700, model_dir=config_dir(tmp_path, "g", None))]
    report = {"teacher": {"path": teacher_dir, "params": 1200}, "models": models,
              "benchmark": {"profiles": [{"name": "cpu", "precisions": ["fp32", "int8"]}]}}
    warnings = runtime_warnings(report)
    assert any(w.startswith("shallow removed 67% of the encoder's parameters") and "1.11x" in w for w in warnings)
    assert any(w.startswith("int4 is 75% smaller than onnxruntime-fp32 but only 1.00x as fast") for w in warnings)
    assert any(w.startswith("half is fp16, which profile cpu does not run fast") for w in warnings)
    assert not any(w.startswith("good") for w in warnings)
    assert not any("scope: linears" in w for w in warnings)
    # a baseline's precision is judged too (Optimum's int8 on a profile listing fp32 only)
    report["models"].append(entry("optimum-default-int8", 0.8, 6.0, precision="dynamic-int8", baseline=True))
    report["benchmark"]["profiles"][0]["precisions"] = ["fp32"]
    assert any(w.startswith("optimum-default-int8 is dynamic-int8, which profile cpu does not run fast")
               for w in runtime_warnings(report))


def test_a_slow_static_int8_graph_is_told_why():
    base = entry("onnxruntime-fp32", 0.8, 10.0, size=1000, params=1200, baseline=True)
    slow = entry("static", 0.8, 28.0, size=250, params=1200, precision="static-int8")
    slow["onnx"] = {"quantization": {"mode": "static-int8", "scope": "ops"}}
    linear = entry("linears", 0.8, 10.5, size=250, params=1200, precision="static-int8")
    linear["onnx"] = {"quantization": {"mode": "static-int8", "scope": "linears"}}
    report = {"teacher": {"path": None, "params": 1200}, "models": [base, slow, linear],
              "benchmark": {"profiles": [{"name": "cpu", "precisions": ["fp32", "int8"]}]}}
    warnings = runtime_warnings(report)
    (static,) = [w for w in warnings if w.startswith("static ")]
    assert "0.36x as fast" in static and "use scope: linears" in static
    (linears,) = [w for w in warnings if w.startswith("linears ")]
    assert "scope" not in linears


def test_markdown_report_has_every_section():
    models = [entry("a", 0.8, 3.0), entry("onnxruntime-fp32", 0.81, 6.0, baseline=True)]
    report = {"recipe": {"name": "r"}, "teacher": {"path": "t", "accuracy": 0.81, "params": 1000, "size_bytes": 100},
              "models": models, "pareto": pareto_fronts(models), "warnings": ["w1"],
              "benchmark": {"skipped": [{"profile": "arm64", "reason": "needs arm"}]},
              "environment": {"cpu": {"model": "X", "cores": 2, "flags": ["avx2"]}, "packages": {"torch": "2"}}}
    md = render_report_md(report, "pareto.png")
    for text in ("# Report: r", "## Models", "## Latency: profile cpu, batch 8, sequence real",
                 "| a | 0.8000 | 3.00 |", "2.00x", "![Pareto chart](pareto.png)", "arm64: needs arm", "- w1",
                 "CPU: X (2 cores"):
        assert text in md, text


def test_the_reports_are_replaced_together_or_not_at_all(tmp_path, monkeypatch):
    """report.json was written before the chart rendered (seconds): a stop then left it beside
    the report.md and .html of the run before."""
    from compressor.report import render
    models = [entry("a", 0.8, 3.0), entry("b", 0.7, 2.0)]
    report = {"recipe": {"name": "r"}, "teacher": {"path": "t", "accuracy": 0.81, "params": 1000, "size_bytes": 100},
              "models": models, "pareto": pareto_fronts(models), "warnings": [], "environment": {}}
    render.write_reports(report, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["pareto.png", "report.html", "report.json", "report.md"]

    def stop(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(render, "render_report_html", stop)
    with pytest.raises(KeyboardInterrupt):
        render.write_reports({**report, "warnings": ["new"]}, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before     # no temporaries either
    monkeypatch.undo()
    unmeasured = {**report, "models": [{**m, "latency": []} for m in models], "pareto": []}
    render.write_reports(unmeasured, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json", "report.md"]
    assert json.loads((tmp_path / "report.json").read_text()) == unmeasured


def test_the_compute_warning_compares_multiply_adds_with_speed():
    base = entry("onnxruntime-fp32", 0.8, 10.0, size=1000, params=1200, baseline=True)
    slow = {**entry("slow", 0.78, 9.0, params=1100, size=900), "flops": 1000}    # 3x less compute, 1.11x faster
    fast = {**entry("fast", 0.78, 4.0, params=1100, size=900), "flops": 1000}    # 2.5x faster: as expected
    report = {"teacher": {"path": None, "params": 1200, "flops": 3000}, "models": [base, slow, fast],
              "benchmark": {"profiles": [{"name": "cpu", "precisions": ["fp32", "int8"]}]}}
    warnings = runtime_warnings(report)
    assert ("slow needs 67% fewer multiply-adds per example than the teacher (3.0x less compute) but runs only "
            "1.11x as fast as onnxruntime-fp32 on cpu at batch 8") in warnings
    assert not any(w.startswith("fast") for w in warnings)


def test_unstructured_sparsity_is_always_warned_about():
    base = entry("onnxruntime-fp32", 0.8, 10.0, size=1000, params=1200, baseline=True)
    sparse = {**entry("sparse", 0.78, 5.0, size=1000, params=1200), "flops": 3000, "sparsity": 0.9,
              "compressed_size_bytes": 400}
    report = {"teacher": {"path": None, "params": 1200, "flops": 3000}, "models": [base, sparse],
              "benchmark": {"profiles": [{"name": "cpu", "precisions": ["fp32", "int8"]}]}}
    table = markdown_table({**report, "teacher": {**report["teacher"], "accuracy": 0.8, "size_bytes": 1000}})
    assert "| sparse | onnx | fp32 | 0.7800 | - | 0.780 | 1.000 | 1,200 | 0.0 | 0.0 | 0.0 |" in table
    (warning,) = runtime_warnings(report)   # even though it measured faster here (noise, or another change)
    assert warning.startswith("sparse has 90% of its encoder weights at zero (unstructured sparsity): "
                              "dense runtimes do not run it faster; 2.00x as fast as onnxruntime-fp32 on cpu")
    assert warning.endswith("the saving is compressed size (0.0 MB compressed vs 0.0 MB as stored)")


def test_shared_layers_are_said_to_save_size_not_time():
    """share-layers keeps every layer's compute: the report says the file shrank but no speed-up is due."""
    base = entry("onnxruntime-fp32", 0.8, 10.0, size=1000, params=1200, baseline=True)
    shared = {**entry("shared", 0.75, 8.0, size=630, params=700), "flops": 3000,
              "passes": [{"pass": "share-layers", "config": {"mode": "all", "groups": 1}},
                         {"pass": "finetune", "config": {}}]}
    plain = {**entry("plain", 0.8, 8.0, size=1000, params=1200), "flops": 3000,
             "passes": [{"pass": "finetune", "config": {}}]}
    report = {"teacher": {"path": None, "params": 1200, "flops": 3000}, "models": [base, shared, plain],
              "benchmark": {"profiles": [{"name": "cpu", "precisions": ["fp32", "int8"]}]}}
    (warning,) = runtime_warnings(report)
    assert warning == ("shared shares layer weights (share-layers): it is 37% smaller than onnxruntime-fp32, "
                       "but every layer still runs, so expect no speed-up from the sharing itself; 1.25x as "
                       "fast as onnxruntime-fp32 on cpu at batch 8")


def test_ranking_names_ties_between_models_of_neighbouring_groups():
    # b ties a (the fastest) and joins its group; c does not tie a, so it starts a group, yet
    # it ties b: '<' between the groups must not read as 'c is clearly slower than b'.
    ranking = {"profile": "cpu", "batch_size": 8, "sequence_length": "real",
               "groups": [{"models": ["a", "b"], "vs_previous_group": None},
                          {"models": ["c"], "vs_previous_group": {"ratio": 1.06}}],
               "ties": [["a", "b"], ["b", "c"]]}
    line = ranking_lines({"rankings": [ranking]})[0]
    assert line == "cpu batch 8 sequence real: a = b < c (1.06x); tied across groups: b = c"
    ranking["ties"] = [["a", "b"]]
    assert "tied across" not in ranking_lines({"rankings": [ranking]})[0]


def test_the_report_says_where_and_when_cached_latencies_were_measured():
    models = [entry("a", 0.8, 3.0), entry("onnxruntime-fp32", 0.81, 6.0, baseline=True)]
    env = {"cpu": {"model": "X", "cores": 2, "flags": ["avx2"]}, "packages": {"torch": "2"}}
    report = {"recipe": {"name": "r"}, "teacher": {"path": "t", "accuracy": 0.81, "params": 1000, "size_bytes": 100},
              "models": models, "pareto": pareto_fronts(models), "flops_sequence_length": 16,
              "benchmark": {"profiles": [{"name": "cpu"}],
                            "environment": {**env, "date": "2026-01-01T00:00:00+00:00",
                                            "cpu": {"model": "Y", "cores": 4, "flags": []}}},
              "environment": {**env, "date": "2026-02-02T00:00:00+00:00"}}
    md = render_report_md(report, "pareto.png")
    measured = md.index("## Where and when the latencies were measured")
    written = md.index("## Environment (this report written)")
    assert md.index("date: 2026-01-01", measured) < written < md.index("date: 2026-02-02", written)
    assert "CPU: Y (4 cores" in md[measured:written]
    assert "M mult-adds (16 tokens)" in md and "peak RSS MiB" in md
    assert "compressed MB" not in md            # no sparse model: no empty column


def test_a_lower_precision_no_faster_than_its_fp32_twin_is_warned_about():
    """Against the unfused baseline an int8 graph may look fast (fusion alone does that); beside
    the same structure in fp32 it is not: the precision bought no speed."""
    def measured(name, p50, *, size, precision="fp32", flops=100, baseline=False):
        return {**entry(name, 0.8, p50, size=size, precision=precision, baseline=baseline), "flops": flops}
    models = [measured("onnxruntime-fp32", 10.0, size=1000, baseline=True),
              measured("fused", 6.0, size=1000),
              measured("int8", 5.8, size=250, precision="dynamic-int8"),          # 1.03x its twin: warned
              measured("fast-int8", 3.0, size=250, precision="dynamic-int8"),     # 2x its twin: fine
              measured("shallow-int8", 2.9, size=150, precision="dynamic-int8", flops=50)]   # no twin measured
    report = {"teacher": {"params": 1000, "flops": 100}, "models": models,
              "benchmark": {"profiles": [{"name": "cpu", "precisions": ["fp32", "int8"]}]}}
    warnings = runtime_warnings(report)
    assert [w for w in warnings if "fp32)" in w] == [
        "int8 is dynamic-int8 and 75% smaller than fused (the same structure in fp32), but only 1.03x as fast "
        "on cpu at batch 8: the precision buys no speed there"]


def test_the_fp32_twin_check_needs_no_baseline():
    """Without onnxruntime-fp32 among the baselines there is no speedup to judge bytes by, but
    a lower precision slower than the same structure in fp32, timed in the same run, is still told."""
    models = [{**entry("as-is", 0.8, 34.3, size=1000), "flops": 100},
              {**entry("half", 0.8, 41.5, size=500, precision="fp16"), "flops": 100},
              entry("pytorch-eager-fp32", 0.8, 50.0, size=1000, baseline=True)]
    report = {"teacher": {"params": 1000, "flops": 100}, "models": models,
              "benchmark": {"profiles": [{"name": "cpu", "precisions": ["fp32", "fp16"]}]}}
    assert runtime_warnings(report) == [
        "half is fp16 and 50% smaller than as-is (the same structure in fp32), but only 0.83x as fast "
        "on cpu at batch 8: the precision buys no speed there"]


SETTINGS = {"activations_dtype": "QUInt8", "weights_dtype": "QInt8", "per_channel": True, "reduce_range": False,
            "operators_to_quantize": ["MatMul"]}
BUILDS = {"avx2": {"path": "o-avx2", "accuracy": 0.18, "size_bytes": 100, "settings": SETTINGS},
          "avx512_vnni": {"path": "o-vnni", "accuracy": 0.17, "size_bytes": 90, "settings": SETTINGS}}
PRESETS = {"avx2-1t": "avx2", "vnni": "avx512_vnni"}


def optimum_entry(p50, profiles):
    """The Optimum baseline timed on profiles of different presets, each against its own
    preset's build; the entry itself is the first profile's build, as report_data writes it."""
    first = PRESETS[profiles[0]]
    optimum = {"preset": first, "profiles": {p: PRESETS[p] for p in profiles}, "builds": BUILDS}
    return {**entry("optimum-default-int8", BUILDS[first]["accuracy"], p50, size=BUILDS[first]["size_bytes"],
                    precision="dynamic-int8", baseline=True, profiles=profiles), "optimum": optimum}


def test_each_profile_judges_the_optimum_baseline_by_its_own_presets_build():
    """A profile's front and latency table use the accuracy of the build that profile timed,
    whichever profile comes first (and so gives the entry its accuracy)."""
    for profiles in (("avx2-1t", "vnni"), ("vnni", "avx2-1t")):
        models = [entry("v", 0.175, 10.0, profiles=profiles), optimum_entry(5.0, profiles)]
        fronts = {f["profile"]: f["models"] for f in pareto_fronts(models)}
        # avx2's build (0.18) beats v on both counts; avx512_vnni's (0.17) is faster but less accurate
        assert fronts == {"avx2-1t": ["optimum-default-int8"], "vnni": ["optimum-default-int8", "v"]}, profiles
        report = {"models": models, "pareto": pareto_fronts(models)}
        accuracy = {profile: row[1] for profile in profiles
                    for row in latency_table(report, (profile, 8, "real"))[1] if row[0] == "optimum-default-int8"}
        assert accuracy == {"avx2-1t": "0.1800", "vnni": "0.1700"}, profiles
    (line,) = baseline_lines({"models": models})
    assert "preset avx2 (accuracy 0.1800, " in line and "preset avx512_vnni (accuracy 0.1700, " in line


def test_export_records_that_nothing_applied_are_warned_about():
    from compressor.report.analysis import recipe_warnings

    def variant(name, passes, exported):
        m = {"name": name, "baseline": False, "kind": "onnx" if exported else "torch",
             "precision": "int8" if exported else "fp32", "passes": [{"pass": p, "config": c} for p, c in passes]}
        return {**m, "onnx": {}} if exported else m
    quantized = [("quantize", {"mode": "dynamic-int8"})]
    after_qat = [("qat", {"epochs": 1}), ("quantize", {"mode": "dynamic-int8"})]
    warnings = recipe_warnings([variant("int8", quantized, exported=False), variant("q", quantized, exported=True),
                                variant("plain", [("finetune", {})], exported=False),
                                variant("qat-dyn", after_qat, exported=True),
                                variant("qat-static", [after_qat[0], ("quantize", {"mode": "static-int8"})], True),
                                variant("qat-alone", after_qat[:1], exported=True)])
    assert len(warnings) == 2
    assert warnings[0].startswith("int8: quantize recorded what the ONNX export should do, and this run exported "
                                  "nothing, so it is scored and timed as its fp32 PyTorch model")
    assert warnings[1].startswith("qat-dyn: qat learned int8 activation ranges, and the quantize after it "
                                  "(dynamic-int8) does not use them")


def test_a_benchmark_that_measured_nothing_says_why():
    """Every profile skipped here: the skipped section leads with why there is no latency (and
    which baselines were not built); with a profile measured, it lists the skips alone."""
    from compressor.report.render import unmeasured_lines
    skipped = [{"profile": "gpu-cuda-fp16", "reason": "no CUDA device is visible"}]
    assert unmeasured_lines({"profiles": [], "skipped": skipped, "baselines_not_built": ["onnxruntime-fp32"]}) == [
        "nothing was measured: every profile is skipped on this machine (below); the baselines onnxruntime-fp32 "
        "were not built, as nothing would measure them"]
    assert unmeasured_lines({"profiles": [], "skipped": skipped, "baselines_not_built": []}) == [
        "nothing was measured: every profile is skipped on this machine (below)"]
    assert unmeasured_lines({"profiles": [{"name": "cpu"}], "skipped": skipped}) == []


def test_the_models_table_says_how_many_test_examples_the_accuracies_come_from():
    report = {"recipe": {"name": "r"}, "models": [entry("a", 0.8, 3.0)], "environment": {},
              "teacher": {"path": "t", "accuracy": 0.81, "params": 1000, "size_bytes": 100, "eval_samples": 1250}}
    assert "## Models (accuracies on the same 1,250 test examples)\n" in render_report_md(report, None)


def test_scored_test_texts_that_train_holds_are_told_in_the_title_and_the_warnings():
    def report(in_train, pair_task=False):
        data = {"task": "t", "pair_task": pair_task, "examples": {"train": 10, "validation": 2, "test": 2},
                "texts_in_train": {"test": {"examples": 1250, "in_train": in_train, "other_label": 1}}}
        return {"recipe": {"name": "r"}, "models": [entry("a", 0.8, 3.0)], "environment": {}, "data": data,
                "teacher": {"path": "t", "accuracy": 0.81, "params": 1000, "size_bytes": 100, "eval_samples": 1250}}
    title = "## Models (accuracies on the same 1,250 test examples, 3 of them with a text the train split also holds)"
    assert title in render_report_md(report(3), None)
    assert "text pair the train split" in render_report_md(report(3, pair_task=True), None)
    (line,) = data_warnings(report(3))
    assert line.startswith("3 of the 1,250 test examples scored have a text that the train split also holds, "
                           "1 of them under another label there")
    assert "## Models (accuracies on the same 1,250 test examples)\n" in render_report_md(report(0), None)
    assert data_warnings(report(0)) == [] and data_warnings({"models": []}) == []     # none; an older report


def labelled_report(accuracies: dict[str, float]) -> dict:
    data = {"task": "reviews", "pair_task": False, "examples": {"train": 80, "validation": 10, "test": 10},
            "texts_in_train": {"test": {"examples": 10, "in_train": 0, "other_label": 0}},
            "labels": ["bad", "good", "so so"], "test_labels": {"bad": 2, "good": 8, "so so": 0},
            "most_frequent": {"label": "good", "accuracy": 0.8, "macro_f1": 0.4444}}
    models = [{**entry(name, accuracy, 3.0), "macro_f1": 0.25} for name, accuracy in accuracies.items()]
    return {"recipe": {"name": "r"}, "models": models, "environment": {}, "data": data,
            "teacher": {"path": "t", "accuracy": 0.9, "macro_f1": 0.8, "params": 1000, "size_bytes": 100}}


def test_the_models_table_has_macro_f1_beside_accuracy_and_the_labels_are_told():
    """report.md showed accuracy alone and named no label: on imbalanced labels a model
    predicting the commonest one everywhere looked as good as its accuracy."""
    md = render_report_md(labelled_report({"small": 0.8}), None)
    assert "| model | kind | precision | accuracy | macro-F1 | retention |" in md
    assert "| teacher (PyTorch) | torch | fp32 | 0.9000 | 0.8000 | 1.000 |" in md
    assert "| small | onnx | fp32 | 0.8000 | 0.2500 | 0.800 |" in md
    assert ("## Task and labels\n\n- reviews: single texts; 80 train, 10 validation, 10 test examples; 3 labels\n"
            "- test examples scored, by label: 'good' 8 (80.0%), 'bad' 2 (20.0%), 'so so' 0 (0.0%)\n"
            "- always predicting the commonest, 'good', scores accuracy 0.8000 and macro-F1 0.4444\n") in md
    older = labelled_report({"small": 0.8})
    older["data"] = {k: older["data"][k] for k in ("task", "pair_task", "examples", "texts_in_train")}
    del older["models"][0]["macro_f1"]
    md = render_report_md(older, None)
    assert "Task and labels" not in md and "| small | onnx | fp32 | 0.8000 | - | 0.800 |" in md


def test_models_no_more_accurate_than_the_commonest_label_are_warned_about():
    (line,) = data_warnings(labelled_report({"small": 0.8, "tiny": 0.7, "fine": 0.85}))
    assert line.startswith("small, tiny: accuracy no higher than always predicting the commonest test label "
                           "'good' (0.8000, macro-F1 0.4444); compare macro-F1")
    assert data_warnings(labelled_report({"fine": 0.85})) == []


def test_latencies_timed_while_other_processes_used_the_cpus_are_warned_about():
    """A measurement is judged by its models' shares pooled over their timed seconds, one line
    per measurement naming the most contended; a short model's high reading alone (jiffy
    noise) is not warned about, and rows that do not record it (older reports) are not judged."""
    def timed(name, contention, batch=8, mean_ms=5.0):
        model = entry(name, 0.8, mean_ms)
        model["latency"][0].update(batch_size=batch, mean_ms=mean_ms, iterations=300,
                                   **({} if contention is None else {"contention": contention}))
        return model
    models = [timed("busy", 0.42), timed("also-busy", 0.351), timed("quiet", 0.02), timed("older", None),
              timed("short-at-1", 0.12, batch=1, mean_ms=0.5), timed("long-at-1", 0.02, batch=1, mean_ms=5.0)]
    report = {"teacher": {"path": None, "params": 1000}, "models": models,
              "benchmark": {"profiles": [{"name": "cpu", "precisions": ["fp32", "int8"]}]}}
    assert runtime_warnings(report) == [
        ("other processes used 26% of the CPUs while the models were timed on cpu at batch 8 (sequence real; "
         "most during busy 42%, also-busy 35%, quiet 2%); those latencies run high and may rank the models "
         "wrongly: rerun on a quiet machine")]


def test_a_scripts_measurement_records_its_contention_and_the_reports_line():
    """What a benchmark script records beside one measurement's stats: the median and worst
    share of its models (those known), and the report's line when the pooled share is high."""
    from compressor.report.analysis import measurement_contention
    row = {"p50_ms": 5.0, "mean_ms": 5.0, "iterations": 300}
    busy = measurement_contention({"a": {**row, "contention": 0.3}, "b": {**row, "contention": 0.5},
                                   "c": {**row, "contention": None}}, "cpu", 8)
    assert busy["contention"] == {"median": 0.4, "worst": 0.5, "measurements": 2}
    (line,) = busy["warnings"]
    assert line.startswith("other processes used 40% of the CPUs while the models were timed on cpu at batch 8 "
                           "(sequence real; most during b 50%, a 30%)")
    quiet = measurement_contention({"a": {**row, "contention": 0.02}}, "cpu", 1, 128)
    assert quiet == {"contention": {"median": 0.02, "worst": 0.02, "measurements": 1}, "warnings": []}
    assert measurement_contention({"a": {**row, "contention": None}}, "cpu", 1) == {"contention": None,
                                                                                   "warnings": []}


def test_a_benchmark_that_measured_nothing_has_no_where_and_when_section():
    env = {"cpu": {"model": "X", "cores": 2, "flags": []}, "packages": {}, "date": "2026-01-01T00:00:00+00:00"}
    report = {"recipe": {"name": "r"}, "models": [], "environment": env,
              "teacher": {"path": "t", "accuracy": 0.81, "params": 1000, "size_bytes": 100},
              "benchmark": {"profiles": [], "environment": env,
                            "skipped": [{"profile": "gpu-cuda-fp16", "reason": "no CUDA device is visible"}]}}
    md = render_report_md(report, None)
    assert "## Skipped profiles" in md and "nothing was measured" in md
    assert "Where and when the latencies were measured" not in md
    assert "## Environment\n" in md
