"""Unstructured pruning: magnitude (Gordon et al.) vs movement (Sanh et al.) at the same budget.

From the fine-tuned teacher, each method prunes the encoder's Linear weights to each
sparsity while training the same number of steps (the passes' cubic schedule, 10% warm-up,
20% cool-down), then the test split scores the result. Sizes: the saved fp32 weights and,
with --int8, the dynamic-int8 ONNX export, each as stored and compressed with zlib level 6.
Dense runtimes do not run these models faster (the zeros are multiplied like any number):
the saving is compressed size only. No latency is measured here.

    nice -n 19 .venv/bin/python benchmarks/sparsity_study.py --teacher runs/demo/teacher \
        --train-samples 8000 --sparsities 0.9 0.5 --int8 \
        --out benchmarks/results/sparsity_study.json

`--only METHOD-SPARSITY ...` (e.g. movement-0.9) runs those rows; rows already in --out are
kept unless run again (two processes may fill one file, each writing after every row).

`--start pretrained` prunes the pretrained MiniLM (a fresh head) while it is fine-tuned, as
Sanh et al. fine-prune pretrained BERT (the budget then has to teach the task as well).
`--soft-targets` gives both
methods the teacher's soft targets (0.5 * KL(T=2) * T^2 + 0.5 * CE, Sanh et al.'s pairing);
`--methods dense` adds the same budget without pruning (what the budget reaches at all).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from compressor.bench.environment import environment
from compressor.bundle import ModelBundle, weights_size
from compressor.cli.commands import task_arg
from compressor.export.onnx import ONNX_FILE, ExportSettings, export_bundle
from compressor.modeling.cost import compressed_size, encoder_sparsity
from compressor.passes import Context, LazyTeacher, apply_pass, get_pass
from pretrain.atomic import write_json
from pretrain.data import load_task
from pretrain.finetune import evaluate
from pretrain.models import load_classifier, set_threads

INT8 = {"quantize": {"mode": "dynamic-int8", "per_channel": True}}
OPEN_GATE = ExportSettings(optimize=True, accuracy_tolerance=1.0)   # every row gets a number


def rows_wanted(args) -> list[tuple[str, str, float]]:
    """(row name, pass, sparsity): the highest sparsity first, the dense teacher (the reference) last."""
    suffix = f"-seed{args.seed}" if args.seed else ""   # seed 0's rows keep their first names
    rows = [(f"{method}-{s:g}{suffix}", f"prune-{method}", s) for s in args.sparsities for method in args.methods
            if method != "dense"]
    rows += [(f"dense{suffix}", "finetune", 0.0)] if "dense" in args.methods else []
    rows += [("teacher", "", 0.0)]
    return [r for r in rows if not args.only or r[0] in args.only]


def sizes(bundle: ModelBundle, directory: Path, task, args) -> dict:
    """The saved fp32 weights, and with --int8 the int8 ONNX export, as stored and compressed."""
    bundle.save(directory)
    files = sorted(directory.glob("*.safetensors"))
    out = {"fp32_size_bytes": weights_size(directory), "fp32_compressed_size_bytes": compressed_size(files)}
    if args.int8:
        export = export_bundle(bundle.replace(deploy=INT8), directory.with_name(directory.name + "-int8"),
                               OPEN_GATE, task, args.eval_samples).record
        onnx = Path(export["path"]) / ONNX_FILE
        out.update(int8_onnx_accuracy=export["accuracy"], int8_size_bytes=onnx.stat().st_size,
                   int8_compressed_size_bytes=compressed_size([onnx]))
    return out


def pass_config(pass_name: str, sparsity: float, args) -> dict:
    config: dict = {"epochs": args.epochs, "max_train_samples": args.train_samples}
    if pass_name != "finetune":
        config.update(sparsity=sparsity, teacher_soft_targets=args.soft_targets)
    if pass_name == "prune-movement":
        config["scores_lr"] = args.scores_lr
    return config


def start_bundle(teacher: ModelBundle, args) -> ModelBundle:
    """What the passes start from: the fine-tuned teacher, or the pretrained encoder with a
    fresh head for the teacher's labels (seed 0)."""
    if args.start == "teacher":
        return teacher
    model, tokenizer = load_classifier(args.pretrained, teacher.label_names, seed=0)
    return ModelBundle(model=model, tokenizer=tokenizer, task=teacher.task)


