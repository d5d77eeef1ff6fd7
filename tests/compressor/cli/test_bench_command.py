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
