"""`compressor pretrain --objective span` with one thing changed, to find what makes it collapse.

A diagnostic for benchmarks/collapse_probe.py, not a product feature: the first argument
names the change, the rest is an ordinary `compressor` command line.
- `pos512`: SpanBERT's BERT with 512 positions (as `mlm`'s config) instead of max_length;
- `nosbo`: the loss without the span boundary objective (span-masked MLM only).

    .venv/bin/python benchmarks/collapse_variants.py nosbo pretrain --objective span ... --out DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def apply(variant: str) -> None:
    import pretrain.objectives.span as span
    from pretrain.objectives.architectures import bert_config
    if variant == "pos512":
        span.bert_config = lambda specials, size, max_length: bert_config(specials, size, 512)
    elif variant == "nosbo":
        span.SpanObjective.loss = lambda self, model, batch: model(batch)[0]
    else:
        raise SystemExit(f"unknown variant {variant!r}; expected pos512 or nosbo")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if len(sys.argv) >= 2 else 2)
    apply(sys.argv.pop(1))
    from compressor.cli import main
    raise SystemExit(main())
