"""BERT-of-Theseus vs drop-layers + finetune: a 3-layer student of the fine-tuned teacher.

Accuracy (any machine; rows are written as each finishes): every row starts from the
teacher, runs its passes with one training budget (train samples x epochs, batch 32, the
passes' default rates unless the row names one) and goes through the real export path (ONNX, parity gate, ORT
fusion); its accuracy is the shipped graph's on the first --eval-samples test examples.
The `teacher` row is the same export of the teacher itself (the reference, and the
latency baseline). A rerun skips rows whose export is already in --work; a killed Theseus
run resumes from its checkpoint there.

    nice -n 19 .venv/bin/python benchmarks/theseus_study.py --teacher runs/demo/teacher \
        --train-samples 20000 --epochs 1 --out benchmarks/results/theseus_study.json

Latency (a quiet machine): the exported fused fp32 graphs of the teacher and the Theseus
student, timed together (interleaved) with `measure_models` at batch 8 on real test batches
(the `cpu` profile: all cores, full graph optimization); the target is a p50 ratio <= 0.55.

    .venv/bin/python benchmarks/theseus_study.py --latency --teacher runs/demo/teacher \
        --work runs/theseus-study [--student theseus-lr3e-4] --out benchmarks/results/theseus_latency.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from compressor.bench.environment import environment
from compressor.bench.measure import measure_models
from compressor.bench.profiles import load_profile
from compressor.bench.runners import Deployable
from compressor.bundle import ModelBundle
from compressor.export.onnx import ONNX_FILE, ExportSettings, export_bundle
from compressor.passes import Context, apply_pass, get_pass
from pretrain.atomic import write_json
from pretrain.data import load_task
from pretrain.models import set_threads

OPEN_GATE = ExportSettings(optimize=True, accuracy_tolerance=1.0)


def rows(args, depth: int) -> dict[str, list[tuple[str, dict]]]:
    """name -> passes applied to the teacher, every trained row at the same budget; the
    drop-layers student keeps the first layer of each block (6 -> 3: layers 0, 2, 4)."""
    budget = {"epochs": args.epochs, "max_train_samples": args.train_samples}
    theseus = {"successor_layers": args.successor_layers, **budget}
    keep = list(range(0, depth, depth // args.successor_layers))
    return {
        "teacher": [],
        "theseus": [("theseus", {**theseus, "schedule": "linear"})],   # the pass's default rate (3e-4 now)
        "theseus-lr1e-4": [("theseus", {**theseus, "schedule": "linear", "lr": 1e-4})],
        "drop-layers+finetune": [("drop-layers", {"keep": keep}), ("finetune", budget)],
        "theseus-first-init": [("theseus", {**theseus, "schedule": "linear", "init": "first"})],
        "theseus-constant": [("theseus", {**theseus, "schedule": "constant"})],
        # only the successors train: a rate above full fine-tuning's (1e-4)
        "theseus-lr3e-4": [("theseus", {**theseus, "schedule": "linear", "lr": 3e-4})],
        "theseus-constant-lr3e-4": [("theseus", {**theseus, "schedule": "constant", "lr": 3e-4})],
        "theseus-lr1e-3": [("theseus", {**theseus, "schedule": "linear", "lr": 1e-3})],
    }


def run_row(name: str, steps: list[tuple[str, dict]], teacher: ModelBundle, task, args) -> dict:
    start = time.perf_counter()
    ctx = Context(task=task, seed=args.seed, show_progress=False, work_dir=args.work / f"{name}.checkpoints")
    bundle = teacher
    for pass_name, config in steps:
        bundle = apply_pass(bundle, pass_name, get_pass(pass_name).config_type.model_validate(config), ctx)
    trained = time.perf_counter() - start
    exported = export_bundle(bundle, args.work / name, OPEN_GATE, task, args.eval_samples)
    shutil.rmtree(ctx.work_dir, ignore_errors=True)    # the row is done: its checkpoint is not needed
    labels = np.asarray(task.split("test").head(args.eval_samples).labels)
    return {"name": name, "passes": steps, "accuracy": float(np.mean(exported.predictions == labels)),
            "layers": bundle.model.config.num_hidden_layers, "params": bundle.params,
            "model_class": type(bundle.model).__name__, "optimized": exported.record.get("optimized"),
            "train_seconds": round(trained, 1), "seconds": round(time.perf_counter() - start, 1)}


def accuracy_study(args) -> None:
    teacher = ModelBundle.load(args.teacher)
    task = load_task(args.task or teacher.task, seed=args.seed)
    prior = json.loads(args.out.read_text()) if args.out.exists() else {}
    done = {r["name"]: r for r in prior.get("results", [])}
    for name, steps in rows(args, teacher.model.config.num_hidden_layers).items():
        if args.runs and name not in args.runs:
            continue
        if name in done and (args.work / name / ONNX_FILE).exists():
            continue
        row = run_row(name, steps, teacher, task, args)
        done[name] = row
        reference = done.get("teacher", {}).get("accuracy")
        if reference:
            for r in done.values():
                r["retention"] = r["accuracy"] / reference
        print(f"{name}: accuracy {row['accuracy']:.4f} ({row['seconds']:.0f} s)", flush=True)
        write_json(args.out, {"command": " ".join(sys.argv), "teacher": str(args.teacher),
                              "budget": {"train_samples": args.train_samples, "epochs": args.epochs,
                                         "batch_size": 32, "seed": args.seed},
                              "eval_samples": args.eval_samples, "environment": environment(),
                              "results": list(done.values())})


def latency_study(args) -> None:
    """Teacher vs Theseus student, fused fp32 ONNX, interleaved, batch 8, real test batches."""
    teacher = ModelBundle.load(args.teacher)
    task = load_task(args.task or teacher.task, seed=args.seed)
    test = task.split("test").head(args.eval_samples)
    profile = load_profile("cpu").model_copy(update={"batch_sizes": [args.batch_size], "iterations": args.iterations,
                                                     "sequence_lengths": ["real"]})
    set_threads(profile.thread_count())
    names = ("teacher", args.student)
    missing = [n for n in names if not (args.work / n / ONNX_FILE).exists()]
    if missing:
        sys.exit(f"no export of {missing} in {args.work}; run the accuracy study first")
    models = [Deployable(n, "onnx", args.work / n / ONNX_FILE, "fp32") for n in names]
    measured = measure_models(models, profile, teacher.tokenizer, test)
    p50 = {row["model"]: row["p50_ms"] for row in measured.rows}
    ratio = p50[args.student] / p50["teacher"]
    write_json(args.out, {"command": " ".join(sys.argv), "profile": profile.model_dump(mode="json"),
                          "student": args.student, "rows": measured.rows, "rankings": measured.rankings,
                          "p50_ratio_student_vs_teacher": ratio, "target": 0.55,
                          "eval_samples": len(test), "environment": environment()})
    print(json.dumps({"p50_ms": p50, "ratio": ratio}, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--task", help="the teacher's task unless given (a built-in name)")
    parser.add_argument("--successor-layers", type=int, default=3)
    parser.add_argument("--train-samples", type=int, default=20000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--eval-samples", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="*", help="only these rows (default: all, in order)")
    parser.add_argument("--work", type=Path, default=Path("runs/theseus-study"))
    parser.add_argument("--latency", action="store_true", help="time the exported teacher and Theseus graphs")
    parser.add_argument("--student", default="theseus", help="with --latency: the row whose export is timed")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.latency:
        latency_study(args)
    else:
        set_threads(None)
        accuracy_study(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
