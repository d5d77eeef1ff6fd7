"""`compressor finetune`: fine-tune a checkpoint on a task and write an HF dir + metrics.json.

Runs the same under `torchrun --nproc_per_node=N -m compressor finetune ...`: every process
trains its share of each batch (pretrain/train.py), and only rank 0 evaluates and writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from compressor.bench.environment import environment
from compressor.bundle import ModelBundle
from compressor.cli.flags import validated
from compressor.pipeline.cache import inputs_fingerprint
from pretrain import distributed
from pretrain.atomic import atomic_dir, check_output, write_json
from pretrain.cpus import usable_cpus
from pretrain.data import load_task, task_files
from pretrain.data.overlap import scored_overlap
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig, evaluate, finetune
from pretrain.models import check_model_ref, load_classifier, set_threads
from pretrain.resume import checkpoint_dir, claimed_checkpoint
from pretrain.train import Checkpointing, StepCallback

# What every `compressor finetune` output holds: a dir with both is an earlier output to replace.
FINETUNE_OUTPUT = ("compressor.json", "metrics.json")
SETTINGS_FILE = "finetune_settings.json"     # in <out>.checkpoint/: what a resume must match
FLAGS = {"cls_only_last_layer": "--whole-last-layer"}     # fields whose flag is not --<field>


def finetune_command(model_ref: str, task_spec: str | dict, out: Path, overrides: dict,
                     max_eval_samples: int | None = None, show_progress: bool = True, *, resume: bool = False,
                     checkpoint_every: int = 200, callbacks: tuple[StepCallback, ...] = (),
                     threads: int | None = None) -> dict:
    """Fine-tune and write `out` (HF model dir + metrics.json) in one rename. The run keeps a
    checkpoint in `<out>.checkpoint/` every `checkpoint_every` steps; `resume` continues an
    interrupted run from it (same settings only); it goes once the output is written."""
    # Validate everything before the first byte is written.
    cfg = validated(FinetuneConfig, {k: v for k, v in overrides.items() if v is not None}, FLAGS)
    model_path = check_model_ref(model_ref)
    inputs = [model_path, cfg.domain_corpus,
              *(f for spec in (task_spec, cfg.intermediate_task, *cfg.tasks) for f in task_files(spec))]
    check_output(out, inputs, owner_files=FINETUNE_OUTPUT)
    processes = distributed.launched_size()
    if processes > cfg.batch_size:
        raise UserError(f"--nproc_per_node={processes} is larger than the batch size {cfg.batch_size}: "
                        f"every process needs examples of each batch; expected at most {cfg.batch_size}")
    task = load_task(task_spec, seed=cfg.seed, scored="test")     # metrics' `warnings` say test's
    train_examples = len(task.split("train").head(cfg.max_train_samples))
    if processes > train_examples:
        raise UserError(f"--nproc_per_node={processes} is larger than the {train_examples} training examples; "
                        f"expected at most {train_examples}")
    out, ckpt = Path(out), checkpoint_dir(Path(out))
    # The paths' contents too: a task file or model replaced since the stop would be resumed
    # into a mix of two runs.
    settings = {"model": str(model_path.resolve()), "task": task.spec, "config": cfg.model_dump(mode="json"),
                "inputs": inputs_fingerprint(inputs)}
    place = distributed.world()
    with claimed_checkpoint(out, settings, resume, SETTINGS_FILE):
        # Under torchrun this machine's processes share its cores: split them, not oversubscribe.
        shared = max(1, usable_cpus() // distributed.local_size()) if place.distributed else None
        set_threads(threads or shared)
        model, tokenizer = load_classifier(model_ref, task.label_names, seed=cfg.seed)
        result = finetune(model, tokenizer, task, cfg, show_progress=show_progress and place.is_main,
                          mlm_head_from=model_path, callbacks=callbacks,
                          checkpoint=Checkpointing(directory=ckpt, every_steps=checkpoint_every))
        if not place.is_main:
            distributed.shutdown()
            return {}
        train = result.train
        test_metrics, _ = evaluate(model, tokenizer, task.split("test").head(max_eval_samples), cfg.max_length)
        metrics = {"task": task.name, "split": "test", **test_metrics,
                   "strategy": cfg.strategy, "lr": cfg.lr, "trainable_params": result.trainable_params,
                   "total_params": result.total_params, "trainable_percent": round(result.trainable_percent, 3),
                   "train_seconds": round(train.seconds, 2), "train_samples": train.samples,
                   "samples_per_second": round(train.samples_per_second, 2), "steps": train.steps,
                   "final_loss": train.final_loss, "stages": result.stages, "domain_mlm": result.domain,
                   "last_layer_skipped": result.last_layer_skipped,
                   "processes": place.size,
                   "model": model_ref, "config": cfg.model_dump(mode="json"), "environment": environment(),
                   **scored_overlap(task, "test", max_eval_samples)}
        bundle = ModelBundle(model=model, tokenizer=tokenizer, task=task.spec, task_seed=cfg.seed,
                             max_length=cfg.max_length, pair_task=task.is_pair_task,
                             history=({"pass": "finetune", "config": cfg.model_dump(mode="json")},))
        with atomic_dir(out) as tmp:
            bundle.save_into(tmp)
            write_json(tmp / "metrics.json", metrics)
        shutil.rmtree(ckpt, ignore_errors=True)      # the output is safely written: nothing to resume
        distributed.shutdown()
        return metrics
