"""Latency of a structurally pruned model against the unpruned teacher, fp32 and int8, in one run.

The pruned model: the fine-tuned teacher, `prune-heads` (--heads of all heads, taylor), then
`prune-ffn` (--ffn of all FFN neurons, taylor), then a recovery `finetune` (--recovery-epochs
over the first --recovery-samples train examples at --recovery-lr). Both it and the teacher
are exported with ORT transformer fusion (the tool's export, parity-gated), in fp32 and in
dynamic int8 with per-channel weights (the `quantize` pass), and scored on the test split by
the export gate. The four graphs are then timed together, interleaved, on real test batches
(`measure_models` with the `cpu` profile at --batch-size, sequence `real`).

LATENCY NEEDS A QUIET MACHINE; run it alone:

    nice -n 0 .venv/bin/python benchmarks/pruned_latency.py --teacher runs/demo/teacher \
        --out benchmarks/results/pruned_latency.json

The pruned model and the exports are kept in --work, so a rerun only times (delete it to rebuild).
Target (issue 15): pruned/teacher p50 latency <= 0.6 in both precisions. `--precisions int8`
times one precision's two graphs alone.

`--drop-layers K` removes K encoder layers whole first (the `drop-layers` pass with `count`,
which keeps the layers whose removal would cost the most loss), as `prune-heads` does with
`allow_drop_layers` when a layer loses every head: --heads and --ffn stay shares of the
teacher's heads and neurons, the dropped layers' included, so the model has as many heads and
neurons as without it, but fewer layers' fixed work (LayerNorms, residual sums, quantizing
activations).

`--skip-layernorm fused unfused` exports all four graphs in each form of the residual
LayerNorms (ORT's fused SkipLayerNormalization, or Sum + LayerNormalization; default: the
exporter's `auto`) and times every graph in the same run; `--optimum` adds Optimum's int8
recipe for this CPU (the `optimum-default-int8` baseline, built as the benchmark builds it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from compressor.bench.baselines import build_optimum_default_int8, model_file, preset_for_this_cpu
from compressor.bench.environment import environment
from compressor.bench.measure import measure_models
from compressor.bench.profiles import load_profile
from compressor.bench.runners import Deployable
from compressor.bundle import ModelBundle
from compressor.cli.commands import task_arg
from compressor.export.onnx import EXPORT_FILE, ONNX_FILE, ExportSettings, export_bundle, read_export_record
from compressor.modeling.importance import heads_per_layer
from compressor.modeling.structure import family_for
from compressor.passes import Context, apply_pass, get_pass
from pretrain.atomic import write_json
from pretrain.data import load_task
from pretrain.models import encoder_layers
from pretrain.structured import submodule

INT8 = {"mode": "dynamic-int8", "per_channel": True}
TARGET_RATIO = 0.6


def step(bundle: ModelBundle, name: str, config: dict, ctx: Context) -> ModelBundle:
    return apply_pass(bundle, name, get_pass(name).config_type.model_validate(config), ctx)


def pruned_model(teacher: ModelBundle, ctx: Context, args) -> ModelBundle:
    """The teacher pruned and recovered (saved in --work/pruned; loaded from there when present)."""
    saved = args.work / "pruned"
    if saved.exists():
        return ModelBundle.load(saved)
    ranking = {"samples": args.samples, "cost_aware": args.cost_aware}
    heads, ffn = units(teacher)
    bundle = teacher
    if args.drop_layers:
        # whole layers first, chosen by drop-layers' measured importance; the head and FFN
        # fractions stay shares of the teacher's units, so the pruning passes remove the rest
        depth = len(encoder_layers(teacher.model))
        bundle = step(bundle, "drop-layers", {"count": depth - args.drop_layers, "samples": args.samples}, ctx)
    left_heads, left_ffn = units(bundle)
    bundle = step(bundle, "prune-heads", {"count": round(args.heads * heads) - (heads - left_heads), **ranking}, ctx)
    bundle = step(bundle, "prune-ffn", {"fraction": (round(args.ffn * ffn) - (ffn - left_ffn)) / left_ffn, **ranking},
                  ctx)
    bundle = step(bundle, "finetune", {"epochs": args.recovery_epochs, "max_train_samples": args.recovery_samples,
                                       "lr": args.recovery_lr}, ctx)
    bundle.save(saved)
    return bundle


def units(bundle: ModelBundle) -> tuple[int, int]:
    """Attention heads and FFN neurons of the whole model."""
    structure = structure_of(bundle)
    return sum(structure["heads"]), sum(structure["ffn"])


def structure_of(bundle: ModelBundle) -> dict:
    """Heads and FFN width of every layer, as pruned."""
    model = bundle.model
    family = family_for(model, "prune-heads")
    layers = encoder_layers(model)
    return {"heads": heads_per_layer(model, family, layers),
            "ffn": [submodule(layer, family.ffn.outer).in_features for layer in layers]}


def exported(bundle: ModelBundle, name: str, form: str, ctx: Context, args) -> tuple[Deployable, dict]:
    """`bundle` exported with fusion (residual LayerNorms as `form`) to --work/<name> (reused
    when there), with its export record."""
    out = args.work / name
    if not (out / EXPORT_FILE).exists():
        export_bundle(bundle, out, ExportSettings(optimize=True, skip_layernorm=form), ctx.task, args.eval_samples)
    record = read_export_record(out)
    return Deployable(name, "onnx", out / ONNX_FILE, record["precision"]), record


def optimum_baseline(teacher_dir: Path, args) -> Deployable:
    out = args.work / "optimum-default-int8"
    if not model_file("optimum-default-int8", out).exists():
        build_optimum_default_int8(teacher_dir, out, preset_for_this_cpu())
    return Deployable("optimum-default-int8", "onnx", model_file("optimum-default-int8", out), "dynamic-int8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--task", default="wordnet-supersense", help="a built-in task or a CSV/JSONL file")
    parser.add_argument("--heads", type=float, default=0.5, help="share of attention heads pruned")
    parser.add_argument("--ffn", type=float, default=0.5, help="share of FFN neurons pruned")
    parser.add_argument("--samples", type=int, default=512, help="train examples the taylor scores use")
    parser.add_argument("--drop-layers", type=int, default=0,
                        help="encoder layers removed whole first (by measured importance); --heads and --ffn "
                             "stay shares of the teacher's heads and neurons, these layers' included")
    parser.add_argument("--cost-aware", action="store_true",
                        help="rank heads and neurons by importance per multiply-add in the deployed graph")
    parser.add_argument("--recovery-samples", type=int, default=8000)
    parser.add_argument("--recovery-epochs", type=float, default=1.0)
    parser.add_argument("--recovery-lr", type=float, default=1e-4)
    parser.add_argument("--eval-samples", type=int, default=5000, help="test examples the exports are scored on")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--iterations", type=int, help="timed calls per model (default: the profile's)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--skip-layernorm", nargs="+", default=["auto"], choices=["auto", "fused", "unfused"],
                        help="forms of the residual LayerNorms to export and time (each graph once per form)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "int8"], choices=["fp32", "int8"],
                        help="the precisions whose graphs are timed together (one: its teacher and pruned "
                             "graphs alone, no graph of the other precision between their rounds)")
    parser.add_argument("--optimum", action="store_true", help="also time Optimum's int8 recipe for this CPU")
    parser.add_argument("--work", type=Path, default=Path("runs/pruned-latency"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    teacher = ModelBundle.load(args.teacher)
    depth = len(encoder_layers(teacher.model))
    if not 0 <= args.drop_layers < depth:
        parser.error(f"--drop-layers {args.drop_layers}: expected 0 to {depth - 1} (the teacher has {depth} layers)")
    task = load_task(task_arg(args.task))
    ctx = Context(task=task, seed=0, show_progress=True)
    pruned = pruned_model(teacher, ctx, args)
    models, records = [], {}
    # one form keeps the plain names (teacher-int8, ...); several get the form as a suffix
    forms = {form: f"-{form}" if len(args.skip_layernorm) > 1 else "" for form in args.skip_layernorm}
    for form, tag in forms.items():
        for name, bundle in (("teacher", teacher), ("pruned", pruned)):
            for precision in args.precisions:
                quantized = bundle if precision == "fp32" else step(bundle, "quantize", INT8, ctx)
                model, records[f"{name}-{precision}{tag}"] = exported(quantized, f"{name}-{precision}{tag}", form,
                                                                     ctx, args)
                models.append(model)
    if args.optimum:
        models.append(optimum_baseline(args.teacher, args))
    update = {"batch_sizes": [args.batch_size], "sequence_lengths": ["real"]}
    if args.iterations:
        update["iterations"] = args.iterations
    profile = load_profile(args.profile).model_copy(update=update)
    measured = measure_models(models, profile, teacher.tokenizer, task.split("test"))
    p50 = {row["model"]: row["p50_ms"] for row in measured.rows}
    ratios = {f"{precision}{tag}": p50[f"pruned-{precision}{tag}"] / p50[f"teacher-{precision}{tag}"]
              for tag in forms.values() for precision in args.precisions}
    per_round = {graphs: round_ratios(measured.calls[0], f"pruned-{graphs}", f"teacher-{graphs}")
                 for graphs in ratios}
    write_json(args.out, {
        "command": " ".join(sys.argv), "environment": environment(), "profile": profile.model_dump(mode="json"),
        "pruned_passes": list(pruned.history), "params": {"teacher": teacher.params, "pruned": pruned.params},
        "pruned_structure": structure_of(pruned),
        "accuracy": {name: r["accuracy"] for name, r in records.items()},
        "size_bytes": {name: r["size_bytes"] for name, r in records.items()},
        "fusions": {name: r.get("fusions") for name, r in records.items()},
        "skip_layernorm": {name: r.get("skip_layernorm") for name, r in records.items()},
        "latency": measured.rows, "rankings": measured.rankings, "p50_ratio_pruned_to_teacher": ratios,
        "target_met": {precision: ratio <= TARGET_RATIO for precision, ratio in ratios.items()},
        "round_ratios": per_round})
    for graphs, ratio in ratios.items():
        spread = per_round[graphs]
        print(f"{graphs}: pruned {p50[f'pruned-{graphs}']:.2f} ms, teacher {p50[f'teacher-{graphs}']:.2f} ms, "
              f"ratio {ratio:.3f} (target <= {TARGET_RATIO}); per round p10/p50/p90 {spread['p10']:.3f} / "
              f"{spread['p50']:.3f} / {spread['p90']:.3f}, {spread['share_at_or_under_target']:.0%} of rounds met")
    return 0


def round_ratios(calls: dict, pruned: str, teacher: str) -> dict:
    """The pruned/teacher ratio of p50s within each interleaved round, summarized.

    Both models of a round run within a fraction of a second of each other, so each round's
    ratio is taken in one state of the machine; on a VM whose speed comes and goes
    (benchmarks/README.md, "Idle spinning"), the spread of these ratios shows how much of a run
    sat in each state."""
    times = {name: np.asarray(calls["times_ms"][name]) for name in (pruned, teacher)}
    per_round = np.array([np.median(times[pruned][start:stop]) / np.median(times[teacher][start:stop])
                          for start, stop in calls["rounds"]])
    return {"rounds": len(per_round), "p10": float(np.quantile(per_round, 0.1)),
            "p50": float(np.median(per_round)), "p90": float(np.quantile(per_round, 0.9)),
            "share_at_or_under_target": float(np.mean(per_round <= TARGET_RATIO))}


if __name__ == "__main__":
    sys.exit(main())
