"""The `compressor` command: finetune, evaluate, export, run, search, bench, tokenizer, pretrain, embeddings.

Bad input ends with one line on stderr and exit code 2; nothing half-written is left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import BaseModel

from compressor import IMPORT_CHATTER
from compressor.cli.flags import MAX_COUNT, bounded_int, config_number, positive_int, seed_value, thread_count
from compressor.cli.lifecycle import PrintVersion, after_interrupt
from compressor.cli.stops import (first_rank, quiet_exit_after_command, stop_exit_code, stop_word, stops_as_interrupts,
                                  stops_held)
from pretrain.atomic import write_failure
from pretrain.errors import UserError, literal_values, number_kind


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we want just the error, on one line."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {self.prog}: {message}\n")


def from_config(config: type[BaseModel], name: str, help: str = "", *, default: bool = True,
                parse: Callable[[str], Any] | None = None) -> dict:
    """argparse keywords for a flag that sets field `name` of `config`, read from the field so
    that the flag and the config never disagree: its choices when the field is a Literal, its
    type and bounds when a number (refused in the field's words; `parse`: a type of the same
    bounds in other words, as --seed's), and its default (`default=False`: the flag stays None,
    meaning "the config's default", which the help then names)."""
    field = config.model_fields[name]
    keywords: dict = {"default": field.default} if default else {}
    if parse is not None or number_kind(field.annotation) is not None:
        keywords["type"] = parse or config_number(config, name)
    choices = literal_values(field.annotation)
    if choices:
        keywords["choices"] = list(choices)
    if not default and field.default is not None:
        help = f"{help} (default {field.default:g})" if isinstance(field.default, float) else \
            f"{help} (default {field.default})"
    if help:
        keywords["help"] = help.strip()
    return keywords


def default_rates() -> str:
    """The strategies' default learning rates as --help shows them: "full 1e-4, adapters 1e-3, ..."."""
    from pretrain.finetune import DEFAULT_LR
    return ", ".join(f"{strategy} {f'{lr:.0e}'.replace('e-0', 'e-')}" for strategy, lr in DEFAULT_LR.items())


