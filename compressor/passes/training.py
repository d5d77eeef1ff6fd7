"""Passes that train the model on its task with the shared loop: `finetune`."""

from __future__ import annotations

from compressor.bundle import ModelBundle
from compressor.passes.registry import Context, register, word_embedding_training
from pretrain.finetune import FinetuneConfig, finetune, with_run_defaults
from pretrain.train import Checkpointing

CHECKPOINT_EVERY = 200   # optimizer steps between checkpoints in ctx.work_dir


@register("finetune", FinetuneConfig, trains=True, trains_embedding=word_embedding_training)
def finetune_pass(bundle: ModelBundle, cfg: FinetuneConfig, ctx: Context) -> ModelBundle:
    """Continue training on the task (e.g. to recover accuracy after a structural pass)."""
    cfg = with_run_defaults(cfg, ctx.seed, ctx.max_train_samples)
    model = bundle.copy_model()
    # A recovery fine-tune can be a recipe's longest variant stage: a stopped run resumes it
    # from its last checkpoint (the stage's own work dir), as the distillation passes do.
    checkpoint = Checkpointing(directory=ctx.work_dir, every_steps=CHECKPOINT_EVERY) if ctx.work_dir else None
    finetune(model, bundle.tokenizer, ctx.task, cfg, desc="finetune", show_progress=ctx.show_progress,
             checkpoint=checkpoint)
    return bundle.replace(model=model)
