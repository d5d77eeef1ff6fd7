"""The teacher's logits once per example (`TeacherLogits`) against running the teacher on
every batch, in the passes that learn from logits alone.

Each arm applies one pass to the teacher's bundle as a recipe would, twice per round: with
the cache (the passes' behaviour) and without it (`TeacherLogits(cache=False)`: the teacher
runs on every batch, as before 1bc9273), the order alternating between rounds. Every
result is scored on the same test examples, so the speed-up and the accuracy come from the
same runs: the two should agree within float rounding (a cached row was computed in a batch
padded to another width).

Arms (`--arms`): `cnn` and `bilstm` (`distill-structure`), `soft` (`student` on every other layer, [0, 2, 4] of MiniLM, then
`distill` on soft + hard), `movement` (`prune-movement` 90% with the teacher's soft
targets). Each trains `--epochs` epochs over the first `--train-samples` train examples: the
cache saves the teacher's forward in every epoch after the first.

    .venv/bin/python benchmarks/teacher_logits.py --teacher runs/demo/teacher --train-samples 6400 \\
        --epochs 3 --rounds 2 --out benchmarks/results/teacher_logits.json
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

from compressor.bench.environment import environment
from compressor.bundle import ModelBundle
from compressor.cli.commands import task_arg
from compressor.passes import Context, LazyTeacher, apply_pass, get_pass
from compressor.passes import distill_losses
from pretrain.atomic import write_json
from pretrain.data import load_task
from pretrain.finetune import evaluate
from pretrain.models import set_threads


def arm_steps(arm: str, args) -> list[tuple[str, dict]]:
    """(pass, config) applied in order; the last one trains against the teacher."""
    budget = {"epochs": args.epochs, "max_train_samples": args.train_samples}
    if arm in ("cnn", "bilstm"):
        width = {"embedding_dim": args.embedding_dim} if args.embedding_dim else {}
        return [("distill-structure", {"kind": arm, **width, **budget})]
    if arm == "soft":
        return [("student", {"layers": args.student_layers}), ("distill", {"losses": ["soft", "hard"], **budget})]
    return [("prune-movement", {"sparsity": 0.9, "teacher_soft_targets": True, **budget})]


@contextlib.contextmanager
def cache_off():
    """Every TeacherLogits made inside runs the teacher on every batch."""
    real = distill_losses.TeacherLogits.__init__

    def uncached(self, teacher, first_token=True, cache=True):
        real(self, teacher, first_token, cache=False)
    distill_losses.TeacherLogits.__init__ = uncached
    try:
        yield
    finally:
        distill_losses.TeacherLogits.__init__ = real


def run_arm(arm: str, cached: bool, teacher: ModelBundle, task, args) -> dict:
    ctx = Context(task=task, seed=0, show_progress=False, teacher_source=LazyTeacher.from_dir(args.teacher))
    bundle = teacher
    start = time.perf_counter()
    with contextlib.nullcontext() if cached else cache_off():
        for name, config in arm_steps(arm, args):
            bundle = apply_pass(bundle, name, get_pass(name).config_type.model_validate(config), ctx)
    seconds = time.perf_counter() - start
    metrics, _ = evaluate(bundle.model, bundle.tokenizer, task.split("test").head(args.eval_samples))
    return {"arm": arm, "cache": cached, "seconds": round(seconds, 1), "accuracy": metrics["accuracy"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, required=True, help="a fine-tuned model dir")
    parser.add_argument("--task", default="wordnet-supersense",
                        help="a built-in task name or a CSV/JSONL file (text,label) of the teacher's labels")
    parser.add_argument("--arms", nargs="+", default=["cnn", "bilstm", "soft", "movement"],
                        choices=["cnn", "bilstm", "soft", "movement"])
    parser.add_argument("--train-samples", type=int, default=6400)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eval-samples", type=int, default=2000)
    parser.add_argument("--embedding-dim", type=int, help="the BiLSTM/CNN students' (default: the pass's)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    set_threads(None)
    teacher = ModelBundle.load(args.teacher)
    args.student_layers = list(range(0, teacher.model.config.num_hidden_layers, 2))   # MiniLM: [0, 2, 4]
    task = load_task(task_arg(args.task))
    runs = []
    for arm in args.arms:
        for r in range(args.rounds):
            for cached in (True, False) if r % 2 == 0 else (False, True):
                runs.append({"round": r, **run_arm(arm, cached, teacher, task, args)})
                print(runs[-1], flush=True)
    summary = {}
    for arm in args.arms:
        ratios = [off["seconds"] / on["seconds"] for on, off in zip(
            [x for x in runs if x["arm"] == arm and x["cache"]], [x for x in runs if x["arm"] == arm and not x["cache"]])]
        summary[arm] = {"speedup_median": round(statistics.median(ratios), 2),
                        "speedups": [round(x, 2) for x in ratios]}
    write_json(args.out, {"study": "teacher logits once per example vs every batch", "teacher": str(args.teacher),
                          "runs": runs, "summary": summary, "command": " ".join(sys.argv),
                          "environment": environment()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