def build_parser() -> argparse.ArgumentParser:
    # The configs whose fields the flags read; importing them loads torch, so `main` silences
    # the libraries first (their import-time notices would break the one-line errors).
    from compressor.bench.profiles import Profile
    from compressor.export.onnx import ExportSettings
    from compressor.export.quantize import MODE_CONFIGS, IncConfig, Int4WeightOnlyConfig, StaticInt8Config
    from pretrain.finetune import FinetuneConfig
    parser = OneLineParser(prog="compressor", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=PrintVersion)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    ft = sub.add_parser("finetune", help="fine-tune a BERT-family model on a task")
    ft.add_argument("--model", default="minilm", help="'minilm' (bundled) or an HF model dir")
    ft.add_argument("--task", required=True, help="wordnet-supersense, wordnet-wsd, or a CSV/TSV/JSONL file")
    ft.add_argument("--out", required=True, type=Path)
    ft.add_argument("--epochs", **from_config(FinetuneConfig, "epochs"))
    ft.add_argument("--batch-size", **from_config(FinetuneConfig, "batch_size"))
    ft.add_argument("--lr", type=config_number(FinetuneConfig, "lr"), default=None,
                    help=f"learning rate (default: the strategy's; {default_rates()})")
    ft.add_argument("--max-train-samples", type=config_number(FinetuneConfig, "max_train_samples"))
    ft.add_argument("--max-eval-samples", type=positive_int)
    ft.add_argument("--seed", **from_config(FinetuneConfig, "seed", parse=seed_value))
    ft.add_argument("--embedding-updates", **from_config(
        FinetuneConfig, "embedding_updates", "how the word-embedding matrix trains (sparse: only rows in the batch)"))
    ft.add_argument("--precision", **from_config(
        FinetuneConfig, "precision", "bf16: mixed precision (bfloat16 matrix products, fp32 weights), fast on "
                                     "CPUs with AVX-512 BF16 or AMX"))
    ft.add_argument("--dropout-masks", **from_config(
        FinetuneConfig, "dropout_masks", "packed: 16 random bits per element, the same rate (pretrain/dropout.py); "
                                         "torch: torch's dropout"))
    ft.add_argument("--strategy", **from_config(
        FinetuneConfig, "strategy", "full: all weights; frozen: head only; scalar-mix: frozen encoder, learned "
                                    "mix of all layers; adapters: Houlsby bottlenecks + LayerNorms + head"))
    ft.add_argument("--adapter-size", **from_config(FinetuneConfig, "adapter_size", "adapter bottleneck width"))
    ft.add_argument("--adapter-init-std", **from_config(
        FinetuneConfig, "adapter_init_std", "std of the adapters' initial weights (Houlsby's near-identity init)",
        default=False))
    ft.add_argument("--intermediate-task", help="two-stage: fine-tune on this task (name or file) first")
    ft.add_argument("--tasks", help="multi-task: comma-separated tasks trained with --task, one head each")
    ft.add_argument("--domain-corpus",
                    help="first continue MLM pretraining on this text: 'wordnet' or a text file "
                         "(blank lines between documents), as `pretrain --corpus`")
    ft.add_argument("--domain-steps",
                    **from_config(FinetuneConfig, "domain_steps", "MLM steps on --domain-corpus", default=False))
    ft.add_argument("--domain-lr",
                    **from_config(FinetuneConfig, "domain_lr", "MLM learning rate on --domain-corpus", default=False))
    ft.add_argument("--whole-last-layer", action="store_true",
                    help="train the last layer on every token (default: the first token only, the one "
                         "the head reads; pretrain/first_token.py)")
    ft.add_argument("--resume", action="store_true", help="continue an interrupted run from <out>.checkpoint")
    ft.add_argument("--checkpoint-every", type=positive_int, default=200, help="steps between checkpoints")
    ft.add_argument("--threads", type=thread_count,
                    help="torch threads (default: every core; under torchrun, the cores split between processes)")
    ft.add_argument("--quiet", action="store_true", help="no progress bar")
    ft.set_defaults(handler=cmd_finetune)

    ev = sub.add_parser("evaluate", help="evaluate an HF or ONNX model dir; prints JSON")
    ev.add_argument("--model", required=True)
    ev.add_argument("--task", help="default: the task recorded with the model")
    ev.add_argument("--split", default="test", choices=["train", "validation", "test", "all"],
                    help="all: every row of the task's files as written, none held out (--seed does not apply)")
    ev.add_argument("--reference", help="another model: report the fraction of agreeing predictions")
    # --max-eval-samples is what finetune, export, bench and search call the same limit
    ev.add_argument("--max-samples", "--max-eval-samples", dest="max_samples", type=positive_int,
                    help="score the split's first N examples only (also --max-eval-samples, as the other commands "
                         "name it)")
    ev.add_argument("--max-length", type=positive_int,
                    help="tokens per example, the --reference's too (default: the length each model records)")
    ev.add_argument("--seed", type=seed_value, default=None,
                    help="the seed the task's splits were drawn with (default: the one recorded with the model's "
                         "task, else 0)")
    ev.set_defaults(handler=cmd_evaluate)

    ex = sub.add_parser("export", help="export an HF model dir to a gated ONNX model dir")
    ex.add_argument("--model", required=True, type=Path, help="an HF model dir (e.g. one a recipe wrote)")
    ex.add_argument("--out", required=True, type=Path)
    ex.add_argument("--optimize", action="store_true", help="ONNX Runtime transformer fusion")
    ex.add_argument("--whole-last-layer", action="store_true",
                    help="trace the last layer for every token (default: the first token only, the one "
                         "the head reads; pretrain/first_token.py)")
    ex.add_argument("--skip-layernorm", choices=["auto", "fused", "unfused"], default="auto",
                    help="with --optimize: residual add + LayerNorm as ORT's fused SkipLayerNormalization or as "
                         "Sum + LayerNormalization (auto: unfused where the installed onnxruntime's CPU kernel is "
                         "the slower one)")
    ex.add_argument("--quantize", choices=["none", *MODE_CONFIGS],
                    help="default: what the model's quantize pass recorded, else none (fp32)")
    # --no-...: the static modes and inc default to per-channel, and a recorded mode may hold either
    ex.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=None,
                    help="per-channel int8 weight scales (default: the mode's)")
    ex.add_argument("--reduce-range", action=argparse.BooleanOptionalAction, default=None,
                    help="7-bit int8 weights (default: the mode's)")
    ex.add_argument("--weight-type", **from_config(StaticInt8Config, "weight_type", default=False))
    ex.add_argument("--calibration",
                    **from_config(StaticInt8Config, "calibration", "static-int8 ranges", default=False))
    ex.add_argument("--format", **from_config(StaticInt8Config, "format", "static-int8 graph form", default=False))
    ex.add_argument("--scope", **from_config(
        StaticInt8Config, "scope", "static-int8: every fusable op (ops) or only the Linear layers and embedding "
                                 "(linears)", default=False))
    ex.add_argument("--calibration-samples", **from_config(
        StaticInt8Config, "calibration_samples", "static-int8/inc: train examples", default=False))
    ex.add_argument("--block-size",
                    **from_config(Int4WeightOnlyConfig, "block_size", "int4-weight-only: weights per scale", default=False))
    ex.add_argument("--tolerable-loss", **from_config(
        IncConfig, "tolerable_loss", "inc: relative accuracy loss allowed", default=False))
    ex.add_argument("--max-trials", **from_config(IncConfig, "max_trials", "inc: autotune trials", default=False))
    ex.add_argument("--min-accuracy", **from_config(
        ExportSettings, "min_accuracy", "absolute test-accuracy floor when quantized", default=False))
    ex.add_argument("--task", help="default: the task recorded with the model")
    ex.add_argument("--max-eval-samples", type=positive_int, help="test examples for the accuracy gate")
    ex.add_argument("--max-length", type=positive_int,
                    help="tokens per example for the gate, calibration and shipped tokenizer (default: the length "
                         "the model records)")
    ex.add_argument("--parity-tolerance",
                    **from_config(ExportSettings, "parity_tolerance", "max |logit diff| vs PyTorch"))
    ex.add_argument("--accuracy-tolerance",
                    **from_config(ExportSettings, "accuracy_tolerance", "max accuracy drop when quantized"))
    ex.add_argument("--seed", type=seed_value, default=None,
                    help="the seed the task's splits were drawn with (default: the one recorded with the model's "
                         "task, else 0)")
    ex.set_defaults(handler=cmd_export)

    run = sub.add_parser("run", help="run a recipe: teacher, variants, report.json")
    run.add_argument("recipe", type=Path)
    run.add_argument("--out", required=True, type=Path)
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument("--force", action="store_true", help="replace another recipe's results in --out")
    run.add_argument("--plan", action="store_true",
                     help="check the recipe and show each stage as cached or to build, and what building runs; "
                          "runs and writes nothing")
    run.add_argument("--rebenchmark", action="store_true",
                     help="measure again even when the benchmark stage is cached")
    run.set_defaults(handler=cmd_run)

    be = sub.add_parser("bench", help="latency, throughput, memory and accuracy of one model on a profile")
    be.add_argument("--model", required=True, help="an HF model dir, an ONNX export dir or a .onnx file")
    be.add_argument("--profile", default="cpu", help="a profile name (profiles/NAME.yaml) or a profile file")
    be.add_argument("--batch-sizes", type=int_list, help="e.g. 1,8 (default: the profile's)")
    be.add_argument("--sequence-lengths", type=length_list, help="e.g. real,128 (default: the profile's)")
    be.add_argument("--iterations", type=config_number(Profile, "iterations"),
                    help="timed iterations (default: the profile's)")
    be.add_argument("--task", help="default: the task recorded with the model")
    be.add_argument("--max-eval-samples", type=positive_int, help="test examples for accuracy and batches")
    be.add_argument("--max-length", type=positive_int,
                    help="tokens per example for accuracy and real-length batches (default: the length the model "
                         "records)")
    be.add_argument("--seed", type=seed_value, default=None,
                    help="the seed the task's splits were drawn with (default: the one recorded with the model's "
                         "task, else 0)")
    be.add_argument("--out", type=Path, help="also write the result JSON to this file")
    be.set_defaults(handler=cmd_bench)
    add_search_command(sub)
    add_pretraining_commands(sub)
    return parser


