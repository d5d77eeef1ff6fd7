"""Fine-tuning throughput and accuracy: this tool's training loop vs the Transformers Trainer.

Issue 13's fair comparison. `--rounds N` full runs per side; in each round both sides
fine-tune the bundled all-MiniLM-L6-v2 on the first `--train-samples` wordnet-supersense
training examples for `--epochs` epochs, one side after the other in one process, the order
alternating (round 0: ours first, round 1: the Trainer first, ...), each round with its
own seed (`--seed` + round: data split, head initialisation, data order and dropout, as
`compressor finetune --seed` uses it). Every trained model is evaluated on the same test
examples, so the accuracy at equal settings comes from the very runs that are timed.

What both sides get alike:
- the same tokenized examples: `pretrain.batching.encode` output, computed once per round
  before either clock starts (the Trainer reads the same id lists through a thin Dataset);
- batch 32, lr 1e-4, weight decay 0.01 (not on biases and LayerNorm), 6% warm-up then
  linear decay, gradient clipping at norm 1.0, fused AdamW for the dense parameters;
- dynamic padding to each batch's longest member (ours: `collate`; the Trainer:
  `DataCollatorWithPadding`) and length-grouped batches (ours: `group_by_length`; the
  Trainer: its own `group_by_length=True`, whose `LengthGroupedSampler` takes the lengths
  from the dataset's `input_ids` lists: `datasets` is not installed, so no `length` column
  applies, and nothing is re-tokenized);
- the same torch thread count (`set_threads`, checked before and after each run: the
  Trainer does not change it), no dataloader workers, no progress bars, no checkpoints, no
  evaluation during training;
- the same precision: fp32, or mixed bf16 on both sides (ours: a mode with `-bf16`, i.e.
  `TrainConfig.precision="bf16"`; the Trainer: `--trainer-precisions bf16`, its own
  `bf16=True`). Each mode of ours is compared with the Trainer run in its own precision.

What differs: ours trains the last layer on the first token only (the one the classifier
reads; same gradients, pretrain/first_token.py) and draws its dropout masks 16 bits per
element (the same rate), the attention-probability masks included, for which its SDPA
attention runs in its eager form (pretrain/dropout.py); the Trainer has no options for
these. `--modes sparse-whole` and `sparse-torchdropout` measure ours without each, and a
Trainer side `bf16-eager` (or `fp32-eager`) gives the Trainer's model the same eager
attention (with torch's dropout), so that what the attention form alone is worth is not
counted as the loop's.

What the clock covers, on both sides: the whole training call and nothing else. Ours:
`pretrain.train.train` (optimizer creation included) with the TrainConfig that
`pretrain.finetune.finetune` builds and the last layer on the first token only as its
`train_stage` sets it (`last_layer_for`), exactly what `compressor finetune` runs for the
`full` strategy. The Trainer: `Trainer.train()` (its optimizer, sampler and dataloader
creation included); building the `Trainer` object is timed separately
(`setup_seconds`, not counted). Model loading, tokenizing and evaluation are outside
the clock on both sides.

Every TrainingArguments value that differs from the Trainer's defaults is recorded in the
output (`trainer_arguments`). The throughput figure is the median over rounds of the
per-round ratio ours / Trainer (samples per second), with its min and max.

The fair comparison (about 2 x 1,000 steps per round):

    .venv/bin/python benchmarks/finetune_throughput.py --rounds 3 --train-samples 32000 --epochs 1 \
        --out benchmarks/results/finetune_throughput_fair.json

`--modes sparse,dense,frozen,sparse-ungrouped,sparse-whole` runs several of our variants
per round (embedding updates, `-ungrouped` for no length grouping, `-whole` for the whole
last layer instead of the first token only); each gets its own ratio.

Every run also counts the tokens the model saw (padded and real), so the two samplers'
padding can be compared. `--profile` adds where the CPU time goes (torch.profiler, self
time per operator, grouped: matrix products, attention, embedding backward, optimizers);
use it with a short run, e.g. `--rounds 2 --train-samples 1600 --eval-samples 100 --profile`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch

from compressor.bench.environment import environment
from pretrain.atomic import write_json
from pretrain.batching import Encoded, encode, usable_length
from pretrain.data import TaskData, load_task
from pretrain.dropout import eager_forward
from pretrain.finetune import FinetuneConfig, LoopHooks, evaluate, last_layer_for, whole_last_layer_reason
from pretrain.models import load_classifier, set_threads
from pretrain.strategies import trainable_for
from pretrain.train import TrainConfig, train

MODEL = "minilm"
TASK = "wordnet-supersense"
LOG_EVERY = 50   # the Trainer logs the mean loss of the last 50 steps: ours' final_loss window


MODE_FLAGS = ("ungrouped", "whole", "bf16", "torchdropout")
TRAINER = "transformers-trainer"
ENV_MIXED_PRECISION = "ACCELERATE_MIXED_PRECISION"


def mode_parts(mode: str) -> tuple[str, set[str]]:
    """'sparse-ungrouped-whole' -> ('sparse', {'ungrouped', 'whole'})."""
    updates, *flags = mode.split("-")
    return updates, set(flags)


def finetune_config(args: argparse.Namespace, seed: int, mode: str = "sparse") -> FinetuneConfig:
    """What `compressor finetune --epochs E --batch-size B --lr LR --seed S --max-train-samples N
    [--embedding-updates M] [--whole-last-layer] [--precision bf16] [--dropout-masks torch]` builds;
    `-ungrouped` turns off length grouping, `-whole` trains the whole last layer (not the first token
    only), `-bf16` trains in mixed precision, `-torchdropout` uses torch's dropout (not the packed
    masks and eager attention of pretrain/dropout.py)."""
    embedding_updates, flags = mode_parts(mode)
    return FinetuneConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=seed,
                          max_train_samples=args.train_samples, embedding_updates=embedding_updates,
                          group_by_length="ungrouped" not in flags, cls_only_last_layer="whole" not in flags,
                          precision="bf16" if "bf16" in flags else "fp32",
                          dropout_masks="torch" if "torchdropout" in flags else "packed")


def encoded_train(model, tokenizer, task: TaskData, cfg: FinetuneConfig) -> Encoded:
    """The training data exactly as `pretrain.finetune.train_stage` encodes it."""
    return encode(tokenizer, task.split("train").head(cfg.max_train_samples), usable_length(model, cfg.max_length))


# Operator name fragments (lower case) -> group, for --profile's summary; first match wins.
OP_GROUPS = (("optimizer", ("adam", "optimizer", "sgd")),
             ("embedding backward", ("embedding_dense_backward", "embedding_backward", "index_put", "sparse")),
             ("attention", ("scaled_dot_product", "softmax", "bmm", "baddbmm")),
             ("matrix products", ("addmm", "aten::mm", "matmul", "linear")),
             ("gradient clipping", ("norm", "clamp", "_foreach_mul")))


@contextlib.contextmanager
def observed(model, profile: bool):
    """Tokens the model sees in training (padded and real) and, with `profile`, where the time goes."""
    seen = {"padded_tokens": 0, "real_tokens": 0}

    def count(module, args, kwargs):
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is not None:
            seen["padded_tokens"] += ids.numel()
            seen["real_tokens"] += int(mask.sum()) if mask is not None else ids.numel()
    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None
    try:
        with profiler or contextlib.nullcontext():
            yield seen
    finally:
        handle.remove()
    seen["padding_fraction"] = 1 - seen["real_tokens"] / max(seen["padded_tokens"], 1)
    if profiler is not None:
        seen["profile"] = profile_summary(profiler)


def profile_summary(profiler) -> dict:
    """Self CPU time (ms) per operator group and the top operators."""
    events = [(e.key, e.self_cpu_time_total / 1e3, e.count) for e in profiler.key_averages()]
    groups = {name: 0.0 for name, _ in OP_GROUPS} | {"other": 0.0}
    for key, ms, _ in events:
        group = next((name for name, parts in OP_GROUPS if any(p in key.lower() for p in parts)), "other")
        groups[group] += ms
    top = sorted(events, key=lambda e: -e[1])[:20]
    return {"self_ms_by_group": {k: round(v, 1) for k, v in groups.items()},
            "top_ops": [{"op": k, "self_ms": round(ms, 1), "calls": n} for k, ms, n in top]}


def run_ours(task: TaskData, args: argparse.Namespace, seed: int, mode: str) -> dict:
    cfg = finetune_config(args, seed, mode)
    model, tokenizer = load_classifier(MODEL, task.label_names, seed=seed)
    data = encoded_train(model, tokenizer, task, cfg)
    # As pretrain.finetune.train_stage does for one task (prepare() adds nothing for "full").
    train_cfg = TrainConfig(**cfg.model_dump(include=set(TrainConfig.model_fields)))
    threads = torch.get_num_threads()
    with observed(model, args.profile) as seen, trainable_for(model, cfg.strategy, model.base_model), \
            last_layer_for([model], cfg, LoopHooks()):
        start = time.perf_counter()
        result = train(model, data, train_cfg, desc=f"ours ({mode})", show_progress=False)
        seconds = time.perf_counter() - start
    return {"side": f"ours-{mode}", "seconds": seconds, "samples": result.samples, "steps": result.steps,
            "last_layer_skipped": whole_last_layer_reason([model], cfg),
            "samples_per_second": result.samples / seconds,
            "loop_seconds": result.seconds,   # the loop's own clock (after optimizer creation)
            "final_loss": result.final_loss, "mean_loss": float(np.mean(result.losses)),
            "threads": [threads, torch.get_num_threads()],
            "train_config": train_cfg.model_dump(mode="json"), "tokens": seen,
            **evaluate_model(model, tokenizer, task, args)}


class EncodedDataset(torch.utils.data.Dataset):
    """The same tokenised examples, as the dicts the Trainer's collator expects."""

    def __init__(self, encoded: Encoded):
        self.encoded = encoded

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int) -> dict:
        item = {"input_ids": self.encoded.input_ids[i], "labels": int(self.encoded.labels[i])}
        if self.encoded.token_type_ids is not None:
            item["token_type_ids"] = self.encoded.token_type_ids[i]
        return item


