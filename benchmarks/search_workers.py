"""Two search workers on one Optuna storage against one worker (issue 17's scale-out target).

Both arms run the same search (`compressor search`, a loose budget so every proposed plan
trains its proxy; a small latency model, since no plan is filtered by it) to a fixed number of proxy trials, each process with one thread: one
worker alone, then a lead plus a worker started with `--join` on the same SQLite storage.
The wall time to the N-th finished trial is read from the storage (first trial start to N-th
completion), so the finals that follow (kept tiny here) do not count. Plans differ between
the arms (a joined worker samples with its own seed), so the mean proxy time per trained
trial is written beside the wall time: the speedup is read with it.

    .venv/bin/python benchmarks/search_workers.py --teacher runs/demo/teacher --trials 12 \
        --work runs/search-workers --out benchmarks/results/search_workers.json
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import optuna

from compressor.bench.environment import environment
from pretrain.atomic import write_json
from pretrain.child_process import ends_with_this_process


def search_command(args, name: str, work: Path, join: bool) -> list[str]:
    storage = f"sqlite:///{work / (name + '.db')}"      # relative to the working directory
    return [sys.executable, "-m", "compressor", "search", "--teacher", str(args.teacher), "--task", args.task,
            "--profile", "cpu", "--latency-budget-ms", "1000", "--min-retention", "0.5", "--storage", storage,
            "--study-name", name, "--max-trials", str(args.trials), "--finalists", "1",
            "--proxy-train-samples", str(args.proxy_train_samples), "--validation-samples", "1000",
            "--train-samples", "200", "--max-eval-samples", "500", "--baselines", "onnxruntime-fp32",
            "--precisions", "fp32", "--latency-structures", "4", "--latency-held-out", "2", "--threads", "1", "--time-budget-min", "120", "--quiet",
            "--out", str(work / (name + ("-worker" if join else "")))] + (["--join"] if join else [])


def storage_timing(work: Path, name: str, trials: int) -> dict:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{work / (name + '.db')}")
    done = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE),
                  key=lambda t: t.datetime_complete)
    start = min(t.datetime_start for t in study.trials if t.datetime_start)
    trained = [t for t in done[:trials] if t.user_attrs.get("status") == "proxy trained"]
    return {"wall_s_to_nth_trial": (done[trials - 1].datetime_complete - start).total_seconds(),
            "completed": len(done), "trained_in_first_n": len(trained),
            "mean_proxy_seconds": (sum(t.user_attrs["prep_seconds"] + t.user_attrs["train_seconds"]
                                       for t in trained) / len(trained)) if trained else None,
            "workers": sorted({t.user_attrs.get("worker") for t in done[:trials]})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--task", default="wordnet-supersense")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--proxy-train-samples", type=int, default=1000)
    parser.add_argument("--work", type=Path, default=Path("runs/search-workers"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)

    start = time.time()
    subprocess.check_call(search_command(args, "one", args.work, join=False), preexec_fn=ends_with_this_process())
    one = storage_timing(args.work, "one", args.trials)
    lead = subprocess.Popen(search_command(args, "two", args.work, join=False), preexec_fn=ends_with_this_process())
    worker = subprocess.Popen(search_command(args, "two", args.work, join=True), preexec_fn=ends_with_this_process())
    if lead.wait() or worker.wait():
        return 1
    two = storage_timing(args.work, "two", args.trials)
    write_json(args.out, {
        "command": " ".join(["benchmarks/search_workers.py", *sys.argv[1:]]),
        "search_command": " ".join(search_command(args, "NAME", args.work, join=False)[2:]),
        "one_worker": one, "two_workers": two,
        "speedup": one["wall_s_to_nth_trial"] / two["wall_s_to_nth_trial"],
        "wall_s": time.time() - start, "environment": environment(),
    })
    print(f"{args.trials} trials: one worker {one['wall_s_to_nth_trial']:.0f} s, two workers "
          f"{two['wall_s_to_nth_trial']:.0f} s ({one['wall_s_to_nth_trial'] / two['wall_s_to_nth_trial']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