def add_search_command(sub) -> None:
    from compressor.search.settings import SearchSettings
    se = sub.add_parser("search", help="search pruning, recovery and precision for a latency budget")
    se.add_argument("--teacher", required=True, help="the fine-tuned teacher's HF model dir")
    se.add_argument("--task", required=True, help="wordnet-supersense, wordnet-wsd, or a CSV/TSV/JSONL file")
    se.add_argument("--profile", default="cpu", help="where latency is measured: a profile name or file")
    se.add_argument("--batch-size", **from_config(SearchSettings, "batch_size"))
    se.add_argument("--latency-budget-ms", type=config_number(SearchSettings, "latency_budget_ms"), required=True,
                    help="p50 at --batch-size on the profile")
    se.add_argument("--min-retention",
                    **from_config(SearchSettings, "min_retention", "least share of the teacher's test accuracy"))
    se.add_argument("--time-budget-min", **from_config(SearchSettings, "time_budget_min", "wall time of this command"))
    se.add_argument("--out", required=True, type=Path)
    se.add_argument("--storage", help="Optuna storage URL (default: sqlite:///OUT/study.db)")
    se.add_argument("--study-name", **from_config(SearchSettings, "study_name"))
    se.add_argument("--join", action="store_true",
                    help="run proxy trials of an existing study in --storage until its lead starts the finals")
    se.add_argument("--finalists", **from_config(SearchSettings, "finalists", "plans trained fully and benchmarked"))
    se.add_argument("--max-trials", **from_config(
        SearchSettings, "max_trials", "proxy trials (all workers) before the finals", default=False))
    se.add_argument("--proxy-train-samples", **from_config(SearchSettings, "proxy_train_samples"))
    se.add_argument("--proxy-lr", **from_config(
        SearchSettings, "proxy_lr", "one learning rate for every proxy (default: the recovery's default scaled by "
                                    "teacher depth / layers kept, at most 10x)", default=False))
    se.add_argument("--validation-samples", **from_config(SearchSettings, "validation_samples"))
    se.add_argument("--train-samples", **from_config(SearchSettings, "train_samples"))
    se.add_argument("--epochs", **from_config(SearchSettings, "epochs", "of a finalist's training"))
    se.add_argument("--scoring-samples", **from_config(SearchSettings, "scoring_samples"))
    se.add_argument("--latency-structures",
                    **from_config(SearchSettings, "latency_structures", "random structures per precision timed to "
                                  "fit the latency model"))
    se.add_argument("--latency-held-out",
                    **from_config(SearchSettings, "latency_held_out", "more timed to score it"))
    se.add_argument("--baselines", type=name_list, help="measured beside the finalists (default: all three)")
    se.add_argument("--compare", action="append", metavar="RECIPE:VARIANT",
                    help="a hand-written variant of a recipe, trained and measured beside the finalists "
                         "(repeatable; e.g. recipes/demo.yaml:three-layers-int8)")
    se.add_argument("--recoveries", type=name_list, help="e.g. finetune,distill (default: finetune,distill,theseus)")
    se.add_argument("--precisions", type=name_list, help="e.g. int8 (default: fp32,int8)")
    se.add_argument("--max-eval-samples", **from_config(SearchSettings, "max_eval_samples"))
    se.add_argument("--threads", type=thread_count,
                    help="torch threads for training and scoring, every phase (default: every core; timed calls "
                         "run at the profile's threads)")
    se.add_argument("--seed", type=seed_value, default=0)
    se.add_argument("--quiet", action="store_true", help="no progress bars")
    se.set_defaults(handler=cmd_search)


