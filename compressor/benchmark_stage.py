"""The benchmark stage of a recipe: every deployable model on every profile, in one run.

For each available profile, every model is loaded once, then each batch size and sequence
length is measured over all models together in interleaved rounds (compressor/bench.py),
and each model's peak memory is read in a child process. Profiles whose hardware or
provider is absent are recorded as skipped with the reason.
"""

from __future__ import annotations

import gc

from compressor.bench import (TIE_THRESHOLD, Deployable, input_batches, load_runner, peak_rss_mb,
                              ranking_with_ties, summarize, tied_pairs, time_interleaved)
from compressor.environment import environment
from compressor.profiles import Profile, unavailable_reason
from pretrain.batching import MAX_LENGTH
from pretrain.data import Split


def run_benchmarks(models: list[Deployable], settings, tokenizer, test: Split,
                   log=print, max_length: int = MAX_LENGTH) -> dict:
    """{"profiles": [...measured], "skipped": [...], "measurements": [...], "rankings": [...],
    "timings": [...every timed call], "environment": ...}. Inputs are cut at `max_length`
    tokens (the teacher's `usable_length`: every variant has its positions)."""
    measured, skipped, rows, rankings, calls = [], [], [], [], []
    for profile in settings.profile_objects():
        reason = unavailable_reason(profile)
        if reason is not None:
            skipped.append({"profile": profile.name, "reason": reason})
            log(f"benchmark: profile {profile.name} skipped: {reason}")
            continue
        profile_rows, profile_rankings, profile_calls = measure_profile(models, profile, tokenizer, test, log,
                                                                         max_length)
        rows += profile_rows
        rankings += profile_rankings
        calls += profile_calls
        measured.append(profile.model_dump(mode="json"))
    return {"profiles": measured, "skipped": skipped, "measurements": rows, "rankings": rankings,
            "timings": calls, "environment": environment()}


def measure_profile(models: list[Deployable], profile: Profile, tokenizer, test: Split,
                    log, max_length: int = MAX_LENGTH) -> tuple[list[dict], list[dict], list[dict]]:
    """Latency rows (one per model and setting), the tie-aware ranking of each setting, and
    every timed call (kept so that anyone can recompute the statistics)."""
    models = [m.on(profile.name) for m in models]
    runners = {m.name: load_runner(m, profile) for m in models}
    settings = [(b, n) for b in profile.batch_sizes for n in profile.sequence_lengths]
    batch_sets = [input_batches(tokenizer, test, b, n, max_length=max_length) for b, n in settings]
    rows, rankings, calls = [], [], []
    try:
        for (batch_size, length), batches in zip(settings, batch_sets):
            log(f"benchmark: {profile.name} batch {batch_size} sequence {length}: "
                f"{len(models)} models, {profile.iterations} iterations each")
            timings = time_interleaved(runners, batches, profile)
            rows += [{"model": m.name, "profile": profile.name, "batch_size": batch_size,
                      "sequence_length": length, "kind": m.kind, "precision": m.precision,
                      **summarize(list(timings.times[m.name]), timings.samples[m.name])}
                     for m in models]
            rankings.append({"profile": profile.name, "batch_size": batch_size, "sequence_length": length,
                             "tie_threshold": TIE_THRESHOLD, "groups": ranking_with_ties(timings),
                             "ties": tied_pairs(timings)})
            calls.append({"profile": profile.name, "batch_size": batch_size, "sequence_length": length,
                          "rounds": [[r.start, r.stop] for r in timings.rounds],
                          "order_seed": timings.order_seed, "orders": timings.orders,
                          "times_ms": {name: [round(float(t), 4) for t in times]
                                       for name, times in timings.times.items()}})
    finally:
        runners.clear()
        gc.collect()
    # Memory after timing, one child process per model, so the children never share the
    # cores with a latency measurement.
    memory = {m.name: peak_rss_mb(m, profile, batch_sets) for m in models}
    for row in rows:
        row["peak_rss_mb"] = memory[row["model"]][settings.index((row["batch_size"], row["sequence_length"]))]
    return rows, rankings, calls
