"""Fine-tuning strategies on the MiniLM teacher (wordnet-supersense), at one equal budget.

Every run is the real command a user types (`compressor finetune ...`, or under
`torchrun --nproc_per_node=2` for the DDP check); its metrics.json (test accuracy on the
held-out test split) is collected into one results file, rewritten after every run so a
partial sweep is still recorded. Accuracy only: the machine is shared, times are not a
throughput figure.

Every row takes the same target-task steps (train samples x epochs / batch 32), seed and
test examples. Two-stage rows first train as many steps on wordnet-wsd (`two-stage-wsd`)
or with MLM on the wordnet corpus (`two-stage-mlm`); `multi-task-wsd` adds a wordnet-wsd
batch to every target step.

    python benchmarks/finetune_strategies.py --runs full,adapters,frozen,scalar-mix \
        --out benchmarks/results/finetune_strategies_defaults.json     # each at its default rate
    python benchmarks/finetune_strategies.py --runs adapters,ddp-1,ddp-2 --head-lr 1e-3 \
        --out benchmarks/results/finetune_strategies.json
    python benchmarks/finetune_strategies.py --runs full,two-stage-mlm,two-stage-wsd,multi-task-wsd,frozen,scalar-mix \
        --train-samples 3200 --lr 2e-4 --max-eval-samples 3000 \
        --out benchmarks/results/finetune_strategies_equal_steps.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from pretrain.child_process import ends_with_this_process

ROOT = Path(__file__).resolve().parents[1]


def runs(args) -> dict[str, list[str]]:
    """name -> command line (after `python -m`)."""
    budget = ["--max-train-samples", str(args.train_samples), "--epochs", str(args.epochs)]
    small = ["--max-train-samples", str(args.ddp_train_samples), "--epochs", "1"]
    ft = ["compressor", "finetune", "--model", str(args.model), "--task", str(args.task), "--quiet",
          *(["--seed", str(args.seed)] if args.seed else [])]
    # No rate given: each row runs at the tool's default for its strategy, as a user's command would.
    full = [*ft, *budget, "--strategy", "full", *(["--lr", args.lr] if args.lr else [])]
    head = ["--lr", args.head_lr] if args.head_lr else []   # frozen, scalar-mix, adapters
    return {
        "full": full,
        "adapters": [*ft, *budget, "--strategy", "adapters", *head],
        "frozen": [*ft, *budget, "--strategy", "frozen", *head],
        "scalar-mix": [*ft, *budget, "--strategy", "scalar-mix", *head],
        "two-stage-wsd": [*full, "--intermediate-task", "wordnet-wsd"],
        "two-stage-mlm": [*full, "--domain-corpus", "wordnet", "--domain-steps", str(target_steps(args))],
        "multi-task-wsd": [*full, "--tasks", "wordnet-supersense,wordnet-wsd"],
        "ddp-1": [*ft, *small, "--lr", "2e-4"],
        "ddp-2": ["torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", *ft, *small, "--lr", "2e-4"],
    }


def display_path(path: Path) -> Path:
    """Recorded paths are relative to the repository when they lie inside it."""
    path = path.resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def target_steps(args) -> int:
    """The target task's optimizer steps (the loop's count for batch 32): the domain MLM gets as many."""
    return max(1, math.ceil(args.epochs * math.ceil(args.train_samples / 32)))


def run_one(name: str, argv: list[str], out_dir: Path, max_eval: int | None) -> dict:
    out = out_dir / name
    cmd = [sys.executable, "-m", *argv, "--out", str(out)]
    if max_eval:
        cmd += ["--max-eval-samples", str(max_eval)]
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, preexec_fn=ends_with_this_process())
    wall = time.perf_counter() - start
    shown = " ".join(["python", "-m", *argv, "--out", str(display_path(out))]
                     + (["--max-eval-samples", str(max_eval)] if max_eval else []))
    if proc.returncode != 0:
        return {"name": name, "command": shown, "error": proc.stderr[-2000:], "wall_seconds": round(wall, 1)}
    metrics = json.loads((out / "metrics.json").read_text())
    keep = ("accuracy", "macro_f1", "samples", "strategy", "trainable_params", "total_params",
            "trainable_percent", "steps", "train_samples", "train_seconds", "final_loss", "stages", "processes",
            "domain_mlm")
    return {"name": name, "command": shown, **{k: metrics.get(k) for k in keep},
            "lr": metrics["config"]["lr"], "wall_seconds": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="adapters,ddp-1,ddp-2,frozen,scalar-mix,full,two-stage-wsd,multi-task-wsd")
    parser.add_argument("--model", default="minilm", help="the teacher: 'minilm' (bundled) or an HF model dir")
    parser.add_argument("--task", default="wordnet-supersense", help="the target task (name or CSV/TSV/JSONL file)")
    parser.add_argument("--train-samples", type=int, default=30000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--ddp-train-samples", type=int, default=6000)
    parser.add_argument("--lr", help="learning rate of the rows that train every weight "
                                     "(default: none given, the tool's default for the strategy)")
    parser.add_argument("--head-lr", help="learning rate of frozen, scalar-mix and adapters "
                                          "(default: none given, each strategy's own default)")
    parser.add_argument("--seed", type=int, default=0, help="every run's seed (data order, heads, dropout)")
    parser.add_argument("--max-eval-samples", type=int, help="default: the whole test split")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "strategies")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "finetune_strategies.json")
    args = parser.parse_args()

    from compressor.bench.environment import environment
    known = runs(args)
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown runs {unknown}; known: {', '.join(known)}")
    previous = json.loads(args.out.read_text())["runs"] if args.out.is_file() else []
    results = {r["name"]: r for r in previous}
    for name in names:
        print(f"running {name}: {' '.join(known[name])}", file=sys.stderr, flush=True)
        results[name] = run_one(name, known[name], args.work, args.max_eval_samples)
        print(json.dumps(results[name]), file=sys.stderr, flush=True)
        record = {"command": " ".join(["python", "benchmarks/finetune_strategies.py", *sys.argv[1:]]),
                  "environment": environment(),
                  "settings": {"train_samples": args.train_samples, "epochs": args.epochs,
                               "target_steps": target_steps(args), "lr": args.lr, "head_lr": args.head_lr,
                               "ddp_train_samples": args.ddp_train_samples, "batch_size": 32, "seed": args.seed,
                               "max_eval_samples": args.max_eval_samples},
                  "runs": list(results.values())}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