def name_list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def int_list(value: str) -> list[int]:
    return listed(value, positive_int, "comma-separated positive integers (e.g. 1,8)")


def length_list(value: str) -> list[int | str]:
    from compressor.bench.profiles import MIN_SEQUENCE_LENGTH    # a profile's rule: read when the flag is given
    fixed_length = bounded_int(MIN_SEQUENCE_LENGTH, MAX_COUNT, "a sequence length")
    return listed(value, lambda v: v if v == "real" else fixed_length(v),
                  f"comma-separated integers >= {MIN_SEQUENCE_LENGTH} or 'real' (e.g. real,128)")


def listed(value: str, parse: Callable[[str], Any], expected: str) -> list:
    """A comma-separated flag value, each item parsed; one message naming the whole value."""
    try:
        items = [parse(v.strip()) for v in value.split(",") if v.strip()]
    except argparse.ArgumentTypeError:
        items = []
    if not items:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
    return items


def add_pretraining_commands(sub) -> None:
    """tokenizer, pretrain, embeddings: the teacher side from raw text."""
    from pretrain.data.tokenizers import TokenizerConfig
    from pretrain.objectives.dae import NoiseConfig
    from pretrain.pretraining import PretrainConfig
    from pretrain.static_embeddings import EmbeddingConfig
    tk = sub.add_parser("tokenizer", help="train a WordPiece, byte-level BPE or word-level tokenizer on a corpus")
    tk.add_argument("--corpus", required=True, help="'wordnet' or a text file (blank lines between documents)")
    tk.add_argument("--kind", choices=["wordpiece", "bpe", "wordlevel"], default="wordpiece")
    tk.add_argument("--vocab-size", **from_config(TokenizerConfig, "vocab_size"))
    tk.add_argument("--min-frequency", **from_config(TokenizerConfig, "min_frequency"))
    tk.add_argument("--out", required=True, type=Path)
    tk.set_defaults(handler=cmd_tokenizer)

    pt = sub.add_parser("pretrain", help="pretrain a model from scratch with a named objective")
    pt.add_argument("--objective", required=True, help="mlm, mlm-wwm, clm, nsp, sop, mlm+nsp, mlm+sop, ...")
    pt.add_argument("--dae-noise", help="dae: noise functions to compose, each optionally =RATE: mask, delete, "
                                        "infill (Poisson spans), permute, rotate; e.g. infilling,permutation "
                                        "(default: BART's infill=0.3,permute)")
    pt.add_argument("--mask-ratio", type=config_number(NoiseConfig, "mask"),     # infill's bounds are mask's
                    help="dae: rate of token masking / text infilling (fairseq's --mask)")
    pt.add_argument("--objective-option", action="append", default=[], metavar="KEY[=VALUE]",
                    help="an option of the objective (repeatable), e.g. poisson=3.5 for dae")
    pt.add_argument("--corpus", required=True, help="'wordnet' or a text file (blank lines between documents)")
    pt.add_argument("--size", choices=["tiny", "small", "base"], default="small")
    pt.add_argument("--steps", type=config_number(PretrainConfig, "steps"), required=True)
    pt.add_argument("--out", required=True, type=Path)
    pt.add_argument("--resume", action="store_true", help="continue from <out>.checkpoint")
    pt.add_argument("--tokenizer", default=None,
                    help="a tokenizer dir (compressor tokenizer) or 'minilm' (default: --init's own, else 'minilm')")
    pt.add_argument("--init", help="mlm, mlm-wwm: continue from this BERT model ('minilm' or an HF dir; its "
                                   "tokenizer) instead of a fresh --size model; a missing MLM head starts fresh")
    pt.add_argument("--batch-size", **from_config(PretrainConfig, "batch_size"))
    pt.add_argument("--lr", **from_config(PretrainConfig, "lr"))
    pt.add_argument("--warmup-ratio", **from_config(
        PretrainConfig, "warmup_ratio", "share of the steps over which the rate warms up linearly", default=False))
    pt.add_argument("--max-length", **from_config(PretrainConfig, "max_length"))
    pt.add_argument("--seed", type=seed_value, default=0)
    pt.add_argument("--buffer-size", **from_config(PretrainConfig, "buffer_size", "chunks in the shuffle buffer"))
    pt.add_argument("--checkpoint-every", type=positive_int, default=200, help="steps between checkpoints")
    pt.add_argument("--threads", type=thread_count, help="torch threads (default: all cores)")
    pt.add_argument("--quiet", action="store_true", help="no progress bar")
    pt.set_defaults(handler=cmd_pretrain)

    em = sub.add_parser("embeddings", help="train skip-gram (word2vec) static word embeddings on a corpus")
    em.add_argument("--corpus", required=True, help="'wordnet' or a text file (blank lines between documents)")
    em.add_argument("--dim", **from_config(EmbeddingConfig, "dim"))
    em.add_argument("--window", **from_config(EmbeddingConfig, "window"))
    em.add_argument("--negatives", **from_config(EmbeddingConfig, "negatives"))
    em.add_argument("--min-count", **from_config(EmbeddingConfig, "min_count"))
    em.add_argument("--max-vocab", **from_config(EmbeddingConfig, "max_vocab"))
    em.add_argument("--steps", **from_config(EmbeddingConfig, "steps"))
    em.add_argument("--batch-size",
                    **from_config(EmbeddingConfig, "batch_size", "(centre, context) pairs per step", default=False))
    em.add_argument("--lr", **from_config(
        EmbeddingConfig, "lr", "SGD step per pair, decaying linearly to 0", default=False))
    em.add_argument("--seed", type=seed_value, default=0)
    em.add_argument("--out", required=True, type=Path)
    em.add_argument("--quiet", action="store_true", help="no progress bar")
    em.set_defaults(handler=cmd_embeddings)


