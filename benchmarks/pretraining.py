"""Does pretraining work? MLM from scratch on the WordNet corpus vs random initialisation.

Both arms are the same architecture (SIZES["small"]: 4 layers, hidden 256, 4 heads, FFN
1024; BERT with a WordPiece vocabulary of 8192 trained on the corpus), fine-tuned with the
same `compressor finetune` settings on wordnet-supersense and evaluated on the whole
held-out test split:
- pretrained: `compressor pretrain --objective mlm --corpus wordnet --size small ...`;
- random: the same model class built by the same objective with the same seed, untrained.

Every step is a `compressor` command (recorded in the results); a step whose output already
exists is skipped, so a rerun after an interruption continues where it stopped. Each runs in
its own process unless `--in-process` (then `compressor.cli.main` is called here: no import
cost per step, but the steps share this process's memory and torch settings).

The defaults are the benchmark; `--corpus FILE`, `--size tiny`, `--max-eval-samples` and
small steps, vocabulary and fine-tune samples make a smoke run (tests/benchmarks).

    .venv/bin/python benchmarks/pretraining.py --out benchmarks/results/pretraining.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pretrain.child_process import ends_with_this_process  # noqa: E402


IN_PROCESS = ["compressor"]


def compressor_cli(in_process: bool = False) -> list[str]:
    """The prefix of every step's command: `python -m compressor` in a child process, or
    `compressor` run by `run` in this process (`compressor.cli.main`)."""
    return list(IN_PROCESS) if in_process else [sys.executable, "-m", "compressor"]


def run(cmd: list[str], log: list[dict], done: Path | None = None) -> None:
    """Run a step, or record it as cached when its output `done` exists (a rerun)."""
    if done is not None and done.exists():
        log.append({"command": " ".join(cmd), "cached": True})
        return
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    if cmd[:1] == IN_PROCESS:
        from compressor.cli import main as compressor_main
        if code := compressor_main(cmd[1:]):
            raise SystemExit(f"step failed (exit code {code}): {' '.join(cmd)}")
    else:
        # Cores here are shared: idle OpenMP threads must not spin against other jobs.
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        subprocess.run(cmd, check=True, cwd=ROOT, env=env, preexec_fn=ends_with_this_process())
    log.append({"command": " ".join(cmd), "seconds": round(time.time() - start, 1)})


def tokenizer_step(cli: list[str], tok: Path, vocab_size: int, log: list[dict], corpus: str = "wordnet") -> None:
    """The WordPiece tokenizer every arm shares, trained once on the corpus."""
    run(cli + ["tokenizer", "--corpus", corpus, "--kind", "wordpiece",
               "--vocab-size", str(vocab_size), "--out", str(tok)], log, done=tok)


def pretrain_step(cli: list[str], objective: str, tok: Path, out: Path, args: argparse.Namespace,
                  log: list[dict], lr: float | None = None) -> dict:
    """`compressor pretrain` with the benchmark's shared settings (the learning rate `lr` when
    given, else `args.lr`); returns its metrics.json."""
    run(cli + ["pretrain", "--objective", objective, "--corpus", args.corpus, "--size", args.size,
               "--tokenizer", str(tok), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
               "--max-length", str(args.max_length), "--lr", str(lr or args.lr), "--seed", str(args.seed),
               "--checkpoint-every", "100", "--threads", str(args.threads), "--resume",
               "--out", str(out)], log, done=out)
    return json.loads((out / "metrics.json").read_text())


def finetune_step(cli: list[str], model_dir: Path, out: Path, args: argparse.Namespace, log: list[dict],
                  max_eval_samples: int | None = None) -> dict:
    """`compressor finetune` on wordnet-supersense; returns the test metrics of the arm."""
    eval_limit = [] if max_eval_samples is None else ["--max-eval-samples", str(max_eval_samples)]
    run(cli + ["finetune", "--model", str(model_dir), "--task", "wordnet-supersense",
               "--max-train-samples", str(args.finetune_samples), "--epochs", str(args.finetune_epochs),
               "--lr", str(args.finetune_lr), "--batch-size", "32", "--seed", str(args.seed),
               *eval_limit, "--quiet", "--out", str(out)], log, done=out)
    metrics = json.loads((out / "metrics.json").read_text())
    arm = {k: metrics[k] for k in ("accuracy", "macro_f1", "train_samples", "steps",
                                   "final_loss", "train_seconds") if k in metrics}
    arm["test_examples"] = metrics["samples"]
    return arm


def random_init_dir(tokenizer_dir: Path, out: Path, max_length: int, seed: int, size: str = "small") -> None:
    """The untrained arm: what `compressor pretrain` would start from, saved as an HF dir."""
    from pretrain.atomic import atomic_dir
    from pretrain.models import load_tokenizer
    from pretrain.objectives import SIZES, get_objective
    objective = get_objective("mlm")
    tokenizer = load_tokenizer(tokenizer_dir)
    model = objective.deliverable(objective.build_model(tokenizer, SIZES[size], max_length, seed))
    with atomic_dir(out) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-pretraining")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "pretraining.json")
    p.add_argument("--corpus", default="wordnet",
                   help="'wordnet' or a text file (blank lines between documents), for the tokenizer and pretraining")
    p.add_argument("--size", choices=["tiny", "small", "base"], default="small", help="model size of both arms")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--finetune-samples", type=int, default=10000)
    p.add_argument("--finetune-epochs", type=float, default=3)
    p.add_argument("--finetune-lr", type=float, default=2e-4)
    p.add_argument("--max-eval-samples", type=int, help="test examples per arm (default: the whole test split)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads for pretraining")
    p.add_argument("--only-random", action="store_true",
                   help="only the random-init arm (to run it beside the pretraining); no results file")
    p.add_argument("--in-process", action="store_true",
                   help="run the compressor steps in this process instead of one child process each")
    args = p.parse_args()

    cli = compressor_cli(args.in_process)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    log: list[dict] = []
    tok, pre, rnd = work / "tokenizer", work / "mlm", work / "random"

    tokenizer_step(cli, tok, args.vocab_size, log, args.corpus)
    if not args.only_random:
        pretrain_step(cli, "mlm", tok, pre, args, log)
    if not rnd.exists():
        random_init_dir(tok, rnd, args.max_length, args.seed, args.size)

    arms = {}
    both = (("pretrained_mlm", pre), ("random_init", rnd))
    for name, model_dir in both[1:] if args.only_random else both:
        arms[name] = finetune_step(cli, model_dir, work / f"finetune-{name}", args, log, args.max_eval_samples)
    if args.only_random:
        return

    from compressor.bench.environment import environment
    pretrain_metrics = json.loads((pre / "metrics.json").read_text())
    gain = arms["pretrained_mlm"]["accuracy"] - arms["random_init"]["accuracy"]
    result = {
        "benchmark": "pretraining: mlm from scratch on the wordnet corpus vs random init, fine-tuned on wordnet-supersense",
        "script": "benchmarks/pretraining.py " + " ".join(sys.argv[1:]),
        "settings": vars(args) | {"work": str(args.work), "out": str(args.out)},
        "commands": log,
        "tokenizer": json.loads((tok / "tokenizer_metrics.json").read_text()) | {"environment": None},
        "pretraining": {k: v for k, v in pretrain_metrics.items() if k != "environment"},
        "arms": arms,
        "accuracy_gain_points": round(100 * gain, 2),
        "target_points": 5.0,
        "environment": environment(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({"arms": arms, "accuracy_gain_points": result["accuracy_gain_points"]}, indent=2))


if __name__ == "__main__":
    main()
