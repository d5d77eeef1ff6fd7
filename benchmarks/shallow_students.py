"""BiLSTM and CNN students (`distill-structure`, Tang et al. 2019) beside the teacher.

For each kind, the same network is trained once per arm with the same budget (steps): on the
teacher's logits (`distilled`: `alpha: 0`, MSE, Tang et al.'s objective) and on the labels
alone (`labels-only`: `alpha: 1`, no teacher: the control); `--arms` adds `distilled-kl`
(KL at T = 2), `distilled-mixed` (alpha 0.5), `distilled-augment` (Tang et al.'s transfer
set: `--copies` noised copies of each text from the masked LM `--mlm`, labelled by the
teacher; its epochs divided by 1 + copies, so it takes the same steps as the others) and
`distilled-unlabeled` / `distilled-mixed-unlabeled` (the next `--unlabeled` train texts after
the labelled ones, labels withheld, so only the teacher labels them; epochs scaled to the
same steps). Each is exported through the real gate (`export_bundle`: ONNX,
parity with PyTorch, accuracy on the test split) and its test accuracy and file size are
recorded, with the teacher's. `--latency` also times every exported graph against the
teacher's fused fp32 graph, interleaved, at batch 8 on real test batches (the `cpu`
profile's threads): run that part on a quiet machine, with `--reuse` to keep the students
already exported under `--work`.

    .venv/bin/python benchmarks/shallow_students.py --teacher runs/demo/teacher \
        --train-samples 20000 --epochs 2 --eval-samples 5000 --latency \
        --out benchmarks/results/shallow_students.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from compressor.bench.environment import environment
from compressor.bench.measure import measure_models
from compressor.bench.profiles import load_profile
from compressor.bench.runners import Deployable
from compressor.bundle import ModelBundle
from compressor.cli.commands import task_arg
from compressor.export.onnx import ONNX_FILE, ExportSettings, export_bundle
from compressor.passes import Context, LazyTeacher, apply_pass, get_pass
from pretrain.atomic import write_json
from pretrain.data import load_task

GATE = ExportSettings(optimize=True, accuracy_tolerance=1.0)   # score every student, gate parity only
# arm -> distill-structure settings beside the shared budget ("augment": copies from --mlm)
ARMS: dict[str, dict] = {
    "distilled": {"alpha": 0.0},
    "labels-only": {"alpha": 1.0},
    "distilled-kl": {"alpha": 0.0, "logit_loss": "kl"},
    "distilled-mixed": {"alpha": 0.5},
    "distilled-augment": {"alpha": 0.0, "augment": True},
    # the next --unlabeled train texts, labels withheld: only the teacher labels them
    "distilled-unlabeled": {"alpha": 0.0, "unlabeled": True},
    "distilled-mixed-unlabeled": {"alpha": 0.5, "unlabeled": True},
    "distilled-kl-unlabeled": {"alpha": 0.0, "logit_loss": "kl", "unlabeled": True},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True, help="fine-tuned teacher dir")
    parser.add_argument("--task", default=None, help="task name or CSV/JSONL file (default: the teacher's)")
    parser.add_argument("--kinds", nargs="+", default=["bilstm", "cnn"], choices=["bilstm", "cnn"])
    parser.add_argument("--arms", nargs="+", default=["distilled", "labels-only"], choices=list(ARMS))
    parser.add_argument("--mlm", type=Path, help="distilled-augment: a masked-LM dir (compressor pretrain --init)")
    parser.add_argument("--copies", type=int, default=2, help="distilled-augment: noised copies per text")
    parser.add_argument("--unlabeled", type=int, default=0,
                        help="*-unlabeled arms: train texts after the --train-samples labelled ones, labels withheld")
    parser.add_argument("--embedding-dim", type=int, default=256)
    parser.add_argument("--train-samples", type=int, default=20000)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--eval-samples", type=int, default=5000)
    parser.add_argument("--latency", action="store_true", help="also time the graphs (quiet machine)")
    parser.add_argument("--reuse", action="store_true", help="students already exported under --work are kept")
    parser.add_argument("--seed", type=int, default=0, help="seed of every arm's initialisation and data order")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--work", type=Path, default=Path("runs/shallow_students"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if "distilled-augment" in args.arms and args.mlm is None:
        parser.error("the distilled-augment arm needs --mlm, a masked-LM dir")
    if any(arm.endswith("-unlabeled") for arm in args.arms) and args.unlabeled < 1:
        parser.error("the *-unlabeled arms need --unlabeled N, a positive number of train texts")

    teacher = ModelBundle.load(args.teacher)
    task = load_task(task_arg(args.task) if args.task else teacher.task)
    ctx = Context(task=task, seed=args.seed, show_progress=False, teacher_source=LazyTeacher.from_dir(args.teacher))
    rows = [exported("teacher", teacher, task, args, seconds=0.0)]
    for kind in args.kinds:
        for arm in args.arms:
            if args.reuse and (args.work / f"{kind}-{arm}" / "row.json").is_file():
                rows.append(json.loads((args.work / f"{kind}-{arm}" / "row.json").read_text()))
                continue
            config = get_pass("distill-structure").config_type.model_validate(arm_config(kind, arm, args))
            start = time.perf_counter()
            student = apply_pass(teacher, "distill-structure", config, ctx)
            rows.append(exported(f"{kind}-{arm}", student, task, args, time.perf_counter() - start))
            write_json(args.work / f"{kind}-{arm}" / "row.json", rows[-1])
            print(rows[-1], flush=True)
            write_results(args, rows, latency=None)
    latency = measure_latency(rows, teacher, task, args) if args.latency else None
    write_results(args, rows, latency)
    return 0


def arm_config(kind: str, arm: str, args) -> dict:
    settings = dict(ARMS[arm])
    epochs = args.epochs
    if settings.pop("augment", False):
        settings["augment"] = {"copies": args.copies, "mlm": str(args.mlm)}
        epochs /= 1 + args.copies          # the same steps over originals + copies
    if settings.pop("unlabeled", False):
        settings["unlabeled_samples"] = args.unlabeled
        epochs *= args.train_samples / (args.train_samples + args.unlabeled)   # the same steps again
    return {"kind": kind, **settings, "epochs": epochs, "max_train_samples": args.train_samples,
            "embedding_dim": args.embedding_dim, "hidden_size": 2 * args.embedding_dim}


def exported(name: str, bundle: ModelBundle, task, args, seconds: float) -> dict:
    out = args.work / name
    record = export_bundle(bundle, out, GATE, task, args.eval_samples).record
    return {"name": name, "family": bundle.model.config.model_type, "train_seconds": round(seconds, 1),
            "params": bundle.params, "accuracy": record["accuracy"], "size_bytes": record["size_bytes"],
            "onnx": str(out / ONNX_FILE)}


def measure_latency(rows: list[dict], teacher: ModelBundle, task, args) -> dict:
    profile = load_profile("cpu").model_copy(update={"batch_sizes": (args.batch_size,),
                                                     "iterations": args.iterations})
    models = [Deployable(r["name"], "onnx", Path(r["onnx"]), "fp32") for r in rows]
    measured = measure_models(models, profile, teacher.tokenizer, task.split("test").head(args.eval_samples))
    p50 = {row["model"]: row["p50_ms"] for row in measured.rows}
    return {"batch_size": args.batch_size, "p50_ms": p50, "rankings": measured.rankings,
            "vs_teacher": {name: p50[name] / p50["teacher"] for name in p50 if name != "teacher"}}


def write_results(args, rows: list[dict], latency: dict | None) -> None:
    teacher_accuracy = rows[0]["accuracy"]
    for row in rows:
        row["retention"] = row["accuracy"] / teacher_accuracy
    write_json(args.out, {"command": " ".join(["benchmarks/shallow_students.py", *sys.argv[1:]]),
                          "train_samples": args.train_samples, "epochs": args.epochs, "seed": args.seed,
                          "eval_samples": args.eval_samples, "results": rows, "latency": latency,
                          "environment": environment()})


if __name__ == "__main__":
    sys.exit(main())