def cmd_embeddings(args: argparse.Namespace) -> int:
    from compressor.cli.pretrain_command import embeddings_command
    from pretrain.models import set_threads
    set_threads(None)
    settings = {"dim": args.dim, "window": args.window, "negatives": args.negatives, "min_count": args.min_count,
                "max_vocab": args.max_vocab, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                "seed": args.seed}
    metrics = embeddings_command(args.corpus, args.out, settings, show_progress=not args.quiet)
    print(json.dumps({k: v for k, v in metrics.items() if k != "environment"}, indent=2))
    return 0


def cmd_tokenizer(args: argparse.Namespace) -> int:
    from compressor.cli.pretrain_command import tokenizer_command
    metrics = tokenizer_command(args.corpus, args.kind, args.vocab_size, args.out, args.min_frequency)
    print(json.dumps({k: v for k, v in metrics.items() if k != "environment"}, indent=2))
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from compressor.cli.pretrain_command import pretrain_command
    from pretrain.pretraining import make_config, objective_options
    options = objective_options(args.objective, args.dae_noise, args.mask_ratio, tuple(args.objective_option))
    cfg = make_config(objective=args.objective, objective_options=options, corpus=args.corpus, size=args.size,
                      tokenizer=args.tokenizer or args.init or "minilm", init=args.init,
                      steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_ratio=args.warmup_ratio,
                      max_length=args.max_length,
                      seed=args.seed, buffer_size=args.buffer_size)
    metrics = pretrain_command(cfg, args.out, resume=args.resume, show_progress=not args.quiet,
                               checkpoint_every=args.checkpoint_every, threads=args.threads)
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("environment", "loss_curve")}, indent=2))
    return 0


