"""Interleaved timing and the tie-aware ranking of compressor/bench/timing.py."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from compressor.bench.profiles import load_profile
from compressor.bench.runners import Runner
from compressor.bench.timing import (ROUND_WARMUP, Timings, paired_ratio, ranking_with_ties, tied, tied_pairs,
                                     time_interleaved)


def synthetic(medians: dict[str, float], noise: float, calls: int = 200, round_calls: int = 10) -> Timings:
    """Per-call times: a shared per-batch cost times each model's factor times noise."""
    rng = np.random.default_rng(1)
    batch_cost = rng.uniform(1.0, 3.0, size=calls)          # real batches differ in length
    times = {name: m * batch_cost * np.exp(rng.normal(0, noise, size=calls)) for name, m in medians.items()}
    rounds = [slice(s, s + round_calls) for s in range(0, calls, round_calls)]
    return Timings(times, dict.fromkeys(medians, calls), rounds)


def test_paired_ratio_removes_batch_to_batch_variation():
    timings = synthetic({"a": 2.0, "b": 1.0}, noise=0.02)
    pair = paired_ratio(timings, "a", "b")
    # The batch costs vary 3x, but paired per call the ratio is tight around 2.
    assert abs(pair["ratio"] - 2.0) < 0.02
    low, high = pair["ci95"]
    assert low < pair["ratio"] < high and high / low < 1.03


def test_ranking_groups_near_ties_and_orders_clear_differences():
    timings = synthetic({"slow": 3.0, "fast": 1.0, "fast-twin": 1.01, "middle": 2.0}, noise=0.05)
    groups = ranking_with_ties(timings)
    assert [sorted(g["models"]) for g in groups] == [["fast", "fast-twin"], ["middle"], ["slow"]]
    assert groups[0]["vs_previous_group"] is None
    assert 1.9 < groups[1]["vs_previous_group"]["ratio"] < 2.1   # middle vs fast
    assert len(groups[0]["ratios_to_first"]) == 1
    assert tied_pairs(timings) == [["fast", "fast-twin"]]


def test_noisy_measurements_of_a_small_difference_tie():
    # 8% apart but with 40% per-call noise over few calls: the interval holds 1, so a tie.
    timings = synthetic({"a": 1.0, "b": 1.08}, noise=0.4, calls=40)
    assert len(ranking_with_ties(timings)) == 1


def test_models_tie_when_per_call_ratio_and_p50s_disagree_on_the_direction():
    pair = {"ratio": 0.8, "ci95": [0.7, 0.9], "p50_ratio": 1.05}
    assert tied(pair)
    assert not tied({**pair, "p50_ratio": 0.85})


def test_time_interleaved_aligns_calls_across_models():
    profile = load_profile("cpu").model_copy(update={"warmup": 1, "iterations": 25})
    seen = {"quick": [], "sleepy": []}

    def runner(name, seconds):
        return Runner(prepare=lambda feed: feed, run=lambda feed: (seen[name].append(int(feed["id"][0])),
                                                                   time.sleep(seconds)))
    batches = [{"id": np.array([i])} for i in range(7)]
    timings = time_interleaved({"quick": runner("quick", 0.0), "sleepy": runner("sleepy", 0.004)},
                               batches, profile, round_calls=10)
    assert [len(t) for t in timings.times.values()] == [25, 25]
    assert [(s.start, s.stop) for s in timings.rounds] == [(0, 10), (10, 20), (20, 25)]
    assert seen["quick"] == seen["sleepy"]   # the same batches in the same order, warm-ups included
    assert timings.samples == {"quick": 25, "sleepy": 25}
    assert [g["models"] for g in ranking_with_ties(timings)] == [["quick"], ["sleepy"]]


def test_each_round_runs_the_models_in_a_recorded_random_order():
    profile = load_profile("cpu").model_copy(update={"warmup": 0, "iterations": 60})
    ran: list[str] = []

    def runner(name):
        return Runner(prepare=lambda feed: feed, run=lambda feed: ran.append(name))
    names = ["a", "b", "c", "d"]
    timings = time_interleaved({n: runner(n) for n in names}, [{"id": np.array([0])}], profile,
                               round_calls=3, order_seed=7)
    assert len(timings.orders) == len(timings.rounds) == 20 and timings.order_seed == 7
    assert all(sorted(order) == names for order in timings.orders)
    # The recorded orders are the orders that ran (warm-up and timed calls of each model in turn).
    per_round = len(names) * (ROUND_WARMUP + 3)
    ran_orders = [list(dict.fromkeys(ran[i:i + per_round])) for i in range(0, len(ran), per_round)]
    assert ran_orders == timings.orders
    # No model always follows the same one, and every model sometimes runs first.
    predecessors = {n: {o[o.index(n) - 1] for o in timings.orders if o.index(n) > 0} for n in names}
    assert all(len(p) > 1 for p in predecessors.values())
    assert {o[0] for o in timings.orders} == set(names)
    again = time_interleaved({n: runner(n) for n in names}, [{"id": np.array([0])}], profile,
                             round_calls=3, order_seed=7)
    assert again.orders == timings.orders       # the seed reproduces the order


def test_a_short_measurement_still_has_rounds_to_resample():
    """5 iterations at 10 calls a round would be one round, and every interval a single point."""
    profile = load_profile("cpu").model_copy(update={"warmup": 0, "iterations": 5})

    def runner(seconds):
        return Runner(prepare=lambda feed: feed, run=lambda feed: time.sleep(seconds))
    timings = time_interleaved({"a": runner(0.001), "b": runner(0.002)}, [{"id": np.array([0])}], profile,
                               round_calls=10)
    assert [(s.start, s.stop) for s in timings.rounds] == [(0, 1), (1, 3), (3, 5)]
    assert [len(t) for t in timings.times.values()] == [5, 5]
    assert len(set(paired_ratio(timings, "a", "b")["ci95"])) == 2


