"""`compressor tokenizer` and `compressor pretrain`: validate, train, write atomically."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from compressor.bench.environment import environment
from compressor.bundle import PROVENANCE_FILE
from compressor.cli.flags import validated
from compressor.pipeline.cache import inputs_fingerprint
from pretrain import distributed
from pretrain.atomic import atomic_dir, check_output, claimed_output, write_json
from pretrain.errors import UserError
from pretrain.models import set_threads
from pretrain.model_code import ship_model_code
from pretrain.pretraining import SETTINGS_FILE, PretrainConfig, prepare, run_pretraining
from pretrain.resume import checkpoint_dir, claimed_checkpoint
from pretrain.train import StepCallback

if TYPE_CHECKING:
    from pretrain.static_embeddings import EmbeddingConfig


def tokenizer_command(corpus: str, kind: str, vocab_size: int, out: Path, min_frequency: int = 2) -> dict:
    from pretrain.data.tokenizers import (METRICS_FILE, TokenizerConfig, save_tokenizer, tokenizer_metrics,
                                          train_tokenizer)
    cfg = validated(TokenizerConfig, {"kind": kind, "vocab_size": vocab_size, "min_frequency": min_frequency})
    check_output(out, [corpus], owner_files=(METRICS_FILE,))
    with claimed_output(Path(out)):       # a second command writing `out` meanwhile is refused
        tokenizer = train_tokenizer(corpus, cfg)
        metrics = {**tokenizer_metrics(corpus, cfg, tokenizer), "environment": environment()}
        with atomic_dir(Path(out)) as tmp:
            save_tokenizer(tokenizer, tmp)
            write_json(tmp / METRICS_FILE, metrics)
    return metrics


def pretrain_command(cfg: PretrainConfig, out: Path, resume: bool = False, show_progress: bool = True,
                     checkpoint_every: int = 200, threads: int | None = None,
                     callbacks: tuple[StepCallback, ...] = ()) -> dict:
    """Pretrain and write `out` (HF model dir + metrics.json); checkpoints in `<out>.checkpoint`."""
    out = Path(out)
    check_output(out, [cfg.corpus, cfg.tokenizer, cfg.init], owner_files=("config.json", "metrics.json"))
    if (out / PROVENANCE_FILE).is_file():    # config.json and metrics.json: a fine-tuned model has both too
        raise UserError(f"--out {out} holds a model `compressor finetune` or `run` wrote ({PROVENANCE_FILE}); "
                        "pretrain replaces only its own earlier output: choose another --out")
    ckpt = checkpoint_dir(out)
    # The inputs' contents too: a corpus or init model replaced since the stop is another run.
    settings = {**cfg.model_dump(mode="json"), "inputs": inputs_fingerprint([cfg.corpus, cfg.tokenizer, cfg.init])}
    place = distributed.world()
    with claimed_checkpoint(out, settings, resume, SETTINGS_FILE):
        objective, tokenizer, model = prepare(cfg)
        set_threads(threads)
        model, metrics = run_pretraining(cfg, objective, tokenizer, model, ckpt, show_progress=show_progress,
                                         checkpoint_every=checkpoint_every, callbacks=callbacks)
        metrics["environment"] = environment()
        if place.is_main:
            with atomic_dir(out) as tmp:
                model.save_pretrained(str(tmp), safe_serialization=True)
                ship_model_code(tmp)              # a BiLM loads without this package
                tokenizer.save_pretrained(str(tmp))
                write_json(tmp / "metrics.json", metrics)
            shutil.rmtree(ckpt, ignore_errors=True)   # the output is safely written: nothing to resume
        distributed.shutdown()
        return metrics


def embeddings_command(corpus: str, out: Path, settings: dict, show_progress: bool = True) -> dict:
    """Skip-gram embeddings: embeddings.npy + vocab.txt + metrics.json (with probe neighbours)."""
    from pretrain.static_embeddings import EmbeddingConfig
    cfg = validated(EmbeddingConfig, {k: v for k, v in settings.items() if v is not None})
    check_output(out, [corpus], owner_files=("embeddings.npy", "metrics.json"))
    with claimed_output(Path(out)):       # a second command writing `out` meanwhile is refused
        return write_embeddings(corpus, Path(out), cfg, show_progress)


def write_embeddings(corpus: str, out: Path, cfg: EmbeddingConfig, show_progress: bool) -> dict:
    """Train, then write `out` (claimed by `embeddings_command`); its metrics returned."""
    from pretrain.static_embeddings import geometry, nearest_neighbours, save_embeddings, train_embeddings
    vocab, matrix, result = train_embeddings(corpus, cfg, show_progress=show_progress)
    metrics = {"corpus": corpus, "vocab_size": len(vocab), "dim": cfg.dim, "steps": result.steps,
               "initial_loss": result.initial_loss, "final_loss": result.final_loss,
               "train_seconds": round(result.seconds, 2), "config": cfg.model_dump(),
               "geometry": geometry([w for w, _ in vocab], matrix),
               "nearest_neighbours": nearest_neighbours([w for w, _ in vocab], matrix),
               # Diagnostic: the same after removing the mean vector (the common direction
               # SGNS vectors share; Mu & Viswanath 2018), to see whether it dominates.
               "nearest_neighbours_mean_removed": nearest_neighbours([w for w, _ in vocab], matrix - matrix.mean(0)),
               "environment": environment()}
    with atomic_dir(out) as tmp:
        save_embeddings(tmp, vocab, matrix)
        write_json(tmp / "metrics.json", metrics)
    return metrics
