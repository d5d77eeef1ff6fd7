"""`compressor finetune`: fine-tune a checkpoint on a task and write an HF dir + metrics.json."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from compressor.atomic import atomic_dir, write_json
from compressor.bundle import ModelBundle
from compressor.environment import environment
from compressor.recipe import describe_validation_error
from pretrain.data import load_task
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig, evaluate, finetune
from pretrain.models import check_model_ref, load_classifier, set_threads


def finetune_command(model_ref: str, task_spec: str | dict, out: Path, overrides: dict,
                     max_eval_samples: int | None = None, show_progress: bool = True) -> dict:
    # Validate everything before the first byte is written.
    try:
        cfg = FinetuneConfig(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as err:
        raise UserError(describe_validation_error(err)) from None
    check_model_ref(model_ref)
    task = load_task(task_spec, seed=cfg.seed)
    set_threads(None)

    model, tokenizer = load_classifier(model_ref, task.label_names, seed=cfg.seed)
    result = finetune(model, tokenizer, task, cfg, show_progress=show_progress)
    test_metrics, _ = evaluate(model, tokenizer, task.split("test").head(max_eval_samples))
    metrics = {"task": task.name, "split": "test", **test_metrics,
               "train_seconds": round(result.seconds, 2), "train_samples": result.samples,
               "samples_per_second": round(result.samples_per_second, 2), "steps": result.steps,
               "final_loss": result.final_loss, "model": model_ref,
               "config": cfg.model_dump(mode="json"), "environment": environment()}
    bundle = ModelBundle(model=model, tokenizer=tokenizer, task=task.spec,
                         history=({"pass": "finetune", "config": cfg.model_dump(mode="json")},))
    with atomic_dir(out) as tmp:
        bundle.save_into(tmp)
        write_json(tmp / "metrics.json", metrics)
    return metrics
