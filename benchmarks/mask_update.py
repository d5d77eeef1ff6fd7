"""Mask updates of `prune-magnitude` and `prune-movement`: the passes' threshold selection
against scattering torch.topk's indices (their code until 09d2bce), on a real model's weights.

After every optimizer step both passes recompute a top-k mask on each Linear weight of the
encoder (MiniLM: 36 matrices, 10.6M weights), so the update is paid once per step.

Part 1 (always): one update of every matrix, |W| as the scores, for each `--sparsities`
and both scopes (`per_layer`: a mask per matrix; `global`: one ranking over all of them),
`--rounds` times with the order of the two methods alternating; the median of each. Both
masks are compared: the same count in every matrix always, the same set wherever no score
ties at the threshold (`identical_masks` counts the matrices where they agree).

Part 2 (`--train-samples N`): `prune-magnitude` (90%, one epoch over N train examples, hard
labels) trains once with each mask function per round, the order alternating; samples per
second and the seconds spent in the mask updates (`Pruner.update`) are recorded. The VM's
speed drifts, so compare within a round.

    .venv/bin/python benchmarks/mask_update.py --model runs/demo/teacher --rounds 5 \\
        --train-samples 6400 --train-rounds 2 --out benchmarks/results/mask_update.json
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

from compressor.bench.environment import environment
from compressor.bundle import ModelBundle
from compressor.cli.commands import task_arg
from compressor.modeling.cost import encoder_linears
from compressor.passes import Context, apply_pass, get_pass
from compressor.passes import sparsity as sparsity_passes
from pretrain.atomic import write_json
from pretrain.data import load_task
from pretrain.models import set_threads


def topk_indices_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The straightforward mask: 1 at torch.topk's indices of the largest scores."""
    keep = round((1 - sparsity) * scores.numel())
    mask = torch.zeros_like(scores)
    if keep:
        mask[torch.topk(scores, keep, sorted=False).indices] = 1
    return mask


METHODS = {"threshold": sparsity_passes.top_k_mask, "topk-indices": topk_indices_mask}


def update(mask_fn, scores: list[torch.Tensor], sparsity: float, scope: str) -> list[torch.Tensor]:
    """One update of every matrix, as `Pruner.update` does it."""
    if scope == "global":
        return list(mask_fn(torch.cat(scores), sparsity).split([s.numel() for s in scores]))
    return [mask_fn(s, sparsity) for s in scores]


def time_updates(scores: list[torch.Tensor], sparsity: float, scope: str, rounds: int) -> dict:
    seconds: dict[str, list[float]] = {name: [] for name in METHODS}
    for r in range(rounds):
        for name in list(METHODS) if r % 2 == 0 else list(METHODS)[::-1]:
            start = time.perf_counter()
            update(METHODS[name], scores, sparsity, scope)
            seconds[name].append(time.perf_counter() - start)
    ours, theirs = (update(fn, scores, sparsity, scope) for fn in METHODS.values())
    ms = {name: round(statistics.median(s) * 1e3, 2) for name, s in seconds.items()}
    return {"sparsity": sparsity, "scope": scope, "median_ms": ms,
            "speedup": round(ms["topk-indices"] / ms["threshold"], 2),
            "same_counts": all(int(a.sum()) == int(b.sum()) for a, b in zip(ours, theirs)),
            "identical_masks": sum(torch.equal(a, b) for a, b in zip(ours, theirs)), "matrices": len(scores)}


@contextlib.contextmanager
def mask_function(fn, clock: list[float]):
    """The passes use `fn` for their masks; every Pruner.update's seconds go to `clock`."""
    real_mask, real_update = sparsity_passes.top_k_mask, sparsity_passes.Pruner.update

    def timed_update(self, sparsity):
        start = time.perf_counter()
        real_update(self, sparsity)
        clock.append(time.perf_counter() - start)
    sparsity_passes.top_k_mask, sparsity_passes.Pruner.update = fn, timed_update
    try:
        yield
    finally:
        sparsity_passes.top_k_mask, sparsity_passes.Pruner.update = real_mask, real_update


def time_training(bundle: ModelBundle, task, args) -> list[dict]:
    cfg = get_pass("prune-magnitude").config_type(sparsity=0.9, epochs=1, max_train_samples=args.train_samples)
    rows = []
    for r in range(args.train_rounds):
        for name in list(METHODS) if r % 2 == 0 else list(METHODS)[::-1]:
            clock: list[float] = []
            with mask_function(METHODS[name], clock):
                start = time.perf_counter()
                apply_pass(bundle, "prune-magnitude", cfg, Context(task=task, seed=0, show_progress=False))
                seconds = time.perf_counter() - start
            rows.append({"round": r, "method": name, "seconds": round(seconds, 1),
                         "samples_per_second": round(cfg.max_train_samples / seconds, 1),
                         "updates": len(clock), "update_seconds": round(sum(clock), 1)})
            print(rows[-1], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a fine-tuned model dir (its weights are the scores)")
    parser.add_argument("--task", default="wordnet-supersense",
                        help="for --train-samples: a built-in task name or a CSV/JSONL file (text,label)")
    parser.add_argument("--sparsities", nargs="+", type=float, default=[0.1, 0.5, 0.9])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--train-samples", type=int, default=0, help="also time prune-magnitude training (part 2)")
    parser.add_argument("--train-rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    set_threads(None)
    bundle = ModelBundle.load(args.model)
    scores = [m.weight.detach().abs().flatten() for m in encoder_linears(bundle.model).values()]
    result: dict = {"study": "mask update: threshold selection vs topk indices", "model": str(args.model),
                    "weights": sum(s.numel() for s in scores),
                    "updates": [time_updates(scores, s, scope, args.rounds)
                                for s in args.sparsities for scope in ("per_layer", "global")]}
    for row in result["updates"]:
        print(row, flush=True)
    if args.train_samples:
        result["training"] = time_training(bundle, load_task(task_arg(args.task)), args)
    result.update(command=" ".join(sys.argv), environment=environment())
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
