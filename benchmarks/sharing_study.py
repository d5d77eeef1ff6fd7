"""Cross-layer sharing (`share-layers`) on the fine-tuned teacher: unique parameters, file
sizes and test accuracy, before and after a recovery fine-tune.

Each variant is the teacher with `share-layers` (mode, groups) and then `finetune` (the
recovery budget: `--recovery-samples` train examples, `--recovery-epochs`, `--recovery-lr`),
through the registered passes. Per variant: unique parameters (whole model and the encoder's
layers), the saved model's model.safetensors, the fused fp32 ONNX export and the fused
dynamic int8 (per-channel) export, with the test accuracy of the torch model before
recovery and of both exports after it (the exports' own scoring on the test split, behind
an open accuracy gate). No latency is measured here (sharing keeps every layer's compute).

    .venv/bin/python benchmarks/sharing_study.py --teacher runs/demo/teacher --eval-samples 5000 \
        --recovery-samples 20000 --out benchmarks/results/sharing_study.json

Results are written after each variant, so a run cut short keeps the rows it finished;
`--only NAME ...` runs just those variants (and the teacher's row), `--merge` keeps the
other rows of an existing --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from compressor.bench.environment import environment
from compressor.bundle import ModelBundle
from compressor.cli.commands import task_arg
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.passes import Context, apply_pass, get_pass
from pretrain.atomic import write_json
from pretrain.batching import encode, usable_length
from pretrain.data import load_task
from pretrain.finetune import predict_logits
from pretrain.models import count_params, encoder_layers, set_threads

OPEN_GATE = ExportSettings(optimize=True, accuracy_tolerance=1.0)
INT8 = {"mode": "dynamic-int8", "per_channel": True}   # the demo recipe's int8 mode

# name -> share-layers config, in the order they run (the target first)
VARIANTS = {
    "all-g1": {"mode": "all", "groups": 1},
    "all-g3": {"mode": "all", "groups": 3},
    "attention-g1": {"mode": "attention", "groups": 1},
    "ffn-g1": {"mode": "ffn", "groups": 1},
    "all-g2": {"mode": "all", "groups": 2},
    "all-g1-average": {"mode": "all", "groups": 1, "init": "average"},
}


def run(name: str, passes: list[tuple[str, dict]], bundle: ModelBundle, task, ctx, args) -> dict:
    start = time.perf_counter()
    row: dict = {"name": name, "passes": passes, "command": " ".join(sys.argv)}   # rows of --merge runs differ
    for pass_name, config in passes:
        bundle = apply_pass(bundle, pass_name, get_pass(pass_name).config_type.model_validate(config), ctx)
        if pass_name == "share-layers":   # before recovery: what sharing alone does
            row["accuracy_before_recovery"] = torch_accuracy(bundle, task, args.eval_samples)
    row.update(sizes(bundle, args.work / name))
    labels = np.asarray(task.split("test").head(args.eval_samples).labels)
    for precision, extra in (("fp32", []), ("int8", [("quantize", INT8)])):
        shipped = bundle
        for pass_name, config in extra:
            shipped = apply_pass(shipped, pass_name, get_pass(pass_name).config_type.model_validate(config), ctx)
        exported = export_bundle(shipped, args.work / name / f"onnx-{precision}", OPEN_GATE, task, args.eval_samples)
        record = exported.record
        row[f"onnx_{precision}"] = {
            "accuracy": float(np.mean(exported.predictions == labels)), "size_bytes": record["size_bytes"],
            "fusions": record.get("fusions"), "fused_duplicates_merged": record.get("fused_duplicates_merged"),
            "quantized_duplicates_merged": record.get("quantized_duplicates_merged")}
    row["seconds"] = time.perf_counter() - start
    print(f"{name}: encoder params {row['encoder_params']:,} fp32 onnx {row['onnx_fp32']['size_bytes'] / 1e6:.1f} MB "
          f"accuracy {row['onnx_fp32']['accuracy']:.4f} int8 {row['onnx_int8']['accuracy']:.4f}", flush=True)
    return row


def torch_accuracy(bundle: ModelBundle, task, eval_samples: int) -> float:
    test = task.split("test").head(eval_samples)
    data = encode(bundle.tokenizer, test, usable_length(bundle.model))
    return float(np.mean(predict_logits(bundle.model, data).argmax(axis=1) == np.asarray(data.labels)))


def sizes(bundle: ModelBundle, work: Path) -> dict:
    """Unique parameters (shared tensors once) and the saved weights file."""
    saved = bundle.save(work / "model")
    return {"params": bundle.params, "encoder_params": count_params(encoder_layers(bundle.model)),
            "safetensors_bytes": (saved / "model.safetensors").stat().st_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--task", default="wordnet-supersense",
                        help="a built-in task name or a CSV/JSONL file (text,label) of the teacher's labels")
    parser.add_argument("--eval-samples", type=int, default=5000)
    parser.add_argument("--recovery-samples", type=int, default=20000)
    parser.add_argument("--recovery-epochs", type=float, default=1.0)
    parser.add_argument("--recovery-lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--only", nargs="*", help="run only these variants (and the teacher)")
    parser.add_argument("--merge", action="store_true", help="keep the other rows of an existing --out")
    parser.add_argument("--work", type=Path, default=Path("runs/sharing-study"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", action="store_true", help="print --out's results as a table and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())))
        return 0
    set_threads(None)
    teacher = ModelBundle.load(args.teacher)
    task = load_task(task_arg(args.task))
    ctx = Context(task=task, seed=0, show_progress=False)
    recovery = {"epochs": args.recovery_epochs, "max_train_samples": args.recovery_samples,
                "lr": args.recovery_lr, "batch_size": args.batch_size}
    prior = json.loads(args.out.read_text()) if args.merge and args.out.exists() else {}
    rows = {r["name"]: r for r in prior.get("results", [])}
    plan = {"teacher": [], **{name: [("share-layers", cfg), ("finetune", recovery)] for name, cfg in VARIANTS.items()
                              if not args.only or name in args.only}}
    for name, passes in plan.items():
        if name == "teacher" and "teacher" in rows and args.merge:
            continue
        try:
            rows[name] = run(name, passes, teacher, task, ctx, args)
        except Exception as err:   # one failed variant must not lose the others' numbers
            rows[name] = {"name": name, "passes": passes, "error": f"{type(err).__name__}: {err}"}
            print(f"{name}: FAILED {rows[name]['error']}", flush=True)
        write_json(args.out, {"command": " ".join(sys.argv), "teacher": str(args.teacher), "task": args.task,
                              "eval_samples": args.eval_samples, "recovery": recovery,
                              "environment": environment(), "results": list(rows.values())})
    return 0


def markdown(result: dict) -> str:
    rows = {r["name"]: r for r in result["results"]}
    base = rows.get("teacher", {})
    lines = ["| variant | unique encoder params | encoder cut | safetensors (MB) | ONNX fp32 (MB) | ONNX int8 (MB) "
             "| accuracy before recovery | accuracy fp32 | accuracy int8 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows.values():
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error'][:80]} | | | | | | | |")
            continue
        cut = base["encoder_params"] / r["encoder_params"] if base and "error" not in base else float("nan")
        before = r.get("accuracy_before_recovery")
        lines.append(f"| {r['name']} | {r['encoder_params']:,} | {cut:.1f}x | {r['safetensors_bytes'] / 1e6:.1f} | "
                     f"{r['onnx_fp32']['size_bytes'] / 1e6:.1f} | {r['onnx_int8']['size_bytes'] / 1e6:.1f} | "
                     f"{'' if before is None else f'{before:.4f}'} | {r['onnx_fp32']['accuracy']:.4f} | "
                     f"{r['onnx_int8']['accuracy']:.4f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
