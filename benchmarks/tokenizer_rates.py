"""Unknown-token rate on held-out text: WordPiece and byte-level BPE beside a word-level
vocabulary of the same size, each trained on the WordNet corpus with every 20th document
held out (`compressor tokenizer`).

    .venv/bin/python benchmarks/tokenizer_rates.py --vocab-sizes 8192 30522
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
    p.add_argument("--corpus", default="wordnet")
    p.add_argument("--vocab-sizes", type=int, nargs="+", default=[8192, 30522])
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-tokenizers")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tokenizers.json")
    args = p.parse_args()

    from compressor.bench.environment import environment
    from compressor.cli.pretrain_command import tokenizer_command
    rows = []
    for size in args.vocab_sizes:
        for kind in ("wordpiece", "bpe", "wordlevel"):
            out = args.work / f"{kind}-{size}"
            m = tokenizer_command(args.corpus, kind, size, out)
            row = {k: m[k] for k in ("kind", "requested_vocab_size", "vocab_size", "unk_token_rate",
                                     "unk_word_rate", "tokens_per_word", "tokens", "words", "held_out_lines")}
            row["command"] = f"compressor tokenizer --corpus {args.corpus} --kind {kind} --vocab-size {size} --out {out}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "unknown-token rate on held-out documents (every 20th, at most 5000)",
        "script": "benchmarks/tokenizer_rates.py " + " ".join(sys.argv[1:]),
        "rows": rows, "environment": environment()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
