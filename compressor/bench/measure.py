"""Measuring a set of deployable models on hardware profiles.

`measure_models` is the one measurement: any list of models on one profile. Every model is
loaded once, then each batch size and sequence length is measured over all models together
in interleaved rounds (timing.py), and each model's peak memory is read in a child process.
A recipe's benchmark stage (`run_benchmarks`) calls it for each profile of the recipe; a
search can call it with a candidate and a reference model.

Peak memory is measured in a fresh child process per model (memory_probe.py): it loads the
model, runs the batches, and reports its peak resident set size. That is the memory a
process serving that model needs, runtime included, and unlike in-process readings it is
not inflated by the models measured before it.

Each row records `contention`: the share of the CPUs it ran on that other processes used
while it was timed (contention.py); a row over CONTENTION_WARNING is flagged in the report.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from compressor.bench.contention import rounded
from compressor.bench.environment import environment
from compressor.bench.profiles import Profile, unavailable_reason
from compressor.bench.runners import Deployable, Feed, id_translation, input_batches, load_runner, translated
from compressor.bench.timing import (HARNESS_VERSION, TIE_THRESHOLD, ranking_with_ties, summarize, tied_pairs,
                                     time_interleaved)
from pretrain.atomic import scratch_dir
from pretrain.batching import MAX_LENGTH
from pretrain.data import Split


@dataclass(frozen=True)
class Measurement:
    """What one profile measured of a set of models."""

    rows: list[dict]       # one per model and setting: latency statistics and peak memory
    rankings: list[dict]   # one per setting: the models grouped by speed, ties kept together
    calls: list[dict]      # every timed call, so that anyone can recompute the statistics
    # What a deadline cut: settings timed with fewer calls than the profile's, models whose
    # memory was not probed (TIME_LIMITED's keys); empty without a deadline.
    time_limited: dict = field(default_factory=dict)


TIME_LIMITED = ("timing", "memory_not_probed")
PROBE_RESERVE_S = 10.0     # a memory probe's child process: start, imports, model load, its calls
PROBE_CALLS = 20           # calls per set of batches in a memory probe
PROBE_TIMEOUT_S = 900.0


PROGRESS = logging.getLogger(__name__).info


def run_benchmarks(models: list[Deployable], settings, tokenizer, test: Split, log: Callable[[str], None] = PROGRESS,
                   max_length: int = MAX_LENGTH, positions: int | None = None, deadline: float | None = None) -> dict:
    """A recipe's benchmark: every model on each of `settings`' profiles.

    {"profiles": [...measured], "skipped": [...], "measurements": [...], "rankings": [...],
    "timings": [...every timed call], "environment": ...}, and `time_limited` (Measurement's)
    where a `deadline` (time.monotonic()) cut the calls: the time left is shared evenly among
    the profiles still to measure. Inputs are cut at `max_length` tokens (the teacher's
    `usable_length`: every variant has its positions)."""
    measured, skipped, rows, rankings, calls, timed = [], [], [], [], [], []
    limited: dict[str, list] = {key: [] for key in TIME_LIMITED}
    available = [p for p in settings.profile_objects() if unavailable_reason(p) is None]
    for profile in settings.profile_objects():
        reason = unavailable_reason(profile)
        if reason is not None:
            skipped.append({"profile": profile.name, "reason": reason})
            log(f"benchmark: profile {profile.name} skipped: {reason}")
            continue
        left = len(available) - len(timed)
        share = None if deadline is None else time.monotonic() + (deadline - time.monotonic()) / left
        result = measure_models(models, profile, tokenizer, test, log=log, max_length=max_length,
                                positions=positions, deadline=share)
        rows += result.rows
        rankings += result.rankings
        calls += result.calls
        for key, entries in result.time_limited.items():
            limited[key] += entries
        measured.append(profile.model_dump(mode="json"))
        timed.append(profile)
    cut = {key: entries for key, entries in limited.items() if entries}
    return {"harness_version": HARNESS_VERSION, "profiles": measured, "skipped": skipped, "measurements": rows,
            "rankings": rankings, "timings": calls, "environment": measuring_environment(timed),
            **({"time_limited": cut} if cut else {})}


def measuring_environment(profiles: list[Profile]) -> dict:
    """environment(), with the threads each profile was timed at in place of the process's own
    torch setting (the harness sets the profile's count for its measurements only)."""
    env = {k: v for k, v in environment().items() if k != "torch_threads"}
    return {**env, "threads": {p.name: p.thread_count() for p in profiles}}


def measure_models(models: list[Deployable], profile: Profile, tokenizer, test: Split, *,
                   log: Callable[[str], None] = PROGRESS, max_length: int = MAX_LENGTH,
                   positions: int | None = None, deadline: float | None = None) -> Measurement:
    """Time `models` together, interleaved, at each of the profile's settings; then their memory.

    The profile must be available here (`unavailable_reason(profile) is None`). Batches are
    the test split's texts, cut at `max_length` tokens. With a `deadline` (time.monotonic()),
    each setting gets an even share of the time left less PROBE_RESERVE_S per model for the
    memory probes, and times as many calls as fit in it (timing.time_interleaved); a probe
    gets an even share of what is left then, and none starts past the deadline. Each cut is
    logged and listed in `time_limited`.
    """
    models = [m.on(profile.name) for m in models]
    ids = {m.name: id_translation(m, tokenizer) for m in models}   # a trimmed vocabulary's renumbering
    runners = {m.name: load_runner(m, profile, ids[m.name]) for m in models}
    settings = [(b, n) for b in profile.batch_sizes for n in profile.sequence_lengths]
    batch_sets = [input_batches(tokenizer, test, b, n, max_length=max_length, positions=positions)
                  for b, n in settings]
    rows, rankings, calls, cut = [], [], [], []
    try:
        for done, ((batch_size, length), batches) in enumerate(zip(settings, batch_sets)):
            log(f"benchmark: {profile.name} batch {batch_size} sequence {length}: "
                f"{len(models)} models, {profile.iterations} iterations each")
            timings = time_interleaved(runners, batches, profile,
                                       deadline=timing_deadline(deadline, len(settings) - done, len(models)))
            setting = {"profile": profile.name, "batch_size": batch_size, "sequence_length": length}
            timed = len(next(iter(timings.times.values())))
            if deadline is not None and timed < profile.iterations:
                cut.append({**setting, "iterations": profile.iterations, "timed": timed})
                log(f"benchmark: {profile.name} batch {batch_size} sequence {length}: {timed} of "
                    f"{profile.iterations} calls per model timed, to end within the time budget")
            rows += [{"model": m.name, **setting, "kind": m.kind, "precision": m.precision,
                      **summarize(list(timings.times[m.name]), timings.samples[m.name]),
                      "contention": rounded(timings.contention.get(m.name))}
                     for m in models]
            rankings.append({**setting, "tie_threshold": TIE_THRESHOLD, "groups": ranking_with_ties(timings),
                             "ties": tied_pairs(timings)})
            calls.append({**setting, "rounds": [[r.start, r.stop] for r in timings.rounds],
                          "order_seed": timings.order_seed, "orders": timings.orders,
                          "times_ms": {name: [round(float(t), 4) for t in times]
                                       for name, times in timings.times.items()}})
    finally:
        runners.clear()
        gc.collect()
    # Memory after timing, one child process per model, so the children never share the
    # cores with a latency measurement.
    memory, not_probed = {}, []
    for done, m in enumerate(models):
        timeout = PROBE_TIMEOUT_S if deadline is None else \
            min(PROBE_TIMEOUT_S, (deadline - time.monotonic()) / (len(models) - done))
        if timeout <= 0:
            memory[m.name] = [None] * len(batch_sets)
        else:
            memory[m.name] = peak_rss_mb(m, profile, [[translated(feed, ids[m.name]) for feed in batches]
                                                      for batches in batch_sets], timeout=timeout)
        if deadline is not None and all(r is None for r in memory[m.name]):
            not_probed.append({"profile": profile.name, "model": m.name})
    if not_probed:
        log(f"benchmark: {profile.name}: peak memory of {', '.join(e['model'] for e in not_probed)} not read "
            "within the time budget")
    for row in rows:
        row["peak_rss_mb"] = memory[row["model"]][settings.index((row["batch_size"], row["sequence_length"]))]
    limited = {"timing": cut, "memory_not_probed": not_probed}
    return Measurement(rows, rankings, calls, {key: entries for key, entries in limited.items() if entries})


def timing_deadline(deadline: float | None, settings_left: int, models: int) -> float | None:
    """The deadline of the next setting's timed calls: an even share of what is left after
    the memory probes' reserve."""
    if deadline is None:
        return None
    now = time.monotonic()
    return now + max(0.0, deadline - now - models * PROBE_RESERVE_S) / settings_left


def peak_rss_mb(model: Deployable, profile: Profile, batch_sets: list[list[Feed]],
                calls: int = PROBE_CALLS, timeout: float = PROBE_TIMEOUT_S) -> list[float | None]:
    """Peak RSS of a fresh process serving `model`, one reading per set of batches.

    The child loads the model once; before each set it resets the kernel's high-water mark
    (so each reading is the peak while serving that batch size, model included) and runs
    `calls` batches. The mark resets only to what the process holds now, arenas a larger set
    left included, so the sets run smallest first: each reading is then the one a process
    serving that set alone would show, whatever order the profile lists them in. Readings
    (in `batch_sets`' order) are None if the child fails or runs past `timeout` seconds.
    """
    order = sorted(range(len(batch_sets)), key=lambda n: max(b["input_ids"].size for b in batch_sets[n]))
    with scratch_dir("mem") as tmp:
        inputs = []
        for n in order:
            inputs.append(str(Path(tmp) / f"set{n}.npz"))
            np.savez(inputs[-1], **{f"{i}:{k}": v for i, b in enumerate(batch_sets[n]) for k, v in b.items()})
        # parent_pid: the child ends with this process, even one killed by SIGKILL (child_process.py)
        job = {"kind": model.kind, "path": str(model.path), "inputs": inputs, "calls": calls,
               "threads": profile.thread_count(), "provider": profile.provider, "device": profile.device,
               "graph_optimization": profile.graph_optimization, "parent_pid": os.getpid()}
        try:
            done = subprocess.run([sys.executable, "-m", "compressor.bench.memory_probe", json.dumps(job)],
                                  capture_output=True, text=True, timeout=timeout)
            readings = json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mb"]
            by_set = dict(zip(order, (float(r) for r in readings), strict=True))
            return [by_set[n] for n in range(len(batch_sets))]
        except (subprocess.SubprocessError, ValueError, IndexError, KeyError, TypeError):
            return [None] * len(batch_sets)
