"""What the benchmark harness adds to a measurement: harness p50 vs a bare `session.run` loop.

The demo's fastest model at batch 8 (by the report's p50) is timed by the harness
(`compressor.bench.timing.measure_interleaved`: the pipeline's interleaved timing) and by a
bare loop over the same prepared inputs, alternating five times; the overhead is the
relative difference of the median p50s. Each harness repeat and each bare loop records
other processes' share of the CPUs while it timed (`harness_contention`, `bare_contention`;
the median and worst of all of them: `contention`), and a busy machine gets the report's
warning (`warnings`, printed on stderr too): load on either side skews the overhead.

    .venv/bin/python benchmarks/harness_overhead.py --run runs/demo --out benchmarks/results/harness_overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from compressor.bench.contention import others_share, read_cpu_time, rounded
from compressor.bench.environment import environment
from compressor.bench.profiles import load_profile
from compressor.bench.runners import Deployable, input_batches, load_runner
from compressor.bench.timing import measure_interleaved
from compressor.report.analysis import announced_contention
from pretrain.atomic import write_json
from pretrain.cpus import our_cpus
from pretrain.data import load_task
from pretrain.models import load_tokenizer, set_threads


def bare_stats(session, feeds: list, iterations: int) -> dict:
    """A bare `session.run` loop's p50 and mean, and other processes' share of our CPUs while
    it ran (`contention`: the CPUs' counters read around the whole loop, as the harness reads
    them around each model's calls), so its record pools with the harness's stats."""
    cpus = our_cpus()
    times = []
    before = read_cpu_time(cpus)
    for i in range(iterations):
        t0 = time.perf_counter()
        session.run(None, feeds[i % len(feeds)])
        times.append((time.perf_counter() - t0) * 1e3)
    after = read_cpu_time(cpus)
    spent = None if before is None or after is None else after - before
    return {"p50_ms": float(np.percentile(times, 50)), "mean_ms": float(np.mean(times)), "iterations": iterations,
            "contention": rounded(others_share(spent))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/demo"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/harness_overhead.json"))
    args = parser.parse_args()
    report = json.loads((args.run / "report.json").read_text())
    profile = load_profile("cpu").model_copy(update={"iterations": args.iterations, "warmup": 10})
    set_threads(profile.thread_count())
    onnx_models = [m for m in report["models"] if m["kind"] == "onnx"]
    fastest = min(onnx_models, key=lambda m: next(r["p50_ms"] for r in m["latency"]
                                                   if r["batch_size"] == args.batch_size))
    path = Path(fastest["path"])
    path = path / ("model_optimized_quantized.onnx" if fastest["name"] == "optimum-default-int8" else "model.onnx")
    task = load_task(report["recipe"]["teacher"]["task"], seed=report["recipe"]["seed"])
    test = task.split("test").head(report["recipe"]["data"]["max_eval_samples"])
    batches = input_batches(load_tokenizer(Path(report["teacher"]["path"])), test, args.batch_size, "real")
    runner = load_runner(Deployable(fastest["name"], "onnx", path, fastest["precision"]), profile)
    session_feeds = [runner.prepare(b) for b in batches]
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = profile.thread_count()
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    bare_stats(session, session_feeds, 10)
    measured, bare = {}, {}          # the harness's stats and the bare loop's, per repeat
    for repeat in range(1, args.repeats + 1):
        stats = measure_interleaved({"m": runner}, batches, profile, with_contention=True)["m"]
        measured[f"{fastest['name']} (harness, repeat {repeat})"] = stats
        bare[f"{fastest['name']} (bare loop, repeat {repeat})"] = bare_stats(session, session_feeds, args.iterations)
    harness = [stats["p50_ms"] for stats in measured.values()]
    bare_p50 = [stats["p50_ms"] for stats in bare.values()]
    overhead = statistics.median(harness) / statistics.median(bare_p50) - 1
    result = {"command": " ".join(sys.argv), "model": fastest["name"], "batch_size": args.batch_size,
              "harness_p50_ms": harness, "bare_p50_ms": bare_p50, "overhead": overhead,
              "under_2_percent": overhead < 0.02,
              "harness_contention": [stats["contention"] for stats in measured.values()],
              "bare_contention": [stats["contention"] for stats in bare.values()],
              **announced_contention(measured | bare, profile.name, args.batch_size), "environment": environment()}
    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in ("model", "harness_p50_ms", "bare_p50_ms", "overhead")}, indent=2))


if __name__ == "__main__":
    main()
