"""compressor/cli/bench_command.py: the length a bench cuts texts at."""

from __future__ import annotations

from compressor.bench import measure
from compressor.cli import bench_command


def test_max_length_overrides_the_length_a_model_records(tiny_bert_dir, tiny_csv, monkeypatch):
    """bench had no --max-length: a model was always measured at the length it records."""
    lengths = []

    def measured(*args, max_length, **kwargs):
        lengths.append(max_length)
        return measure.Measurement([], [], [])
    monkeypatch.setattr(bench_command, "measure_models", measured)
    spec = {"path": str(tiny_csv)}
    at_16 = bench_command.bench_command(str(tiny_bert_dir), "cpu", batch_sizes=[1], iterations=2, task_spec=spec,
                                        max_length=16)
    recorded = bench_command.bench_command(str(tiny_bert_dir), "cpu", batch_sizes=[1], iterations=2, task_spec=spec)
    assert lengths == [16, 128] and (at_16["max_length"], recorded["max_length"]) == (16, 128)


def test_latencies_timed_while_other_processes_used_the_cpus_are_warned_about(tiny_bert_dir, tiny_csv,
                                                                              monkeypatch, capsys):
    """The share of the CPUs other processes used is in each latency row; over the threshold,
    a warning line on stderr and in the JSON's `warnings` names it."""
    def measured(models, profile, *args, **kwargs):
        row = {"model": models[0].name, "profile": profile.name, "kind": "torch", "precision": "fp32", "p50_ms": 1.0}
        return measure.Measurement([{**row, "batch_size": 1, "sequence_length": "real", "contention": 0.37},
                                    {**row, "batch_size": 4, "sequence_length": "real", "contention": 0.01}], [], [])
    monkeypatch.setattr(bench_command, "measure_models", measured)
    result = bench_command.bench_command(str(tiny_bert_dir), "cpu", batch_sizes=[1, 4], iterations=2,
                                         task_spec={"path": str(tiny_csv)})
    assert [row["contention"] for row in result["latency"]] == [0.37, 0.01]
    (warning,) = result["warnings"]
    assert warning.startswith(f"other processes used 37% of the CPUs while the models were timed on cpu at batch 1 "
                              f"(sequence real; most during {tiny_bert_dir.name} 37%)")
    assert warning.endswith("rerun on a quiet machine")
    assert capsys.readouterr().err.splitlines()[-1] == f"warning: {warning}"


def test_a_task_of_the_other_shape_than_the_model_was_fine_tuned_on_is_refused(shape_tuned, tiny_pairs_csv, tmp_path,
                                                                               monkeypatch, capsys):
    """A single-text model was scored and timed on text pairs: refused before any timing."""
    from compressor.cli.commands import main

    def measured(*args, **kwargs):
        raise AssertionError("timed a model on a task of the other shape")
    monkeypatch.setattr(bench_command, "measure_models", measured)
    model, out = shape_tuned["single"], tmp_path / "bench.json"
    assert main(["bench", "--model", str(model), "--profile", "cpu", "--task", str(tiny_pairs_csv),
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: {model} was fine-tuned on single texts; task 'tiny-pairs' gives text "
                                       "pairs (text, text_pair): expected a task without a text_pair column, or a "
                                       "model fine-tuned on text pairs\n")
    assert not out.exists()
