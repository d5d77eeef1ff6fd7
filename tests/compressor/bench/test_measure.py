"""measure_models: any list of deployable models timed together on one profile."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compressor.bench import measure
from compressor.bench.profiles import load_profile
from compressor.bench.runners import Deployable
from tests.pretrain.test_child_process import children_running, ended_within, kill_left


def test_any_models_are_measured_together_with_rankings(tiny_bert_dir, tiny_task, tokenizer, monkeypatch):
    """A candidate timed beside a reference (what a latency search does): a row per model and
    setting, one ranking per setting naming both, and every timed call kept."""
    monkeypatch.setattr(measure, "peak_rss_mb", lambda model, profile, batch_sets, **k: [None] * len(batch_sets))
    profile = load_profile("cpu").model_copy(update={"batch_sizes": [1, 4], "sequence_lengths": ["real"],
                                                     "iterations": 4, "warmup": 1, "threads": 1})
    models = [Deployable("reference", "torch", tiny_bert_dir, "fp32"),
              Deployable("candidate", "torch", tiny_bert_dir, "fp32")]
    result = measure.measure_models(models, profile, tokenizer, tiny_task.split("test"), log=lambda message: None)
    assert [(row["model"], row["batch_size"]) for row in result.rows] == [
        ("reference", 1), ("candidate", 1), ("reference", 4), ("candidate", 4)]
    assert all(row["iterations"] == 4 and row["p50_ms"] > 0 and row["profile"] == "cpu" for row in result.rows)
    # Other processes' share of the CPUs while each was timed (on Linux; unknown elsewhere).
    assert all(0 <= row["contention"] <= 1 for row in result.rows)
    assert [r["batch_size"] for r in result.rankings] == [1, 4]
    for ranking in result.rankings:
        assert sorted(name for group in ranking["groups"] for name in group["models"]) == ["candidate", "reference"]
    assert all(set(call["times_ms"]) == {"reference", "candidate"} for call in result.calls)


def test_a_fixed_length_may_use_every_position_the_model_has(tokenizer, tiny_task):
    """Real batches are cut at the tool's max_length; a fixed benchmark length is bounded by
    the model's positions only (MiniLM: 512), and beyond them refused in one line."""

    from compressor.bench.runners import input_batches
    from pretrain.errors import UserError
    test = tiny_task.split("test")
    batches = input_batches(tokenizer, test, 4, 48, max_length=16, positions=64)
    assert {b["input_ids"].shape[1] for b in batches} == {48}
    assert max(b["input_ids"].shape[1] for b in input_batches(tokenizer, test, 4, "real", max_length=16,
                                                              positions=64)) <= 16
    with pytest.raises(UserError, match="sequence length 65 is longer than the model's 64 positions"):
        input_batches(tokenizer, test, 4, 65, max_length=16, positions=64)
    # An export's tokenizer caps texts at the length it was gated at (here 16): a fixed length
    # up to the positions is still a shape the model runs, and was refused as "16 positions".
    gated = copy.copy(tokenizer)
    gated.model_max_length = 16
    assert {b["input_ids"].shape[1] for b in input_batches(gated, test, 4, 48, max_length=16, positions=64)} == {48}
    with pytest.raises(UserError, match="sequence length 65 is longer than the model's 64 positions"):
        input_batches(gated, test, 4, 65, max_length=16, positions=64)
    with pytest.raises(UserError, match="sequence length 17 is longer than the 16 tokens texts are cut at"):
        input_batches(gated, test, 4, 17, max_length=16)