def test_measure_interleaved_keeps_the_contention_for_callers_that_ask(monkeypatch):
    """Its stats dropped the share of the CPUs other processes took while each runner was timed
    (benchmark scripts could not record it); a caller that does not ask gets what it got."""
    from compressor.bench import timing
    monkeypatch.setattr(timing, "others_share", lambda spent: 0.12345)
    profile = load_profile("cpu").model_copy(update={"warmup": 0, "iterations": 6})
    runners = {"a": Runner(prepare=lambda feed: feed, run=lambda feed: None)}
    plain = timing.measure_interleaved(runners, [{"id": np.array([0])}], profile)
    asked = timing.measure_interleaved(runners, [{"id": np.array([0])}], profile, with_contention=True)
    assert set(plain["a"]) == {"p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput", "iterations"}
    assert set(asked["a"]) == set(plain["a"]) | {"contention"}
    assert asked["a"]["contention"] == 0.123          # rounded as a latency row records it


def test_rounds_are_as_many_as_the_calls_allow_up_to_three():
    from compressor.bench.timing import round_spans
    spans = {n: [(s.start, s.stop) for s in round_spans(n, 10)] for n in (1, 2, 4, 30, 31)}
    assert spans[1] == [(0, 1)] and spans[2] == [(0, 1), (1, 2)] and spans[4] == [(0, 1), (1, 2), (2, 4)]
    assert spans[30] == [(0, 10), (10, 20), (20, 30)] and spans[31][-1] == (30, 31)


@contextlib.contextmanager
def spinners(count: int):
    """`count` child processes spinning on this thread's CPUs (they inherit its affinity)."""
    children = [subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"],
                                 stdout=subprocess.PIPE) for _ in range(count)]
    try:
        for child in children:
            child.stdout.readline()         # spinning from here on
        yield
    finally:
        for child in children:
            child.kill()
            child.wait()
            child.stdout.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_other_processes_spinning_on_our_cpu_show_as_contention(tiny_bert_dir, tiny_task, tokenizer):
    """A tiny model timed on one pinned CPU, alone and while two child processes spin on that
    CPU: the spinners take about two thirds of it, and the timing says so. Whatever else
    shares the machine lands in both cases, so the quiet case is judged against the spinning
    one, not against zero."""
    from compressor.bench.runners import Deployable, input_batches, load_runner
    profile = load_profile("cpu").model_copy(update={"warmup": 2, "iterations": 150, "threads": 1})
    runner = load_runner(Deployable("tiny", "torch", tiny_bert_dir, "fp32"), profile)
    batches = input_batches(tokenizer, tiny_task.split("test"), 4, "real", count=4)
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(affinity)})    # this thread; one-thread torch runs on it
    try:
        quiet = time_interleaved({"tiny": runner}, batches, profile).contention["tiny"]
        with spinners(2):
            contended = time_interleaved({"tiny": runner}, batches, profile).contention["tiny"]
    finally:
        os.sched_setaffinity(0, affinity)
    assert contended > 0.5
    assert contended > quiet + 0.15


def test_a_deadline_times_as_many_calls_as_fit_before_it():
    """With a deadline the calls are cut to what the warm-up's times say fits, the rounds'
    orders those of the uncut measurement's first rounds."""
    profile = load_profile("cpu").model_copy(update={"warmup": 1, "iterations": 1000})

    def runner(seconds):
        return Runner(prepare=lambda feed: feed, run=lambda feed: time.sleep(seconds))
    runners = {"a": runner(0.002), "b": runner(0.003)}
    start = time.monotonic()
    timings = time_interleaved(runners, [{"id": np.array([0])}], profile, deadline=start + 0.5)
    took = time.monotonic() - start
    timed = [len(t) for t in timings.times.values()]
    assert timed[0] == timed[1] and 3 <= timed[0] < 1000 and took < 2.0     # 1,000 calls each take 6 s
    assert timings.rounds[-1].stop == timed[0] and timings.samples["a"] == timed[0]
    uncut = time_interleaved({"a": runner(0.0), "b": runner(0.0)}, [{"id": np.array([0])}], profile)
    assert timings.orders == uncut.orders[:len(timings.orders)]


def test_a_deadline_already_past_still_times_a_few_calls_of_each():
    profile = load_profile("cpu").model_copy(update={"warmup": 0, "iterations": 100})
    runners = {"a": Runner(prepare=lambda feed: feed, run=lambda feed: None)}
    timings = time_interleaved(runners, [{"id": np.array([0])}], profile, deadline=time.monotonic() - 1)
    assert len(timings.times["a"]) == 3 and len(timings.rounds) == 3


def test_fitted_iterations_count_each_rounds_warm_up_calls():
    from compressor.bench.timing import fitted_iterations
    warm = {"a": [10.0, 10.0], "b": [30.0]}          # 40 ms for one call of each
    # 20 timed calls in 3 rounds (7, 7, 6 calls) plus 3 * ROUND_WARMUP: 26 * 0.04 s = 1.04 s
    assert fitted_iterations(warm, 100, 10, 26 * 0.04) == 20
    assert fitted_iterations(warm, 100, 10, 1000.0) == 100
    assert fitted_iterations(warm, 100, 10, 0.0) == 3
