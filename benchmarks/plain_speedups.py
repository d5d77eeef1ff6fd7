"""Keeps the benchmark harness honest: the demo's speedups, re-measured by a plain script.

No compressor code is used for timing: the batches are built with the tokenizer directly
(the same real test examples, batch 8, each batch padded to its longest member), each
model is timed with a bare loop (`session.run` / `model(**batch)`), in three alternating
blocks, and the median latency gives the speedups of `onnxruntime-fp32` and
`optimum-default-int8` over `pytorch-eager-fp32`, which are compared with the report's.

    .venv/bin/python benchmarks/plain_speedups.py --run runs/demo --out benchmarks/results/plain_speedups.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import onnxruntime as ort
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from compressor.bench.environment import environment
from pretrain.atomic import write_json
from pretrain.data import load_task


def time_loop(call, feeds: list, iterations: int) -> list[float]:
    times = []
    for i in range(iterations):
        t0 = time.perf_counter()
        call(feeds[i % len(feeds)])
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/demo"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/plain_speedups.json"))
    args = parser.parse_args()
    report = json.loads((args.run / "report.json").read_text())
    entries = {m["name"]: m for m in report["models"]}
    threads = report["benchmark"]["profiles"][0]["threads"]
    threads = torch.get_num_threads() if threads == "cores" else threads
    threads = 2 if threads is None else threads
    torch.set_num_threads(threads)

    teacher_dir = report["teacher"]["path"]
    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    task = load_task(report["recipe"]["teacher"]["task"], seed=report["recipe"]["seed"])
    texts = task.split("test").texts[: args.batch_size * 64]
    batches = [tokenizer(texts[i:i + args.batch_size], padding="longest", truncation=True, max_length=128,
                         return_tensors="np") for i in range(0, len(texts), args.batch_size)]

    model = AutoModelForSequenceClassification.from_pretrained(teacher_dir).eval()
    torch_feeds = [{k: torch.from_numpy(v.astype("int64")) for k, v in b.items()} for b in batches]

    def eager(feed):
        with torch.inference_mode():
            return model(**feed).logits

    calls = {"pytorch-eager-fp32": (eager, torch_feeds)}
    for name, file in (("onnxruntime-fp32", "model.onnx"), ("optimum-default-int8", "model_optimized_quantized.onnx")):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(Path(entries[name]["path"]) / file), options,
                                       providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        feeds = [{k: v.astype("int64") for k, v in b.items() if k in wanted} for b in batches]
        calls[name] = (lambda feed, s=session: s.run(None, feed), feeds)

    times: dict[str, list[float]] = {name: [] for name in calls}
    for name, (call, feeds) in calls.items():
        time_loop(call, feeds, 10)                                     # warm-up
    for _ in range(3):
        for name, (call, feeds) in calls.items():
            times[name] += time_loop(call, feeds, args.iterations // 3)
    p50 = {name: statistics.median(t) for name, t in times.items()}

    def report_p50(name: str) -> float:
        return next(r["p50_ms"] for r in entries[name]["latency"]
                    if r["batch_size"] == args.batch_size and r["sequence_length"] == "real")

    comparison = {}
    for name in ("onnxruntime-fp32", "optimum-default-int8"):
        plain = p50["pytorch-eager-fp32"] / p50[name]
        harness = report_p50("pytorch-eager-fp32") / report_p50(name)
        comparison[name] = {"plain_speedup": plain, "report_speedup": harness,
                            "relative_difference": abs(harness - plain) / plain}
    result = {"command": " ".join(sys.argv), "batch_size": args.batch_size, "threads": threads,
              "plain_p50_ms": p50, "speedups_over_pytorch_eager_fp32": comparison,
              "within_15_percent": all(c["relative_difference"] <= 0.15 for c in comparison.values()),
              "environment": environment()}
    write_json(args.out, result)
    print(json.dumps(comparison, indent=2))


if __name__ == "__main__":
    main()
