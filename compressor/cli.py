"""The `compressor` command: finetune, evaluate, export, run.

Bad input ends with one line on stderr and exit code 2; nothing half-written is left.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path

from pretrain.errors import UserError


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we want just the error, on one line."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {self.prog}: {message}\n")


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="compressor", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    ft = sub.add_parser("finetune", help="fine-tune a BERT-family model on a task")
    ft.add_argument("--model", default="minilm", help="'minilm' (bundled) or an HF model dir")
    ft.add_argument("--task", required=True, help="wordnet-supersense, wordnet-wsd, or a CSV/TSV/JSONL file")
    ft.add_argument("--out", required=True, type=Path)
    ft.add_argument("--epochs", type=float, default=1.0)
    ft.add_argument("--batch-size", type=positive_int, default=32)
    ft.add_argument("--lr", type=float, default=1e-4)
    ft.add_argument("--max-train-samples", type=positive_int)
    ft.add_argument("--max-eval-samples", type=positive_int)
    ft.add_argument("--seed", type=int, default=0)
    ft.add_argument("--embedding-updates", choices=["sparse", "dense", "frozen"], default="sparse",
                    help="how the word-embedding matrix trains (sparse: only rows in the batch)")
    ft.add_argument("--quiet", action="store_true", help="no progress bar")
    ft.set_defaults(handler=cmd_finetune)

    ev = sub.add_parser("evaluate", help="evaluate an HF or ONNX model dir; prints JSON")
    ev.add_argument("--model", required=True)
    ev.add_argument("--task", help="default: the task recorded with the model")
    ev.add_argument("--split", default="test", choices=["train", "validation", "test"])
    ev.add_argument("--reference", help="another model: report the fraction of agreeing predictions")
    ev.add_argument("--max-samples", type=positive_int)
    ev.add_argument("--seed", type=int, default=0, help="the seed the task's splits were drawn with")
    ev.set_defaults(handler=cmd_evaluate)

    ex = sub.add_parser("export", help="export an HF model dir to a gated ONNX model dir")
    ex.add_argument("--model", required=True, type=Path, help="an HF model dir (e.g. one a recipe wrote)")
    ex.add_argument("--out", required=True, type=Path)
    ex.add_argument("--optimize", action="store_true", help="ONNX Runtime transformer fusion")
    ex.add_argument("--quantize", choices=["none", "dynamic-int8", "static-int8", "inc", "torch-dynamic-int8",
                                           "fp16", "int4-weight-only"],
                    help="default: what the model's quantize pass recorded, else none (fp32)")
    ex.add_argument("--per-channel", action="store_const", const=True, help="per-channel int8 weight scales")
    ex.add_argument("--reduce-range", action="store_const", const=True, help="7-bit int8 weights")
    ex.add_argument("--weight-type", choices=["qint8", "quint8"])
    ex.add_argument("--calibration", choices=["minmax", "entropy", "percentile"], help="static-int8 ranges (default entropy)")
    ex.add_argument("--format", choices=["qdq", "qoperator"], help="static-int8 graph form")
    ex.add_argument("--calibration-samples", type=positive_int, help="static-int8/inc: train examples")
    ex.add_argument("--block-size", type=positive_int, help="int4-weight-only: weights per scale")
    ex.add_argument("--tolerable-loss", type=float, help="inc: relative accuracy loss allowed")
    ex.add_argument("--max-trials", type=positive_int, help="inc: autotune trials")
    ex.add_argument("--min-accuracy", type=float, help="absolute test-accuracy floor when quantized")
    ex.add_argument("--task", help="default: the task recorded with the model")
    ex.add_argument("--max-eval-samples", type=positive_int, help="test examples for the accuracy gate")
    ex.add_argument("--parity-tolerance", type=float, default=1e-4, help="max |logit diff| vs PyTorch")
    ex.add_argument("--accuracy-tolerance", type=float, default=0.01, help="max accuracy drop when quantized")
    ex.add_argument("--seed", type=int, default=0, help="the seed the task's splits were drawn with")
    ex.set_defaults(handler=cmd_export)

    run = sub.add_parser("run", help="run a recipe: teacher, variants, report.json")
    run.add_argument("recipe", type=Path)
    run.add_argument("--out", required=True, type=Path)
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(handler=cmd_run)
    return parser


def task_arg(value: str) -> str | dict:
    """A built-in task name, or a data file with the default columns text[, text_pair], label."""
    return {"path": value} if Path(value).suffix.lower() in (".csv", ".tsv", ".jsonl", ".json") else value


def cmd_finetune(args: argparse.Namespace) -> int:
    from compressor.finetune_command import finetune_command
    metrics = finetune_command(
        model_ref=args.model, task_spec=task_arg(args.task), out=args.out,
        overrides={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                   "max_train_samples": args.max_train_samples, "seed": args.seed,
                   "embedding_updates": args.embedding_updates},
        max_eval_samples=args.max_eval_samples, show_progress=not args.quiet)
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from compressor.evaluate import evaluate_path
    from pretrain.models import set_threads
    set_threads(None)
    task = task_arg(args.task) if args.task else None
    result = evaluate_path(args.model, task, args.split, args.max_samples, args.reference, args.seed)
    print(json.dumps(result, indent=2))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from compressor.export_command import export_command
    record = export_command(
        args.model, args.out, task_arg(args.task) if args.task else None,
        settings={"optimize": args.optimize, "parity_tolerance": args.parity_tolerance,
                  "accuracy_tolerance": args.accuracy_tolerance, "min_accuracy": args.min_accuracy},
        quantize=args.quantize,
        quantize_options={"per_channel": args.per_channel, "reduce_range": args.reduce_range,
                          "weight_type": args.weight_type, "calibration": args.calibration,
                          "format": args.format, "calibration_samples": args.calibration_samples,
                          "block_size": args.block_size, "tolerable_loss": args.tolerable_loss,
                          "max_trials": args.max_trials},
        max_eval_samples=args.max_eval_samples, seed=args.seed)
    print(json.dumps(record, indent=2))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from compressor.pipeline import run_recipe
    from compressor.recipe import load_recipe
    recipe, steps = load_recipe(args.recipe)
    report = run_recipe(recipe, steps, args.out, base_dir=args.recipe.parent, show_progress=not args.quiet)
    from compressor.report import exports_table, markdown_table
    print(markdown_table(report))
    exports = exports_table(report)
    if exports:
        print(f"\n{exports}")
    print(f"report: {args.out / 'report.json'}")
    return 0


def quiet_libraries() -> None:
    """Library chatter (hub hints, init notices) would bury our one-line messages."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")        # nothing is fetched from a hub, ever
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    # torchao (pulled in by neural-compressor-pt) logs missing CUDA kernels at import, and
    # torch logs a deprecation for torchao's enums: neither concerns a CPU user.
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import transformers
    transformers.logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # bad flags (already reported in one line) or --help
        return int(exit_.code or 0)
    try:
        quiet_libraries()
        return args.handler(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished stages are kept; rerun the same command to resume", file=sys.stderr)
        return 130