def run_row(name: str, pass_name: str, sparsity: float, teacher: ModelBundle, start_from: ModelBundle, task,
            ctx: Context, args) -> dict:
    start = time.perf_counter()
    row: dict = {"name": name, "method": pass_name or "none (dense teacher)", "sparsity_target": sparsity,
                 "seed": args.seed}
    bundle = teacher
    if pass_name:
        config = pass_config(pass_name, sparsity, args)
        row.update(config=config, start=args.start if args.start == "teacher" else f"pretrained {args.pretrained}")
        # Each row resumes its own interrupted training (a checkpoint per row, not per pass).
        row_ctx = dataclasses.replace(ctx, work_dir=args.work / "resume" / f"{name}-from-{args.start}")
        bundle = apply_pass(start_from, pass_name, get_pass(pass_name).config_type.model_validate(config), row_ctx)
        row["train_seconds"] = round(time.perf_counter() - start, 1)
    test = task.split("test").head(args.eval_samples)
    metrics, _ = evaluate(bundle.model, bundle.tokenizer, test)
    row.update(accuracy=metrics["accuracy"], macro_f1=metrics["macro_f1"], eval_samples=len(test),
               encoder_sparsity=encoder_sparsity(bundle.model))
    row.update(sizes(bundle, args.work / name, task, args))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--task", default="wordnet-supersense",
                        help="a built-in task name or a CSV/JSONL file (text,label) of the teacher's labels")
    parser.add_argument("--methods", nargs="+", default=["magnitude", "movement"],
                        choices=["magnitude", "movement", "dense"])
    parser.add_argument("--start", choices=["teacher", "pretrained"], default="teacher",
                        help="prune the fine-tuned teacher, or fine-prune the pretrained encoder (Sanh et al.)")
    parser.add_argument("--pretrained", default="minilm", help="with --start pretrained: the encoder to start from")
    parser.add_argument("--soft-targets", action="store_true", help="both methods learn from the teacher too")
    parser.add_argument("--sparsities", nargs="+", type=float, default=[0.9, 0.5])
    parser.add_argument("--train-samples", type=int, default=8000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--scores-lr", type=float, default=1e-2)
    parser.add_argument("--eval-samples", type=int, default=5000)
    parser.add_argument("--int8", action="store_true", help="also export dynamic-int8 ONNX and size it")
    parser.add_argument("--seed", type=int, default=0,
                        help="the passes' seed (data order, dropout); rows of another seed get a -seedN suffix")
    parser.add_argument("--only", nargs="*", help="run only these rows (teacher, magnitude-0.9, ...)")
    parser.add_argument("--work", type=Path, default=Path("runs/sparsity-study"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    set_threads(None)
    teacher = ModelBundle.load(args.teacher)
    task = load_task(task_arg(args.task))
    # The teacher for soft targets is its own copy (loaded once, eval mode, never trained).
    ctx = Context(task=task, seed=args.seed, show_progress=True, teacher_source=LazyTeacher.from_dir(args.teacher))
    start_from = start_bundle(teacher, args)
    for name, pass_name, sparsity in rows_wanted(args):
        try:
            row = run_row(name, pass_name, sparsity, teacher, start_from, task, ctx, args)
        except Exception as err:   # one failed row must not lose the others
            row = {"name": name, "error": f"{type(err).__name__}: {err}"}
        row.update(command=" ".join(sys.argv), environment=environment())
        print(json.dumps({k: v for k, v in row.items() if k != "environment"}), flush=True)
        save_row(args.out, row, args)
    return 0


def save_row(out: Path, row: dict, args) -> None:
    """Replace the row's namesake in --out (read again now: another process may have written)."""
    prior = json.loads(out.read_text()) if out.exists() else {}
    rows = [r for r in prior.get("results", []) if r["name"] != row["name"]] + [row]
    write_json(out, {"study": "unstructured pruning, magnitude vs movement at the same training budget",
                     "teacher": str(args.teacher), "task": args.task, "start": args.start,
                     "soft_targets": args.soft_targets,
                     "note": "dense runtimes do not run sparse models faster; the saving is compressed size",
                     "results": rows})


if __name__ == "__main__":
    sys.exit(main())
