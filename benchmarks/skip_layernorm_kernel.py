"""ONNX Runtime's residual LayerNorm kernels alone: fused SkipLayerNormalization vs Sum + LayerNormalization.

One graph per form, input + residual -> LayerNorm over the last axis (hidden --hidden), timed
on the CPU provider at each --shapes batch x sequence, the two forms interleaved call by call
(one session each, --threads intra-op threads). The same random tensors and weights feed both;
the outputs must agree. What the exporter's `skip_layernorm: auto` rests on: on the installed
onnxruntime, which form is faster. To compare releases, run it under each (for example with
`pip install --target DIR onnxruntime==X` and PYTHONPATH=DIR).

    .venv/bin/python benchmarks/skip_layernorm_kernel.py --out benchmarks/results/skip_layernorm_kernel.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from compressor.bench.environment import environment
from pretrain.atomic import write_json

FORMS = ("fused", "unfused")


def residual_graph(form: str, hidden: int) -> bytes:
    """y = LayerNorm(x + r) as one SkipLayerNormalization, or as Sum then LayerNormalization
    (a two-input Sum, which ORT's session-time SkipLayerNormFusion leaves alone)."""
    dims = ["batch", "sequence", hidden]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name in ("x", "r")]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    rng = np.random.default_rng(0)
    weights = [helper.make_tensor(name, TensorProto.FLOAT, [hidden], rng.normal(size=hidden).astype(np.float32))
               for name in ("gamma", "beta")]
    if form == "fused":
        nodes = [helper.make_node("SkipLayerNormalization", ["x", "r", "gamma", "beta"], ["y"],
                                  domain="com.microsoft", epsilon=1e-12)]
    else:
        nodes = [helper.make_node("Sum", ["x", "r"], ["s"]),
                 helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12)]
    model = helper.make_model(helper.make_graph(nodes, "residual", inputs, [output], weights),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model.SerializeToString()


def session(graph: bytes, threads: int):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def measure(shape: tuple[int, int], hidden: int, threads: int, calls: int) -> dict:
    rng = np.random.default_rng(1)
    feed = {name: rng.normal(size=(*shape, hidden)).astype(np.float32) for name in ("x", "r")}
    sessions = {form: session(residual_graph(form, hidden), threads) for form in FORMS}
    outputs = {form: s.run(None, feed)[0] for form, s in sessions.items()}
    times: dict[str, list[float]] = {form: [] for form in FORMS}
    for call in range(calls + 20):                 # the first 20 calls warm up, untimed
        for form in (FORMS if call % 2 == 0 else FORMS[::-1]):
            start = time.perf_counter()
            sessions[form].run(None, feed)
            if call >= 20:
                times[form].append(time.perf_counter() - start)
    p50 = {form: float(np.median(t)) * 1e6 for form, t in times.items()}
    return {"batch": shape[0], "sequence": shape[1], "hidden": hidden,
            "p50_us": {form: round(v, 1) for form, v in p50.items()},
            "fused_over_unfused": round(p50["fused"] / p50["unfused"], 3),
            "max_abs_diff": float(np.abs(outputs["fused"] - outputs["unfused"]).max())}


def shape_arg(text: str) -> tuple[int, int]:
    batch, sequence = (int(part) for part in text.lower().split("x"))
    return batch, sequence


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", type=shape_arg, default=[(1, 16), (8, 28), (8, 128), (32, 28)],
                        help="batch x sequence, e.g. 8x28")
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per form and shape")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import onnxruntime as ort
    rows = [measure(shape, args.hidden, args.threads, args.calls) for shape in args.shapes]
    for row in rows:
        print(f"{row['batch']}x{row['sequence']}x{row['hidden']}: fused {row['p50_us']['fused']} us, "
              f"unfused {row['p50_us']['unfused']} us, fused/unfused {row['fused_over_unfused']}")
    write_json(args.out, {"command": " ".join(["benchmarks/skip_layernorm_kernel.py", *sys.argv[1:]]),
                          "onnxruntime": ort.__version__, "onnx": onnx.__version__, "threads": args.threads,
                          "calls": args.calls, "results": rows, "environment": environment()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