def trainer_arguments(args: argparse.Namespace, seed: int, output_dir: str, precision: str = "fp32") -> dict:
    """Every TrainingArguments value we set (the rest are the Trainer's defaults); `bf16` is the
    Trainer's own mixed precision (torch.autocast on the CPU)."""
    return dict(output_dir=output_dir, bf16=precision == "bf16", per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
                num_train_epochs=args.epochs, weight_decay=0.01, warmup_ratio=0.06, lr_scheduler_type="linear",
                max_grad_norm=1.0, seed=seed, group_by_length=True, dataloader_num_workers=0, use_cpu=True,
                report_to="none", save_strategy="no", eval_strategy="no", logging_steps=LOG_EVERY,
                disable_tqdm=True)


def plain(value):
    """A JSON-friendly form of a TrainingArguments value."""
    if hasattr(value, "value"):   # enums
        return value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


def non_default_arguments(targs) -> dict:
    """The TrainingArguments fields whose (post-init) value differs from a default instance's."""
    from transformers import TrainingArguments
    with tempfile.TemporaryDirectory() as tmp:
        default = TrainingArguments(output_dir=tmp)
        skip = {"output_dir", "logging_dir"}
        return {name: plain(getattr(targs, name)) for name in sorted(vars(default))
                if name not in skip and not name.startswith("_")
                and plain(getattr(targs, name)) != plain(getattr(default, name))}