def task_arg(value: str | dict) -> str | dict:
    """A built-in task name, or a data file with the default columns text[, text_pair], label
    (a spec that is already a mapping, as a model's recorded task, is kept)."""
    from pretrain.data.files import file_spec
    return file_spec(value)


def corpus_arg(value: str | None) -> str | None:
    """A corpus file is recorded by its absolute path (a built-in name stays a name)."""
    if value is None or not Path(value).is_file():
        return value
    return str(Path(value).resolve())


def cmd_finetune(args: argparse.Namespace) -> int:
    from compressor.cli.finetune_command import finetune_command
    metrics = finetune_command(
        model_ref=args.model, task_spec=task_arg(args.task), out=args.out,
        overrides={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                   "max_train_samples": args.max_train_samples, "seed": args.seed,
                   "embedding_updates": args.embedding_updates, "precision": args.precision,
                   "dropout_masks": args.dropout_masks,
                   "strategy": args.strategy,
                   "adapter_size": args.adapter_size, "adapter_init_std": args.adapter_init_std,
                   "intermediate_task": task_arg(args.intermediate_task) if args.intermediate_task else None,
                   "tasks": tuple(task_arg(t.strip()) for t in args.tasks.split(",") if t.strip())
                   if args.tasks else None,
                   "domain_corpus": corpus_arg(args.domain_corpus), "domain_steps": args.domain_steps,
                   "domain_lr": args.domain_lr, "cls_only_last_layer": False if args.whole_last_layer else None},
        max_eval_samples=args.max_eval_samples, show_progress=not args.quiet, resume=args.resume,
        checkpoint_every=args.checkpoint_every, threads=args.threads)
    if metrics:       # empty on the other ranks of a torchrun
        print(json.dumps(metrics, indent=2))
    print_warnings(metrics)
    return 0


