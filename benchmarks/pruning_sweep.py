"""Test accuracy against the share of attention heads (FFN neurons) pruned, by importance.

For each importance (taylor, magnitude, random) and fraction, the `prune-heads` pass is applied
to the fine-tuned teacher, then scored on the test split as it is and after a short recovery
fine-tune (the `finetune` pass: --recovery-epochs over the first --recovery-samples train
examples at --recovery-lr). `prune-ffn` is swept the same way at --ffn-fractions. Accuracy only;
no latency here (benchmarks/pruned_latency.py times the pruned model).

    nice -n 19 .venv/bin/python benchmarks/pruning_sweep.py --teacher runs/demo/teacher \
        --out benchmarks/results/pruning_sweep.json --plot benchmarks/results/pruning_sweep.png

Points run in priority order (the issue's targets first) and the file is rewritten after each,
so a run cut short keeps what it measured; rerunning the same command skips the points
already in --out (same teacher, eval and recovery budget) and measures the rest. Processes
given other `--importances` may fill one --out side by side (each re-reads it before writing).
`--markdown` prints --out as a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from compressor.bench.environment import environment
from compressor.bundle import ModelBundle
from compressor.cli.commands import task_arg
from compressor.modeling.importance import accuracy, encode_for_model
from compressor.passes import Context, apply_pass, get_pass
from pretrain.atomic import write_json
from pretrain.data import load_task

IMPORTANCES = ("taylor", "magnitude", "random")
PRIORITY = (0.5, 0.3, 0.7, 0.1, 0.9, 0.2, 0.4, 0.6, 0.8)   # the recovery grid's order


def points(args) -> list[tuple[str, str, float, bool]]:
    """(pass, importance, fraction, recovered) in the order they run: targets, the grid
    without recovery, FFN at 50%, then the recovery grid from the middle out."""
    heads = list(args.fractions)
    first = [("prune-heads", "taylor", 0.5, True)] + [("prune-heads", i, 0.5, False) for i in IMPORTANCES]
    plain = [("prune-heads", i, f, False) for f in heads for i in IMPORTANCES]
    ffn = [("prune-ffn", i, f, r) for f in args.ffn_fractions for r in (False, True) for i in IMPORTANCES]
    ordered = sorted(heads, key=lambda f: PRIORITY.index(f) if f in PRIORITY else -1)
    recovered = [("prune-heads", i, f, True) for f in ordered for i in IMPORTANCES]
    out: list = []
    for point in first + plain + ffn + recovered:
        if point[2] == 0:   # nothing pruned: the importance makes no difference, measure it once
            point = (point[0], "taylor", 0.0, point[3])
        if point not in out and (args.recovery or not point[3]):
            out.append(point)
    return out


def key(point) -> str:
    name, importance, fraction, recovered = point
    return f"{name}/{importance}/{fraction:.2f}/{'recovered' if recovered else 'pruned'}"


def measure(point, teacher: ModelBundle, ctx: Context, test, args) -> dict:
    name, importance, fraction, recovered = point
    start = time.perf_counter()
    bundle = teacher
    if fraction > 0:
        cfg = {"fraction": fraction, "importance": importance, "samples": args.samples}
        bundle = apply_pass(bundle, name, get_pass(name).config_type.model_validate(cfg), ctx)
    if recovered:
        bundle = apply_pass(bundle, "finetune", get_pass("finetune").config_type.model_validate(recovery(args)), ctx)
    model = bundle.model
    structure = getattr(model.config, "compressor_structure", None) or {}
    layers = model.base_model.encoder.layer if hasattr(model.base_model, "encoder") else []
    return {"key": key(point), "pass": name, "importance": importance, "fraction": fraction,
            "recovered": recovered, "accuracy": accuracy(model, test),
            "heads_per_layer": [layer.attention.self.num_attention_heads for layer in layers],
            "intermediate_sizes": structure.get("intermediate_sizes"), "params": bundle.params,
            "seconds": round(time.perf_counter() - start, 1)}


def recovery(args) -> dict:
    return {"epochs": args.recovery_epochs, "max_train_samples": args.recovery_samples, "lr": args.recovery_lr}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--task", default="wordnet-supersense", help="a built-in task or a CSV/JSONL file")
    parser.add_argument("--eval-samples", type=int, default=5000, help="first N test examples")
    parser.add_argument("--samples", type=int, default=512, help="train examples the taylor scores use")
    parser.add_argument("--fractions", type=float, nargs="+", default=[round(0.1 * i, 1) for i in range(10)])
    parser.add_argument("--ffn-fractions", type=float, nargs="*", default=[0.5])
    parser.add_argument("--importances", nargs="+", default=list(IMPORTANCES), choices=IMPORTANCES)
    parser.add_argument("--recovery-samples", type=int, default=4000)
    parser.add_argument("--recovery-epochs", type=float, default=1.0)
    parser.add_argument("--recovery-lr", type=float, default=1e-4)
    parser.add_argument("--no-recovery", dest="recovery", action="store_false")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot", type=Path, help="write the accuracy curves here (png)")
    parser.add_argument("--markdown", action="store_true", help="print --out as a table and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())))
        return 0
    teacher = ModelBundle.load(args.teacher)
    task = load_task(task_arg(args.task))
    test = encode_for_model(teacher.model, teacher.tokenizer, task, task.split("test").head(args.eval_samples))
    ctx = Context(task=task, seed=0, show_progress=False)
    setup = {"teacher": str(args.teacher), "task": args.task, "eval_samples": len(test), "samples": args.samples,
             "recovery": recovery(args)}
    prior = json.loads(args.out.read_text()) if args.out.exists() else {}
    results = {r["key"]: r for r in prior.get("results", [])} if prior.get("setup") == setup else {}
    teacher_accuracy = prior.get("teacher_accuracy") if results else None
    if teacher_accuracy is None:
        teacher_accuracy = accuracy(teacher.model, test)
    for point in points(args):
        if point[1] not in args.importances or key(point) in results:
            continue
        row = measure(point, teacher, ctx, test, args)
        row["retention"] = row["accuracy"] / teacher_accuracy
        print(f"{row['key']}: accuracy {row['accuracy']:.4f} ({row['retention']:.3f} of the teacher) "
              f"{row['seconds']} s", flush=True)
        results = saved_with(args.out, setup, results, row)
        write_json(args.out, {"command": " ".join(sys.argv), "setup": setup, "teacher_accuracy": teacher_accuracy,
                              "environment": environment(), "results": list(results.values()),
                              "targets": targets(results, teacher_accuracy)})
        if args.plot:
            plot(results, teacher_accuracy, args.plot)
    return 0


def saved_with(out: Path, setup: dict, results: dict, row: dict) -> dict:
    """Our points, the points another process has written to --out since (same setup; say
    `--importances taylor` in one and `magnitude random` in another), and the new row."""
    prior = json.loads(out.read_text()) if out.exists() else {}
    theirs = {r["key"]: r for r in prior.get("results", [])} if prior.get("setup") == setup else {}
    return {**theirs, **results, row["key"]: row}


def targets(results: dict, teacher_accuracy: float) -> dict:
    """Issue 15's two accuracy targets, where measured."""
    def acc(k):
        return results[k]["accuracy"] if k in results else None
    recovered = acc("prune-heads/taylor/0.50/recovered")
    taylor, random = acc("prune-heads/taylor/0.50/pruned"), acc("prune-heads/random/0.50/pruned")
    return {"taylor_50_recovered_retention": recovered / teacher_accuracy if recovered is not None else None,
            "taylor_50_recovered_at_least_98_percent": recovered >= 0.98 * teacher_accuracy
            if recovered is not None else None,
            "taylor_beats_random_at_50_without_recovery": taylor > random
            if taylor is not None and random is not None else None}


