"""Passes that train the model on its task with the shared loop: `finetune`."""

from __future__ import annotations

from compressor.bundle import ModelBundle
from compressor.passes.registry import Context, register
from pretrain.finetune import FinetuneConfig, finetune


@register("finetune", FinetuneConfig, trains=True)
def finetune_pass(bundle: ModelBundle, cfg: FinetuneConfig, ctx: Context) -> ModelBundle:
    """Continue training on the task (e.g. to recover accuracy after a structural pass)."""
    if cfg.max_train_samples is None and ctx.max_train_samples is not None:
        cfg = cfg.model_copy(update={"max_train_samples": ctx.max_train_samples})
    if "seed" not in cfg.model_fields_set:
        cfg = cfg.model_copy(update={"seed": ctx.seed})
    model = bundle.copy_model()
    finetune(model, bundle.tokenizer, ctx.task, cfg, desc="finetune", show_progress=ctx.show_progress)
    return bundle.replace(model=model)
