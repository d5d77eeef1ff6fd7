"""Distillation study: one 3-layer student of the fine-tuned teacher, trained by each method
with the same budget, scored on the held-out test split.

Every row starts from the same student, the teacher's layers [0, 2, 4] (the `student`
pass), and trains it with the `distill` pass for the same number of steps (train samples x
epochs / batch size; progressive and two-stage rows share those epochs out over their
phases, augmented rows divide them by 1 + copies, unlabelled rows by the larger transfer set), seed and test examples; only the losses
differ. `hard` (task cross-entropy alone) is what `drop-layers` + `finetune` does. `theseus` is the `theseus` pass on the teacher with
one successor per student layer, each starting as the first layer of its block (0, 2, 4: the
same start), at the pass's own learning rate unless --lr is given.

The results file is rewritten after every row, so a partial sweep is still recorded, and a
rerun with the same settings skips the (row, seed) pairs it already holds (a killed row
resumes from its checkpoint in --work). Accuracy only: times are no figure unless the machine
was quiet. `--markdown` prints the table (every seed, and the mean).

    python benchmarks/distill_study.py --teacher runs/demo/teacher --rows tinybert,hard,soft \
        --train-samples 20000 --epochs 1 --out benchmarks/results/distill_study.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from compressor.cli.commands import task_arg
from pretrain.atomic import write_json

ROOT = Path(__file__).resolve().parents[1]

# row -> the distill pass's config (besides the shared budget); "pass" names another pass
ROWS: dict[str, dict] = {
    "hard": {"losses": ["hard"]},
    "soft": {"losses": ["soft"]},
    "soft-hard": {"losses": ["soft", "hard"]},      # DistilBERT's classification recipe (CE for its MLM)
    # layer-wise distillation beside both targets, as CoFi recovers a pruned model: each student
    # layer's output (and the embedding output) against the teacher's by MSE
    "soft-hard-hidden": {"losses": ["soft", "hard", "hidden"]},
    "tinybert": {"losses": ["soft", "hidden", "attention"]},
    # TinyBERT's score MSE is ~10x the other terms on this teacher: scaled down, or MiniLM's KL
    "tinybert-weighted": {"losses": ["soft", "hidden", "attention"], "weights": {"attention": 0.05}},
    "tinybert-kl": {"losses": ["soft", "hidden", "attention"], "attention_kind": "distribution"},
    "tinybert-auto": {"losses": ["soft", "hidden", "attention"], "weights": {"attention": 0.05}, "layer_map": "auto"},
    # TinyBERT's losses beside the labels (DistilBERT's soft + hard, plus the layer-wise terms)
    "tinybert-hard": {"losses": ["soft", "hidden", "attention", "hard"], "weights": {"attention": 0.05}},
    "tinybert-auto-hard": {"losses": ["soft", "hidden", "attention", "hard"], "weights": {"attention": 0.05},
                           "layer_map": "auto"},
    "tinybert-two-stage": {"losses": ["soft", "hidden", "attention"], "two_stage": True, "epochs_share": 0.5},
    "minilm": {"losses": ["soft", "attention", "value-relation"], "attention_kind": "distribution",
               "attention_layers": "last"},
    "progressive": {"losses": ["progressive", "soft"], "epochs_share": 0.5},
    "soft-auto": {"losses": ["soft", "hidden"], "layer_map": "auto"},
    "soft-uniform": {"losses": ["soft", "hidden"], "layer_map": "uniform"},
    # TinyBERT's augmentation: --copies noised copies of each text from the masked LM --mlm
    "soft-hard-augment": {"losses": ["soft", "hard"], "augment": True},
    "soft-augment": {"losses": ["soft"], "augment": True},
    # Labels scarce, text not: the next --unlabeled train texts after the labelled ones, their
    # labels withheld, so only the teacher labels them (`unlabeled_samples`); the same steps
    "tinybert-unlabeled": {"losses": ["soft", "hidden", "attention"], "weights": {"attention": 0.05},
                           "unlabeled": True},
    "tinybert-auto-unlabeled": {"losses": ["soft", "hidden", "attention"], "weights": {"attention": 0.05},
                                "layer_map": "auto", "unlabeled": True},
    "soft-unlabeled": {"losses": ["soft"], "unlabeled": True},
    "soft-hard-unlabeled": {"losses": ["soft", "hard"], "unlabeled": True},
    # BERT-of-Theseus from the teacher: successors replace blocks of depth / len(--layers) layers
    "theseus": {"pass": "theseus"},
    # the official code's start: successors are the first layers (0..N-1), the layers `auto`
    # picks on this teacher, rather than the first layer of each block
    "theseus-first": {"pass": "theseus", "init": "first"},
    # the paper's first schedule: p = 0.5 for half the steps, then the successors alone
    "theseus-constant": {"pass": "theseus", "schedule": "constant"},
    # module replacing plus the predecessor's soft targets (KL at T = 2, weight 1) beside the labels
    "theseus-soft": {"pass": "theseus", "soft_weight": 1.0},
}


def student_layers(text: str) -> list[int]:
    return [int(i) for i in text.split(",")]


def run_row(name: str, args, teacher_dir: Path, task, seed: int) -> dict:
    from compressor.bundle import ModelBundle
    from compressor.passes import Context, LazyTeacher, apply_pass, get_pass
    from pretrain.finetune import evaluate

    row = dict(ROWS[name])
    pass_name = row.pop("pass", "distill")
    # Phased rows (two-stage, progressive: layer phases then prediction) get half the epochs per
    # part, so every row takes the same number of steps.
    share = row.pop("epochs_share", 1.0)
    if row.pop("augment", False):
        # Augmented rows see each text 1 + copies times per epoch: fewer epochs, the same steps.
        row["augment"] = {"copies": args.copies, "mlm": str(args.mlm)}
        share /= 1 + args.copies
    if row.pop("unlabeled", False):
        # Unlabelled rows run over train_samples + unlabeled texts: the epochs shrink so the
        # number of steps is that of the labelled rows.
        row["unlabeled_samples"] = args.unlabeled
        share *= math.ceil(args.train_samples / args.batch_size) / math.ceil(
            (args.train_samples + args.unlabeled) / args.batch_size)
    ctx = Context(task=task, seed=seed, show_progress=True, teacher_source=LazyTeacher.from_dir(teacher_dir),
                  work_dir=args.work / f"{name}-seed{seed}" if args.work else None)
    teacher = ModelBundle.load(teacher_dir)
    if pass_name == "theseus":
        student, row = teacher, {**row, "successor_layers": len(args.layers)}
    else:
        student = make_student(teacher, args, ctx)
    config = {**row, "epochs": args.epochs * share, "max_train_samples": args.train_samples,
              "batch_size": args.batch_size, "seed": seed, **({"lr": args.lr} if args.lr else {}),
              **({"precision": args.precision} if args.precision != "fp32" else {})}
    start = time.perf_counter()
    out = apply_pass(student, pass_name, get_pass(pass_name).config_type.model_validate(config), ctx)
    seconds = time.perf_counter() - start
    test = task.split("test").head(args.max_eval_samples)
    metrics, _ = evaluate(out.model, out.tokenizer, test)
    return {"name": name, "seed": seed, "pass": pass_name, "config": config, "accuracy": metrics["accuracy"],
            "macro_f1": metrics["macro_f1"], "test_samples": len(test), "params": out.params,
            pass_name: out.deploy.get(pass_name), "train_seconds": round(seconds, 1)}


def make_student(teacher, args, ctx):
    """The teacher's layers `--layers`, or (distillation as recovery) the teacher with
    `--prune-heads` / `--prune-ffn` of its heads and FFN neurons removed by taylor importance."""
    from compressor.passes import apply_pass, get_pass
    if not (args.prune_heads or args.prune_ffn):
        return apply_pass(teacher, "student", get_pass("student").config_type.model_validate({"layers": args.layers}),
                          ctx)
    student = teacher
    for name, fraction in (("prune-heads", args.prune_heads), ("prune-ffn", args.prune_ffn)):
        if fraction:
            config = {"fraction": fraction, "samples": args.prune_samples}
            student = apply_pass(student, name, get_pass(name).config_type.model_validate(config), ctx)
    return student


def teacher_accuracy(teacher_dir: Path, task, max_eval: int) -> dict:
    """The teacher's test accuracy: from its stage.json when that scored the same test examples
    (a recipe's teacher stage), else measured here."""
    stage = teacher_dir / "stage.json"
    if stage.is_file():
        metrics = json.loads(stage.read_text()).get("metrics") or {}
        if metrics.get("samples") == min(max_eval, len(task.split("test"))):
            return {"accuracy": metrics["accuracy"], "macro_f1": metrics.get("macro_f1"),
                    "samples": metrics["samples"], "source": "stage.json"}
    from compressor.bundle import ModelBundle
    from pretrain.finetune import evaluate
    teacher = ModelBundle.load(teacher_dir)
    metrics, _ = evaluate(teacher.model, teacher.tokenizer, task.split("test").head(max_eval))
    return {**metrics, "source": "measured"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, default=Path("runs/demo/teacher"), help="a fine-tuned model dir")
    parser.add_argument("--task", help="a built-in task or a data file (default: the teacher's recorded task)")
    parser.add_argument("--rows", default="tinybert,hard,soft", help=f"known: {', '.join(ROWS)}")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--layers", type=student_layers, default=[0, 2, 4], help="teacher layers of the student")
    parser.add_argument("--prune-heads", type=float, default=0.0,
                        help="instead of --layers: the student is the teacher with this share of heads pruned")
    parser.add_argument("--prune-ffn", type=float, default=0.0, help="... and this share of FFN neurons")
    parser.add_argument("--prune-samples", type=int, default=512, help="train examples the taylor scores use")
    parser.add_argument("--mlm", type=Path, help="*-augment rows: a masked-LM dir (compressor pretrain --init)")
    parser.add_argument("--copies", type=int, default=2, help="*-augment rows: noised copies per text")
    parser.add_argument("--unlabeled", type=int, default=0,
                        help="*-unlabeled rows: train texts after the labelled ones, labels withheld")
    parser.add_argument("--train-samples", type=int, default=20000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, help="default: the distill pass's (fine-tuning's 1e-4)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: every row trains in mixed precision (fast on CPUs with AVX-512 BF16 or AMX)")
    parser.add_argument("--max-eval-samples", type=int, default=5000)
    parser.add_argument("--work", type=Path, help="checkpoint dir per row (a killed sweep resumes)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "distill_study.json")
    parser.add_argument("--markdown", action="store_true", help="print --out's table and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())))
        return
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    if args.mlm is None and any(ROWS[n].get("augment") for n in names):
        parser.error("the *-augment rows need --mlm, a masked-LM dir")
    if args.unlabeled == 0 and any(ROWS[n].get("unlabeled") for n in names):
        parser.error("the *-unlabeled rows need --unlabeled N, the train texts after the labelled ones")
    if "theseus" in names and (args.prune_heads or args.prune_ffn):
        parser.error("the theseus row replaces the teacher's layers; it takes --layers, not --prune-*")
    settings = {"student_layers": args.layers, "prune_heads": args.prune_heads, "prune_ffn": args.prune_ffn,
                "prune_samples": args.prune_samples, "train_samples": args.train_samples, "epochs": args.epochs,
                "batch_size": args.batch_size, "lr": args.lr, "max_eval_samples": args.max_eval_samples,
                **({"precision": args.precision} if args.precision != "fp32" else {})}
    # --mlm, --copies and --unlabeled shape only the *-augment / *-unlabeled rows: each such row
    # records them in its config.
    previous = json.loads(args.out.read_text()) if args.out.is_file() else None
    if previous is not None and previous["settings"] != settings:
        parser.error(f"{args.out} holds runs with other settings; expected the same settings or another --out")

    from compressor.bench.environment import environment
    from compressor.bundle import read_provenance
    from pretrain.data import load_task
    spec = args.task or read_provenance(args.teacher).get("task") or "wordnet-supersense"
    task = load_task(task_arg(spec))
    teacher_metrics = teacher_accuracy(args.teacher, task, args.max_eval_samples)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name in names:
            # Re-read before each row: sweeps of other rows may run beside this one.
            previous = json.loads(args.out.read_text())["runs"] if args.out.is_file() else []
            results = {(r["name"], r["seed"]): r for r in previous}
            if (name, seed) in results:
                print(f"{name} seed {seed}: already in {args.out}, skipped", file=sys.stderr, flush=True)
                continue
            print(f"running {name} seed {seed}", file=sys.stderr, flush=True)
            row = run_row(name, args, args.teacher, task, seed)
            row["kept_of_teacher"] = round(row["accuracy"] / teacher_metrics["accuracy"], 4)
            # Rows of one table may come from several commands (other --rows, --seeds, --mlm):
            # each row keeps its own, the file the one that started it.
            row["command"] = " ".join(["python", "benchmarks/distill_study.py", *map(str, sys.argv[1:])])
            before = json.loads(args.out.read_text()) if args.out.is_file() else {"runs": [], "command": row["command"]}
            results = {(r["name"], r["seed"]): r for r in before["runs"]}
            results[(name, seed)] = row
            print(json.dumps({k: row[k] for k in ("name", "seed", "accuracy", "kept_of_teacher", "train_seconds")}),
                  file=sys.stderr, flush=True)
            record = {"command": before["command"],
                      "environment": environment(),
                      "teacher": {"dir": str(args.teacher), **teacher_metrics},
                      "settings": settings, "runs": list(results.values())}
            write_json(args.out, record)


def markdown(record: dict) -> str:
    """One line per row: each seed's accuracy, their mean and its share of the teacher's."""
    teacher = record["teacher"]["accuracy"]
    seeds = sorted({r["seed"] for r in record["runs"]})
    by_row: dict[str, dict[int, float]] = {}
    for r in record["runs"]:
        by_row.setdefault(r["name"], {})[r["seed"]] = r["accuracy"]
    lines = [f"| row | {' | '.join(f'seed {s}' for s in seeds)} | mean | of teacher ({teacher:.4f}) |",
             "|---|" + "---:|" * (len(seeds) + 2)]
    for name, accuracy in by_row.items():
        mean = sum(accuracy.values()) / len(accuracy)
        cells = " | ".join(f"{accuracy[s]:.4f}" if s in accuracy else "" for s in seeds)
        lines.append(f"| `{name}` | {cells} | {mean:.4f} | {mean / teacher:.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
