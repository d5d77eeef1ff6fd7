"""How well the latency model predicts structures it has not measured (issue 17's targets).

Fits the profile's latency model on the teacher (the whole teacher plus `--fit` random
structures per precision, fp32 and int8, exported with fusion and timed together on real
test batches), then scores it on `--held-out` more random structures measured in the same
run: the median absolute relative error of the predicted p50 (target at most 15%) and the
Spearman rank correlation between predicted and measured p50s (target at least 0.9).

    .venv/bin/python benchmarks/latency_model.py --teacher runs/demo/teacher --profile cpu \
        --batch-sizes 8 --work runs/latency_model --out benchmarks/results/latency_model.json

`--export-only` builds the exports (reused from `--work` by a later run) and times nothing,
so that the timed part can run alone on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compressor.bench.profiles import load_profile
from compressor.bundle import ModelBundle
from compressor.cli.commands import task_arg
from compressor.search import structures
from compressor.search.latency import Structure
from pretrain.atomic import write_json
from pretrain.data import load_task


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--task", default=None, help="task name or CSV/JSONL file (default: the teacher's)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--batch-sizes", default="8", help="comma-separated")
    parser.add_argument("--fit", type=int, default=12, help="random structures per precision to fit on")
    parser.add_argument("--held-out", type=int, default=8, help="random structures per precision to score on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export-only", action="store_true")
    parser.add_argument("--work", type=Path, default=Path("runs/latency_model"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    teacher = ModelBundle.load(args.teacher)
    task = load_task(task_arg(args.task) if args.task else teacher.task)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.export_only:
        shape = structures.teacher_shape(teacher)
        every = [Structure(heads=(shape.heads,) * shape.layers, ffn=(shape.ffn,) * shape.layers, precision=p)
                 for p in ("fp32", "int8")]
        every += structures.sample_structures(shape, args.fit, ("fp32", "int8"), args.seed)
        every += structures.sample_structures(shape, args.held_out, ("fp32", "int8"), args.seed + 1)
        structures.export_structures(teacher, list(dict.fromkeys(every)), task, args.work)
        return 0
    model = structures.fit_latency_model(teacher, task, load_profile(args.profile), batch_sizes, work=args.work,
                                         fit_count=args.fit, held_out_count=args.held_out, seed=args.seed)
    held = model.held_out or {}
    write_json(args.out, {
        "command": " ".join(["benchmarks/latency_model.py", *sys.argv[1:]]),
        "profile": args.profile, "batch_sizes": batch_sizes, "fit_structures_per_precision": args.fit,
        "held_out_structures": held.get("structures"),
        "median_abs_relative_error": held.get("median_abs_relative_error"), "spearman": held.get("spearman"),
        "spearman_by_batch_size": held.get("spearman_by_batch_size"),
        "targets": {"median_abs_relative_error": 0.15, "spearman": 0.9},
        "met": bool(held) and held["median_abs_relative_error"] <= 0.15 and (held["spearman"] or 0) >= 0.9,
        "held_out": held.get("rows"), "model": model.model_dump(mode="json", exclude={"machine"}),
        "environment": model.machine})
    print(f"held out: {held.get('structures')} structures, median |error| "
          f"{held.get('median_abs_relative_error')}, Spearman {held.get('spearman')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
