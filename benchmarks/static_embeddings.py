"""Sanity check of skip-gram embeddings on the WordNet corpus: nearest neighbours of probes.

    .venv/bin/python benchmarks/static_embeddings.py     # = compressor embeddings --corpus wordnet --dim 100 ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-embeddings")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "static_embeddings.json")
    args = p.parse_args()

    from compressor.pretrain_command import embeddings_command
    from pretrain.models import set_threads
    set_threads(1)
    settings = {"dim": args.dim, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr}
    metrics = embeddings_command("wordnet", args.work, settings, show_progress=True)
    record = {"benchmark": "skip-gram with negative sampling on the wordnet corpus: probe-word neighbours",
              "command": (f"compressor embeddings --corpus wordnet --dim {args.dim} --steps {args.steps} "
                          f"--batch-size {args.batch_size} --lr {args.lr} --out {args.work}"),
              **metrics}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    for probe, neighbours in metrics["nearest_neighbours"].items():
        print(f"{probe}: " + ", ".join(f"{w} ({s:.2f})" for w, s in neighbours))


if __name__ == "__main__":
    main()