def print_warnings(result: dict) -> None:
    """A command's `warnings` (held-out texts that train also holds), on stderr: stdout is
    the JSON alone, and the exit code stays 0."""
    for line in result.get("warnings", []):
        print(f"warning: {line}", file=sys.stderr)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from compressor.evaluate import evaluate_path
    from pretrain.models import set_threads
    set_threads(None)
    task = task_arg(args.task) if args.task else None
    result = evaluate_path(args.model, task, args.split, args.max_samples, args.reference, args.seed,
                           args.max_length)
    print(json.dumps(result, indent=2))
    print_warnings(result)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from compressor.cli.export_command import export_command
    record = export_command(
        args.model, args.out, task_arg(args.task) if args.task else None,
        settings={"optimize": args.optimize, "parity_tolerance": args.parity_tolerance,
                  "accuracy_tolerance": args.accuracy_tolerance, "min_accuracy": args.min_accuracy,
                  "cls_only_last_layer": not args.whole_last_layer, "skip_layernorm": args.skip_layernorm},
        quantize=args.quantize,
        quantize_options={"per_channel": args.per_channel, "reduce_range": args.reduce_range,
                          "weight_type": args.weight_type, "calibration": args.calibration,
                          "format": args.format, "scope": args.scope,
                          "calibration_samples": args.calibration_samples,
                          "block_size": args.block_size, "tolerable_loss": args.tolerable_loss,
                          "max_trials": args.max_trials},
        max_eval_samples=args.max_eval_samples, seed=args.seed, max_length=args.max_length)
    print(json.dumps(record, indent=2))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from compressor.pipeline import run_recipe
    from compressor.pipeline.recipe import load_recipe, located
    recipe, steps = load_recipe(args.recipe)
    if args.force:      # --force clears the dir: the recipe file must not be in it
        from pretrain.atomic import check_output
        with located(str(args.recipe)):
            check_output(args.out, [args.recipe], owner_files=None)
    if args.plan:
        from compressor.pipeline.plan import plan_lines, plan_recipe
        plan = plan_recipe(recipe, steps, args.out, base_dir=args.recipe.parent, force=args.force,
                           rebenchmark=args.rebenchmark, source=str(args.recipe))
        print("\n".join(plan_lines(plan)))
        return 0
    with stage_lines(not args.quiet):
        report = run_recipe(recipe, steps, args.out, base_dir=args.recipe.parent, show_progress=not args.quiet,
                            force=args.force, rebenchmark=args.rebenchmark, source=str(args.recipe))
    from compressor.report.render import exports_table, markdown_table
    print(markdown_table(report))
    exports = exports_table(report)
    if exports:
        print(f"\n{exports}")
    for warning in report.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)   # stdout: the results alone
    if report.get("search"):
        print(f"search: {report['search']['outcome']} (its report: {args.out / report['search']['dir'] / 'report.json'})")
    print(f"report: {args.out / 'report.json'} (also report.md, report.html)")
    return 0


