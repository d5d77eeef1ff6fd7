"""Peak memory of corpus streaming as the corpus grows from 10 MB to 1 GB.

Each corpus is WordNet's glosses and examples repeated (documents reshuffled per copy)
until the size is reached. For each size a fresh process streams one whole epoch through
the pretraining path (`ChunkStream`: read, split sentences, tokenize with MiniLM's
WordPiece, chunk to max_length 128, bounded shuffle buffer of 10,000 chunks) and reports
its peak resident set size (ru_maxrss). Flat memory means the peak does not grow with the
corpus. Tokenizing 1 GB takes hours on 2 shared cores, so corpora above
--tokenize-all-up-to-mb are streamed the way a resumed run starts: the whole file is read
document by document up to the last 100,000 documents, which are then tokenized, chunked
and shuffled (reading is what would grow memory if anything held on to text).

    .venv/bin/python benchmarks/stream_memory.py --sizes-mb 10 100 1000
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAIL_DOCS = 100_000
sys.path.insert(0, str(ROOT))


def generate(path: Path, size_mb: int) -> int:
    """Write the corpus (once); returns its number of documents."""
    count_file = path.with_suffix(".docs")
    if path.exists() and count_file.exists():
        return int(count_file.read_text())
    from pretrain.data import load_corpus
    docs = ["\n".join(d) + "\n\n" for d in load_corpus("wordnet")]
    rng = random.Random(0)
    written = count = 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        while written < size_mb * 1_000_000:
            rng.shuffle(docs)
            for doc in docs:
                f.write(doc)
                count += 1
                written += len(doc.encode())
                if written >= size_mb * 1_000_000:
                    break
    tmp.rename(path)
    count_file.write_text(str(count))
    return count


def measure(corpus: str, skip_docs: int = 0) -> dict:
    """Stream one whole epoch in this process; peak RSS and counts.

    With skip_docs, the stream starts as a resumed run would at that document: it reads
    (without tokenizing) the whole file up to there, then tokenizes the rest.
    """
    from pretrain.data.stream import ChunkStream
    from pretrain.models import load_tokenizer, resolve_model_path
    tokenizer = load_tokenizer(resolve_model_path("minilm"))
    stream = ChunkStream(corpus, tokenizer, 128, buffer_size=10_000, seed=0)
    if skip_docs:
        stream.restore(stream.state() | {"docs_read": skip_docs})
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    chunks = tokens = 0
    while stream.epoch == 0:              # until the whole corpus has been read once
        batch = stream.take(1000)
        chunks += len(batch)
        tokens += sum(len(s) for c in batch for s in c)
    return {"chunks": chunks, "tokens": tokens, "seconds": round(time.perf_counter() - start, 1),
            "rss_after_imports_mb": round(baseline / 1024, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "stream-memory")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "stream_memory.json")
    p.add_argument("--tokenize-all-up-to-mb", type=int, default=100,
                   help="larger corpora are read whole but tokenized only in their last TAIL_DOCS documents")
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--skip-docs", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.skip_docs)))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes_mb:
        path = args.work / f"corpus-{size}mb.txt"
        docs = generate(path, size)
        skip = max(0, docs - TAIL_DOCS) if size > args.tokenize_all_up_to_mb else 0
        proc = subprocess.run([sys.executable, __file__, "--measure", str(path), "--skip-docs", str(skip)],
                              check=True, capture_output=True, text=True)
        row = {"corpus_mb": size, "bytes": path.stat().st_size, "documents": docs,
               "mode": f"read whole, tokenize last {docs - skip} documents (resume path)" if skip
               else "read and tokenize whole", **json.loads(proc.stdout.splitlines()[-1])}
        print(json.dumps(row), flush=True)
        rows.append(row)
    from compressor.environment import environment
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "peak RSS of streaming one epoch of a corpus (ChunkStream, max_length 128, buffer 10,000)",
        "command": "benchmarks/stream_memory.py " + " ".join(sys.argv[1:]),
        "rows": rows, "environment": environment()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
