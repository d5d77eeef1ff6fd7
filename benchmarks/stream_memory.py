"""Peak memory of corpus streaming as the corpus grows from 10 MB to 1 GB.

Each corpus is WordNet's glosses and examples (8.9 MB, 117,659 documents) repeated, the
documents reshuffled per copy, until the size is reached. For each size a fresh process
streams one whole epoch through the pretraining data path (`ChunkStream`, what
`compressor pretrain` reads with: read line by line, split sentences, tokenize with
MiniLM's WordPiece, chunk to max_length 128, bounded shuffle buffer of 10,000 chunks) and
reports its resident memory: the kernel's high-water mark (VmHWM) reset after the imports,
so it covers the streaming alone, plus the RSS every 1,000 chunks.

Tokenizing runs at about 0.6 MB/s on 2 shared cores (a whole 1 GB would take about half an
hour), so corpora above --tokenize-all-up-to-mb are streamed the way a resumed run starts:
`ChunkStream.restore` puts the position at the last --tail-docs documents, the stream reads
(without tokenizing) the whole file up to there, then tokenizes, chunks and shuffles the
rest. The read phase's peak (the file up to the position, plus the tokenized chunks that
first fill the shuffle buffer) is reported separately: reading is what would grow memory
if anything held on to text. `chunks_taken` counts chunks out of the shuffle buffer; when
the epoch ends the last 10,000 are still in it.

    .venv/bin/python benchmarks/stream_memory.py --sizes-mb 10 100 1000 --tokenize-all-up-to-mb 100

Sizes may be fractional (0.05 is 50 kB), `--corpus FILE` repeats a text file (blank lines
between documents) instead of WordNet and `--buffer-size` shrinks the shuffle buffer; with
`--in-process` each size is measured in this process (its readings then include whatever the
process already held): a smoke run (tests/benchmarks), not the benchmark.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pretrain.child_process import ends_with_this_process  # noqa: E402


def generate(path: Path, size_mb: float, source: str = "wordnet") -> int:
    """Write the corpus (once) from the documents of `source` (a built-in corpus or a text
    file); returns its number of documents."""
    count_file = path.with_suffix(".docs")
    if path.exists() and count_file.exists():
        return int(count_file.read_text())
    from pretrain.data import load_corpus
    docs = ["\n".join(d) + "\n\n" for d in load_corpus(source)]
    if not docs:
        raise SystemExit(f"corpus {source} has no documents")
    sizes = [len(d.encode()) for d in docs]
    order = list(range(len(docs)))
    rng = random.Random(0)
    written = count = 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        while written < size_mb * 1_000_000:
            rng.shuffle(order)
            for i in order:
                f.write(docs[i])
                count += 1
                written += sizes[i]
                if written >= size_mb * 1_000_000:
                    break
    tmp.rename(path)
    count_file.write_text(str(count))
    return count


def rss_mb() -> float:
    """Current resident set size."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource
    return pages * resource.getpagesize() / 2**20


def measure(corpus: str, skip_docs: int = 0, buffer_size: int = 10_000) -> dict:
    """Stream one whole epoch in this process; memory readings and counts.

    With skip_docs, the stream starts as a resumed run would at that document: it reads
    (without tokenizing) the whole file up to there, then tokenizes the rest.
    """
    from compressor.bench.memory_probe import reset_hwm, vm_hwm_mb
    from pretrain.data.stream import ChunkStream
    from pretrain.models import load_tokenizer, resolve_model_path
    tokenizer = load_tokenizer(resolve_model_path("minilm"))
    stream = ChunkStream(corpus, tokenizer, 128, buffer_size=buffer_size, seed=0)
    if skip_docs:
        stream.restore(stream.state() | {"docs_read": skip_docs})
    after_imports = rss_mb()
    reset_hwm()
    row: dict = {"rss_after_imports_mb": round(after_imports, 1)}
    start = time.perf_counter()
    chunks = tokens = 0
    if skip_docs:      # the read phase: the file up to the position, then the buffer fills
        first = stream.take(1)
        chunks, tokens = 1, sum(len(s) for c in first for s in c)
        row |= {"read_phase_seconds": round(time.perf_counter() - start, 1),
                "read_phase_peak_rss_mb": round(vm_hwm_mb(), 1)}
    timeline = []
    while stream.epoch == 0:              # until the whole corpus has been read once
        batch = stream.take(1000)
        chunks += len(batch)
        tokens += sum(len(s) for c in batch for s in c)
        timeline.append([chunks, round(rss_mb(), 1)])
    step = max(1, len(timeline) // 20)    # about 20 readings are enough to see a trend
    return row | {"chunks_taken": chunks, "tokens": tokens, "seconds": round(time.perf_counter() - start, 1),
                  "peak_rss_mb": round(vm_hwm_mb(), 1),
                  "growth_over_imports_mb": round(vm_hwm_mb() - after_imports, 1),
                  "rss_by_chunks": timeline[::step] + ([timeline[-1]] if (len(timeline) - 1) % step else [])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[10, 100, 1000], help="may be fractional")
    p.add_argument("--corpus", default="wordnet",
                   help="the documents repeated: 'wordnet' or a text file (blank lines between documents)")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "stream-memory")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "stream_memory.json")
    p.add_argument("--tokenize-all-up-to-mb", type=float, default=100,
                   help="larger corpora are read whole but tokenized only in their last --tail-docs documents")
    p.add_argument("--tail-docs", type=int, default=100_000)
    p.add_argument("--buffer-size", type=int, default=10_000, help="chunks in the shuffle buffer")
    p.add_argument("--in-process", action="store_true",
                   help="measure in this process, not a fresh one per size (a smoke run: readings include "
                        "what the process already held)")
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--skip-docs", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.skip_docs, args.buffer_size)))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    source = "" if args.corpus == "wordnet" else f"{Path(args.corpus).stem}-"
    for size in args.sizes_mb:
        size = int(size) if size == int(size) else size           # 10, not 10.0, in names and rows
        path = args.work / f"corpus-{source}{size}mb.txt"
        docs = generate(path, size, args.corpus)
        skip = max(0, docs - args.tail_docs) if size > args.tokenize_all_up_to_mb else 0
        if args.in_process:
            measured = measure(str(path), skip, args.buffer_size)
        else:
            proc = subprocess.run([sys.executable, __file__, "--measure", str(path), "--skip-docs", str(skip),
                                   "--buffer-size", str(args.buffer_size)],
                                  check=True, capture_output=True, text=True, preexec_fn=ends_with_this_process())
            measured = json.loads(proc.stdout.splitlines()[-1])
        row = {"corpus_mb": size, "bytes": path.stat().st_size, "documents": docs,
               "mode": (f"read whole, tokenize last {docs - skip} documents (resume path)" if skip
                        else "read and tokenize whole"), **measured}
        print(json.dumps({k: v for k, v in row.items() if k != "rss_by_chunks"}), flush=True)
        rows.append(row)
    from compressor.bench.environment import environment
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "resident memory of streaming one epoch of a corpus (ChunkStream, max_length 128, "
                     f"buffer {args.buffer_size:,} chunks); VmHWM reset after the imports",
        "command": "benchmarks/stream_memory.py " + " ".join(sys.argv[1:]),
        "rows": rows, "environment": environment()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
