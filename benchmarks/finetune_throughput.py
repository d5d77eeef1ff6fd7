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


def run_ours(task, args, embedding_updates: str) -> dict:
    model, tokenizer = load_classifier("minilm", task.label_names, seed=args.seed)
    cfg = FinetuneConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                         max_train_samples=args.train_samples, embedding_updates=embedding_updates)
    result = finetune(model, tokenizer, task, cfg, desc=f"ours ({embedding_updates})")
    metrics, _ = evaluate(model, tokenizer, task.split("test").head(args.eval_samples))
    return {"name": f"ours-{embedding_updates}", "train_seconds": result.seconds,
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


def run_trainer(task, args) -> dict:
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    model, tokenizer = load_classifier("minilm", task.label_names, seed=args.seed)
    train = EncodedDataset(encode(tokenizer, task.split("train").head(args.train_samples)))
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(output_dir=tmp, per_device_train_batch_size=args.batch_size,
                                  learning_rate=args.lr, num_train_epochs=args.epochs, seed=args.seed,
                                  use_cpu=True, report_to=[], save_strategy="no", logging_steps=100,
                                  disable_tqdm=False)
        trainer = Trainer(model=model, args=targs, train_dataset=train,
                          data_collator=DataCollatorWithPadding(tokenizer))
        start = time.perf_counter()
        out = trainer.train()
        seconds = time.perf_counter() - start
    metrics, _ = evaluate(model, tokenizer, task.split("test").head(args.eval_samples))
    samples = len(train) * args.epochs
    return {"name": "transformers-trainer", "train_seconds": seconds, "train_samples": int(samples),
            "samples_per_second": samples / seconds, "final_loss": out.training_loss,
            "optimizer": targs.optim.value if hasattr(targs.optim, "value") else str(targs.optim), **metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-samples", type=int, default=30000)
    parser.add_argument("--eval-samples", type=int, default=None, help="default: the whole test split")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="sparse", help="comma-separated embedding_updates modes of ours")
    parser.add_argument("--skip-trainer", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    set_threads(None)
    task = load_task("wordnet-supersense", seed=args.seed)
    runs = [run_ours(task, args, mode) for mode in args.modes.split(",")]
    if not args.skip_trainer:
        runs.append(run_trainer(task, args))
        base = runs[-1]
        for r in runs[:-1]:
            r["speedup_vs_trainer"] = r["samples_per_second"] / base["samples_per_second"]
            r["accuracy_delta_vs_trainer"] = r["accuracy"] - base["accuracy"]
    result = {"command": "python benchmarks/finetune_throughput.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out",) and v is not None and v is not False),
              "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "environment": environment(), "runs": runs}
    print(json.dumps(runs, indent=2))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
