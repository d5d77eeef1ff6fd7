"""Fine-tuning throughput: this tool's training loop vs the Transformers Trainer.

Same model (the bundled all-MiniLM-L6-v2), same WordNet supersense training examples,
same batch size, learning rate, epochs, seed and thread count, measured one after the
other in one process. The Trainer keeps its default settings otherwise (fused AdamW,
linear decay, dynamic padding through DataCollatorWithPadding). Both models are then
evaluated on the same held-out test examples.

    .venv/bin/python benchmarks/finetune_throughput.py --train-samples 30000 --epochs 2 \
        --out benchmarks/results/finetune_throughput.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from compressor.atomic import write_json
from compressor.environment import environment
from pretrain.batching import encode
from pretrain.data import load_task
from pretrain.finetune import FinetuneConfig, evaluate, finetune
from pretrain.models import load_classifier, set_threads


def run_ours(task, args, mode: str) -> dict:
    """mode = "<embedding_updates>" or "<embedding_updates>-ungrouped" (no length grouping)."""
    embedding_updates, _, grouping = mode.partition("-")
    model, tokenizer = load_classifier("minilm", task.label_names, seed=args.seed)
    cfg = FinetuneConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                         max_train_samples=args.train_samples, embedding_updates=embedding_updates,
                         group_by_length=grouping != "ungrouped")
    result = finetune(model, tokenizer, task, cfg, desc=f"ours ({mode})").train
    metrics, _ = evaluate(model, tokenizer, task.split("test").head(args.eval_samples))
    return {"name": f"ours-{mode}", "train_seconds": result.seconds,
            "train_samples": result.samples, "samples_per_second": result.samples_per_second,
            "final_loss": result.final_loss, **metrics}


class EncodedDataset(torch.utils.data.Dataset):
    """The same tokenised examples, as the dicts the Trainer's collator expects."""

    def __init__(self, encoded):
        self.encoded = encoded

    def __len__(self):
        return len(self.encoded)

    def __getitem__(self, i):
        item = {"input_ids": self.encoded.input_ids[i], "labels": int(self.encoded.labels[i])}
        if self.encoded.token_type_ids is not None:
            item["token_type_ids"] = self.encoded.token_type_ids[i]
        return item


def run_trainer(task, args, evaluate_after: bool = True) -> dict:
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    model, tokenizer = load_classifier("minilm", task.label_names, seed=args.seed)
    train = EncodedDataset(encode(tokenizer, task.split("train").head(args.train_samples)))
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(output_dir=tmp, per_device_train_batch_size=args.batch_size,
                                  learning_rate=args.lr, num_train_epochs=args.epochs, seed=args.seed,
                                  use_cpu=True, report_to=[], save_strategy="no", logging_steps=100,
                                  disable_tqdm=not evaluate_after)
        trainer = Trainer(model=model, args=targs, train_dataset=train,
                          data_collator=DataCollatorWithPadding(tokenizer))
        start = time.perf_counter()
        out = trainer.train()
        seconds = time.perf_counter() - start
    metrics = evaluate(model, tokenizer, task.split("test").head(args.eval_samples))[0] if evaluate_after else {}
    samples = len(train) * args.epochs
    return {"name": "transformers-trainer", "train_seconds": seconds, "train_samples": int(samples),
            "samples_per_second": samples / seconds, "final_loss": out.training_loss,
            "optimizer": targs.optim.value if hasattr(targs.optim, "value") else str(targs.optim), **metrics}


def interleaved_throughput(task, args) -> dict:
    """Short windows of ours and the Trainer, alternating, so that background load on a
    shared machine falls on both alike; the ratio of medians is the throughput figure."""
    short = argparse.Namespace(**{**vars(args), "train_samples": args.window_samples, "epochs": 1})
    ours_args = argparse.Namespace(**vars(short))
    rounds = []
    for r in range(args.interleave_rounds + 1):   # round 0 warms up thread pools and caches
        ours = run_ours_timing(task, ours_args, args.modes.split(",")[0])
        theirs = run_trainer(task, short, evaluate_after=False)["samples_per_second"]
        if r > 0:
            rounds.append({"ours": ours, "trainer": theirs, "ratio": ours / theirs})
    ratios = sorted(x["ratio"] for x in rounds)
    return {"window_samples": args.window_samples, "rounds": rounds,
            "median_ratio": ratios[len(ratios) // 2]}


def run_ours_timing(task, args, mode: str) -> float:
    embedding_updates, _, grouping = mode.partition("-")
    model, tokenizer = load_classifier("minilm", task.label_names, seed=args.seed)
    cfg = FinetuneConfig(epochs=1, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                         max_train_samples=args.train_samples, embedding_updates=embedding_updates,
                         group_by_length=grouping != "ungrouped")
    return finetune(model, tokenizer, task, cfg, show_progress=False).samples_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-samples", type=int, default=30000)
    parser.add_argument("--eval-samples", type=int, default=None, help="default: the whole test split")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="sparse", help="comma-separated runs of ours: sparse, dense, frozen, each optionally with -ungrouped")
    parser.add_argument("--skip-trainer", action="store_true")
    parser.add_argument("--interleave-rounds", type=int, default=0,
                        help="instead of full runs: alternate short timed windows of ours and the Trainer")
    parser.add_argument("--window-samples", type=int, default=3200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    set_threads(None)
    task = load_task("wordnet-supersense", seed=args.seed)
    if args.interleave_rounds:
        result = {"command": command_line(args), "settings": settings(args), "environment": environment(),
                  "interleaved": interleaved_throughput(task, args)}
        print(json.dumps(result["interleaved"], indent=2))
        if args.out:
            write_json(args.out, result)
        return
    runs = [run_ours(task, args, mode) for mode in args.modes.split(",")]
    if not args.skip_trainer:
        runs.append(run_trainer(task, args))
        base = runs[-1]
        for r in runs[:-1]:
            r["speedup_vs_trainer"] = r["samples_per_second"] / base["samples_per_second"]
            r["accuracy_delta_vs_trainer"] = r["accuracy"] - base["accuracy"]
    result = {"command": command_line(args), "settings": settings(args),
              "environment": environment(), "runs": runs}
    print(json.dumps(runs, indent=2))
    if args.out:
        write_json(args.out, result)


def settings(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if k != "out"}


def command_line(args: argparse.Namespace) -> str:
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
             if v is not None and v is not False and v is not True]
    return "python benchmarks/finetune_throughput.py " + " ".join(flags)


if __name__ == "__main__":
    main()