@contextlib.contextmanager
def stage_lines(shown: bool) -> Iterator[None]:
    """While the command runs, the pipeline's one line per stage (cached, building, built in
    N s) goes to stderr, where the progress bars go; `--quiet` hides both. The handler is
    removed afterwards: nothing of it outlives the command."""
    logger = logging.getLogger("compressor.pipeline")
    if not shown:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def cmd_search(args: argparse.Namespace) -> int:
    from compressor.cli.flags import validated
    from compressor.pipeline.recipe import compared_variants
    from compressor.search import SearchSettings, run_search
    compare = compared_variants(args.compare or [])
    fields = {"latency_budget_ms": args.latency_budget_ms, "batch_size": args.batch_size,
              "min_retention": args.min_retention, "time_budget_min": args.time_budget_min,
              "storage": args.storage, "study_name": args.study_name, "finalists": args.finalists,
              "max_trials": args.max_trials, "proxy_train_samples": args.proxy_train_samples, "proxy_lr": args.proxy_lr,
              "validation_samples": args.validation_samples, "train_samples": args.train_samples, "epochs": args.epochs,
              "recoveries": args.recoveries, "precisions": args.precisions,
              "max_eval_samples": args.max_eval_samples, "seed": args.seed, "scoring_samples": args.scoring_samples,
              "latency_structures": args.latency_structures, "latency_held_out": args.latency_held_out,
              "baselines": args.baselines, "compare": compare or None}
    # a bad value names its flag (--min-retention), as export's do
    settings = validated(SearchSettings, {k: v for k, v in fields.items() if v is not None})
    with stage_lines(not args.quiet):
        result = run_search(args.teacher, task_arg(args.task), args.profile, settings, args.out, join=args.join,
                            threads=args.threads, show_progress=not args.quiet)
    if args.join:
        print(f"search: this worker is done; the study holds {result['trials']} trained trials")
        return 0
    print(f"search: {result['outcome']}")
    print(f"report: {args.out / 'report.json'} (also report.md, report.html); "
          f"recipe: {args.out / result['recipe_file']}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from compressor.cli.bench_command import bench_command
    result = bench_command(args.model, args.profile, batch_sizes=args.batch_sizes,
                           sequence_lengths=args.sequence_lengths, iterations=args.iterations,
                           task_spec=task_arg(args.task) if args.task else None,
                           max_eval_samples=args.max_eval_samples, seed=args.seed, out=args.out,
                           max_length=args.max_length)
    print(json.dumps(result, indent=2))
    return 0


def quiet_libraries() -> None:
    """Library chatter (hub hints, init notices) would bury our one-line messages."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")        # nothing is fetched from a hub, ever
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    for name in IMPORT_CHATTER:      # torchao's CUDA kernels, torch's enum deprecation
        logging.getLogger(name).setLevel(logging.ERROR)
    import transformers
    transformers.logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> int:
    args = None      # until the command line is read (the libraries import first, for seconds)
    stopped: KeyboardInterrupt | None = None
    try:
        with stops_as_interrupts():
            quiet_libraries()   # before the parser imports the configs (and with them torch)
            try:
                args = build_parser().parse_args(argv)
            except SystemExit as exit_:  # bad flags (already reported in one line) or --help
                return int(exit_.code or 0)
            return args.handler(args)
    except UserError as err:
        if first_rank():
            print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:     # a write the disk refused mid-command: one line, as bad input gets
        what = write_failure(err)
        if what is None:
            raise
        if first_rank():
            print(f"error: cannot write {getattr(args, 'out', None) or 'the output'}: {what}; fix the disk or "
                  f"permissions; {after_interrupt(args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        stopped = stop
        return stop_exit_code(stop)
    finally:
        # The command is over: a second Ctrl-C (an impatient user) or SIGTERM now could only
        # end it in a traceback, past its line.
        with stops_held():
            if stopped is not None and first_rank():
                print(f"{stop_word(stopped)}: {after_interrupt(args)}", file=sys.stderr)
            quiet_exit_after_command()      # the last at-exit call registered: the first to run
