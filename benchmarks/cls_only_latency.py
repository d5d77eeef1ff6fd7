"""The last layer on the first token only (`export: cls_only_last_layer`): latency, same logits.

Each model (`--model NAME=DIR`, a saved model dir: the demo's teacher, a 3-layer student, a
search finalist) is exported twice by the tool's exporter (fused, parity-gated, scored on the
test split), once with its last layer whole and once on the first token only, in fp32 and in
dynamic int8 with per-channel weights (the demo's `quantize` settings). Every graph, plus the
baselines named with `--baseline NAME=DIR` (a run's baseline dirs, such as the demo's
`baselines/optimum-default-int8-<preset>`), is timed together, interleaved, on real test batches with
the `cpu` profile. The result: each model's p50 with and without, the speedup, the accuracy of
both (identical predictions are expected), and every p50 as a ratio of the first baseline's.

LATENCY NEEDS A QUIET MACHINE; run it alone:

    .venv/bin/python benchmarks/cls_only_latency.py --model teacher=runs/demo/teacher \
        --baseline optimum-default-int8=runs/demo/baselines/optimum-default-int8-avx512_vnni \
        --out benchmarks/results/cls_only_latency.json

Exports are kept in --work (a rerun only times; delete it to re-export).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compressor.bench.baselines import BASELINES, baseline_kind, model_file
from compressor.bench.environment import environment
from compressor.bench.measure import measure_models
from compressor.bench.profiles import load_profile
from compressor.bench.runners import Deployable
from compressor.bundle import ModelBundle
from compressor.cli.commands import task_arg
from compressor.export.onnx import EXPORT_FILE, ONNX_FILE, ExportSettings, export_bundle, read_export_record
from compressor.passes import Context, apply_pass, get_pass
from pretrain.atomic import write_json
from pretrain.data import load_task

INT8 = {"mode": "dynamic-int8", "per_channel": True}
LAYOUTS = {"whole": False, "cls-only": True}


def named_dir(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name, Path(path)


def exports(name: str, bundle: ModelBundle, ctx: Context, args) -> dict[str, tuple[Deployable, dict]]:
    """`bundle` in fp32 and int8, each with the last layer whole and on the first token only
    (a model dir whose passes asked for int8, such as a search finalist, gives its fp32 too)."""
    bundle = bundle.replace(deploy={k: v for k, v in bundle.deploy.items() if k != "quantize"})
    int8 = apply_pass(bundle, "quantize", get_pass("quantize").config_type.model_validate(INT8), ctx)
    out = {}
    for precision, model in (("fp32", bundle), ("int8", int8)):
        for layout, cls_only in LAYOUTS.items():
            label = f"{name}-{precision}-{layout}"
            path = args.work / label
            if not (path / EXPORT_FILE).exists():
                settings = ExportSettings(optimize=True, cls_only_last_layer=cls_only)
                export_bundle(model, path, settings, ctx.task, args.eval_samples)
            record = read_export_record(path)
            out[label] = Deployable(label, "onnx", path / ONNX_FILE, record["precision"]), record
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=named_dir, action="append", required=True, help="NAME=saved model dir")
    parser.add_argument("--baseline", type=named_dir, action="append", default=[],
                        help="NAME=DIR of a run's baseline (onnxruntime-fp32, optimum-default-int8), timed "
                             "beside (the first is the ratios' reference)")
    parser.add_argument("--task", default="wordnet-supersense", help="a built-in task or a CSV/JSONL file")
    parser.add_argument("--eval-samples", type=int, default=5000, help="test examples the exports are scored on")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--iterations", type=int, help="timed calls per model (default: the profile's)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--work", type=Path, default=Path("runs/cls-only-latency"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    unknown = [name for name, _ in args.baseline if name not in BASELINES[1:]]
    if unknown:
        parser.error(f"unknown baseline {unknown[0]!r}; expected {' or '.join(BASELINES[1:])}")
    task = load_task(task_arg(args.task))
    ctx = Context(task=task, seed=0, show_progress=False)
    bundles = {name: ModelBundle.load(path) for name, path in args.model}
    records, models = {}, []
    for name, bundle in bundles.items():
        for label, (model, record) in exports(name, bundle, ctx, args).items():
            models.append(model)
            records[label] = record
    for name, path in args.baseline:
        kind, precision = baseline_kind(name)
        models.append(Deployable(name, kind, model_file(name, path), precision))
    update = {"batch_sizes": args.batch_sizes, "sequence_lengths": ["real"]}
    if args.iterations:
        update["iterations"] = args.iterations
    profile = load_profile(args.profile).model_copy(update=update)
    tokenizer = next(iter(bundles.values())).tokenizer
    measured = measure_models(models, profile, tokenizer, task.split("test"))
    rows = summary(measured.rows, records, bundles, args.baseline[0][0] if args.baseline else None)
    write_json(args.out, {
        "command": " ".join(["benchmarks/cls_only_latency.py", *sys.argv[1:]]), "environment": environment(),
        "profile": profile.model_dump(mode="json"), "eval_samples": args.eval_samples,
        "models": {name: str(path) for name, path in args.model},
        "baselines": {name: str(path) for name, path in args.baseline},
        "summary": rows, "latency": measured.rows, "rankings": measured.rankings})
    for row in rows:
        print(f"{row['model']} {row['precision']} batch {row['batch_size']}: whole {row['whole_p50_ms']:.2f} ms, "
              f"cls-only {row['cls_only_p50_ms']:.2f} ms, speedup {row['speedup']:.3f}x, "
              f"accuracy {row['accuracy_whole']:.4f} / {row['accuracy_cls_only']:.4f}")
    return 0


def summary(rows: list[dict], records: dict, bundles: dict, reference: str | None) -> list[dict]:
    """Per model, precision and batch size: both layouts' p50, the speedup, accuracies, ratios."""
    p50 = {(r["model"], r["batch_size"]): r["p50_ms"] for r in rows}
    out = []
    for name in bundles:
        for precision in ("fp32", "int8"):
            whole, cls_only = f"{name}-{precision}-whole", f"{name}-{precision}-cls-only"
            for batch in sorted({r["batch_size"] for r in rows}):
                row = {"model": name, "precision": precision, "batch_size": batch,
                       "whole_p50_ms": p50[(whole, batch)], "cls_only_p50_ms": p50[(cls_only, batch)],
                       "speedup": p50[(whole, batch)] / p50[(cls_only, batch)],
                       "accuracy_whole": records[whole]["accuracy"], "accuracy_cls_only": records[cls_only]["accuracy"],
                       "parity_max_abs_diff_cls_only": records[cls_only]["parity_max_abs_diff"],
                       "applied": records[cls_only]["cls_only_last_layer"]}
                if reference is not None:
                    row[f"whole_of_{reference}"] = p50[(whole, batch)] / p50[(reference, batch)]
                    row[f"cls_only_of_{reference}"] = p50[(cls_only, batch)] / p50[(reference, batch)]
                out.append(row)
    return out


if __name__ == "__main__":
    sys.exit(main())
