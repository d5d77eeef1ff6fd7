"""The search to a latency budget, at a fraction of Optuna's int8 latency (issue 17's targets).

The budget is `--fraction` of `optimum-default-int8`'s p50 at the batch size, read from a
finished demo run's report (Optuna's preset for this CPU, measured by the demo's benchmark);
the search then measures its finalists beside the three baselines in one run, so the result
is also read as ratios within that run. Runs `compressor search` as a user would (its
storage, cache and resume included), then writes what it reached next to the budget:

    .venv/bin/python benchmarks/search_study.py --demo runs/demo --fraction 0.3333 \
        --time-budget-min 90 --out-dir runs/search-third --out benchmarks/results/search_third.json

A killed run resumes with the same command; rerun after it finished, the same command rewrites
the result from the stored study and stages (no training, no timing), its wall time added to
the earlier invocations' (`invocations`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from compressor.bench.environment import environment
from compressor.search.run import measured_p50
from pretrain.atomic import write_json
from pretrain.child_process import ends_with_this_process

OPTIMUM = "optimum-default-int8"
PROFILE = "cpu"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, default=Path("runs/demo"), help="a finished demo run dir")
    parser.add_argument("--fraction", type=float, required=True, help="of optimum-default-int8's p50")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--min-retention", type=float, default=0.97)
    parser.add_argument("--time-budget-min", type=float, default=90)
    parser.add_argument("--out-dir", type=Path, required=True, help="the search's --out")
    parser.add_argument("--out", type=Path, required=True, help="the result JSON")
    parser.add_argument("extra", nargs="*", help="more `compressor search` flags, after --")
    args = parser.parse_args()

    demo = json.loads((args.demo / "report.json").read_text())
    optimum = next(m for m in demo["models"] if m["name"] == OPTIMUM)
    budget = measured_p50(optimum, PROFILE, args.batch_size) * args.fraction
    command = [sys.executable, "-m", "compressor", "search", "--teacher", str(args.demo / "teacher"),
               "--task", "wordnet-supersense", "--profile", PROFILE, "--batch-size", str(args.batch_size),
               "--latency-budget-ms", f"{budget:.3f}", "--min-retention", str(args.min_retention),
               "--time-budget-min", str(args.time_budget_min), "--out", str(args.out_dir), *args.extra]
    start = time.time()
    code = subprocess.call(command, preexec_fn=ends_with_this_process())
    if code != 0:
        return code
    report = json.loads((args.out_dir / "report.json").read_text())
    search = report["search"]
    by_name = {m["name"]: m for m in report["models"]}
    baselines = {name: measured_p50(by_name[name], PROFILE, args.batch_size)
                 for name in ("pytorch-eager-fp32", "onnxruntime-fp32", OPTIMUM) if name in by_name}
    rows, compared = ([with_ratios(r, baselines) for r in search.get(key, [])] for key in ("finalists", "compared"))
    # The same search run before (killed and resumed, or finished and rerun): its time counts too.
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    earlier = []
    if previous.get("search_command") == " ".join(command[2:]):
        earlier = previous.get("invocations") or [{"wall_s": previous["wall_s"], "date": previous["environment"]["date"]}]
    invocations = earlier + [{"wall_s": time.time() - start, "date": environment()["date"]}]
    write_json(args.out, {
        "command": " ".join(["benchmarks/search_study.py", *sys.argv[1:]]),
        "search_command": " ".join(command[2:]),
        "budget_ms": budget, "fraction_of_optimum": args.fraction,
        "optimum_p50_ms_in_demo": measured_p50(optimum, PROFILE, args.batch_size),
        "baselines_p50_ms_in_this_run": baselines,
        "teacher_accuracy": report["teacher"]["accuracy"],
        "outcome": search["outcome"], "chosen": search["chosen"], "best_effort": search["best_effort"],
        "finalists": rows, "front": search["front"], "compared": compared, "trials": search["trials"],
        "latency_model": search["latency_model"], "wall_s": sum(i["wall_s"] for i in invocations),
        "invocations": invocations,
        "environment": environment(),
    })
    print(search["outcome"])
    return 0


def with_ratios(row: dict, baselines: dict[str, float]) -> dict:
    """A measured model's speedup over each baseline of the run, and its share of Optimum's p50."""
    p50 = row["measured_p50_ms"]
    return {**row, "vs_baselines": {n: b / p50 for n, b in baselines.items()} if p50 else {},
            "of_optimum_in_this_run": p50 / baselines[OPTIMUM] if p50 and OPTIMUM in baselines else None}


if __name__ == "__main__":
    raise SystemExit(main())
