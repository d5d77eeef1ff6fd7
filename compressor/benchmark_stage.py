"""The benchmark stage of a recipe: every deployable model on every profile, in one run.

For each available profile, every model is loaded once, then each batch size and sequence
length is measured over all models together in interleaved rounds (compressor/bench.py),
and each model's peak memory is read in a child process. Profiles whose hardware or
provider is absent are recorded as skipped with the reason.
"""

from __future__ import annotations

import gc

from compressor.bench import (Deployable, input_batches, load_runner, measure_interleaved,
                              peak_rss_mb)
from compressor.environment import environment
from compressor.profiles import Profile, unavailable_reason
from pretrain.data import Split


def run_benchmarks(models: list[Deployable], settings, tokenizer, test: Split,
                   log=print) -> dict:
    """{"profiles": [...measured], "skipped": [...], "measurements": [...], "environment": ...}."""
    measured, skipped, rows = [], [], []
    for profile in settings.profile_objects():
        reason = unavailable_reason(profile)
        if reason is not None:
            skipped.append({"profile": profile.name, "reason": reason})
            log(f"benchmark: profile {profile.name} skipped: {reason}")
            continue
        rows += measure_profile(models, profile, tokenizer, test, log)
        measured.append(profile.model_dump(mode="json"))
    return {"profiles": measured, "skipped": skipped, "measurements": rows, "environment": environment()}


def measure_profile(models: list[Deployable], profile: Profile, tokenizer, test: Split, log) -> list[dict]:
    runners = {m.name: load_runner(m, profile) for m in models}
    settings = [(b, n) for b in profile.batch_sizes for n in profile.sequence_lengths]
    batch_sets = [input_batches(tokenizer, test, b, n) for b, n in settings]
    rows = []
    try:
        for (batch_size, length), batches in zip(settings, batch_sets):
            log(f"benchmark: {profile.name} batch {batch_size} sequence {length}: "
                f"{len(models)} models, {profile.iterations} iterations each")
            stats = measure_interleaved(runners, batches, profile)
            rows += [{"model": m.name, "profile": profile.name, "batch_size": batch_size,
                      "sequence_length": length, "kind": m.kind, "precision": m.precision, **stats[m.name]}
                     for m in models]
    finally:
        runners.clear()
        gc.collect()
    # Memory after timing, one child process per model, so the children never share the
    # cores with a latency measurement.
    memory = {m.name: peak_rss_mb(m, profile, batch_sets) for m in models}
    for row in rows:
        row["peak_rss_mb"] = memory[row["model"]][settings.index((row["batch_size"], row["sequence_length"]))]
    return rows
