"""Pretraining objectives at equal compute: mlm, mlm+sop, rtd and span, then the same fine-tune.

Issue 3 asks for downstream wordnet-supersense accuracy after pretraining with each objective
at equal compute (ELECTRA's paper found replaced token detection more compute-efficient than
MLM). Every arm is the same small architecture (SIZES["small"]: 4 layers, hidden 256, 4
heads, FFN 1024) with the same WordPiece tokenizer (trained once on the corpus), pretrained
on the WordNet corpus with the same batch size, max length, warm-up, seed and number of
steps, and by default the same peak learning rate; `--lr-for rtd=2e-4,span=1e-4` gives an
objective its own rate (at 1e-3 rtd and span collapse the encoder; see benchmarks/README.md). The corpus stream is seeded the same way for every objective, so each sees the
same documents: the same steps and (up to the pair objective's one extra [SEP] per
sequence) the same tokens. Each deliverable is then fine-tuned with the same `compressor
finetune` settings and evaluated on the same held-out test examples.

`rtd` trains a generator (hidden 64, 1/4 of the discriminator's, sharing its embeddings)
beside the discriminator: extra compute per step, recorded as trained parameters and wall
seconds; only the discriminator is kept and fine-tuned (the objective's deliverable). A
random-initialisation arm (the same fine-tune from an untrained model) shows how much any of
the short pretraining runs adds at all.

Every step is a `compressor` command (recorded); a step whose output exists is skipped, and
the results file is rewritten after every arm ("complete": false until the last one), so an
interrupted run keeps what it finished and a rerun continues. `--in-process` runs the steps
in this process (`compressor.cli.main`) instead of one child process each.

The defaults are the benchmark; `--corpus FILE`, `--size tiny`, `--objectives mlm` and small
steps, vocabulary, fine-tune and eval samples make a smoke run (tests/benchmarks).

    .venv/bin/python benchmarks/pretraining_objectives.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.pretraining import (  # noqa: E402
    compressor_cli, finetune_step, pretrain_step, random_init_dir, tokenizer_step)

OBJECTIVES = ("mlm", "mlm+sop", "rtd", "span")


def trained_params(objective: str, tokenizer_dir: Path, max_length: int, seed: int, size: str = "small") -> int:
    """Parameters the objective trains (shared ones counted once): for rtd the generator's too."""
    from pretrain.models import load_tokenizer
    from pretrain.objectives import SIZES, get_objective
    model = get_objective(objective).build_model(load_tokenizer(tokenizer_dir), SIZES[size], max_length, seed)
    return sum(p.numel() for p in model.parameters())


def input_dependence(model_dir: Path, examples: int = 256) -> dict:
    """How much the delivered encoder's last hidden states depend on the input, before any
    fine-tuning: the std across the first `examples` validation glosses, averaged over the
    hidden dims, of the [CLS] vector (what the classifier reads) and of the text tokens.
    The states are LayerNorm outputs (rms about 1); an untrained BERT gives about 0.03 for
    [CLS] and 0.8 for the tokens. Near 0 means a collapsed encoder: every input maps to the
    same vectors, and fine-tuning gradients into it vanish."""
    import numpy as np
    import torch
    from transformers import AutoModel
    from pretrain.batching import collate, encode, usable_length
    from pretrain.data import load_task
    from pretrain.models import load_tokenizer
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    tokenizer = load_tokenizer(model_dir)
    data = encode(tokenizer, load_task("wordnet-supersense").split("validation").head(examples),
                  usable_length(model))
    batch = collate(data, np.arange(len(data)), with_token_types=False)
    batch.pop("labels")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    text = batch["attention_mask"].bool() & ~torch.isin(batch["input_ids"], torch.tensor(tokenizer.all_special_ids))
    return {"cls_std": round(float(hidden[:, 0].std(0).mean()), 4),
            "token_std": round(float(hidden[text].std(0).mean()), 4), "examples": len(data)}


def pretraining_summary(metrics: dict, params: int) -> dict:
    seconds = metrics["train_seconds"]
    return {"steps": metrics["steps"], "samples": metrics["samples"], "tokens": metrics["tokens"],
            "train_seconds": seconds, "seconds_per_step": round(seconds / max(1, metrics["steps"]), 3),
            "lr": metrics["config"]["lr"], "warmup_ratio": metrics["config"]["warmup_ratio"],
            "initial_loss": metrics["initial_loss"], "final_loss": metrics["final_loss"],
            "architecture": metrics["architecture"], "delivered_params": metrics["params"],
            "trained_params": params, "loss_curve": metrics["loss_curve"]}