def trained_samples(examples: int, batch_size: int, steps: int) -> int:
    """Examples in the first `steps` batches of epochs over `examples` (the last batch of an epoch short)."""
    per_epoch = math.ceil(examples / batch_size)
    epochs, rest = divmod(steps, per_epoch)
    return epochs * examples + min(rest * batch_size, examples)


@contextlib.contextmanager
def own_mixed_precision_env():
    """TrainingArguments(bf16=True) writes ACCELERATE_MIXED_PRECISION=bf16 into os.environ, and
    every later TrainingArguments without bf16 reads it back (transformers 4.57): an fp32
    Trainer built after a bf16 one would train in bf16. Each Trainer gets a clean variable."""
    from accelerate.state import AcceleratorState

    saved = os.environ.pop(ENV_MIXED_PRECISION, None)
    try:
        yield
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)   # the Trainer's singleton, likewise
        os.environ.pop(ENV_MIXED_PRECISION, None)
        if saved is not None:
            os.environ[ENV_MIXED_PRECISION] = saved


def trainer_side(spec: str) -> str:
    return TRAINER if spec == "fp32" else f"{TRAINER}-{spec}"


def trainer_spec_parts(spec: str) -> tuple[str, bool]:
    """'bf16-eager' -> ('bf16', True): the precision, and whether the model runs eager attention."""
    precision, _, attention = spec.partition("-")
    return precision, attention == "eager"


def eager_attention(model) -> int:
    """Run the model's SDPA self-attention as its eager form, as our loop does while it trains
    (pretrain/dropout.py), so a Trainer side can have the same attention; returns how many."""
    swapped = 0
    for module in model.modules():
        forward = eager_forward(module)
        if forward is not None:
            module.forward = types.MethodType(forward, module)
            swapped += 1
    return swapped


