"""Write the README's headline tables from a demo report.json.

The part of README.md between the `<!-- headline:start -->` and `<!-- headline:end -->`
markers is replaced by the report's model table, its latency tables (largest batch first)
and its latency ranking, rendered by the same code as report.md; the prose around the
markers is the author's.

    .venv/bin/python benchmarks/headline.py benchmarks/results/demo_report.json --readme README.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compressor.report.analysis import measurement_keys  # noqa: E402
from compressor.report.render import (baseline_lines, latency_table, ranking_lines,  # noqa: E402
                                      render_markdown, summary_table)
from pretrain.atomic import atomic_file  # noqa: E402

START, END = "<!-- headline:start -->", "<!-- headline:end -->"


def headline(report: dict) -> str:
    env = report["environment"]
    parts = [f"Run {env['date'][:10]}, {env['cpu']['model']} ({env['cpu']['cores']} cores), "
             + ", ".join(f"{k} {v}" for k, v in env["packages"].items()
                         if k in ("torch", "onnxruntime", "optimum") and v) + ".", "",
             "Every model and baseline (deployed artifacts: ONNX exports behind the parity and accuracy gate):",
             "", render_markdown(summary_table(report))]
    if any(m.get("baseline") for m in report["models"]):
        parts += ["", "How each baseline was built:", ""] + [f"- {line}" for line in baseline_lines(report)]
    keys = sorted(measurement_keys(report["models"]), key=lambda k: -k[1])
    for key in keys:
        parts += ["", f"Latency, profile {key[0]}, batch {key[1]} (sequence: {key[2]}):", "",
                  render_markdown(latency_table(report, key))]
    if report.get("benchmark", {}).get("rankings"):
        parts += ["", "Ranking by latency (fastest first; `=` joins models that tie within the noise):", ""]
        parts += [f"- {line}" for line in ranking_lines(report["benchmark"])]
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args()
    text = args.readme.read_text()
    if START not in text or END not in text:
        sys.exit(f"error: {args.readme} has no {START} ... {END} section to fill")
    block = headline(json.loads(args.report.read_text()))
    text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{block}\n{END}",
                  text, flags=re.S)
    atomic_file(args.readme, text.encode())
    print(f"{args.readme}: headline tables from {args.report}")


if __name__ == "__main__":
    main()
