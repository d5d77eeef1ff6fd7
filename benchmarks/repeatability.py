"""Repeatability of the benchmark stage: measure the demo's models twice, compare.

Runs the recipe twice with `rebenchmark` (every other stage comes from the cache), then
compares, per profile and batch size, the ranking of the models by p50 latency and every
model's speedup over each baseline. Target: the same ranking, ratios within 10%.

"The same ranking" is judged with the ties the benchmark stage reports (compressor/bench/timing.py:
two models tie when their paired per-call latency ratio is within 3% or its 95% interval
holds 1). The rankings differ when some pair is clearly ordered one way in one run and
clearly the other way in the other; a pair that ties in either run cannot contradict.

    .venv/bin/python benchmarks/repeatability.py recipes/demo.yaml --run runs/demo \
        --out benchmarks/results/repeatability.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compressor.pipeline import run_recipe
from compressor.pipeline.recipe import load_recipe
from compressor.report.analysis import latency_row, measurement_keys
from pretrain.atomic import write_json


def speedups(report: dict, key: tuple) -> dict[str, float]:
    bases = [m for m in report["models"] if m.get("baseline") and latency_row(m, key)]
    return {f"{m['name']} vs {b['name']}": latency_row(b, key)["p50_ms"] / latency_row(m, key)["p50_ms"]
            for m in report["models"] if latency_row(m, key) for b in bases if b is not m}


def ranking(report: dict, key: tuple) -> list[str]:
    measured = [m for m in report["models"] if latency_row(m, key)]
    return [m["name"] for m in sorted(measured, key=lambda m: latency_row(m, key)["p50_ms"])]


def stage_ranking(report: dict, key: tuple) -> dict:
    return next(r for r in report["benchmark"]["rankings"]
                if (r["profile"], r["batch_size"], r["sequence_length"]) == key)


def orders(report: dict, key: tuple) -> dict[tuple[str, str], int]:
    """-1: a clearly faster than b; 1: clearly slower; 0: tied."""
    ties = {frozenset(pair) for pair in stage_ranking(report, key)["ties"]}
    p50 = {m["name"]: latency_row(m, key)["p50_ms"] for m in report["models"] if latency_row(m, key)}
    return {(a, b): 0 if frozenset((a, b)) in ties else (-1 if p50[a] < p50[b] else 1)
            for a in p50 for b in p50 if a < b}


def contradictions(first: dict, second: dict, key: tuple) -> list[str]:
    one, two = orders(first, key), orders(second, key)
    return [f"{a} vs {b}" for (a, b), o in one.items() if o * two[(a, b)] < 0]


def grouped(report: dict, key: tuple) -> list[list[str]]:
    return [g["models"] for g in stage_ranking(report, key)["groups"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--run", type=Path, default=Path("runs/demo"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/repeatability.json"))
    args = parser.parse_args()
    recipe, steps = load_recipe(args.recipe)
    reports = [run_recipe(recipe, steps, args.run, base_dir=args.recipe.parent, show_progress=False,
                          rebenchmark=True) for _ in range(2)]
    comparison = []
    for key in measurement_keys(reports[0]["models"]):
        first, second = speedups(reports[0], key), speedups(reports[1], key)
        worst = max(abs(second[k] / first[k] - 1) for k in first)
        flipped = contradictions(reports[0], reports[1], key)
        comparison.append({"profile": key[0], "batch_size": key[1], "sequence_length": key[2],
                           "ranking": [ranking(r, key) for r in reports],
                           "ranking_with_ties": [grouped(r, key) for r in reports],
                           "identical_order_ignoring_ties": ranking(reports[0], key) == ranking(reports[1], key),
                           "contradicting_pairs": flipped, "same_ranking": not flipped,
                           "speedups": [first, second], "max_relative_change": worst,
                           "worst_ratio": max(first, key=lambda k: abs(second[k] / first[k] - 1))})
    result = {"command": " ".join(sys.argv), "measurements": comparison,
              "repeatable": all(c["same_ranking"] and c["max_relative_change"] <= 0.10 for c in comparison),
              "environment": reports[1]["environment"]}
    write_json(args.out, result)
    for c in comparison:
        print(f"{c['profile']} batch {c['batch_size']}: same ranking {c['same_ranking']} "
              f"(contradicting pairs: {c['contradicting_pairs'] or 'none'}; groups {c['ranking_with_ties']}), "
              f"max speedup change {c['max_relative_change']:.1%} ({c['worst_ratio']})")


if __name__ == "__main__":
    main()
