"""Why a frozen MiniLM read at CLS (and a scalar mix of CLS positions) learns little.

For the first N training glosses of wordnet-supersense, the per-dimension standard deviation
across examples of the CLS hidden state of every layer, and of the frozen pooler's output
when it reads the last layer or the uniform mix of all layers (where `scalar-mix` training
starts). Inference only, a few seconds.

    python benchmarks/cls_variation.py --out benchmarks/results/cls_variation.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

from pretrain.data import load_task
from pretrain.models import load_classifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cls_variation.json"))
    args = parser.parse_args()
    task = load_task("wordnet-supersense")
    model, tokenizer = load_classifier("minilm", task.label_names)
    model.eval()
    inputs = tokenizer(task.split("train").texts[: args.examples], padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model.bert(**inputs, output_hidden_states=True).hidden_states   # (layers + 1) x (n, seq, 384)
        cls_std = [float(h[:, 0].std(0).mean()) for h in states]
        last = model.bert.pooler(states[-1])
        mix = model.bert.pooler(sum(states) / len(states))
    record = {"command": " ".join(["python", "benchmarks/cls_variation.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "examples": args.examples,
              "versions": {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__},
              "cls_std_by_layer": {("embeddings" if j == 0 else f"layer {j}"): round(v, 4) for j, v in enumerate(cls_std)},
              "pooler_std_last_layer": round(float(last.std(0).mean()), 4),
              "pooler_std_uniform_mix": round(float(mix.std(0).mean()), 4)}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
