"""`trim-vocab` on the fine-tuned teacher: rows kept, file sizes and test accuracy.

For the teacher as it is and for `trim-vocab` at each `--min-counts` value (tokens used at
least that often in the train split): embedding rows kept, parameters, the saved
model.safetensors, and the ONNX export through the real exporter (`export_bundle`: parity
gate, ORT fusion) in fp32 and in the demo's int8 mode (dynamic-int8, per-channel), each with
its test accuracy. Test texts can hold tokens the train split never uses; their effect is
counted on the test examples scored: token occurrences of the teacher's tokenization whose
token was dropped, examples that hold one, and the [UNK] tokens of each tokenization.
No latency is measured here.

    .venv/bin/python benchmarks/trim_vocab_study.py --teacher runs/demo/teacher \
        --eval-samples 5000 --out benchmarks/results/trim_vocab.json

It prints the results as a table; `--markdown` only prints the table of an existing --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from compressor.bench.environment import environment
from compressor.bundle import ModelBundle, weights_size
from compressor.cli.commands import task_arg
from compressor.export.onnx import ExportSettings, export_bundle
from compressor.passes import Context, apply_pass, get_pass
from pretrain.atomic import write_json
from pretrain.data import Split, load_task
from pretrain.models import set_threads

OPEN_GATE = ExportSettings(optimize=True, accuracy_tolerance=1.0)   # every variant gets its number
INT8 = {"mode": "dynamic-int8", "per_channel": True}                # the demo recipe's int8 variant


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--task", help="a built-in task name or a CSV/JSONL file of the teacher's labels "
                                       "(default: the task recorded with the teacher)")
    parser.add_argument("--eval-samples", type=int, default=5000, help="test examples scored")
    parser.add_argument("--min-counts", type=int, nargs="+", default=[1, 2, 5])
    parser.add_argument("--work", type=Path, default=Path("runs/trim-vocab-study"))
    parser.add_argument("--out", type=Path, required=True, help="the results (JSON)")
    parser.add_argument("--markdown", action="store_true", help="only print the table of an existing --out")
    args = parser.parse_args()
    if not args.markdown:
        study(args)
    print(markdown(json.loads(args.out.read_text())))
    return 0


def study(args) -> None:
    set_threads(None)
    teacher = ModelBundle.load(args.teacher)
    spec = args.task or teacher.task
    task = load_task(task_arg(spec))
    test = task.split("test").head(args.eval_samples)
    ctx = Context(task=task, seed=0, show_progress=False)
    result = {"command": " ".join(sys.argv), "teacher": str(args.teacher), "task": spec,
              "eval_samples": len(test), "int8": INT8, "environment": environment(), "results": []}
    for min_count in [None, *args.min_counts]:
        start = time.perf_counter()
        bundle, name = teacher, "teacher"
        if min_count is not None:
            cfg = get_pass("trim-vocab").config_type.model_validate({"min_count": min_count})
            bundle, name = apply_pass(teacher, "trim-vocab", cfg, ctx), f"trim-vocab-min-count-{min_count}"
        row = {"name": name, "min_count": min_count, "trim_seconds": time.perf_counter() - start,
               **measure(bundle, args.work / name, task, args.eval_samples),
               "test_tokens": token_effect(teacher, bundle, test)}
        result["results"].append(row)
        write_json(args.out, result)
        print(f"{name}: rows {row['embedding_rows']} accuracy fp32 {row['accuracy_fp32']:.4f} "
              f"int8 {row['accuracy_int8']:.4f} sizes {row['safetensors_bytes'] / 1e6:.1f} / "
              f"{row['onnx_fp32_bytes'] / 1e6:.1f} / {row['onnx_int8_bytes'] / 1e6:.1f} MB", flush=True)


def measure(bundle: ModelBundle, work: Path, task, eval_samples: int) -> dict:
    """Sizes of the saved model and its fp32 and int8 exports, and their test accuracy."""
    saved = bundle.save(work / "model")
    fp32 = export_bundle(bundle, work / "onnx-fp32", OPEN_GATE, task, eval_samples).record
    int8 = export_bundle(bundle.replace(deploy={**bundle.deploy, "quantize": INT8}), work / "onnx-int8",
                         OPEN_GATE, task, eval_samples).record
    return {"embedding_rows": bundle.model.get_input_embeddings().num_embeddings, "params": bundle.params,
            "safetensors_bytes": weights_size(saved), "onnx_fp32_bytes": fp32["size_bytes"],
            "onnx_int8_bytes": int8["size_bytes"], "accuracy_fp32": fp32["accuracy"],
            "accuracy_int8": int8["accuracy"], "parity_max_abs_diff": fp32["parity_max_abs_diff"]}


def token_effect(teacher: ModelBundle, bundle: ModelBundle, test: Split) -> dict:
    """What the trimmed vocabulary does to the test texts, against the teacher's tokenization."""
    before = tokens(teacher, test)
    after = tokens(bundle, test)
    kept = set(bundle.tokenizer.get_vocab())
    dropped = [[t for t in row if t not in kept] for row in before]
    unk = teacher.tokenizer.unk_token
    return {"tokens": sum(map(len, before)),
            "dropped_occurrences": sum(map(len, dropped)),
            "dropped_distinct": len({t for row in dropped for t in row}),
            "examples_with_dropped": sum(1 for row in dropped if row),
            "examples_tokenized_differently": sum(a != b for a, b in zip(before, after)),
            "unk_before": sum(row.count(unk) for row in before),
            "unk_after": sum(row.count(unk) for row in after)}


def tokens(bundle: ModelBundle, split: Split) -> list[list[str]]:
    ids = bundle.tokenizer(split.texts, split.text_pairs, truncation=False)["input_ids"]
    return [bundle.tokenizer.convert_ids_to_tokens(row) for row in ids]


def markdown(result: dict) -> str:
    rows = result["results"]
    base = rows[0]
    lines = ["| variant | embedding rows | params | safetensors MB | ONNX fp32 MB | ONNX int8 MB | "
             "accuracy fp32 (change, points) | accuracy int8 (change, points) | test tokens dropped | "
             "test examples affected |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = r["test_tokens"]
        lines.append(
            f"| {r['name']} | {r['embedding_rows']:,} | {r['params'] / 1e6:.2f}M | {r['safetensors_bytes'] / 1e6:.1f} | "
            f"{r['onnx_fp32_bytes'] / 1e6:.1f} | {r['onnx_int8_bytes'] / 1e6:.1f} | "
            f"{r['accuracy_fp32']:.4f} ({(r['accuracy_fp32'] - base['accuracy_fp32']) * 100:+.2f}) | "
            f"{r['accuracy_int8']:.4f} ({(r['accuracy_int8'] - base['accuracy_int8']) * 100:+.2f}) | "
            f"{t['dropped_occurrences']:,} of {t['tokens']:,} | {t['examples_tokenized_differently']:,} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