def write_results(args: argparse.Namespace, log: list[dict], arms: dict, tok: Path, complete: bool) -> None:
    from compressor.bench.environment import environment
    from pretrain.atomic import write_json
    result = {
        "benchmark": "pretraining objectives at equal steps and tokens: mlm, mlm+sop, rtd, span on the "
                     "wordnet corpus, each fine-tuned on wordnet-supersense",
        "script": "benchmarks/pretraining_objectives.py " + " ".join(sys.argv[1:]),
        "settings": vars(args) | {"work": str(args.work), "out": str(args.out)},
        "complete": complete,
        "commands": log,
        "tokenizer": json.loads((tok / "tokenizer_metrics.json").read_text()) | {"environment": None},
        "arms": arms,
        "notes": ["final_loss is each objective's own training loss (rtd: generator MLM + 50 x "
                  "discriminator BCE; span: MLM + SBO; mlm+sop: MLM + SOP): not comparable across arms",
                  "rtd's trained_params include its generator, which runs forward and backward on every "
                  "batch: more compute per step than the other arms; only the discriminator is fine-tuned"],
        "environment": environment(),
    }
    write_json(args.out, repo_relative(result))


def repo_relative(result: dict) -> dict:
    """The results with this checkout's absolute paths made repo-relative and the venv's
    interpreter written as `.venv/bin/python`: the file must not name one machine's paths."""
    text = json.dumps(result).replace(json.dumps(sys.executable)[1:-1], ".venv/bin/python")
    return json.loads(text.replace(json.dumps(str(ROOT) + "/")[1:-1], ""))


def rates_by_objective(text: str) -> dict[str, float]:
    """`rtd=2e-4,span=1e-4` -> {"rtd": 2e-4, "span": 1e-4}; a malformed entry stops the run."""
    rates = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, value = entry.partition("=")
        try:
            rates[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise SystemExit(f"--lr-for entry {entry!r} is not OBJECTIVE=RATE (e.g. rtd=2e-4)")
    return rates


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-pretraining-objectives")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "pretraining_objectives.json")
    p.add_argument("--objectives", default=",".join(OBJECTIVES), help="comma-separated, in run order")
    p.add_argument("--corpus", default="wordnet",
                   help="'wordnet' or a text file (blank lines between documents), for the tokenizer and pretraining")
    p.add_argument("--size", choices=["tiny", "small", "base"], default="small", help="model size of every arm")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-for", type=rates_by_objective, default={},
                   help="per-objective peak rates overriding --lr, e.g. rtd=2e-4,span=1e-4")
    p.add_argument("--finetune-samples", type=int, default=5000)
    p.add_argument("--finetune-epochs", type=float, default=2)
    p.add_argument("--finetune-lr", type=float, default=2e-4)
    p.add_argument("--max-eval-samples", type=int, default=3000, help="0: the whole test split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads for pretraining")
    p.add_argument("--no-random", action="store_true", help="skip the random-initialisation arm")
    p.add_argument("--in-process", action="store_true",
                   help="run the compressor steps in this process instead of one child process each")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    eval_limit = args.max_eval_samples or None
    objectives = [o.strip() for o in args.objectives.split(",") if o.strip()]
    if unknown := sorted(set(args.lr_for) - set(objectives)):
        raise SystemExit(f"--lr-for names {', '.join(unknown)}, not among --objectives {args.objectives}")
    cli = compressor_cli(args.in_process)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    log: list[dict] = []
    arms: dict[str, dict] = {}
    tok = work / "tokenizer"
    tokenizer_step(cli, tok, args.vocab_size, log, args.corpus)

    if not args.no_random:
        rnd = work / "random"
        if not rnd.exists():
            random_init_dir(tok, rnd, args.max_length, args.seed, args.size)
        arms["random_init"] = {"input_dependence": input_dependence(rnd),
                               "finetune": finetune_step(cli, rnd, work / "finetune-random_init", args, log,
                                                         eval_limit)}
        write_results(args, log, arms, tok, complete=False)

    for objective in objectives:
        name = objective.replace("+", "-")
        metrics = pretrain_step(cli, objective, tok, work / name, args, log, args.lr_for.get(objective))
        params = trained_params(objective, tok, args.max_length, args.seed, args.size)
        finetune = finetune_step(cli, work / name, work / f"finetune-{name}", args, log, eval_limit)
        arms[objective] = {"pretraining": pretraining_summary(metrics, params),
                           "input_dependence": input_dependence(work / name), "finetune": finetune}
        write_results(args, log, arms, tok, complete=objective == objectives[-1])

    print(json.dumps({name: {"accuracy": arm["finetune"]["accuracy"],
                             **({"pretrain_seconds": arm["pretraining"]["train_seconds"],
                                 "tokens": arm["pretraining"]["tokens"]} if "pretraining" in arm else {})}
                      for name, arm in arms.items()}, indent=2))


if __name__ == "__main__":
    main()