def test_a_recipe_benchmark_length_past_the_teachers_positions_stops_before_training(tiny_bert_dir, tiny_csv,
                                                                                     tmp_path, run_raw):

    from pretrain.errors import UserError
    raw = {"name": "long", "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
           "variants": {"same": []},
           "benchmark": {"profiles": ["cpu"], "batch_sizes": [1], "sequence_lengths": [256]}}
    with pytest.raises(UserError, match="sequence length 256 is longer than the teacher's 128 positions"):
        run_raw(raw, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_recipe_batch_larger_than_the_scored_test_rows_stops_before_training(tiny_bert_dir, tiny_csv, tmp_path,
                                                                              run_raw):

    from pretrain.errors import UserError
    raw = {"name": "wide", "teacher": {"model": str(tiny_bert_dir), "task": {"path": str(tiny_csv)}},
           "data": {"max_eval_samples": 3}, "variants": {"same": []},
           "benchmark": {"profiles": ["cpu"], "batch_sizes": [1, 4]}}
    with pytest.raises(UserError, match="batch size 4 is larger than the 3 test examples scored"):
        run_raw(raw, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_profile_this_machine_skips_does_not_count_in_the_batch_check():

    from compressor.bench.profiles import load_profile, unavailable_reason
    from compressor.pipeline.benchmark_stages import check_batches_fit
    from compressor.pipeline.recipe import BenchmarkSettings
    from pretrain.errors import UserError
    if unavailable_reason(load_profile("gpu-cuda-fp16")) is None:
        pytest.skip("this machine runs the GPU profile")
    settings = BenchmarkSettings(profiles=["cpu", "gpu-cuda-fp16"], batch_sizes=[1, 64])
    with pytest.raises(UserError, match=r"profile cpu: batch size 64 is larger than the 50 test examples scored; "
                                        r"expected batch sizes of at most 50$"):
        check_batches_fit(settings, 50, capped=False)
    check_batches_fit(BenchmarkSettings(profiles=["cpu", "gpu-cuda-fp16"]), 50, capped=True)   # cpu: [1, 8]


# A benchmark reading a model's peak memory, for ever: its parent process, to be killed.
MEASURING = """
import sys
import numpy as np
from compressor.bench.measure import peak_rss_mb
from compressor.bench.profiles import load_profile
from compressor.bench.runners import Deployable
batch = {"input_ids": np.full((1, 8), 5, dtype=np.int64), "attention_mask": np.ones((1, 8), dtype=np.int64)}
profile = load_profile("cpu").model_copy(update={"threads": 1})
peak_rss_mb(Deployable("m", "torch", sys.argv[1], "fp32"), profile, [[batch]], calls=10**9)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_memory_probe_ends_with_a_benchmark_killed_by_sigkill(tiny_bert_dir):
    """`kill -9` of a `compressor run` or `bench` left its memory-probe child running its calls."""
    root = Path(__file__).resolve().parents[3]
    parent = subprocess.Popen([sys.executable, "-c", MEASURING, str(tiny_bert_dir)], cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root)})
    probes = []
    try:
        deadline = time.monotonic() + 120
        while not probes and parent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            probes = children_running(parent.pid, b"compressor.bench.memory_probe")
        assert len(probes) == 1
        time.sleep(3)      # the probe well into its calls (or not yet: either way it must end)
        parent.kill()
        parent.wait(timeout=30)
        assert ended_within(probes[0], 5)
    finally:
        parent.kill()
        for probe in probes:
            kill_left(probe)


def test_a_deadline_cuts_the_timed_calls_and_the_memory_probes_and_says_so(tiny_bert_dir, tiny_task, tokenizer,
                                                                           monkeypatch):
    """A search's final benchmark had no deadline: on a loaded machine it ran 14 minutes past a
    small time budget. With one, the calls are cut to what fits, every cut listed."""
    import time
    probed = []
    monkeypatch.setattr(measure, "peak_rss_mb", lambda model, profile, batch_sets, **k: probed.append(k["timeout"])
                        or [50.0] * len(batch_sets))
    monkeypatch.setattr(measure, "PROBE_RESERVE_S", 0.0)
    profile = load_profile("cpu").model_copy(update={"batch_sizes": [1, 4], "iterations": 10_000, "warmup": 1,
                                                     "threads": 1})
    models = [Deployable("a", "torch", tiny_bert_dir, "fp32"), Deployable("b", "torch", tiny_bert_dir, "fp32")]
    lines = []
    start = time.monotonic()
    result = measure.measure_models(models, profile, tokenizer, tiny_task.split("test"), log=lines.append,
                                    deadline=start + 2.0)
    assert time.monotonic() - start < 8      # 10,000 calls of each model at two batch sizes take minutes
    timing = result.time_limited["timing"]
    assert [(e["batch_size"], e["iterations"]) for e in timing] == [(1, 10_000), (4, 10_000)]
    assert all(3 <= e["timed"] < 10_000 for e in timing)
    assert [row["iterations"] for row in result.rows] == [e["timed"] for e in timing for _ in models]
    assert sum("calls per model timed, to end within the time budget" in line for line in lines) == 2
    if probed:      # the probes start only while the deadline has not passed
        assert all(0 < t <= 2.0 for t in probed)
    not_probed = [e["model"] for e in result.time_limited.get("memory_not_probed", [])]
    assert len(probed) + len(not_probed) == 2


def test_without_a_deadline_nothing_is_cut(tiny_bert_dir, tiny_task, tokenizer, monkeypatch):
    monkeypatch.setattr(measure, "peak_rss_mb", lambda model, profile, batch_sets, **k: [None] * len(batch_sets))
    profile = load_profile("cpu").model_copy(update={"batch_sizes": [1], "iterations": 5, "warmup": 0, "threads": 1})
    result = measure.measure_models([Deployable("a", "torch", tiny_bert_dir, "fp32")], profile, tokenizer,
                                    tiny_task.split("test"), log=lambda message: None)
    assert result.time_limited == {} and result.rows[0]["iterations"] == 5
