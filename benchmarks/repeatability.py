"""Repeatability of the benchmark stage: measure the demo's models twice, compare.

Runs the recipe twice with `rebenchmark` (every other stage comes from the cache), then
compares, per profile and batch size, the ranking of the models by p50 latency and every
model's speedup over each baseline. Target: the same ranking, ratios within 10%.

    .venv/bin/python benchmarks/repeatability.py recipes/demo.yaml --run runs/demo \
        --out benchmarks/results/repeatability.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compressor.atomic import write_json
from compressor.pipeline import run_recipe
from compressor.recipe import load_recipe
from compressor.report import latency_row, measurement_keys


def speedups(report: dict, key: tuple) -> dict[str, float]:
    bases = [m for m in report["models"] if m.get("baseline") and latency_row(m, key)]
    return {f"{m['name']} vs {b['name']}": latency_row(b, key)["p50_ms"] / latency_row(m, key)["p50_ms"]
            for m in report["models"] if latency_row(m, key) for b in bases if b is not m}


def ranking(report: dict, key: tuple) -> list[str]:
    measured = [m for m in report["models"] if latency_row(m, key)]
    return [m["name"] for m in sorted(measured, key=lambda m: latency_row(m, key)["p50_ms"])]


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
        comparison.append({"profile": key[0], "batch_size": key[1], "sequence_length": key[2],
                           "ranking": [ranking(r, key) for r in reports],
                           "same_ranking": ranking(reports[0], key) == ranking(reports[1], key),
                           "speedups": [first, second], "max_relative_change": worst})
    result = {"command": " ".join(sys.argv), "measurements": comparison,
              "repeatable": all(c["same_ranking"] and c["max_relative_change"] <= 0.10 for c in comparison),
              "environment": reports[1]["environment"]}
    write_json(args.out, result)
    for c in comparison:
        print(f"{c['profile']} batch {c['batch_size']}: same ranking {c['same_ranking']}, "
              f"max speedup change {c['max_relative_change']:.1%}")


if __name__ == "__main__":
    main()
