"""Two ONNX graphs on ONNX Runtime's thread pools: idle spinning, and the machine's states.

`spinning`: the two graphs timed in turn in one process (rounds of 10 calls, the order
alternating), with the sessions' pools left spinning after each call (ONNX Runtime's
default) or stopped when a call returns (`session.force_spinning_stop`, what the benchmark
harness uses); each setting in its own child process, the settings alternating, --repeats
times. Shows what an idle session's spinning workers cost the session being timed.

`states`: the two graphs on two intra-op threads and on one, all four sessions interleaved in
one process for --state-rounds rounds; the p50 of every window of --window rounds, per session. On
a VM whose second core slows down for a while, the two-thread sessions slow down in those
windows and the one-thread ones do not.

    .venv/bin/python benchmarks/session_threads.py runs/pruned-latency-cost/teacher-int8 \\
        runs/pruned-latency-cost/pruned-int8 --out benchmarks/results/session_threads.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from compressor.bench.environment import environment
from compressor.bench.profiles import ort_session_options
from compressor.bench.runners import input_batches
from compressor.bench.timing import timed_calls
from compressor.cli.commands import task_arg
from compressor.export.onnx import ONNX_FILE
from pretrain.atomic import write_json
from pretrain.child_process import ends_with_this_process
from pretrain.data import load_task
from pretrain.models import load_tokenizer

ROUND_CALLS = 10
SPIN_SETTINGS = ("spinning after calls", "stopped after calls")


def sessions(models: list[Path], batches: list[dict], threads: int, stop_spinning: bool) -> dict:
    """name -> (session, its feeds), warmed up."""
    import onnxruntime as ort
    loaded = {}
    for model in models:
        options = ort_session_options(threads, "all", stop_spinning)
        session = ort.InferenceSession(str(model / ONNX_FILE), options, providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        feeds = [{k: v for k, v in b.items() if k in wanted} for b in batches]
        for feed in feeds[:10]:
            session.run(None, feed)
        loaded[f"{model.name}@{threads}"] = (session, feeds)
    return loaded


def round_p50(session, feeds: list[dict], round_: int) -> float:
    """One untimed call, then the p50 (ms) of ROUND_CALLS timed ones (the harness's hot loop)."""
    session.run(None, feeds[round_ % len(feeds)])
    return statistics.median(timed_calls(lambda feed: session.run(None, feed), feeds, round_ * ROUND_CALLS,
                                         ROUND_CALLS))


def interleaved(loaded: dict, rounds: int) -> dict[str, list[float]]:
    """Per-round p50s of every session, the order rotating each round."""
    names = list(loaded)
    per_round = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            per_round[name].append(round_p50(*loaded[name], r))
    return per_round


def spinning_child(args, batches: list[dict]) -> dict:
    """One setting in this process: the two graphs' p50 over all their calls' round p50s."""
    loaded = sessions(args.models, batches, args.threads, args.setting == SPIN_SETTINGS[1])
    per_round = interleaved(loaded, args.rounds)
    return {"p50_ms": {name: statistics.median(p50s) for name, p50s in per_round.items()},
            "batch_size": len(batches[0]["input_ids"])}


def spinning(args) -> list[dict]:
    results = []
    for repeat in range(args.repeats):
        for setting in SPIN_SETTINGS if repeat % 2 == 0 else SPIN_SETTINGS[::-1]:
            command = [sys.executable, __file__, *map(str, args.models), "--task", args.task, "--child", setting,
                       "--rounds", str(args.rounds), "--threads", str(args.threads),
                       "--batch-size", str(args.batch_size)]
            done = subprocess.run(command, capture_output=True, text=True, check=True,
                                  preexec_fn=ends_with_this_process())
            child = json.loads(done.stdout.strip().splitlines()[-1])
            p50 = child["p50_ms"]
            first, second = (p50[f"{m.name}@{args.threads}"] for m in args.models)
            results.append({"repeat": repeat, "setting": setting, "batch_size": child["batch_size"], "p50_ms": p50,
                            "ratio": second / first})
            print(f"{setting}: {first:.2f} / {second:.2f} ms, ratio {second / first:.3f}", file=sys.stderr)
    return results


def states(args, batches: list[dict]) -> list[dict]:
    loaded = {**sessions(args.models, batches, args.threads, True), **sessions(args.models, batches, 1, True)}
    per_round = interleaved(loaded, args.state_rounds)
    windows = []
    for start in range(0, args.state_rounds, args.window):
        p50 = {name: statistics.median(p50s[start:start + args.window]) for name, p50s in per_round.items()}
        ratios = {threads: p50[f"{args.models[1].name}@{threads}"] / p50[f"{args.models[0].name}@{threads}"]
                  for threads in (args.threads, 1)}
        windows.append({"rounds": [start, min(start + args.window, args.state_rounds)], "p50_ms": p50,
                        "ratio_by_threads": ratios})
        print(f"rounds {start}-: " + ", ".join(f"{k} {v:.2f}" for k, v in p50.items())
              + ", ratios " + ", ".join(f"{t} threads {r:.3f}" for t, r in ratios.items()), file=sys.stderr)
    return windows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", type=Path, nargs=2, help="two exported model dirs (model.onnx): reference, other")
    parser.add_argument("--task", default="wordnet-supersense", help="its test split gives the batches")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of the multi-thread sessions")
    parser.add_argument("--experiments", default="spinning,states")
    parser.add_argument("--repeats", type=int, default=4, help="spinning: child processes per setting")
    parser.add_argument("--rounds", type=int, default=60, help="spinning: rounds per child process")
    parser.add_argument("--state-rounds", type=int, default=400, help="states: rounds in all")
    parser.add_argument("--window", type=int, default=20, help="states: rounds per window")
    parser.add_argument("--child", choices=SPIN_SETTINGS, dest="setting", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    for model in args.models:
        if not (model / ONNX_FILE).is_file():
            parser.error(f"{model} has no {ONNX_FILE}; expected an exported model dir")
    task = load_task(task_arg(args.task))
    batches = input_batches(load_tokenizer(args.models[0]), task.split("test"), args.batch_size, "real")
    if args.setting is not None:
        print(json.dumps(spinning_child(args, batches)))
        return 0
    if args.out is None:
        parser.error("--out is required")
    experiments = args.experiments.split(",")
    result = {"command": " ".join(sys.argv), "environment": environment(), "models": [str(m) for m in args.models],
              "batch_size": args.batch_size, "threads": args.threads, "round_calls": ROUND_CALLS}
    if "spinning" in experiments:
        result["spinning"] = spinning(args)
    if "states" in experiments:
        result["states"] = states(args, batches)
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
