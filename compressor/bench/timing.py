"""Interleaved timing of loaded models, its statistics, and tie-aware rankings.

Fairness within one run: every model of a measurement sees the same batches (real test
batches in test order, each padded to its longest member, or real texts cut/padded to a
fixed length), and the models are measured in interleaved rounds (A B C, C A B, B C A, ...)
so that drift in machine load lands on all of them alike instead of on whoever runs last.
The order within each round is a fresh permutation drawn from a recorded seed, so no model
always runs right after the same other one (whose cache and thread state it would inherit).
Interleaving spreads other processes' load evenly; it does not remove it, so the share of our
CPUs they took is read over each model's timed calls (contention.py) and kept with its times.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from compressor.bench.contention import CpuTime, others_share, read_cpu_time, rounded
from compressor.bench.profiles import Profile
from compressor.bench.runners import Feed, Runner
from pretrain.cpus import our_cpus

ROUND_CALLS = 10              # timed calls per model per interleaved round
ROUND_WARMUP = 2              # untimed calls per model at the start of every round
# Rounds are shortened so that a short measurement still has this many (where it has the calls):
# the per-call ratios' interval resamples rounds, and from one round it would be a single point.
MIN_ROUNDS = 3
TIE_THRESHOLD = 0.03          # per-call latency ratios within 3% of 1 rank as ties
BOOTSTRAP_RESAMPLES = 400
ORDER_SEED = 0                # seeds the per-round model order (recorded with the timings)
# What a cached benchmark was measured with: bump when the harness changes what a timing
# means, so a recipe's benchmark stage measures again. 2: sessions stop spinning between calls.
HARNESS_VERSION = 2


def timed_calls(run: Callable[[object], object], inputs: list, start: int, calls: int) -> list[float]:
    """The hot loop: `calls` calls cycling through `inputs` from `start`; milliseconds each."""
    times = []
    clock = time.perf_counter
    for i in range(start, start + calls):
        feed = inputs[i % len(inputs)]
        t0 = clock()
        run(feed)
        times.append((clock() - t0) * 1e3)
    return times


def summarize(times_ms: list[float], samples: int) -> dict:
    t = np.asarray(times_ms)
    return {"p50_ms": float(np.percentile(t, 50)), "p90_ms": float(np.percentile(t, 90)),
            "p99_ms": float(np.percentile(t, 99)), "mean_ms": float(t.mean()),
            "throughput": samples / (t.sum() / 1e3), "iterations": len(t)}


@dataclass(frozen=True)
class Timings:
    """Every timed call of an interleaved measurement, aligned across models.

    times[name][i] is call i of that model; call i of every model ran on the same batch,
    within the same round (rounds[r] is a slice of call indices), so per-call ratios
    between two models are paired measurements.
    """

    times: dict[str, np.ndarray]
    samples: dict[str, int]
    rounds: list[slice]
    orders: list[list[str]] = field(default_factory=list)   # the order the models ran in, per round
    order_seed: int = ORDER_SEED
    # Per model: other processes' share of our CPUs over its timed calls (None: unknown).
    contention: dict[str, float | None] = field(default_factory=dict)


def time_interleaved(runners: dict[str, Runner], batches: list[Feed], profile: Profile,
                     round_calls: int = ROUND_CALLS, order_seed: int = ORDER_SEED,
                     deadline: float | None = None) -> Timings:
    """Time every runner on the same batches in short interleaved rounds (A B C, C A B, ...).

    Short rounds spread slow drift in machine load evenly over the models; the untimed
    calls at the start of each round absorb the switch from the previous model (caches,
    the other runtime's spinning threads). Each round runs the models in a random order
    drawn from `order_seed`, so which model precedes which varies from round to round.
    Around each model's timed calls the CPUs' counters are read, for the share of them other
    processes used meanwhile (`Timings.contention`).

    With a `deadline` (time.monotonic()), the timed calls are as many of the profile's
    `iterations` as the warm-up calls' times say fit before it (at least MIN_ROUNDS rounds'
    worth), and no round starts past it once MIN_ROUNDS have run: a caller compares the calls
    timed with the profile's to see a cut.
    """
    import torch
    prepared = {name: [runner.prepare(b) for b in batches] for name, runner in runners.items()}
    sizes = [len(next(iter(b.values()))) for b in batches]
    times: dict[str, list[float]] = {name: [] for name in runners}
    rng = np.random.default_rng(order_seed)
    # Drawn for the profile's rounds before any cut, so that a cut keeps the uncut run's first orders.
    orders = [[str(name) for name in rng.permutation(list(runners))]
              for _ in round_spans(profile.iterations, round_calls)]
    cpus = our_cpus()
    spent: dict[str, CpuTime | None] = {name: CpuTime(0.0, 0.0, 0.0, len(cpus or ())) for name in runners}
    threads = torch.get_num_threads()
    torch.set_num_threads(profile.thread_count())
    try:
        # Under a deadline one warm-up call at least: its time says how many calls fit.
        warmup = profile.warmup if deadline is None else max(profile.warmup, 1)
        warm = {name: timed_calls(runner.run, prepared[name], 0, warmup) for name, runner in runners.items()}
        iterations = profile.iterations if deadline is None else \
            fitted_iterations(warm, profile.iterations, round_calls, deadline - time.monotonic())
        rounds = round_spans(iterations, round_calls)
        orders = orders[:len(rounds)]          # fewer calls never make more rounds
        for done, (span, order) in enumerate(zip(rounds, orders)):
            if deadline is not None and done >= MIN_ROUNDS and time.monotonic() > deadline:
                rounds, orders = rounds[:done], orders[:done]      # the load rose past the estimate
                break
            for name in order:
                run = runners[name].run
                timed_calls(run, prepared[name], span.start, ROUND_WARMUP)
                before = read_cpu_time(cpus)       # outside the timed calls: it costs a file read
                times[name] += timed_calls(run, prepared[name], span.start, span.stop - span.start)
                spent[name] = added(spent[name], before, read_cpu_time(cpus))
    finally:
        torch.set_num_threads(threads)
    samples = sum(sizes[i % len(sizes)] for i in range(rounds[-1].stop if rounds else 0))
    return Timings({name: np.asarray(t) for name, t in times.items()}, dict.fromkeys(runners, samples), rounds,
                   orders, order_seed, {name: others_share(total) for name, total in spent.items()})


def fitted_iterations(warm_ms: dict[str, list[float]], iterations: int, round_calls: int, seconds: float) -> int:
    """The most timed calls per model, up to `iterations`, whose rounds (each with its
    ROUND_WARMUP calls) fit in `seconds` at the warm-up calls' median times; at least
    MIN_ROUNDS calls (a measurement with fewer rounds has no interval to report)."""
    per_call_s = sum(float(np.median(t)) for t in warm_ms.values() if len(t)) / 1e3     # one call of each model
    least = min(MIN_ROUNDS, iterations)
    if per_call_s <= 0:
        return iterations
    calls = iterations
    while calls > least and (calls + ROUND_WARMUP * round_count(calls, round_calls)) * per_call_s > seconds:
        calls -= 1
    return calls


def round_count(iterations: int, round_calls: int) -> int:
    """len(round_spans(iterations, round_calls)), without listing them."""
    full = math.ceil(iterations / round_calls)
    return full if full >= MIN_ROUNDS else min(MIN_ROUNDS, iterations)


def added(total: CpuTime | None, before: CpuTime | None, after: CpuTime | None) -> CpuTime | None:
    """`total` plus the window from `before` to `after`; unknown once any reading was."""
    if total is None or before is None or after is None:
        return None
    return total + (after - before)


def round_spans(iterations: int, round_calls: int) -> list[slice]:
    """The timed calls' indices per round: `round_calls` each, or, where that would make
    fewer than MIN_ROUNDS rounds, MIN_ROUNDS rounds as even as the calls allow."""
    if math.ceil(iterations / round_calls) >= MIN_ROUNDS:
        return [slice(start, min(start + round_calls, iterations)) for start in range(0, iterations, round_calls)]
    count = min(MIN_ROUNDS, iterations)
    edges = [i * iterations // count for i in range(count + 1)]
    return [slice(a, b) for a, b in zip(edges, edges[1:])]


def measure_interleaved(runners: dict[str, Runner], batches: list[Feed], profile: Profile, *,
                        with_contention: bool = False) -> dict[str, dict]:
    """Time every runner on the same batches, in interleaved rounds; stats per runner. With
    `with_contention`, each runner's stats also hold `contention`: other processes' share of
    our CPUs while it was timed, as a latency row records it (None: unknown)."""
    timings = time_interleaved(runners, batches, profile)
    stats = {name: summarize(list(t), timings.samples[name]) for name, t in timings.times.items()}
    if with_contention:
        stats = {name: {**s, "contention": rounded(timings.contention.get(name))} for name, s in stats.items()}
    return stats


def paired_ratio(timings: Timings, a: str, b: str, seed: int = 0) -> dict:
    """a's latency over b's: the median per-call ratio on the same batches, a 95% interval
    for it, and the ratio of their p50s.

    The interval resamples whole rounds (a block bootstrap), so noise lasting a round widens
    it as it should. Pairing calls removes the batch-to-batch variation (real batches differ
    in length) that the p50s carry.
    """
    log_ratio = np.log(timings.times[a]) - np.log(timings.times[b])
    blocks = [log_ratio[span] for span in timings.rounds]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(blocks), size=(BOOTSTRAP_RESAMPLES, len(blocks)))
    medians = [np.median(np.concatenate([blocks[i] for i in pick])) for pick in picks]
    low, high = np.percentile(medians, [2.5, 97.5])
    return {"ratio": float(np.exp(np.median(log_ratio))), "ci95": [float(np.exp(low)), float(np.exp(high))],
            "p50_ratio": float(np.median(timings.times[a]) / np.median(timings.times[b]))}


def tied(pair: dict) -> bool:
    """Two models tie unless one is clearly faster: the per-call ratio is more than the
    threshold away from 1, its interval excludes 1, and the p50s agree on the direction."""
    low, high = pair["ci95"]
    same_direction = (pair["ratio"] > 1) == (pair["p50_ratio"] > 1)
    return abs(pair["ratio"] - 1) < TIE_THRESHOLD or low <= 1 <= high or not same_direction


def tied_pairs(timings: Timings) -> list[list[str]]:
    """Every pair of models that tie (so neither may be called faster than the other)."""
    names = list(timings.times)
    return [[a, b] for i, a in enumerate(names) for b in names[i + 1:]
            if tied(paired_ratio(timings, a, b))]


def ranking_with_ties(timings: Timings) -> list[dict]:
    """Models by p50, fastest first, grouped: a model joins the current group while it ties
    with the group's fastest member. Each group holds its members' ratios to its first
    model, and its first model's ratio to the previous group's first (paired_ratio)."""
    order = sorted(timings.times, key=lambda name: float(np.median(timings.times[name])))
    groups: list[dict] = []
    for name in order:
        if groups:
            pair = paired_ratio(timings, name, groups[-1]["models"][0])
            if tied(pair):
                groups[-1]["models"].append(name)
                groups[-1]["ratios_to_first"].append(pair)
                continue
            groups.append({"models": [name], "ratios_to_first": [], "vs_previous_group": pair})
        else:
            groups.append({"models": [name], "ratios_to_first": [], "vs_previous_group": None})
    return groups