def run_trainer(task: TaskData, args: argparse.Namespace, seed: int, spec: str) -> dict:
    from transformers import DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments

    class Losses(TrainerCallback):
        def __init__(self):
            self.logged: list[float] = []

        def on_log(self, targs, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.logged.append(float(logs["loss"]))

    precision, eager = trainer_spec_parts(spec)
    cfg = finetune_config(args, seed)
    model, tokenizer = load_classifier(MODEL, task.label_names, seed=seed)
    eager_modules = eager_attention(model) if eager else 0
    train_set = EncodedDataset(encoded_train(model, tokenizer, task, cfg))
    losses = Losses()
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp, own_mixed_precision_env():
        targs = TrainingArguments(**trainer_arguments(args, seed, tmp, precision))
        start = time.perf_counter()
        trainer = Trainer(model=model, args=targs, train_dataset=train_set,
                          data_collator=DataCollatorWithPadding(tokenizer), callbacks=[losses])
        setup_seconds = time.perf_counter() - start
        with observed(model, args.profile) as seen:
            start = time.perf_counter()
            out = trainer.train()
            seconds = time.perf_counter() - start
        mixed_precision = trainer.accelerator.mixed_precision   # what it really ran: "no" or "bf16"
    model.eval()
    samples = trained_samples(len(train_set), args.batch_size, out.global_step)
    return {"side": trainer_side(spec), "seconds": seconds, "eager_attention_modules": eager_modules,
            "samples": samples, "steps": out.global_step,
            "samples_per_second": samples / seconds, "setup_seconds": setup_seconds,
            # the mean loss of the last LOG_EVERY steps (as ours), or of the whole run if shorter
            "final_loss": losses.logged[-1] if losses.logged else out.training_loss,
            "mean_loss": out.training_loss, "threads": [threads, torch.get_num_threads()],
            "optimizer": plain(targs.optim), "sampler": type(trainer._get_train_sampler()).__name__,
            "mixed_precision": mixed_precision,
            "tokens": seen,
            **evaluate_model(model, tokenizer, task, args)}


def evaluate_model(model, tokenizer, task: TaskData, args: argparse.Namespace) -> dict:
    metrics, _ = evaluate(model, tokenizer, task.split("test").head(args.eval_samples))
    return {"accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"],
            "eval_samples": len(task.split("test").head(args.eval_samples))}


def baseline_for(mode: str, trainers: list[str]) -> str:
    """The Trainer side a mode of ours is compared with: the one in the same precision when it
    ran (SDPA before eager attention), else the first listed."""
    precision = "bf16" if "bf16" in mode_parts(mode)[1] else "fp32"
    same = [spec for spec in (precision, f"{precision}-eager") if spec in trainers]
    return trainer_side(same[0] if same else trainers[0])


def run_rounds(args: argparse.Namespace) -> dict:
    modes = args.modes.split(",")
    trainers = [] if args.skip_trainer else args.trainer_precisions.split(",")
    rounds = []
    for r in range(args.rounds):
        seed = args.seed + r
        task = load_task(TASK, seed=seed)   # as `compressor finetune --seed` loads it
        sides = [("ours", m) for m in modes] + [("trainer", p) for p in trainers]
        if r % 2 == 1:
            sides.reverse()
        runs = {}
        for kind, mode in sides:
            set_threads(args.threads)
            run = run_ours(task, args, seed, mode) if kind == "ours" else run_trainer(task, args, seed, mode)
            runs[run["side"]] = run
            print(f"round {r} seed {seed} {run['side']}: {run['samples_per_second']:.1f} samples/s, "
                  f"{run['steps']} steps, loss {run['final_loss']:.4f}, accuracy {run['accuracy']:.4f}",
                  file=sys.stderr, flush=True)
        entry = {"round": r, "seed": seed, "order": [s["side"] for s in runs.values()], "runs": runs}
        if trainers:
            base = {f"ours-{m}": runs[baseline_for(m, trainers)] for m in modes}
            entry["ratio"] = {f"ours-{m}": runs[f"ours-{m}"]["samples_per_second"]
                              / base[f"ours-{m}"]["samples_per_second"] for m in modes}
            entry["accuracy_difference"] = {f"ours-{m}": runs[f"ours-{m}"]["accuracy"] - base[f"ours-{m}"]["accuracy"]
                                            for m in modes}
        rounds.append(entry)
    return {"rounds": rounds, "compared_with": {f"ours-{m}": baseline_for(m, trainers) for m in modes} if trainers
            else {}, "summary": summarize(rounds, modes, trainers)}


