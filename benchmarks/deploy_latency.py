"""Issue 5's latency numbers, side by side in one run, on the demo's exports.

Measured together (interleaved rounds, the `cpu` profile's threads and graph optimization,
real test batches padded to each batch's longest member):

- teacher fp32, exported and fused by this tool (the reference for the int8 ratio);
- teacher fp32, plain export (no fusion): the `onnxruntime-fp32` baseline;
- this tool's export + fusion + dynamic int8 (per-channel), the demo's `int8` variant;
- Optimum's recipe (export, O2, the dynamic int8 preset for this CPU): the `optimum-default-int8` baseline;
- other exported int8 variants of the run when present (static int8, QAT, sensitivity);
- the teacher with half of the heads and half of the FFN neurons removed in every layer
  (structure only, no training), exported and fused here, against the unsliced fused
  teacher: evidence that structure the pruning passes remove becomes speed.

Each graph's entry records `contention` (other processes' share of the CPUs while it was
timed); the result, their median and worst (`contention`) and the report's warning when the
machine was busy (`warnings`, printed on stderr too).

    .venv/bin/python benchmarks/deploy_latency.py --run runs/demo --batch-size 8 \
        --out benchmarks/results/deploy_latency.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from compressor.bench.environment import environment
from compressor.bench.profiles import load_profile
from compressor.bench.runners import Deployable, input_batches, load_runner
from compressor.bench.timing import measure_interleaved
from compressor.export.optimize import fuse
from compressor.export.trace import write_onnx
from compressor.report.analysis import announced_contention
from pretrain.atomic import write_json
from pretrain.data import load_task
from pretrain.models import encoder_layers, load_saved_classifier, set_threads


def halve_structure(model) -> None:
    """Remove the first half of every layer's heads and keep the first half of its FFN neurons."""
    heads = model.config.num_attention_heads
    model.prune_heads({i: list(range(heads // 2)) for i in range(len(encoder_layers(model)))})
    for layer in encoder_layers(model):
        inner, outer = layer.intermediate.dense, layer.output.dense
        width = inner.out_features // 2
        layer.intermediate.dense = sliced_linear(inner.weight[:width], inner.bias[:width])
        layer.output.dense = sliced_linear(outer.weight[:, :width], outer.bias)


def sliced_linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    layer.weight.data, layer.bias.data = weight.detach().clone(), bias.detach().clone()
    return layer


def fused_export(model, work: Path, name: str) -> Path:
    raw = work / f"{name}-raw.onnx"
    write_onnx(model, raw)
    fusion = fuse(raw, work / f"{name}.onnx")
    if fusion.path is None:
        sys.exit(f"fusion failed for {name}: {fusion.fallback}")
    return fusion.path



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/demo"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/deploy_latency.json"))
    args = parser.parse_args()
    report = json.loads((args.run / "report.json").read_text())
    profile = load_profile("cpu").model_copy(update={"iterations": args.iterations})
    set_threads(profile.thread_count())
    entries = {m["name"]: m for m in report["models"]}
    teacher_dir = Path(report["teacher"]["path"])

    models = {"teacher-fp32-fused": Path(report["teacher"]["onnx"]["path"]) / "model.onnx"}
    for name in ("onnxruntime-fp32", "optimum-default-int8"):
        models[name] = Path(entries[name]["path"]) / ("model.onnx" if name == "onnxruntime-fp32"
                                                        else "model_optimized_quantized.onnx")
    int8_like = [m for m in report["models"] if not m.get("baseline") and m.get("kind") == "onnx"
                 and "int8" in m["precision"] and m["params"] == report["teacher"]["params"]]
    for m in int8_like:
        models[f"{m['name']} ({m['precision']})"] = Path(m["path"]) / "model.onnx"

    with tempfile.TemporaryDirectory(prefix="deploy-latency-") as tmp:
        model, tokenizer = load_saved_classifier(teacher_dir)
        halve_structure(model)
        models["teacher-half-heads-half-ffn-fp32-fused"] = fused_export(model.eval(), Path(tmp), "half")
        task = load_task(report["recipe"]["teacher"]["task"], seed=report["recipe"]["seed"])
        test = task.split("test").head(report["recipe"]["data"]["max_eval_samples"])
        batches = input_batches(tokenizer, test, args.batch_size, "real")
        runners = {name: load_runner(Deployable(name, "onnx", path, ""), profile) for name, path in models.items()}
        stats = measure_interleaved(runners, batches, profile, with_contention=True)
        sizes = {name: path.stat().st_size for name, path in models.items()}

    p50 = {name: s["p50_ms"] for name, s in stats.items()}
    accuracy = {"teacher-fp32-fused": report["teacher"]["onnx"]["accuracy"],
                **{name: entries[name]["accuracy"] for name in ("onnxruntime-fp32", "optimum-default-int8")},
                **{f"{m['name']} ({m['precision']})": m["accuracy"] for m in int8_like}}
    ours = next((n for n in models if n.startswith("int8 (")), None)
    ratios = {"half_structure_vs_unsliced": p50["teacher-half-heads-half-ffn-fp32-fused"] / p50["teacher-fp32-fused"]}
    if ours:
        ratios.update({"dynamic_int8_vs_fp32_fused": p50[ours] / p50["teacher-fp32-fused"],
                       "dynamic_int8_vs_onnxruntime_fp32": p50[ours] / p50["onnxruntime-fp32"],
                       "ours_int8_vs_optimum_default_int8": p50[ours] / p50["optimum-default-int8"],
                       "int8_file_size_vs_fp32": sizes[ours] / sizes["teacher-fp32-fused"],
                       "ours_minus_optimum_accuracy": accuracy[ours] - accuracy["optimum-default-int8"]})
    contention = announced_contention(stats, profile.name, args.batch_size)
    result = {"command": " ".join(sys.argv), "batch_size": args.batch_size, "profile": profile.model_dump(),
              "models": {name: {**stats[name], "size_bytes": sizes[name], "accuracy": accuracy.get(name)}
                         for name in models},
              "ratios": ratios, "eval_samples": len(test), **contention, "environment": environment()}
    write_json(args.out, result)
    print(json.dumps({"p50_ms": p50, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
