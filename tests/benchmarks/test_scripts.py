"""Every script in benchmarks/ runs at HEAD.

Each script is run in this process (runpy, as `python benchmarks/X.py ...` would run it, so
the heavy imports are paid once): every one parses `--help`, and every one also runs end to
end on a tiny budget and its output is checked. The scripts that read a finished recipe run
(deploy_latency, int8_side_by_side, harness_overhead, plain_speedups, repeatability,
quantization_accuracy, sharing_study) share one tiny run built by a module fixture.

The scripts that chain `compressor` commands (pretraining, pretraining_objectives) run their
steps in this process (`--in-process`: `compressor.cli.main` instead of one child process
per step, each paying the torch/transformers imports) on a 300-document corpus file, with a
tiny model (`--size tiny`), a 300-token vocabulary, 2 pretraining steps and fine-tunes of 16
train and 16 test examples; pretraining_objectives runs the mlm arm only (no random arm).
stream_memory measures in this process too (`--in-process`), on 20 and 40 kB corpora made
from that file with a 100-chunk shuffle buffer, the larger one through the resume path.
The subprocess paths of these three scripts are not run here: their default behaviour.
"""

from __future__ import annotations

import json
import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))


def run_script(name: str, args: list[str], monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / name), *map(str, args)])
    runpy.run_path(str(BENCHMARKS / name), run_name="__main__")


def run_script_exit(name: str, args: list[str], monkeypatch) -> None:
    """Run a script whose `__main__` ends in `sys.exit(main())`; it must exit 0."""
    with pytest.raises(SystemExit) as exit_:
        run_script(name, args, monkeypatch)
    assert exit_.value.code in (0, None)


def test_every_script_is_listed():
    assert "finetune_throughput.py" in SCRIPTS and len(SCRIPTS) >= 10


