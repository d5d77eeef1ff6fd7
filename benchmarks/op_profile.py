"""Where the time goes: ONNX Runtime's own profiler, per operator type, for exported models.

Each model dir (an export: model.onnx) runs the same real test batches with the profile's
session options plus ORT's profiling on; the per-node times of the timed calls (after a
warm-up) are summed by operator type and divided by the calls, so the table reads as
milliseconds per batch spent in each kind of op. With two or more models, each column is
set beside the first's, which is how to see what a pass removed and what it left: halving
heads and FFN halves the MatMul time but not LayerNorm's or the quantization of activations.

Profiling adds a little overhead to every node; compare models within one run, and take the
p50 figures from the benchmark, not from here. Needs a quiet machine:

    .venv/bin/python benchmarks/op_profile.py runs/pruned-latency/teacher-int8 \\
        runs/pruned-latency/pruned-int8 --out benchmarks/results/op_profile_int8.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from compressor.bench.environment import environment
from compressor.bench.profiles import load_profile, ort_session_options
from compressor.bench.runners import input_batches
from compressor.bundle import read_provenance
from compressor.cli.commands import task_arg
from compressor.export.onnx import ONNX_FILE
from pretrain.atomic import write_json
from pretrain.data import load_task
from pretrain.models import load_tokenizer


def op_times(model_dir: Path, batches: list[dict], profile, warmup: int) -> dict[str, float]:
    """Milliseconds per call spent in each op type over `batches` (after `warmup` untimed calls)."""
    import onnxruntime as ort
    options = ort_session_options(profile.thread_count(), profile.graph_optimization)
    session = ort.InferenceSession(str(model_dir / ONNX_FILE), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    feeds = [{k: v for k, v in b.items() if k in wanted} for b in batches]
    for feed in feeds[:warmup]:
        session.run(None, feed)
    # A second session with profiling on: the warm-up above only primed the OS caches, and
    # this one's first calls are dropped below by their run index.
    options.enable_profiling = True
    options.profile_file_prefix = str(model_dir.name)
    profiled = ort.InferenceSession(str(model_dir / ONNX_FILE), options, providers=["CPUExecutionProvider"])
    for feed in feeds[:warmup] + feeds:
        profiled.run(None, feed)
    trace = Path(profiled.end_profiling())
    try:
        events = json.loads(trace.read_text())
    finally:
        trace.unlink(missing_ok=True)
    return per_op_type(events, skip_runs=warmup, runs=len(feeds))


def per_op_type(events: list[dict], skip_runs: int, runs: int) -> dict[str, float]:
    """Sum the kernel times ("Node" events ending in _kernel_time) of runs after `skip_runs`."""
    totals: dict[str, float] = defaultdict(float)
    run = -1
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            run += 1
            continue
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        # Node events are written before their run's model_run event (which closes the run).
        if run + 1 >= skip_runs:
            totals[event["args"]["op_name"]] += event["dur"] / 1000.0
    return {op: ms / runs for op, ms in sorted(totals.items(), key=lambda kv: -kv[1])}


def markdown(record: dict) -> str:
    names = list(record["models"])
    ops = sorted({op for times in record["models"].values() for op in times},
                 key=lambda op: -record["models"][names[0]].get(op, 0.0))
    short = [Path(n).name for n in names]
    head = " | ".join(f"{n} (ms)" for n in short)
    lines = [f"| op type | {head} |" + "".join(f" {n} / {short[0]} |" for n in short[1:]),
             "|---|" + "---:|" * (2 * len(names) - 1)]
    for op in ops + ["total"]:
        value = [sum(t.values()) if op == "total" else t.get(op, 0.0) for t in record["models"].values()]
        ratios = [f"{v / value[0]:.2f}x" if value[0] else "" for v in value[1:]]
        lines.append(f"| {op} | " + " | ".join(f"{v:.2f}" for v in value) + " |" +
                     ("".join(f" {r} |" for r in ratios)))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help="export dirs (model.onnx), the first is the reference")
    parser.add_argument("--task", help="default: the first model's recorded task")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=100, help="real test batches profiled per model")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", type=Path, help="the result JSON (default: print only)")
    parser.add_argument("--markdown", action="store_true", help="print --out's table and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())))
        return 0
    missing = [str(m) for m in args.models if not (m / ONNX_FILE).is_file()]
    if missing:
        parser.error(f"no {ONNX_FILE} in {', '.join(missing)}; expected export dirs")
    spec = args.task or read_provenance(args.models[0]).get("task") or "wordnet-supersense"
    task = load_task(task_arg(spec))
    profile = load_profile(args.profile)
    tokenizer = load_tokenizer(args.models[0])
    batches = input_batches(tokenizer, task.split("test"), args.batch_size, "real", count=args.batches)
    record = {"command": " ".join(["python", "benchmarks/op_profile.py", *sys.argv[1:]]),
              "environment": environment(), "profile": args.profile, "batch_size": args.batch_size,
              "batches": len(batches),
              "models": {str(m): op_times(m, batches, profile, args.warmup) for m in args.models}}
    if args.out:
        write_json(args.out, record)
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
