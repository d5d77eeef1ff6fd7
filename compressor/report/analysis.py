"""What report.json's numbers say: Pareto fronts, runtime warnings, latency and accuracy lookups.

Plain functions of report.json's model entries (no rendering, no files), so a search over
models can rank and filter candidates with the same rules the report uses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from compressor.bench.contention import CONTENTION_WARNING, contended, summary
from compressor.bench.profiles import precision_family
from pretrain.data.overlap import overlap_warning


def measurement_keys(models: list[dict]) -> list[tuple]:
    """(profile, batch_size, sequence_length) of every measurement, in first-seen order."""
    keys: list[tuple] = []
    for m in models:
        for row in m.get("latency", []):
            key = (row["profile"], row["batch_size"], row["sequence_length"])
            if key not in keys:
                keys.append(key)
    return keys


def latency_row(model: dict, key: tuple) -> dict | None:
    for row in model.get("latency", []):
        if (row["profile"], row["batch_size"], row["sequence_length"]) == key:
            return row
    return None


# What differs between the Optimum baseline's builds (one per preset), beside their settings.
BUILD_FIELDS = ("path", "accuracy", "macro_f1", "retention", "agreement", "size_bytes")


def as_timed_on(model: dict, profile: str) -> dict:
    """The entry as `profile` timed it. The Optimum baseline is built once per preset and each
    profile times its own preset's build, whose accuracy and size may differ from the entry's
    (the first profile's build); every other model is one artifact on every profile."""
    optimum = model.get("optimum") or {}
    build = optimum.get("builds", {}).get(optimum.get("profiles", {}).get(profile))
    if build is None:
        return model
    # A build of an older report has no retention or agreement: None, not the first build's.
    return {**model, **{k: build.get(k) for k in BUILD_FIELDS}}


def undominated(points: list[tuple[str, float, float]], ties=()) -> list[str]:
    """Names of the (name, accuracy, p50 ms) points no other point beats: at least as accurate
    and at least as fast, and better on one. Two models whose timings tie (`ties`: the pairs
    the paired statistics cannot tell apart) are equally fast, so a p50 within noise decides
    nothing: of two tied models the more accurate one wins, and at equal accuracy both stay."""
    tied = {frozenset(pair) for pair in ties}

    def beats(other, point) -> bool:
        (o_name, o_acc, o_lat), (name, acc, lat) = other, point
        same_speed = frozenset((o_name, name)) in tied
        faster = o_lat < lat and not same_speed
        return o_acc >= acc and (same_speed or o_lat <= lat) and (o_acc > acc or faster)

    return [p[0] for p in points if not any(beats(o, p) for o in points if o[0] != p[0])]


def ties_by_measurement(rankings: list[dict]) -> dict[tuple, list]:
    """The benchmark's tied pairs per (profile, batch_size, sequence_length)."""
    return {(r["profile"], r["batch_size"], r["sequence_length"]): r.get("ties", []) for r in rankings}


def pareto_fronts(models: list[dict], rankings: list[dict] = ()) -> list[dict]:
    """Per measurement, the models no other model beats on both accuracy and p50 latency,
    models the benchmark's `rankings` tie counting as equally fast (`undominated`)."""
    ties = ties_by_measurement(list(rankings))
    fronts = []
    for key in measurement_keys(models):
        points = [(m["name"], as_timed_on(m, key[0])["accuracy"], row["p50_ms"]) for m in models
                  if (row := latency_row(m, key)) is not None]
        front = undominated(points, ties.get(key, ()))
        fronts.append({"profile": key[0], "batch_size": key[1], "sequence_length": key[2],
                       "models": sorted(front, key=lambda n: next(t for m, _, t in points if m == n))})
    return fronts


def encoder_params(model_dir: str | None, params: int) -> int | None:
    """Parameters outside the embedding tables: what the per-token compute scales with."""
    if not model_dir:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    hidden = config.get("hidden_size") or config.get("dim")
    rows = sum(config.get(k) or 0 for k in ("vocab_size", "max_position_embeddings", "type_vocab_size"))
    return params - rows * hidden if hidden else None


# Passes that only record what the ONNX export should do (or, for qat, train for it).
EXPORT_RECORDS = ("quantize", "qat", "sensitivity")


def recipe_warnings(models: list[dict]) -> list[str]:
    """Steps whose record nothing applied: a quantize (or qat, sensitivity) in a run that
    exported nothing, so the variant was scored and timed as its fp32 PyTorch model; and
    qat's learned activation ranges under a later quantize mode that does not read them."""
    warnings = []
    for m in (m for m in models if not m.get("baseline")):
        names = [step.get("pass") for step in m.get("passes") or ()]
        recorded = [n for n in dict.fromkeys(names) if n in EXPORT_RECORDS]
        if recorded and "onnx" not in m:       # no export record: the entry is the PyTorch dir
            warnings.append(f"{m['name']}: {', '.join(recorded)} recorded what the ONNX export should do, and this run "
                            "exported nothing, so it is scored and timed as its fp32 PyTorch model; add `export: "
                            "{onnx: true}` to the recipe, or run `compressor export --model` on its dir")
        if "qat" in names:
            last_qat = len(names) - 1 - names[::-1].index("qat")
            later = [step["config"].get("mode") for step in m["passes"][last_qat + 1:] if step.get("pass") == "quantize"]
            if later and later[-1] != "static-int8":
                warnings.append(f"{m['name']}: qat learned int8 activation ranges, and the quantize after it "
                                f"({later[-1]}) does not use them; expected quantize mode static-int8 after "
                                "qat, or no quantize step (qat exports static int8 itself)")
    return warnings


def data_warnings(report: dict) -> list[str]:
    """The scored test examples whose text the train split also holds, and the models no more
    accurate than always predicting the commonest label (`data`; a report from before it was
    recorded has none, and gets no line)."""
    data = report.get("data")
    if data is None:
        return []
    line = overlap_warning("test", data["texts_in_train"]["test"], data["pair_task"])
    return ([line] if line is not None else []) + prior_warnings(report)


def prior_warnings(report: dict) -> list[str]:
    """A model whose accuracy the commonest label alone reaches (imbalanced labels: a model
    that predicts it everywhere looks fine by accuracy, macro-F1 tells)."""
    floor = report["data"].get("most_frequent")
    if floor is None:
        return []
    named = [("teacher", report["teacher"])] + [(m["name"], m) for m in report["models"]]
    at_floor = [name for name, m in named if m["accuracy"] <= floor["accuracy"]]
    if not at_floor:
        return []
    return [f"{', '.join(at_floor)}: accuracy no higher than always predicting the commonest test label "
            f"{floor['label']!r} ({floor['accuracy']:.4f}, macro-F1 {floor['macro_f1']:.4f}); compare macro-F1, "
            "and train longer or on more examples of the other labels"]


def runtime_warnings(report: dict) -> list[str]:
    """Where a pass saved compute or bytes that the runtime did not turn into speed, and
    latencies measured while other processes took the CPUs."""
    models = report["models"]
    profiles = {p["name"]: p for p in report.get("benchmark", {}).get("profiles", [])}
    reference = next((m for m in models if m["name"] == "onnxruntime-fp32"), None)
    warnings = []
    for m in models:
        warnings += precision_warnings(m, profiles)    # a baseline's precision too (Optimum's int8)
        if m.get("baseline"):
            continue
        speedups = {key: latency_row(reference, key)["p50_ms"] / latency_row(m, key)["p50_ms"]
                    for key in measurement_keys([m]) if reference and latency_row(reference, key)}
        if m.get("sparsity"):
            warnings.append(unstructured_warning(m, speedups))
        if any(step.get("pass") == "share-layers" for step in m.get("passes") or ()):
            warnings.append(shared_layers_warning(m, reference, speedups))
        saved = compute_saved(m, report["teacher"])
        for key in measurement_keys([m]):
            warnings += measurement_warnings(m, models, reference, saved, key, speedups.get(key))
    return warnings + contention_warnings(models) + time_limited_warnings(report.get("benchmark", {}))


def time_limited_warnings(benchmark: dict) -> list[str]:
    """What a deadline (a search's time budget) cut from the benchmark, one line per cut."""
    limited = benchmark.get("time_limited", {})
    lines = [f"the time budget cut the benchmark on {e['profile']} at batch {e['batch_size']} (sequence "
             f"{e['sequence_length']}) to {e['timed']} of the profile's {e['iterations']} timed calls per model: "
             "its percentiles and ties rest on fewer calls" for e in limited.get("timing", [])]
    skipped = limited.get("memory_not_probed", [])
    if skipped:
        models = ", ".join(f"{e['model']} ({e['profile']})" for e in skipped)
        lines.append(f"the time budget left no time to read the peak memory of {models}: peak_rss_mb is null")
    return lines


def contention_warnings(models: list[dict]) -> list[str]:
    """One line per measurement during which other processes took more than CONTENTION_WARNING
    of the CPUs, naming the models timed under the most of it (rows without `contention`, from
    reports before it was recorded or where it was unknown, are not judged).

    A measurement is judged whole, its models' shares pooled by their timed seconds: the
    counters tick in jiffies (10 ms), so one model's batch-1 timing (300 calls of 0.5 ms) reads
    its own share to about 10% either way, and on a quiet machine the demo's fastest model read
    11%. Interleaving spreads real load over every model, so the pool sees it; a short burst
    that only one model's rounds saw moves that model's p50 little."""
    warnings = []
    for key in measurement_keys(models):
        rows = [(m["name"], row) for m in models
                if (row := latency_row(m, key)) is not None and row.get("contention") is not None]
        pooled = pooled_share([row for _, row in rows])
        if pooled is not None and pooled > CONTENTION_WARNING:
            most = sorted(rows, key=lambda named: -named[1]["contention"])[:3]
            shares = ", ".join(f"{name} {row['contention']:.0%}" for name, row in most)
            warnings.append(f"other processes used {pooled:.0%} of the CPUs while the models were timed on {key[0]} "
                            f"at batch {key[1]} (sequence {key[2]}; most during {shares}); those latencies run high "
                            "and may rank the models wrongly: rerun on a quiet machine")
    return warnings


def measurement_contention(stats: dict[str, dict], profile: str, batch_size: int,
                           sequence_length: int | str = "real") -> dict:
    """What a script that times models outside a run records beside one measurement's stats
    (name -> a latency row's fields, `contention` among them): `contention`, the median and
    worst of their shares (`summary`, as a search's latency model records it), and `warnings`,
    the report's line when the share pooled over their timed seconds is over CONTENTION_WARNING."""
    key = {"profile": profile, "batch_size": batch_size, "sequence_length": sequence_length}
    models = [{"name": name, "latency": [{**key, **row}]} for name, row in stats.items()]
    return {"contention": summary([row.get("contention") for row in stats.values()]),
            "warnings": contention_warnings(models)}


def announced_contention(stats: dict[str, dict], profile: str, batch_size: int) -> dict:
    """`measurement_contention`, its warnings also printed on stderr: for the benchmarks/
    scripts, whose latencies and ratios run high or skewed on a busy machine."""
    record = measurement_contention(stats, profile, batch_size)
    for line in record["warnings"]:
        print(f"warning: {line}", file=sys.stderr)
    return record


def pooled_share(rows: list[dict]) -> float | None:
    """The rows' contention weighted by their timed seconds (mean x calls); None for no rows."""
    seconds = [row.get("mean_ms", row["p50_ms"]) * row.get("iterations", 1) / 1000 for row in rows]
    if not rows or sum(seconds) <= 0:
        return None
    return sum(row["contention"] * s for row, s in zip(rows, seconds)) / sum(seconds)


def precision_warnings(model: dict, profiles: dict[str, dict]) -> list[str]:
    """The model's precision where a profile that timed it does not list it as fast."""
    warnings = []
    for name in sorted({row["profile"] for row in model.get("latency", [])}):
        suited = profiles.get(name, {}).get("precisions", [])
        if suited and precision_family(model["precision"]) not in suited:
            warnings.append(f"{model['name']} is {model['precision']}, which profile {name} does not run fast "
                            f"(it suits {', '.join(suited)}): expect no speed-up from the precision there")
    return warnings


def measurement_warnings(model: dict, models: list[dict], reference: dict | None, saved: tuple[float, str] | None,
                         key: tuple, speedup: float | None) -> list[str]:
    """On one measurement: compute or bytes saved that bought no speed against onnxruntime-fp32
    (`speedup`; None when the run did not time it), and a lower precision no faster than its
    fp32 twin, which needs no baseline (the twin is a variant timed in the same run)."""
    where = f"on {key[0]} at batch {key[1]}"
    warnings = []
    if speedup is not None and saved is not None and saved[0] >= 1.25 and speedup < 1 + 0.5 * (saved[0] - 1):
        warnings.append(f"{model['name']} {saved[1]} but runs only {speedup:.2f}x as fast as "
                        f"onnxruntime-fp32 {where}")
    if speedup is not None and model["size_bytes"] <= 0.6 * reference["size_bytes"] and speedup < 1.1:
        warnings.append(
            f"{model['name']} is {1 - model['size_bytes'] / reference['size_bytes']:.0%} smaller than "
            f"onnxruntime-fp32 but only {speedup:.2f}x as fast {where}: the runtime does not turn "
            f"the saved bytes into speed{slow_int8_cause(model)}")
    elif (twin := fp32_twin(model, models, key)) is not None:   # one cause, told once
        warnings.append(twin_warning(model, twin, key, where))
    return warnings


def fp32_twin(model: dict, models: list[dict], key: tuple) -> dict | None:
    """For a model in lower precision, a variant measured alongside with the same structure
    (same multiply-adds) in fp32 that it is not clearly faster than: then the precision
    bought no speed, whatever the unfused baseline says (onnxruntime-fp32 runs no fusion,
    so even a slow int8 graph can look 1.2x faster than it)."""
    row = latency_row(model, key)
    if model["precision"] == "fp32" or not model.get("flops") or row is None:
        return None
    twins = [m for m in models if not m.get("baseline") and m["precision"] == "fp32"
             and m.get("flops") == model["flops"] and m.get("kind") == model.get("kind") and latency_row(m, key)]
    fastest = min(twins, key=lambda m: latency_row(m, key)["p50_ms"], default=None)
    if fastest is None or latency_row(fastest, key)["p50_ms"] / row["p50_ms"] >= 1.1:
        return None
    return fastest


def twin_warning(model: dict, twin: dict, key: tuple, where: str) -> str:
    speedup = latency_row(twin, key)["p50_ms"] / latency_row(model, key)["p50_ms"]
    return (f"{model['name']} is {model['precision']} and {1 - model['size_bytes'] / twin['size_bytes']:.0%} "
            f"smaller than {twin['name']} (the same structure in fp32), but only {speedup:.2f}x as fast "
            f"{where}: the precision buys no speed there{slow_int8_cause(model)}")


def compute_saved(model: dict, teacher: dict) -> tuple[float, str] | None:
    """(times less compute than the teacher, what says so): from the analytic multiply-adds
    per example; in an older report without them, from the encoder's parameters."""
    if model.get("flops") and teacher.get("flops"):
        ratio = teacher["flops"] / model["flops"]
        return ratio, (f"needs {1 - 1 / ratio:.0%} fewer multiply-adds per example than the teacher "
                       f"({ratio:.1f}x less compute)")
    encoder = encoder_params(model.get("model_dir"), model["params"])
    teacher_encoder = encoder_params(teacher.get("path"), teacher["params"])
    if not encoder or not teacher_encoder:
        return None
    ratio = teacher_encoder / encoder
    return ratio, (f"removed {1 - encoder / teacher_encoder:.0%} of the encoder's parameters "
                   f"(up to {ratio:.1f}x less compute)")


def unstructured_warning(model: dict, speedups: dict[tuple, float]) -> str:
    """Zeros scattered through dense matrices: every runtime here multiplies them all the same."""
    measured = "".join(f"; {speedup:.2f}x as fast as onnxruntime-fp32 on {key[0]} at batch {key[1]}"
                       for key, speedup in speedups.items())
    compressed = model.get("compressed_size_bytes")
    saving = (f" ({compressed / 1e6:.1f} MB compressed vs {model['size_bytes'] / 1e6:.1f} MB as stored)"
              if compressed else "")
    return (f"{model['name']} has {model['sparsity']:.0%} of its encoder weights at zero (unstructured "
            f"sparsity): dense runtimes do not run it faster{measured}; the saving is compressed size{saving}")


def shared_layers_warning(model: dict, reference: dict | None, speedups: dict[tuple, float]) -> str:
    """Layers that share weights: the file holds each shared tensor once, but every layer runs."""
    smaller = (f" is {1 - model['size_bytes'] / reference['size_bytes']:.0%} smaller than onnxruntime-fp32"
               if reference else " stores each shared tensor once")
    measured = "".join(f"; {speedup:.2f}x as fast as onnxruntime-fp32 on {key[0]} at batch {key[1]}"
                       for key, speedup in speedups.items())
    return (f"{model['name']} shares layer weights (share-layers): it{smaller}, but every layer still runs, "
            f"so expect no speed-up from the sharing itself{measured}")


def slow_int8_cause(model: dict) -> str:
    """Why a static-int8 graph of `scope: ops` is slow on ORT's CPU provider, when it is one."""
    quantization = (model.get("onnx") or {}).get("quantization") or {}
    if quantization.get("mode") != "static-int8" or quantization.get("scope", "ops") != "ops":
        return ""
    return ("; static-int8 with scope: ops puts int8 on fused Attention and EmbedLayerNormalization, "
            "which have no integer kernel there, so ORT dequantizes their weights (the whole word-"
            "embedding table included) on every run: use scope: linears for speed")


def latency_model_warning(contention: dict | None) -> str | None:
    """A search's latency model fitted while other processes took the CPUs (its `contention`
    summary: median and worst over its timed structures), or None."""
    if not contended(contention):
        return None
    return (f"the search's latency model was fitted while other processes used the CPUs (median "
            f"{contention['median']:.0%}, worst {contention['worst']:.0%} of the CPUs' time over its timed "
            "structures): its predicted latencies run high, so the search may have passed over plans that fit "
            "the budget; rerun on a quiet machine (a later search fits the model again)")