def plot(results: dict, teacher_accuracy: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = dict(zip(IMPORTANCES, ("tab:blue", "tab:orange", "tab:gray")))
    for importance in IMPORTANCES:
        for recovered, style in ((False, "--"), (True, "-")):
            rows = sorted((r for r in results.values() if r["pass"] == "prune-heads" and r["recovered"] == recovered
                           and (r["importance"] == importance or r["fraction"] == 0)), key=lambda r: r["fraction"])
            if rows:
                ax.plot([100 * r["fraction"] for r in rows], [r["accuracy"] for r in rows], style, marker="o",
                        color=colors[importance], label=f"{importance}{' + recovery' if recovered else ''}")
    ax.axhline(teacher_accuracy, color="black", linewidth=0.8, label="teacher")
    ax.axhline(0.98 * teacher_accuracy, color="black", linewidth=0.8, linestyle=":", label="98% of teacher")
    ax.set_xlabel("attention heads pruned (%)")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(data: dict) -> str:
    """Rows: pass and fraction; columns: importance without / with recovery."""
    cells = {(r["pass"], r["fraction"], i, r["recovered"]): r["accuracy"] for r in data["results"]
             for i in (IMPORTANCES if r["fraction"] == 0 else (r["importance"],))}   # 0%: one model for all
    lines = ["| pass | pruned | " + " | ".join(f"{i} | {i} + recovery" for i in IMPORTANCES) + " |",
             "|---|---|" + "---|" * (2 * len(IMPORTANCES))]
    for name, fraction in sorted({(p, f) for p, f, _, _ in cells}):
        row = [f"{cells[(name, fraction, i, r)]:.4f}" if (name, fraction, i, r) in cells else "-"
               for i in IMPORTANCES for r in (False, True)]
        lines.append(f"| {name} | {100 * fraction:.0f}% | " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
