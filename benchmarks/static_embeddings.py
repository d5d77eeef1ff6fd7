"""Skip-gram embeddings on the WordNet corpus: probe-word neighbours and collapse checks.

Part 1, the deliverable: `compressor embeddings` on the whole corpus with the defaults
(SGD, lr 0.1 per pair decaying to 0, 4,096 pairs per step) for --steps steps.

Part 2 (--compare), the diagnosis of the collapse: the short run of the collapse test
(tests/pretrain/test_static_embeddings.py: the first 3,000 documents, dim 32, min count 3,
--compare-steps x 1,024 pairs) with the old optimisation (Adam, lr 3e-3), word2vec's SGD at
lr 0.025, and SGD at lr 0.1 (the default).

Each run records the mean cosine over all pairs of the 2,000 most frequent words (near 1:
collapsed), related-word pairs against random pairs, and the probes' nearest neighbours.

    .venv/bin/python benchmarks/static_embeddings.py --steps 2000 --compare --compare-steps 1000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COMPARED = [{"optimizer": "adam", "lr": 3e-3}, {"optimizer": "sgd", "lr": 0.025}, {"optimizer": "sgd", "lr": 0.1}]


def run(corpus: str, work: Path, settings: dict) -> dict:
    from compressor.cli.pretrain_command import embeddings_command
    shutil.rmtree(work, ignore_errors=True)
    metrics = embeddings_command(corpus, work, settings, show_progress=False)
    for probe, neighbours in metrics["nearest_neighbours"].items():
        print(f"  {probe}: " + ", ".join(f"{w} ({s:.2f})" for w, s in neighbours), flush=True)
    print("  " + json.dumps(metrics["geometry"]), flush=True)
    return {k: v for k, v in metrics.items() if k != "environment"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--corpus", default="wordnet",
                   help="part 1's corpus: 'wordnet' or a text file (blank lines between documents)")
    p.add_argument("--min-count", type=int, help="part 1's minimum word count (default: the command's)")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--compare-steps", type=int, default=1000)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-embeddings")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "static_embeddings.json")
    args = p.parse_args()
    os.chdir(ROOT)            # corpus paths are recorded relative to the repository

    from compressor.bench.environment import environment
    from pretrain.data import load_corpus
    from pretrain.models import set_threads
    set_threads(None)
    record: dict = {"benchmark": "skip-gram with negative sampling on the wordnet corpus: neighbours, collapse",
                    "command": "benchmarks/static_embeddings.py " + " ".join(sys.argv[1:]),
                    "environment": environment()}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2, default=str) + "\n")

    print(f"whole corpus {args.corpus}, {args.steps} steps", flush=True)
    min_count = [] if args.min_count is None else ["--min-count", str(args.min_count)]
    record["whole_corpus"] = {
        "cli": " ".join(["compressor embeddings --corpus", args.corpus, "--dim", str(args.dim), "--steps",
                         str(args.steps), *min_count, "--out DIR"]),
        **run(args.corpus, args.work / "whole", {"dim": args.dim, "steps": args.steps,
                                                  "min_count": args.min_count})}
    save()
    if args.compare:
        slice_path = Path("runs/wordnet-3000.txt")
        docs = itertools.islice(load_corpus("wordnet"), 3000)
        slice_path.write_text("".join("\n".join(doc) + "\n\n" for doc in docs), encoding="utf-8")
        record["compare"] = {"corpus": "first 3,000 wordnet documents", "steps": args.compare_steps,
                             "batch_size": 1024, "dim": 32, "min_count": 3, "runs": []}
        for settings in COMPARED:
            print(f"compare {settings}", flush=True)
            result = run(str(slice_path), args.work / "compare",
                         {"dim": 32, "steps": args.compare_steps, "batch_size": 1024, "min_count": 3, **settings})
            record["compare"]["runs"].append({**settings, **result})
            save()


if __name__ == "__main__":
    main()
