"""What makes an int8 graph fast on this CPU: our dynamic int8 vs Optimum's preset, one factor at a time.

The same fine-tuned teacher, quantized many ways, every graph timed in one interleaved run
(the `cpu` profile's threads and graph optimization, real test batches padded to each
batch's longest member) and scored on the same test examples:

- the graph: this tool's fused export (ORT's transformer optimizer, `compressor export
  --optimize`) or Optimum's O2 graph (ORTOptimizer);
- the quantizer settings, changed one at a time from ours (signed int8 weights, one scale per
  output channel, MatMul/Attention/Gather/EmbedLayerNormalization) towards Optimum's presets:
  unsigned weights, per-tensor scales, Optimum's operator list (which adds Transpose, Conv, LSTM);
- Optimum's own quantizer (ORTQuantizer) with the preset for this CPU, with the `avx2` preset
  this tool used before version 0.3.0 (u8/u8, per-tensor), and ORT's quantizer with our
  settings on Optimum's O2 graph.

    .venv/bin/python benchmarks/int8_side_by_side.py --run runs/demo \
        --out benchmarks/results/int8_side_by_side.json
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

import numpy as np

from compressor.bench.baselines import (optimum_o2, optimum_quantize, preset_for_this_cpu, preset_settings,
                                        quantization_config)
from compressor.bench.contention import rounded
from compressor.bench.environment import environment
from compressor.bench.profiles import load_profile
from compressor.bench.runners import Deployable, input_batches, load_runner
from compressor.bench.timing import ranking_with_ties, summarize, time_interleaved
from compressor.evaluate import load_predictor, predict_classes
from compressor.export.onnx import ONNX_FILE
from compressor.export.optimize import fuse
from compressor.export.quantize import TRANSFORMER_INT8_OPS
from compressor.export.trace import write_onnx
from compressor.report.analysis import announced_contention
from pretrain.atomic import write_json
from pretrain.data import load_task
from pretrain.metrics import agreement, classification_metrics
from pretrain.models import load_saved_classifier, set_threads

OPTIMUM_OPS = list(quantization_config("avx2").operators_to_quantize)

# name -> (graph, weight type, per-channel, op list): ORT's quantize_dynamic on that graph.
ORT_VARIANTS = {
    "ours (s8, per-channel, our ops)": ("fused", "qint8", True, TRANSFORMER_INT8_OPS),
    "ours, u8 weights": ("fused", "quint8", True, TRANSFORMER_INT8_OPS),
    "ours, per-tensor": ("fused", "qint8", False, TRANSFORMER_INT8_OPS),
    "ours, u8 weights, per-tensor": ("fused", "quint8", False, TRANSFORMER_INT8_OPS),
    "ours, Optimum's op list": ("fused", "qint8", True, OPTIMUM_OPS),
    "ours, MatMul/Attention only": ("fused", "qint8", True, ["MatMul", "Attention"]),
    "O2 graph, our settings": ("o2", "qint8", True, TRANSFORMER_INT8_OPS),
}


def ort_dynamic(source: Path, target: Path, weight_type: str, per_channel: bool, ops: list[str]) -> Path:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantize_dynamic(str(source), str(target), op_types_to_quantize=ops, per_channel=per_channel,
                     weight_type={"qint8": QuantType.QInt8, "quint8": QuantType.QUInt8}[weight_type],
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return target


def build_graphs(teacher: Path, fused_fp32: Path | None, work: Path) -> dict[str, Path]:
    """Every graph of the comparison, by name."""
    from optimum.onnxruntime.configuration import AutoQuantizationConfig
    if fused_fp32 is None or not fused_fp32.is_file():
        model, _ = load_saved_classifier(teacher)
        write_onnx(model, work / "raw.onnx")
        fuse(work / "raw.onnx", work / "fused.onnx")
        fused_fp32 = work / "fused.onnx"
    o2 = optimum_o2(teacher, work / "optimum")
    graphs = {"fp32, fused (ours)": fused_fp32, "fp32, Optimum O2": o2}
    sources = {"fused": fused_fp32, "o2": o2}
    for i, (name, (graph, weights, per_channel, ops)) in enumerate(ORT_VARIANTS.items()):
        graphs[name] = ort_dynamic(sources[graph], work / f"ort-{i}.onnx", weights, per_channel, ops)
    preset = preset_for_this_cpu()
    graphs[f"Optimum {preset} preset (the baseline)"] = optimum_quantize(o2, work / "preset", quantization_config(preset))
    graphs["Optimum avx2, per-tensor (baseline before 0.3.0)"] = optimum_quantize(
        o2, work / "avx2-old", AutoQuantizationConfig.avx2(is_static=False, per_channel=False))
    return graphs


def op_counts(path: Path) -> dict[str, int]:
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    counts = collections.Counter(node.op_type for node in model.graph.node)
    return dict(sorted(counts.items()))


def score(graph: Path, teacher: Path, task, n: int) -> np.ndarray:
    """Test-set class predictions of a bare .onnx graph (the teacher dir gives config and tokenizer)."""
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / ONNX_FILE
        link.symlink_to(graph.resolve())
        model, tokenizer = load_saved_classifier(teacher)
        model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return predict_classes(load_predictor(Path(tmp)), task.split("test").head(n), task)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=Path("runs/demo"),
                        help="a recipe run dir holding teacher/ (and teacher-as-is-onnx/ if exported)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--batch-sizes", default="8,1")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--eval-samples", type=int, default=5000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    set_threads(None)
    teacher = args.run / "teacher"
    task = load_task(json.loads((teacher / "compressor.json").read_text())["task"], seed=0)
    profile = load_profile(args.profile).model_copy(update={"iterations": args.iterations})
    labels = np.asarray(task.split("test").head(args.eval_samples).labels)
    with tempfile.TemporaryDirectory(prefix="int8-side-") as tmp:
        graphs = build_graphs(teacher, args.run / "teacher-as-is-onnx" / ONNX_FILE, Path(tmp))
        predictions = {name: score(path, teacher, task, args.eval_samples) for name, path in graphs.items()}
        reference = predictions["fp32, fused (ours)"]
        rows = {name: {"accuracy": classification_metrics(labels, p)["accuracy"],
                       "agreement_with_fp32": agreement(p, reference),
                       "size_mb": path.stat().st_size / 1e6, "ops": op_counts(path)}
                for name, (path, p) in ((n, (graphs[n], predictions[n])) for n in graphs)}
        _, tokenizer = load_saved_classifier(teacher)
        runners = {name: load_runner(Deployable(name, "onnx", path, "int8"), profile) for name, path in graphs.items()}
        latency = {}
        for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
            batches = input_batches(tokenizer, task.split("test"), batch_size, "real")
            timings = time_interleaved(runners, batches, profile)
            stats = {name: {**summarize(list(t), timings.samples[name]),
                            "contention": rounded(timings.contention.get(name))} for name, t in timings.times.items()}
            base = stats[f"Optimum {preset_for_this_cpu()} preset (the baseline)"]["p50_ms"]
            latency[str(batch_size)] = {
                "stats": stats, "p50_vs_optimum_preset": {n: s["p50_ms"] / base for n, s in stats.items()},
                "ranking": [g["models"] for g in ranking_with_ties(timings)],
                **announced_contention(stats, profile.name, batch_size)}
            for name in sorted(stats, key=lambda n: stats[n]["p50_ms"]):
                print(f"batch {batch_size}  {stats[name]['p50_ms']:7.2f} ms  "
                      f"{stats[name]['p50_ms'] / base:5.2f}x  {name}")
    result = {"command": "python benchmarks/int8_side_by_side.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
              "environment": environment(), "profile": profile.model_dump(mode="json"),
              "optimum_preset": preset_settings(preset_for_this_cpu()), "graphs": rows, "latency": latency,
              "warnings": [line for measured in latency.values() for line in measured["warnings"]]}
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