def summarize(rounds: list[dict], modes: list[str], trainers: list[str]) -> dict:
    ours = [f"ours-{m}" for m in modes]
    sides = ours + [trainer_side(p) for p in trainers]
    summary: dict = {
        "samples_per_second": {s: [r["runs"][s]["samples_per_second"] for r in rounds] for s in sides},
        "mean_accuracy": {s: statistics.fmean(r["runs"][s]["accuracy"] for r in rounds) for s in sides},
        "mean_macro_f1": {s: statistics.fmean(r["runs"][s]["macro_f1"] for r in rounds) for s in sides},
    }
    if trainers:
        summary["ratio"] = {}
        summary["accuracy_difference"] = {}
        for s in ours:
            ratios = [r["ratio"][s] for r in rounds]
            diffs = [r["accuracy_difference"][s] for r in rounds]
            summary["ratio"][s] = spread(ratios)
            summary["accuracy_difference"][s] = {"mean": statistics.fmean(diffs), "per_seed": diffs}
        summary["ratio_to"] = {s: {t: spread([r["runs"][s]["samples_per_second"] / r["runs"][t]["samples_per_second"]
                                              for r in rounds])
                                   for t in sides if t not in ours} for s in ours}
    return summary


def spread(ratios: list[float]) -> dict:
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "per_round": ratios}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="full runs per side, the order alternating")
    parser.add_argument("--train-samples", type=int, default=32000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--eval-samples", type=int, default=None, help="default: the whole test split")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0, help="round r uses seed + r")
    parser.add_argument("--modes", default="sparse",
                        help="comma-separated runs of ours per round: sparse, dense, frozen, each optionally "
                             "with -ungrouped, -whole (the whole last layer), -bf16 (mixed precision) and/or "
                             "-torchdropout (torch's dropout)")
    parser.add_argument("--trainer-precisions", default="fp32",
                        help="comma-separated Trainer runs per round: fp32, bf16 (its `bf16=True`), each "
                             "optionally with -eager (the model's attention in its eager form, as ours trains "
                             "it); each mode of ours is compared with the Trainer in its own precision (SDPA) "
                             "when that ran, and with every Trainer side in `ratio_to`")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    parser.add_argument("--skip-trainer", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="record where the CPU time goes (torch.profiler; use a short run)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for mode in args.modes.split(","):
        updates, flags = mode_parts(mode)
        if updates not in ("sparse", "dense", "frozen") or not flags <= set(MODE_FLAGS):
            parser.error(f"unknown mode {mode!r}; expected sparse, dense or frozen, optionally with "
                         f"-ungrouped, -whole, -bf16 and/or -torchdropout")
    for spec in args.trainer_precisions.split(","):
        if spec not in ("fp32", "bf16", "fp32-eager", "bf16-eager"):
            parser.error(f"unknown Trainer precision {spec!r}; expected fp32 or bf16, optionally with -eager")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:   # the TrainingArguments the Trainer runs with
        from transformers import TrainingArguments
        targs = TrainingArguments(**trainer_arguments(args, args.seed, tmp))
        differing = non_default_arguments(targs)
        by_side = {}
        for spec in args.trainer_precisions.split(","):
            with own_mixed_precision_env():
                by_side[trainer_side(spec)] = non_default_arguments(
                    TrainingArguments(**trainer_arguments(args, args.seed, tmp, trainer_spec_parts(spec)[0])))
    for values in (differing, *by_side.values()):
        values.pop("seed", None)
    result = {"command": command_line(argv), "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "model": MODEL, "task": TASK, "torch_threads": torch.get_num_threads(),
              "trainer_arguments": {"differing_from_defaults": differing, "differing_by_side": by_side,
                                    "seed": "the round's seed", "optimizer": plain(targs.optim)},
              "environment": environment(), **run_rounds(args)}
    summary = result["summary"]
    for side, ratio in summary.get("ratio", {}).items():
        print(f"{side} / trainer: median {ratio['median']:.2f}x (min {ratio['min']:.2f}, max {ratio['max']:.2f}); "
              f"accuracy difference {summary['accuracy_difference'][side]['mean']:+.4f}")
    if args.out:
        write_json(args.out, result)
    return result


def command_line(argv: list[str] | None) -> str:
    return shlex.join(["python", "benchmarks/finetune_throughput.py", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