def test_finetune_throughput_mixed_precision_on_both_sides(tmp_path, monkeypatch):
    """A -bf16 mode of ours is compared with the Trainer's own bf16, an fp32 mode with its fp32;
    an fp32 Trainer that runs after a bf16 one (round 1) still trains in fp32."""
    out = tmp_path / "throughput.json"
    run_script("finetune_throughput.py", ["--rounds", 2, "--train-samples", 40, "--eval-samples", 16, "--threads", 1,
                                          "--modes", "sparse,sparse-bf16", "--trainer-precisions", "fp32,bf16",
                                          "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert result["compared_with"] == {"ours-sparse": "transformers-trainer",
                                       "ours-sparse-bf16": "transformers-trainer-bf16"}
    runs = result["rounds"][0]["runs"]
    assert runs["ours-sparse-bf16"]["train_config"]["precision"] == "bf16"
    assert runs["ours-sparse"]["train_config"]["precision"] == "fp32"
    assert result["rounds"][0]["ratio"]["ours-sparse-bf16"] == pytest.approx(
        runs["ours-sparse-bf16"]["samples_per_second"] / runs["transformers-trainer-bf16"]["samples_per_second"])
    assert result["rounds"][1]["order"][:2] == ["transformers-trainer-bf16", "transformers-trainer"]
    for r in result["rounds"]:
        assert r["runs"]["transformers-trainer"]["mixed_precision"] == "no"
        assert r["runs"]["transformers-trainer-bf16"]["mixed_precision"] == "bf16"
    by_side = result["trainer_arguments"]["differing_by_side"]
    assert by_side["transformers-trainer-bf16"]["bf16"] is True and "bf16" not in by_side["transformers-trainer"]


def test_finetune_throughput_trainer_with_eager_attention(tmp_path, monkeypatch):
    """A `-eager` Trainer side runs its model's attention in the eager form (as ours trains it),
    keeps its own precision, and every mode of ours gets a ratio to it."""
    out = tmp_path / "throughput.json"
    run_script("finetune_throughput.py", ["--rounds", 1, "--train-samples", 40, "--eval-samples", 16, "--threads", 1,
                                          "--modes", "sparse", "--trainer-precisions", "fp32,fp32-eager",
                                          "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    runs = result["rounds"][0]["runs"]
    assert runs["transformers-trainer-fp32-eager"]["eager_attention_modules"] > 0
    assert runs["transformers-trainer"]["eager_attention_modules"] == 0
    assert runs["transformers-trainer-fp32-eager"]["mixed_precision"] == "no"
    assert result["compared_with"] == {"ours-sparse": "transformers-trainer"}
    to_eager = result["summary"]["ratio_to"]["ours-sparse"]["transformers-trainer-fp32-eager"]
    assert to_eager["median"] == pytest.approx(
        runs["ours-sparse"]["samples_per_second"] / runs["transformers-trainer-fp32-eager"]["samples_per_second"])


@pytest.mark.parametrize("precisions", ["bf16-flash", "eager", "fp16"])
def test_finetune_throughput_refuses_unknown_trainer_side(monkeypatch, precisions):
    with pytest.raises(SystemExit) as exit_:
        run_script("finetune_throughput.py", ["--trainer-precisions", precisions], monkeypatch)
    assert exit_.value.code == 2


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(name, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_script(name, ["--help"], monkeypatch)
    assert exit_.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.strip(), f"{name} --help printed nothing"
    assert "usage" in out or "python benchmarks/" in out


def test_finetune_throughput_rounds(tmp_path, monkeypatch):
    out = tmp_path / "throughput.json"
    run_script("finetune_throughput.py", ["--rounds", 2, "--train-samples", 40, "--eval-samples", 16,
                                          "--threads", 1, "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert result["command"].startswith("python benchmarks/finetune_throughput.py --rounds 2")
    rounds = result["rounds"]
    assert [r["seed"] for r in rounds] == [0, 1]
    assert rounds[0]["order"] == ["ours-sparse", "transformers-trainer"]
    assert rounds[1]["order"] == ["transformers-trainer", "ours-sparse"]
    for r in rounds:
        ours, theirs = r["runs"]["ours-sparse"], r["runs"]["transformers-trainer"]
        for run in (ours, theirs):
            assert run["steps"] == 2 and run["samples"] == 40        # 40 examples at batch 32
            assert run["samples_per_second"] > 0 and run["seconds"] > 0
            assert 0 <= run["accuracy"] <= 1 and 0 <= run["macro_f1"] <= 1
            assert run["eval_samples"] == 16
            assert run["final_loss"] > 0
            assert run["threads"] == [1, 1]                         # the Trainer left them alone
        assert theirs["sampler"] == "LengthGroupedSampler"
        assert ours["last_layer_skipped"] is None                  # first token only, as finetune trains
        for run in (ours, theirs):   # 40 examples seen once each, padded to their batch's longest
            assert run["tokens"]["padded_tokens"] >= run["tokens"]["real_tokens"] > 40
            assert 0 <= run["tokens"]["padding_fraction"] < 1
        assert r["ratio"]["ours-sparse"] == pytest.approx(ours["samples_per_second"] / theirs["samples_per_second"])
    ratio = result["summary"]["ratio"]["ours-sparse"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"]
    assert len(result["summary"]["accuracy_difference"]["ours-sparse"]["per_seed"]) == 2
    differing = result["trainer_arguments"]["differing_from_defaults"]
    assert differing["group_by_length"] is True
    assert differing["weight_decay"] == 0.01 and differing["warmup_ratio"] == 0.06
    assert differing["learning_rate"] == 1e-4 and differing["per_device_train_batch_size"] == 32
    assert "environment" in result


@pytest.mark.parametrize("modes", ["sparse,fast", "sparse-whole-fast", "sparse-quick"])
def test_finetune_throughput_refuses_unknown_mode(monkeypatch, modes):
    with pytest.raises(SystemExit) as exit_:
        run_script("finetune_throughput.py", ["--modes", modes], monkeypatch)
    assert exit_.value.code == 2


def test_trained_samples_counts_short_last_batches():
    module = runpy.run_path(str(BENCHMARKS / "finetune_throughput.py"))
    assert module["trained_samples"](40, 32, 2) == 40
    assert module["trained_samples"](40, 32, 3) == 72        # a second epoch's first batch
    assert module["trained_samples"](64, 32, 4) == 128


def test_cls_variation(tmp_path, monkeypatch):
    out = tmp_path / "cls.json"
    run_script("cls_variation.py", ["--examples", 4, "--out", out], monkeypatch)
    record = json.loads(out.read_text())
    assert record["examples"] == 4
    assert len(record["cls_std_by_layer"]) == 7                 # embeddings + MiniLM's 6 layers
    assert all(v >= 0 for v in record["cls_std_by_layer"].values())


def test_collapse_probe(tmp_path, tiny_bert_dir, monkeypatch):
    out = tmp_path / "probe.json"
    run_script("collapse_probe.py", [tiny_bert_dir, "--out", out, "--note", "tiny"], monkeypatch)
    assert out.is_file()
    text = out.read_text()
    assert "input_dependence" in text and "tiny" in text


def test_headline(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- headline:start -->\nold\n<!-- headline:end -->\noutro\n")
    run_script("headline.py", [BENCHMARKS / "results" / "demo_report.json", "--readme", readme], monkeypatch)
    text = readme.read_text()
    assert text.startswith("intro\n<!-- headline:start -->\n") and text.endswith("<!-- headline:end -->\noutro\n")
    assert "old" not in text and "|" in text


def test_tokenizer_rates(tmp_path, wordnet_corpus_file, monkeypatch):
    out = tmp_path / "tokenizers.json"
    run_script("tokenizer_rates.py", ["--corpus", wordnet_corpus_file(300), "--vocab-sizes", 300,
                                      "--work", tmp_path / "work", "--out", out], monkeypatch)
    rows = json.loads(out.read_text())["rows"]
    assert [r["kind"] for r in rows] == ["wordpiece", "bpe", "wordlevel"]
    assert all(0 <= r["unk_token_rate"] <= 1 and r["tokens"] > 0 for r in rows)


# --- Scripts that read a finished recipe run: one tiny run (the teacher, the demo's `int8`
# variant, the three baselines; cpu profile, batch 1) shared by the module. The peak-memory
# probe (a fresh child process per model, seconds of imports each) is stubbed out: no script
# here reads it.

def no_memory_probe(model, profile, batch_sets, *args, **kwargs):
    return [100.0] * len(batch_sets)

def tiny_recipe(model_dir, csv_path) -> dict:
    return {"name": "tiny-scripts", "seed": 0,
            "teacher": {"model": str(model_dir), "task": {"path": str(csv_path)}},
            "data": {"max_eval_samples": 16},
            "variants": {"int8": [{"quantize": {"mode": "dynamic-int8", "per_channel": True}}]},
            "export": {"onnx": True, "optimize": True, "accuracy_tolerance": 1.0},
            "benchmark": {"profiles": ["cpu"], "batch_sizes": [1], "iterations": 4}}


@pytest.fixture(scope="module")
def finished_run(tiny_bert_dir, tiny_csv, tmp_path_factory):
    """(recipe file, run dir) of a finished tiny recipe run."""
    from compressor.bench import measure
    from compressor.pipeline import run as pipeline_run
    from compressor.pipeline import run_recipe
    from compressor.pipeline.recipe import parse_recipe
    root = tmp_path_factory.mktemp("scripts-run")
    recipe_file = root / "tiny.yaml"
    raw = tiny_recipe(tiny_bert_dir, tiny_csv)
    recipe_file.write_text(json.dumps(raw))                     # JSON is YAML
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline_run, "set_threads", lambda threads: None)
        mp.setattr(measure, "peak_rss_mb", no_memory_probe)
        recipe, steps = parse_recipe(raw)
        run_recipe(recipe, steps, root / "run", show_progress=False)
    return recipe_file, root / "run"


def timed_with_shares(monkeypatch, shares: list[float]) -> None:
    """Time for real, but record the i-th measurement's models as timed while other processes
    took shares[i] of the CPUs (the real shares on a shared test machine are whatever they are)."""
    import dataclasses

    from compressor.bench import timing
    real, calls = timing.time_interleaved, iter(shares)

    def timed_with_share(runners, batches, profile, **kwargs):
        timings = real(runners, batches, profile, **kwargs)
        return dataclasses.replace(timings, contention=dict.fromkeys(timings.times, next(calls)))
    monkeypatch.setattr(timing, "time_interleaved", timed_with_share)


def test_deploy_latency(finished_run, tmp_path, monkeypatch, capsys):
    """Also: its latencies recorded no CPU contention, as the report's and int8_side_by_side's
    do, and a busy machine went unsaid (here the graphs are timed as if others took half the CPUs)."""
    timed_with_shares(monkeypatch, [0.5])
    out = tmp_path / "deploy.json"
    run_script("deploy_latency.py", ["--run", finished_run[1], "--batch-size", 1, "--iterations", 4,
                                     "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert {m["contention"] for m in result["models"].values()} == {0.5}
    assert result["contention"] == {"median": 0.5, "worst": 0.5, "measurements": len(result["models"])}
    (line,) = result["warnings"]
    assert line.startswith("other processes used 50% of the CPUs while the models were timed on cpu at batch 1 ")
    assert f"warning: {line}\n" in capsys.readouterr().err
    assert set(result["models"]) == {"teacher-fp32-fused", "onnxruntime-fp32", "optimum-default-int8",
                                     "int8 (dynamic-int8)", "teacher-half-heads-half-ffn-fp32-fused"}
    for name, m in result["models"].items():
        assert 0 < m["p50_ms"] and m["size_bytes"] > 0, name
    assert result["eval_samples"] == 16
    ratios = result["ratios"]
    assert {"half_structure_vs_unsliced", "dynamic_int8_vs_fp32_fused", "ours_int8_vs_optimum_default_int8",
            "int8_file_size_vs_fp32"} <= set(ratios)
    assert all(v > 0 for k, v in ratios.items() if k != "ours_minus_optimum_accuracy")
    assert ratios["int8_file_size_vs_fp32"] < 1


def test_int8_side_by_side(finished_run, tmp_path, monkeypatch, capsys):
    """Also: its latencies recorded no CPU contention, as the report's and `compressor bench`'s
    do, and a busy machine went unsaid. Batch 2 is timed as if quiet, batch 1 as if others
    took half the CPUs (the real shares on a shared test machine are whatever they are)."""
    import dataclasses

    from compressor.bench import timing
    real = timing.time_interleaved

    def timed_with_share(runners, batches, profile, **kwargs):
        timings = real(runners, batches, profile, **kwargs)
        share = 0.5 if len(batches[0]["input_ids"]) == 1 else 0.0
        return dataclasses.replace(timings, contention=dict.fromkeys(timings.times, share))
    monkeypatch.setattr(timing, "time_interleaved", timed_with_share)
    out = tmp_path / "side.json"
    run_script("int8_side_by_side.py", ["--run", finished_run[1], "--batch-sizes", "2,1", "--iterations", 4,
                                        "--eval-samples", 16, "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    quiet, busy = result["latency"]["2"], result["latency"]["1"]
    count = len(result["graphs"])
    assert quiet["contention"] == {"median": 0.0, "worst": 0.0, "measurements": count} and quiet["warnings"] == []
    assert busy["contention"] == {"median": 0.5, "worst": 0.5, "measurements": count}
    assert {s["contention"] for s in quiet["stats"].values()} == {0.0}
    (line,) = busy["warnings"]
    assert line.startswith("other processes used 50% of the CPUs while the models were timed on cpu at batch 1 ")
    assert result["warnings"] == [line] and f"warning: {line}\n" in capsys.readouterr().err
    graphs = result["graphs"]
    preset = result["optimum_preset"]["preset"]
    assert f"Optimum {preset} preset (the baseline)" in graphs and "ours (s8, per-channel, our ops)" in graphs
    assert graphs["fp32, fused (ours)"]["agreement_with_fp32"] == 1.0
    for name, g in graphs.items():
        assert 0 <= g["accuracy"] <= 1 and g["size_mb"] > 0, name
    # int8 graphs are smaller than fp32 and carry integer kernels; the fp32 ones do not.
    fp32 = graphs["fp32, fused (ours)"]["size_mb"]
    assert graphs["ours (s8, per-channel, our ops)"]["size_mb"] < 0.5 * fp32
    assert "DynamicQuantizeMatMul" in graphs["ours, per-tensor"]["ops"] or \
        "MatMulInteger" in graphs["ours, per-tensor"]["ops"]
    assert not any("Integer" in op or "Quantize" in op for op in graphs["fp32, Optimum O2"]["ops"])
    stats = result["latency"]["2"]["stats"]
    assert set(stats) == set(graphs) and all(s["p50_ms"] > 0 for s in stats.values())


def test_harness_overhead(finished_run, tmp_path, monkeypatch, capsys):
    """Also: the harness's repeats recorded no CPU contention beside their p50s, nor did the
    bare loop beside its own, and a busy machine went unsaid (here others took 40% of the CPUs
    in the first harness repeat, 60% in the second, 20% and 30% in the bare loops)."""
    from compressor.bench import contention
    timed_with_shares(monkeypatch, [0.4, 0.6])
    bare_shares, windows = iter([0.0, 0.2, 0.3]), []      # the first: the untimed warm-up loop's

    def bare_share(spent):             # the bare loops' windows, read for real; their shares as above
        windows.append(spent)
        return next(bare_shares)
    monkeypatch.setattr(contention, "others_share", bare_share)    # the harness's timing keeps its own
    out = tmp_path / "overhead.json"
    run_script("harness_overhead.py", ["--run", finished_run[1], "--batch-size", 1, "--iterations", 4,
                                       "--repeats", 2, "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert result["harness_contention"] == [0.4, 0.6] and result["bare_contention"] == [0.2, 0.3]
    assert len(windows) == 3 and all(w is not None and w.wall_s > 0 for w in windows)
    assert result["contention"] == {"median": 0.35, "worst": 0.6, "measurements": 4}
    (line,) = result["warnings"]
    assert re.match(r"other processes used ([2-5]\d|60)% of the CPUs while the models were timed on cpu at batch 1 "
                    rf"\(sequence real; most during {re.escape(result['model'])} \(harness, repeat 2\) 60%, ", line), line
    assert f"{result['model']} (bare loop, repeat 2) 30%" in line
    assert f"warning: {line}\n" in capsys.readouterr().err
    assert result["model"] in ("int8", "onnxruntime-fp32", "optimum-default-int8")
    assert len(result["harness_p50_ms"]) == len(result["bare_p50_ms"]) == 2
    assert all(v > 0 for v in result["harness_p50_ms"] + result["bare_p50_ms"])
    assert result["overhead"] > -1 and isinstance(result["under_2_percent"], bool)


def test_plain_speedups(finished_run, tmp_path, monkeypatch):
    out = tmp_path / "plain.json"
    run_script("plain_speedups.py", ["--run", finished_run[1], "--batch-size", 1, "--iterations", 6,
                                     "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert set(result["plain_p50_ms"]) == {"pytorch-eager-fp32", "onnxruntime-fp32", "optimum-default-int8"}
    assert all(v > 0 for v in result["plain_p50_ms"].values())
    for name, c in result["speedups_over_pytorch_eager_fp32"].items():
        assert c["plain_speedup"] > 0 and c["report_speedup"] > 0 and c["relative_difference"] >= 0, name
    assert isinstance(result["within_15_percent"], bool)


def test_repeatability(finished_run, tmp_path, monkeypatch):
    from compressor.bench import measure
    from compressor.pipeline import run as pipeline_run
    recipe_file, run_dir = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)                             # the rebenchmark rewrites the report
    monkeypatch.setattr(pipeline_run, "set_threads", lambda threads: None)
    monkeypatch.setattr(measure, "peak_rss_mb", no_memory_probe)
    out = tmp_path / "repeat.json"
    run_script("repeatability.py", [recipe_file, "--run", copy, "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    [measurement] = result["measurements"]
    assert (measurement["profile"], measurement["batch_size"]) == ("cpu", 1)
    assert len(measurement["ranking"]) == 2
    assert sorted(measurement["ranking"][0]) == sorted(measurement["ranking"][1]) == sorted(
        ["int8", "pytorch-eager-fp32", "onnxruntime-fp32", "optimum-default-int8"])
    assert measurement["max_relative_change"] >= 0 and isinstance(result["repeatable"], bool)


def test_quantization_accuracy(finished_run, tiny_csv, tmp_path, monkeypatch):
    out = tmp_path / "quant.json"
    teacher = json.loads((finished_run[1] / "report.json").read_text())["teacher"]["path"]
    run_script_exit("quantization_accuracy.py", [
        "--teacher", teacher, "--task", tiny_csv, "--eval-samples", 16,
        "--only", "dynamic-int8-per-channel", "--work", tmp_path / "work", "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert result["eval_samples"] == 16 and result["task"] == str(tiny_csv)
    rows = {r["name"]: r for r in result["results"]}
    assert list(rows) == ["fp32", "dynamic-int8-per-channel"]
    for name, row in rows.items():
        assert "error" not in row, row
        assert 0 <= row["accuracy"] <= 1 and 0 <= row["agreement_with_teacher_fp32"] <= 1, name
    assert rows["fp32"]["agreement_with_teacher_fp32"] == 1.0
    assert rows["dynamic-int8-per-channel"]["size_bytes"] < rows["fp32"]["size_bytes"]


def test_shallow_students(finished_run, tiny_csv, tmp_path, monkeypatch):
    out = tmp_path / "students.json"
    teacher = json.loads((finished_run[1] / "report.json").read_text())["teacher"]["path"]
    from compressor.bench import measure
    monkeypatch.setattr(measure, "peak_rss_mb", no_memory_probe)
    args = ["--teacher", teacher, "--task", tiny_csv, "--kinds", "cnn", "--embedding-dim", 16,
            "--train-samples", 16, "--epochs", 1,
            "--eval-samples", 16, "--work", tmp_path / "work", "--out", out]
    run_script_exit("shallow_students.py", args, monkeypatch)
    first = json.loads(out.read_text())
    assert [r["name"] for r in first["results"]] == ["teacher", "cnn-distilled", "cnn-labels-only"]
    assert first["results"][0]["retention"] == 1.0 and first["latency"] is None
    assert all(r["family"] == "textcnn" and r["size_bytes"] > 0 for r in first["results"][1:])
    # --reuse keeps the exported students and only adds the timing.
    run_script_exit("shallow_students.py", [*args, "--reuse", "--latency", "--batch-size", 2, "--iterations", 3],
                    monkeypatch)
    second = json.loads(out.read_text())
    assert [r["accuracy"] for r in second["results"]] == [r["accuracy"] for r in first["results"]]
    assert set(second["latency"]["vs_teacher"]) == {"cnn-distilled", "cnn-labels-only"}
    assert all(v > 0 for v in second["latency"]["vs_teacher"].values())
    with pytest.raises(SystemExit) as refused:      # the augmented arm needs a masked LM
        run_script("shallow_students.py", [*args, "--arms", "distilled-augment"], monkeypatch)
    assert refused.value.code == 2
    with pytest.raises(SystemExit) as refused:      # the unlabeled arms need --unlabeled
        run_script("shallow_students.py", [*args, "--arms", "distilled-mixed-unlabeled"], monkeypatch)
    assert refused.value.code == 2
    run_script_exit("shallow_students.py", [*args, "--reuse", "--arms", "labels-only", "distilled-mixed-unlabeled",
                                            "distilled-kl-unlabeled", "--unlabeled", 16], monkeypatch)
    third = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert list(third) == ["teacher", "cnn-labels-only", "cnn-distilled-mixed-unlabeled", "cnn-distilled-kl-unlabeled"]
    assert third["cnn-labels-only"] == {**second["results"][2], "retention": third["cnn-labels-only"]["retention"]}
    assert 0 <= third["cnn-distilled-mixed-unlabeled"]["accuracy"] <= 1
    assert 0 <= third["cnn-distilled-kl-unlabeled"]["accuracy"] <= 1
    # --seed reaches the students: another seed trains another network, and is recorded
    seeded_out = tmp_path / "seed1.json"
    run_script_exit("shallow_students.py", [*args[:-4], "--work", tmp_path / "seed1", "--out", seeded_out,
                                            "--arms", "labels-only", "--seed", 1], monkeypatch)
    assert json.loads(seeded_out.read_text())["seed"] == 1
    assert ((tmp_path / "seed1" / "cnn-labels-only" / "model.onnx").read_bytes()
            != (tmp_path / "work" / "cnn-labels-only" / "model.onnx").read_bytes())


def test_latency_model(finished_run, tiny_csv, tmp_path, monkeypatch):
    from compressor.search import structures
    monkeypatch.setattr(structures, "BATCHES", 2)
    monkeypatch.setattr(structures, "CALLS_PER_BATCH", 2)
    out = tmp_path / "latency.json"
    teacher = json.loads((finished_run[1] / "report.json").read_text())["teacher"]["path"]
    args = ["--teacher", teacher, "--task", tiny_csv, "--batch-sizes", 2, "--fit", 2, "--held-out", 2,
            "--work", tmp_path / "work", "--out", out]
    run_script_exit("latency_model.py", [*args, "--export-only"], monkeypatch)
    exported = sorted(p.name for p in (tmp_path / "work").iterdir())
    assert len(exported) >= 6 and not out.exists()         # whole teacher + 2 + 2, in fp32 and int8
    run_script_exit("latency_model.py", args, monkeypatch)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == exported   # every export reused
    result = json.loads(out.read_text())
    assert result["held_out_structures"] >= 1 and result["median_abs_relative_error"] >= 0
    assert set(result["model"]["coefficients"]) == {"fp32", "int8"} and result["environment"]["cpu"]
def test_theseus_study(finished_run, tmp_path, monkeypatch):
    from compressor.bench import measure
    monkeypatch.setattr(measure, "peak_rss_mb", no_memory_probe)
    teacher = json.loads((finished_run[1] / "report.json").read_text())["teacher"]["path"]
    common = ["--teacher", teacher, "--eval-samples", 16, "--work", tmp_path / "work"]
    out = tmp_path / "theseus.json"
    run_script_exit("theseus_study.py", [*common, "--successor-layers", 2, "--train-samples", 16,
                                         "--runs", "teacher", "theseus", "--out", out],
                    monkeypatch)
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["results"]}
    assert list(rows) == ["teacher", "theseus"] and result["eval_samples"] == 16
    assert rows["teacher"]["retention"] == 1.0 and rows["teacher"]["layers"] == 4
    assert rows["theseus"]["layers"] == 2 and rows["theseus"]["model_class"] == rows["teacher"]["model_class"]
    assert rows["theseus"]["passes"] == [["theseus", {"successor_layers": 2, "epochs": 1.0, "max_train_samples": 16,
                                                      "schedule": "linear"}]]
    assert all(0 <= r["accuracy"] <= 1 and r["optimized"] for r in rows.values())
    latency = tmp_path / "latency.json"
    run_script_exit("theseus_study.py", [*common, "--latency", "--iterations", 4, "--out", latency], monkeypatch)
    timed = json.loads(latency.read_text())
    assert {r["model"] for r in timed["rows"]} == {"teacher", "theseus"}
    assert {r["batch_size"] for r in timed["rows"]} == {8} and timed["p50_ratio_student_vs_teacher"] > 0


# --- Scripts that train or stream a corpus: the smallest budget their flags allow.

def test_static_embeddings(tmp_path, wordnet_corpus_file, monkeypatch):
    monkeypatch.chdir(tmp_path)                                # the script moves to the repository
    out = tmp_path / "embeddings.json"
    run_script("static_embeddings.py", ["--corpus", wordnet_corpus_file(300), "--min-count", 2, "--dim", 8,
                                        "--steps", 5, "--work", tmp_path / "work", "--out", out], monkeypatch)
    whole = json.loads(out.read_text())["whole_corpus"]
    assert whole["steps"] == 5 and whole["dim"] == 8 and whole["vocab_size"] > 50
    assert whole["final_loss"] > 0 and "--min-count 2" in whole["cli"]
    assert whole["nearest_neighbours"] and "geometry" in whole


def test_collapse_variants(tmp_path, wordnet_corpus_file, monkeypatch):
    import pretrain.objectives.span as span
    monkeypatch.setattr(span, "bert_config", span.bert_config)             # restored after the test:
    monkeypatch.setattr(span.SpanObjective, "loss", span.SpanObjective.loss)  # the script patches them
    corpus = wordnet_corpus_file(300)
    tok = tmp_path / "tok"
    run_script_exit("collapse_variants.py", ["nosbo", "tokenizer", "--corpus", corpus, "--kind", "wordpiece",
                                             "--vocab-size", 300, "--out", tok], monkeypatch)
    out = tmp_path / "span"
    run_script_exit("collapse_variants.py", ["nosbo", "pretrain", "--objective", "span", "--corpus", corpus,
                                             "--size", "tiny", "--tokenizer", tok, "--steps", 2, "--batch-size", 4,
                                             "--max-length", 32, "--threads", 1, "--out", out], monkeypatch)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["final_loss"] > 0


def test_finetune_strategies(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch):
    out = tmp_path / "strategies.json"
    run_script("finetune_strategies.py", ["--runs", "frozen", "--model", tiny_bert_dir, "--task", tiny_csv,
                                          "--train-samples", 32, "--max-eval-samples", 16,
                                          "--work", tmp_path / "work", "--out", out], monkeypatch)
    record = json.loads(out.read_text())
    [row] = record["runs"]
    assert "error" not in row, row.get("error")
    assert row["name"] == "frozen" and row["strategy"] == "frozen" and row["samples"] == 16
    assert 0 <= row["accuracy"] <= 1 and row["steps"] == 1
    assert row["lr"] == 3e-2 and "--lr" not in row["command"]     # the strategy's default rate
    assert 0 < row["trainable_params"] < row["total_params"]
    assert record["settings"]["target_steps"] == 1


def test_sparsity_study(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch):
    out = tmp_path / "sparsity.json"
    run_script_exit("sparsity_study.py", ["--teacher", tiny_bert_dir, "--task", tiny_csv, "--sparsities", 0.5,
                                          "--train-samples", 32, "--eval-samples", 16, "--int8",
                                          "--only", "movement-0.5", "teacher",
                                          "--work", tmp_path / "work", "--out", out], monkeypatch)
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert list(rows) == ["movement-0.5", "teacher"]
    moved, teacher = rows["movement-0.5"], rows["teacher"]
    assert "error" not in moved, moved.get("error")
    assert moved["encoder_sparsity"] == pytest.approx(0.5, abs=1e-3) and teacher["encoder_sparsity"] == 0
    assert moved["config"]["max_train_samples"] == 32 and moved["eval_samples"] == 16
    assert moved["fp32_size_bytes"] == teacher["fp32_size_bytes"]             # zeros are stored densely
    assert moved["fp32_compressed_size_bytes"] < teacher["fp32_compressed_size_bytes"]
    assert moved["int8_compressed_size_bytes"] < teacher["int8_compressed_size_bytes"]
    assert 0 <= moved["accuracy"] <= 1 and "--train-samples 32" in moved["command"]
    # another seed: its own row (and resume dir) beside seed 0's, which stays as it was
    run_script_exit("sparsity_study.py", ["--teacher", tiny_bert_dir, "--task", tiny_csv, "--sparsities", 0.5,
                                          "--train-samples", 32, "--eval-samples", 16, "--seed", 1,
                                          "--only", "movement-0.5-seed1", "--work", tmp_path / "work", "--out", out],
                    monkeypatch)
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert list(rows) == ["movement-0.5", "teacher", "movement-0.5-seed1"] and rows["movement-0.5"] == moved
    assert "error" not in rows["movement-0.5-seed1"] and "--seed 1" in rows["movement-0.5-seed1"]["command"]
    assert rows["movement-0.5-seed1"]["seed"] == 1 and moved["seed"] == 0
    assert sorted(p.name for p in (tmp_path / "work" / "resume").iterdir()) == [
        "movement-0.5-from-teacher", "movement-0.5-seed1-from-teacher"]


def test_sparsity_study_fine_prunes_the_pretrained_encoder(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch):
    out = tmp_path / "sparsity.json"
    run_script_exit("sparsity_study.py", ["--teacher", tiny_bert_dir, "--task", tiny_csv, "--sparsities", 0.5,
                                          "--start", "pretrained", "--pretrained", tiny_bert_dir, "--soft-targets",
                                          "--methods", "magnitude", "dense", "--train-samples", 32,
                                          "--eval-samples", 16, "--work", tmp_path / "work", "--out", out],
                    monkeypatch)
    data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["results"]}
    assert list(rows) == ["magnitude-0.5", "dense", "teacher"] and data["start"] == "pretrained"
    pruned, dense = rows["magnitude-0.5"], rows["dense"]
    assert "error" not in pruned and "error" not in dense, (pruned.get("error"), dense.get("error"))
    assert pruned["config"]["teacher_soft_targets"] and pruned["start"].startswith("pretrained")
    assert pruned["encoder_sparsity"] == pytest.approx(0.5, abs=1e-3) and dense["encoder_sparsity"] == 0
    assert "sparsity" not in dense["config"]     # the same budget, nothing pruned
    # each row checkpoints in a dir of its own (the dense one too: the finetune pass checkpoints),
    # so rows never resume one another's runs
    assert sorted(p.name for p in (tmp_path / "work" / "resume").iterdir()) == \
        ["dense-from-pretrained", "magnitude-0.5-from-pretrained"]


def test_finetune_throughput_profile(tmp_path, monkeypatch):
    out = tmp_path / "profile.json"
    run_script("finetune_throughput.py", ["--rounds", 1, "--train-samples", 32, "--eval-samples", 8,
                                          "--threads", 1, "--profile", "--out", out], monkeypatch)
    runs = json.loads(out.read_text())["rounds"][0]["runs"]
    for run in runs.values():
        groups = run["tokens"]["profile"]["self_ms_by_group"]
        assert groups["matrix products"] > 0 and groups["optimizer"] > 0
        assert run["tokens"]["profile"]["top_ops"][0]["self_ms"] > 0


# --- Scripts that chain `compressor` commands: run in this process (`--in-process`), tiny
# corpus, model (--size tiny), vocabulary, steps and fine-tunes.

def pretraining_args(corpus: str, work: Path, out: Path) -> list:
    return ["--in-process", "--corpus", corpus, "--size", "tiny", "--vocab-size", 300, "--steps", 2,
            "--batch-size", 4, "--max-length", 32, "--finetune-samples", 16, "--finetune-epochs", 1,
            "--max-eval-samples", 16, "--work", work, "--out", out]


def check_finetune_arm(arm: dict) -> None:
    assert arm["test_examples"] == 16 and arm["train_samples"] == 16 and arm["steps"] == 1, arm
    assert 0 <= arm["accuracy"] <= 1 and arm["final_loss"] > 0


def test_pretraining(tmp_path, wordnet_corpus_file, monkeypatch):
    import compressor.cli.finetune_command as finetune_command
    monkeypatch.setattr(finetune_command, "set_threads", lambda threads: None)   # stay on one thread
    out = tmp_path / "pretraining.json"
    run_script("pretraining.py", pretraining_args(wordnet_corpus_file(300), tmp_path / "work", out), monkeypatch)
    result = json.loads(out.read_text())
    commands = [c["command"] for c in result["commands"]]
    assert [c.split()[1] for c in commands] == ["tokenizer", "pretrain", "finetune", "finetune"]
    assert all(c.startswith("compressor ") and "seconds" in r for c, r in zip(commands, result["commands"]))
    assert "--size tiny" in commands[1] and "--max-eval-samples 16" in commands[2]
    assert result["tokenizer"]["requested_vocab_size"] == 300
    pretraining = result["pretraining"]
    assert pretraining["steps"] == 2 and pretraining["final_loss"] > 0
    assert pretraining["config"]["size"] == "tiny" and pretraining["config"]["max_length"] == 32
    arms = result["arms"]
    assert set(arms) == {"pretrained_mlm", "random_init"}
    for arm in arms.values():
        check_finetune_arm(arm)
    gain = arms["pretrained_mlm"]["accuracy"] - arms["random_init"]["accuracy"]
    assert result["accuracy_gain_points"] == round(100 * gain, 2)
    # Both arms are the tiny architecture (hidden 128), not the benchmark's small one.
    config = json.loads((tmp_path / "work" / "random" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (128, 2)


def test_pretraining_objectives(tmp_path, wordnet_corpus_file, monkeypatch):
    import compressor.cli.finetune_command as finetune_command
    monkeypatch.setattr(finetune_command, "set_threads", lambda threads: None)
    out = tmp_path / "objectives.json"
    run_script("pretraining_objectives.py", [*pretraining_args(wordnet_corpus_file(300), tmp_path / "work", out),
                                             "--objectives", "mlm", "--no-random"], monkeypatch)
    result = json.loads(out.read_text())
    assert result["complete"] is True and list(result["arms"]) == ["mlm"]
    assert [c["command"].split()[1] for c in result["commands"]] == ["tokenizer", "pretrain", "finetune"]
    arm = result["arms"]["mlm"]
    pretraining = arm["pretraining"]
    assert pretraining["steps"] == 2 and pretraining["samples"] == 8 and pretraining["tokens"] > 0
    assert pretraining["trained_params"] == pretraining["delivered_params"]      # mlm: no generator
    assert pretraining["architecture"] == "BertForMaskedLM"
    check_finetune_arm(arm["finetune"])
    dependence = arm["input_dependence"]
    assert dependence["examples"] == 256 and dependence["cls_std"] >= 0 and dependence["token_std"] > 0


def test_stream_memory(tmp_path, wordnet_corpus_file, monkeypatch):
    out = tmp_path / "stream.json"
    run_script("stream_memory.py", ["--in-process", "--corpus", wordnet_corpus_file(300), "--sizes-mb", 0.02, 0.04,
                                    "--tokenize-all-up-to-mb", 0.02, "--tail-docs", 50, "--buffer-size", 100,
                                    "--work", tmp_path / "work", "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert "buffer 100 chunks" in result["benchmark"]
    whole, tail = result["rows"]
    assert (whole["corpus_mb"], tail["corpus_mb"]) == (0.02, 0.04)
    for row in (whole, tail):
        assert row["corpus_mb"] * 1e6 <= row["bytes"] < row["corpus_mb"] * 1e6 + 5_000     # whole documents
        assert row["documents"] > 50 and row["chunks_taken"] >= 1 and row["tokens"] > 0
        assert row["peak_rss_mb"] > 0
    assert whole["mode"] == "read and tokenize whole" and "read_phase_peak_rss_mb" not in whole
    assert whole["chunks_taken"] >= 100 and whole["rss_by_chunks"]
    assert tail["mode"] == "read whole, tokenize last 50 documents (resume path)"
    assert tail["read_phase_peak_rss_mb"] > 0


def test_trim_vocab_study(tiny_bert_dir, tiny_csv, tmp_path, monkeypatch, capsys):
    out = tmp_path / "trim.json"
    run_script_exit("trim_vocab_study.py", ["--teacher", tiny_bert_dir, "--task", tiny_csv, "--eval-samples", 16,
                                            "--min-counts", 2, "--work", tmp_path / "work", "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    teacher, trimmed = result["results"]
    assert result["eval_samples"] == 16 and trimmed["min_count"] == 2
    assert trimmed["embedding_rows"] < teacher["embedding_rows"] == 30522
    for key in ("safetensors_bytes", "onnx_fp32_bytes", "onnx_int8_bytes"):
        assert trimmed[key] < teacher[key]
    assert teacher["test_tokens"]["dropped_occurrences"] == 0 < trimmed["test_tokens"]["dropped_occurrences"]
    assert "| trim-vocab-min-count-2 |" in capsys.readouterr().out
def test_pruning_sweep(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch):
    out = tmp_path / "sweep.json"
    args = ["--teacher", tiny_bert_dir, "--task", tiny_csv, "--eval-samples", 16, "--samples", 16,
            "--fractions", 0.0, 0.5, "--ffn-fractions", "--importances", "taylor", "random",
            "--recovery-samples", 16, "--out", out, "--plot", tmp_path / "sweep.png"]
    run_script_exit("pruning_sweep.py", args, monkeypatch)
    result = json.loads(out.read_text())
    keys = {r["key"] for r in result["results"]}
    assert "prune-heads/taylor/0.50/recovered" in keys and "prune-heads/random/0.50/pruned" in keys
    assert {r["key"]: r["heads_per_layer"] for r in result["results"]}["prune-heads/taylor/0.50/pruned"] != [4] * 4
    assert result["targets"]["taylor_beats_random_at_50_without_recovery"] is not None
    assert (tmp_path / "sweep.png").stat().st_size > 0
    run_script_exit("pruning_sweep.py", args, monkeypatch)   # resumes: nothing left to measure
    assert json.loads(out.read_text())["results"] == result["results"]
    # another importance in a second process adds its points to the same file, keeping these
    at = args.index("--importances")
    other = args[:at + 1] + ["magnitude"] + args[at + 3:]     # "--importances taylor random" -> "magnitude"
    run_script_exit("pruning_sweep.py", other, monkeypatch)
    merged = {r["key"] for r in json.loads(out.read_text())["results"]}
    assert keys < merged and "prune-heads/magnitude/0.50/recovered" in merged


def test_pruned_latency(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch):
    out = tmp_path / "latency.json"
    run_script_exit("pruned_latency.py", [
        "--teacher", tiny_bert_dir, "--task", tiny_csv, "--samples", 16, "--recovery-samples", 16, "--eval-samples", 16,
        "--iterations", 2, "--cost-aware", "--work", tmp_path / "work", "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert set(result["p50_ratio_pruned_to_teacher"]) == {"fp32", "int8"}
    assert [p["config"]["cost_aware"] for p in result["pruned_passes"][:2]] == [True, True]
    structure = result["pruned_structure"]
    assert sum(structure["heads"]) == 8 and sum(structure["ffn"]) == 128 and len(structure["ffn"]) == 4
    assert result["params"]["pruned"] < result["params"]["teacher"]
    assert {row["model"] for row in result["latency"]} == {"teacher-fp32", "teacher-int8", "pruned-fp32", "pruned-int8"}
    assert set(result["skip_layernorm"].values()) == {"unfused"}       # auto, on this onnxruntime
    # both forms of the residual LayerNorms and Optimum's recipe, timed in one run (the pruned model reused)
    from compressor.bench import measure
    monkeypatch.setattr(measure, "peak_rss_mb", no_memory_probe)
    run_script_exit("pruned_latency.py", [
        "--teacher", tiny_bert_dir, "--task", tiny_csv, "--eval-samples", 16, "--iterations", 2,
        "--skip-layernorm", "fused", "unfused", "--optimum", "--work", tmp_path / "work", "--out", out], monkeypatch)
    both = json.loads(out.read_text())
    assert set(both["p50_ratio_pruned_to_teacher"]) == {"fp32-fused", "int8-fused", "fp32-unfused", "int8-unfused"}
    assert both["skip_layernorm"]["teacher-int8-fused"] == "fused" and both["params"] == result["params"]
    assert both["fusions"]["pruned-fp32-fused"]["SkipLayerNormalization"] == 8         # 4 layers x 2
    assert both["fusions"]["pruned-fp32-unfused"]["residual Sum + LayerNormalization"] == 8
    assert "optimum-default-int8" in {row["model"] for row in both["latency"]}
    # one precision: its two graphs timed alone
    run_script_exit("pruned_latency.py", [
        "--teacher", tiny_bert_dir, "--task", tiny_csv, "--eval-samples", 16, "--iterations", 2,
        "--precisions", "int8", "--work", tmp_path / "work", "--out", out], monkeypatch)
    alone = json.loads(out.read_text())
    assert set(alone["p50_ratio_pruned_to_teacher"]) == {"int8"} == set(alone["round_ratios"])
    assert {row["model"] for row in alone["latency"]} == {"teacher-int8", "pruned-int8"}
    # a layer removed whole first: the same heads and neurons in all, on three layers
    run_script_exit("pruned_latency.py", [
        "--teacher", tiny_bert_dir, "--task", tiny_csv, "--samples", 16, "--recovery-samples", 16, "--eval-samples", 16,
        "--iterations", 2, "--drop-layers", 1, "--precisions", "int8", "--work", tmp_path / "drop", "--out", out],
        monkeypatch)
    dropped = json.loads(out.read_text())
    assert [p["pass"] for p in dropped["pruned_passes"][:3]] == ["drop-layers", "prune-heads", "prune-ffn"]
    structure = dropped["pruned_structure"]
    assert len(structure["heads"]) == 3 and sum(structure["heads"]) == 8 and sum(structure["ffn"]) == 128


def test_pruned_latency_ratios_per_round():
    round_ratios = runpy.run_path(str(BENCHMARKS / "pruned_latency.py"))["round_ratios"]
    # two rounds of two calls: the pruned model at half the teacher's time, then at 0.7
    calls = {"rounds": [[0, 2], [2, 4]], "times_ms": {"p": [5.0, 5.0, 7.0, 7.0], "t": [10.0, 10.0, 10.0, 10.0]}}
    spread = round_ratios(calls, "p", "t")
    assert spread["rounds"] == 2 and spread["share_at_or_under_target"] == 0.5
    assert spread["p10"] == pytest.approx(0.52) and spread["p50"] == pytest.approx(0.6)


def test_sharing_study(finished_run, tiny_csv, tmp_path, monkeypatch):
    out = tmp_path / "sharing.json"
    teacher = json.loads((finished_run[1] / "report.json").read_text())["teacher"]["path"]
    run_script_exit("sharing_study.py", [
        "--teacher", teacher, "--task", tiny_csv, "--eval-samples", 16, "--recovery-samples", 16,
        "--only", "all-g1", "--work", tmp_path / "work", "--out", out], monkeypatch)
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert list(rows) == ["teacher", "all-g1"] and not any("error" in r for r in rows.values())
    teacher_row, shared = rows["teacher"], rows["all-g1"]
    assert shared["encoder_params"] * 4 == teacher_row["encoder_params"]   # 4 layers, one set of weights
    assert shared["safetensors_bytes"] < teacher_row["safetensors_bytes"]
    assert shared["onnx_fp32"]["size_bytes"] < teacher_row["onnx_fp32"]["size_bytes"]
    assert shared["onnx_int8"]["size_bytes"] < teacher_row["onnx_int8"]["size_bytes"]
    assert 0 <= shared["accuracy_before_recovery"] <= 1 and 0 <= shared["onnx_int8"]["accuracy"] <= 1
def test_distill_study(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch, capsys):
    out = tmp_path / "distill.json"
    budget = ["--teacher", tiny_bert_dir, "--task", tiny_csv, "--layers", "0,2", "--train-samples", 32,
              "--batch-size", 16, "--max-eval-samples", 16, "--out", out]
    run_script("distill_study.py", ["--rows", "hard,tinybert,theseus", *budget], monkeypatch)
    record = json.loads(out.read_text())
    rows = {row["name"]: row for row in record["runs"]}
    assert set(rows) == {"hard", "tinybert", "theseus"} and record["teacher"]["source"] == "measured"
    for row in rows.values():
        assert 0 <= row["accuracy"] <= 1 and row["test_samples"] == 16
    for name in ("hard", "tinybert"):
        assert rows[name]["distill"]["stages"][0]["steps"] == 2
    assert rows["tinybert"]["distill"]["layer_map"] == [1, 3]
    # theseus: one successor per student layer, a plain model as small as the 2-layer student
    assert rows["theseus"]["pass"] == "theseus" and rows["theseus"]["config"]["successor_layers"] == 2
    assert rows["theseus"]["params"] == rows["hard"]["params"]
    # a rerun with the same settings skips what the file holds; other settings are refused
    run_script("distill_study.py", ["--rows", "hard", *budget], monkeypatch)
    assert json.loads(out.read_text())["runs"] == record["runs"]
    assert "hard seed 0: already in" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        run_script("distill_study.py", ["--rows", "hard", *budget, "--epochs", 2], monkeypatch)
    assert refused.value.code == 2 and "other settings" in capsys.readouterr().err
    run_script("distill_study.py", ["--markdown", "--out", out], monkeypatch)
    table = capsys.readouterr().out
    assert f"| `theseus` | {rows['theseus']['accuracy']:.4f} |" in table and "| seed 0 | mean |" in table
    # distillation as recovery: the student is the teacher with heads and FFN neurons pruned
    pruned = tmp_path / "recovery.json"
    run_script("distill_study.py", ["--teacher", tiny_bert_dir, "--task", tiny_csv, "--rows", "soft-hard-hidden",
                                    "--prune-heads", 0.5, "--prune-ffn", 0.5, "--prune-samples", 32, "--train-samples", 32,
                                    "--batch-size", 16, "--max-eval-samples", 16, "--out", pruned], monkeypatch)
    record = json.loads(pruned.read_text())
    (row,) = record["runs"]
    from compressor.bundle import ModelBundle
    assert row["params"] < ModelBundle.load(tiny_bert_dir).params and record["settings"]["prune_heads"] == 0.5
    assert row["distill"]["stages"][0]["steps"] == 2
    # an augment row: copies from a masked LM, labelled by the teacher's soft targets
    from transformers import BertConfig, BertForMaskedLM
    mlm = tmp_path / "mlm"
    student = ModelBundle.load(tiny_bert_dir)
    BertForMaskedLM(BertConfig(vocab_size=student.model.config.vocab_size, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=4, intermediate_size=64)).save_pretrained(str(mlm))
    student.tokenizer.save_pretrained(str(mlm))
    # it joins the plain rows' file: --mlm and --copies are the row's own config, not the table's
    run_script("distill_study.py", ["--rows", "soft-hard-augment", *budget, "--mlm", mlm, "--copies", 1], monkeypatch)
    runs = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"hard", "tinybert", "theseus", "soft-hard-augment"}
    row = runs["soft-hard-augment"]
    assert row["config"]["augment"] == {"copies": 1, "mlm": str(mlm)}
    record = json.loads(out.read_text())
    assert "--rows hard,tinybert,theseus" in record["command"] and "--mlm" in row["command"]
    # 32 texts + 32 copies for half the epochs: the same steps as the plain rows
    assert row["distill"]["augment"]["added"] == 32 and row["distill"]["stages"][0]["samples"] == 32
    # an unlabelled row: 32 more train texts, labels withheld, over half the epochs (the same steps);
    # it needs --unlabeled, and refuses without it before anything trains
    with pytest.raises(SystemExit) as refused:
        run_script("distill_study.py", ["--rows", "soft-unlabeled", *budget], monkeypatch)
    assert refused.value.code == 2 and "--unlabeled" in capsys.readouterr().err
    run_script("distill_study.py", ["--rows", "soft-unlabeled", *budget, "--unlabeled", 32], monkeypatch)
    row = {r["name"]: r for r in json.loads(out.read_text())["runs"]}["soft-unlabeled"]
    assert row["config"]["unlabeled_samples"] == 32 and row["config"]["epochs"] == 0.5
    assert row["distill"]["unlabeled"] == {"labelled": 32, "unlabeled": 32}
    assert row["distill"]["stages"][0]["steps"] == 2
    # TinyBERT's losses beside the labels, every row in bf16: its own table (other settings)
    bf16 = tmp_path / "bf16.json"
    run_script("distill_study.py", ["--rows", "tinybert-hard", *budget[:-1], bf16, "--precision", "bf16"], monkeypatch)
    record = json.loads(bf16.read_text())
    (row,) = record["runs"]
    assert record["settings"]["precision"] == "bf16" and row["config"]["precision"] == "bf16"
    assert row["distill"]["losses"] == ["soft", "hidden", "attention", "hard"]
    assert row["distill"]["stages"][0]["losses"]["attention"] == 0.05


def test_op_profile(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch, capsys):
    """ORT's profiler summed per op type: the fp32 export spends its time in MatMul-family
    kernels, the int8 one in integer kernels and activation quantization."""
    from compressor.bundle import ModelBundle
    from compressor.export.onnx import ExportSettings, export_bundle
    from compressor.passes import Context, apply_pass, get_pass
    from pretrain.data import load_task
    bundle, task = ModelBundle.load(tiny_bert_dir), load_task({"path": str(tiny_csv)})
    int8 = apply_pass(bundle, "quantize", get_pass("quantize").config_type.model_validate(
        {"mode": "dynamic-int8"}), Context(task=task, seed=0))
    for name, model in (("fp32", bundle), ("int8", int8)):
        export_bundle(model, tmp_path / name, ExportSettings(optimize=True), task, 16)
    out = tmp_path / "ops.json"
    run_script_exit("op_profile.py", [tmp_path / "fp32", tmp_path / "int8", "--task", tiny_csv, "--batches", 3,
                                      "--warmup", 1, "--out", out], monkeypatch)
    models = json.loads(out.read_text())["models"]
    fp32, int8_ops = models[str(tmp_path / "fp32")], models[str(tmp_path / "int8")]
    assert all(ms > 0 for ms in fp32.values()) and "MatMul" in "".join(fp32)
    assert "DynamicQuantizeLinear" in int8_ops and "DynamicQuantizeLinear" not in fp32
    table = capsys.readouterr().out
    assert "| op type | fp32 (ms) | int8 (ms) | int8 / fp32 |" in table and "| total |" in table


def test_session_threads(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch):
    """Both experiments on two tiny exports: the spinning settings alternate over child
    processes, and every window has both graphs on two threads and on one."""
    from compressor.bundle import ModelBundle
    from compressor.export.onnx import ExportSettings, export_bundle
    from pretrain.data import load_task
    bundle, task = ModelBundle.load(tiny_bert_dir), load_task({"path": str(tiny_csv)})
    for name in ("a", "b"):
        export_bundle(bundle, tmp_path / name, ExportSettings(optimize=True), task, 16)
    out = tmp_path / "threads.json"
    run_script_exit("session_threads.py", [tmp_path / "a", tmp_path / "b", "--task", tiny_csv, "--batch-size", 4,
                                           "--repeats", 2,
                                           "--rounds", 2, "--state-rounds", 2, "--window", 1, "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert [r["setting"] for r in result["spinning"]] == ["spinning after calls", "stopped after calls",
                                                          "stopped after calls", "spinning after calls"]
    assert all(set(r["p50_ms"]) == {"a@2", "b@2"} and r["ratio"] > 0 for r in result["spinning"])
    assert result["batch_size"] == 4 and all(r["batch_size"] == 4 for r in result["spinning"])   # children too
    assert [w["rounds"] for w in result["states"]] == [[0, 1], [1, 2]]
    assert all(set(w["p50_ms"]) == {"a@2", "b@2", "a@1", "b@1"} and set(w["ratio_by_threads"]) == {"2", "1"}
               for w in result["states"])
    with pytest.raises(SystemExit) as bad:
        run_script("session_threads.py", [tmp_path, tmp_path / "b", "--out", out], monkeypatch)
    assert bad.value.code == 2


def test_cls_only_latency(finished_run, tiny_bert_dir, tiny_csv, tmp_path, monkeypatch, capsys):
    from compressor.bench import measure
    monkeypatch.setattr(measure, "peak_rss_mb", no_memory_probe)
    out = tmp_path / "cls.json"
    baseline = finished_run[1] / "baselines" / "onnxruntime-fp32"
    run_script_exit("cls_only_latency.py", [
        "--model", f"tiny={tiny_bert_dir}", "--baseline", f"onnxruntime-fp32={baseline}", "--task", tiny_csv,
        "--eval-samples", 16, "--batch-sizes", 1, "--iterations", 2, "--work", tmp_path / "work", "--out", out],
        monkeypatch)
    rows = json.loads(out.read_text())["summary"]
    assert [(r["precision"], r["batch_size"]) for r in rows] == [("fp32", 1), ("int8", 1)]
    assert all(r["applied"] and r["speedup"] > 0 and r["cls_only_of_onnxruntime-fp32"] > 0 for r in rows)
    assert rows[0]["accuracy_whole"] == rows[0]["accuracy_cls_only"]      # fp32: the same logits
    assert "tiny fp32 batch 1: whole" in capsys.readouterr().out


def test_skip_layernorm_kernel(tmp_path, monkeypatch):
    out = tmp_path / "kernel.json"
    run_script_exit("skip_layernorm_kernel.py", ["--shapes", "1x5", "2x7", "--hidden", 16, "--threads", 1,
                                                 "--calls", 3, "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert [(r["batch"], r["sequence"]) for r in result["results"]] == [(1, 5), (2, 7)]
    for row in result["results"]:
        assert row["max_abs_diff"] < 1e-4                       # the two forms compute the same LayerNorm
        assert row["p50_us"]["fused"] > 0 and row["p50_us"]["unfused"] > 0
    assert result["onnxruntime"] and result["calls"] == 3


def test_mask_update(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch):
    out = tmp_path / "mask.json"
    run_script_exit("mask_update.py", ["--model", tiny_bert_dir, "--task", tiny_csv, "--sparsities", 0.5,
                                       "--rounds", 2, "--train-samples", 32, "--train-rounds", 1, "--out", out],
                    monkeypatch)
    result = json.loads(out.read_text())
    assert [(u["sparsity"], u["scope"]) for u in result["updates"]] == [(0.5, "per_layer"), (0.5, "global")]
    for row in result["updates"]:
        assert row["same_counts"] and 0 < row["identical_masks"] <= row["matrices"]
        assert set(row["median_ms"]) == {"threshold", "topk-indices"}
    trained = {r["method"]: r for r in result["training"]}
    assert set(trained) == {"threshold", "topk-indices"}
    assert all(r["updates"] > 1 and r["samples_per_second"] > 0 for r in trained.values())
    assert "--train-samples 32" in result["command"]


def test_teacher_logits(tmp_path, tiny_bert_dir, tiny_csv, monkeypatch):
    out = tmp_path / "logits.json"
    run_script_exit("teacher_logits.py", ["--teacher", tiny_bert_dir, "--task", tiny_csv, "--arms", "cnn", "soft",
                                          "--train-samples", 32, "--epochs", 2, "--rounds", 1, "--eval-samples", 16, "--embedding-dim", 16,
                                          "--out", out], monkeypatch)
    result = json.loads(out.read_text())
    assert [(r["arm"], r["cache"]) for r in result["runs"]] == [("cnn", True), ("cnn", False),
                                                               ("soft", True), ("soft", False)]
    for on, off in zip(result["runs"][::2], result["runs"][1::2]):   # the same training, within float rounding
        assert on["accuracy"] == pytest.approx(off["accuracy"], abs=2 / 16)
    assert set(result["summary"]) == {"cnn", "soft"} and "--epochs 2" in result["command"]
