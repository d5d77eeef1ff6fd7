"""Unstructured pruning of the encoder's Linear weights: `prune-magnitude`, `prune-movement`.

Both keep, in every Linear of the Transformer layers, a mask that a parametrization applies
(W' = W * M) while the model trains in the shared loop, and raise the sparsity along the
cubic schedule of Zhu & Gupta (used by Gordon et al. 2020 and Sanh et al. 2020):

    s_t = s_f + (s_i - s_f) * (1 - (t - t_w) / (T - t_w - t_c))^3

s_i during the t_w warm-up steps, s_f during the t_c cool-down steps. After every optimizer
step a loop callback recomputes the masks at s_t:

- magnitude (Gordon): keep the largest |W|, globally or per matrix; the pruned weights are
  set to zero after every step, so they stay zero (and pruned) for the rest of the run;
- movement (Sanh, hard top-k): keep the largest learnable scores S; the mask's gradient
  passes straight through to S, so S accumulates -dL/dW' * W (weights moving away from
  zero gain score). Scores train at their own rate (param_groups).

Either may learn from the teacher: 0.5 * KL(T=2) * T^2 + 0.5 * CE (`teacher_soft_targets`),
Sanh et al.'s pairing, which also lets the two be compared with distillation on both sides.

Movement's scores need steps to separate: Adam moves each score by about its rate per step,
so a few hundred steps rank how consistently weights moved, not how much they matter.
Measured on MiniLM at 90% (benchmarks/README.md, "Unstructured pruning"): from the fine-tuned
teacher with its soft targets over 1,875 steps movement keeps more than magnitude (0.7646 vs
0.7308); with 250 steps and no soft targets it collapsed to the majority class; starting from
the pretrained encoder instead (Sanh et al.'s start) both keep less at that budget, which must
then teach the task too. `teacher: DIR` names another fine-tuned teacher for the soft targets.

At the end the masks are multiplied in and every parametrization (mask, scores) is
removed: the output is a plain Transformers model whose pruned weights are real zeros. It
computes as much as the dense model on dense runtimes; what it saves is compressed size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn
from torch.nn.utils import parametrize
from transformers import PreTrainedModel

from compressor.bundle import ModelBundle
from compressor.modeling.cost import encoder_linears
from compressor.passes.distill_losses import TeacherLogits, soft_kl
from compressor.passes.registry import (Context, Known, Shape, check_teacher_bundle, check_teacher_fits, register,
                                        shape_of, word_embedding_training)
from pretrain.errors import UserError
from pretrain.families import FAMILIES, TRANSFORMER_FAMILIES
from pretrain.finetune import FinetuneConfig, finetune, with_run_defaults
from pretrain.models import check_model_ref
from pretrain.train import Batch, Checkpointing, StepLog, task_loss

# Sanh et al. train 10 epochs with 1 of warm-up (nothing pruned) and 2 of cool-down (final
# sparsity held): the same shares of the run when the steps are not given.
WARMUP_SHARE = 0.1
COOLDOWN_SHARE = 0.2


class SparsityConfig(FinetuneConfig):
    """Fine-tuning settings plus the sparsity to reach and how."""

    sparsity: float = Field(ge=0, lt=1)              # final share of zeros in the encoder's Linear weights
    scope: Literal["global", "per_layer"] = "per_layer"   # one ranking over all matrices, or each its own
    schedule: Literal["cubic", "oneshot"] = "cubic"  # oneshot: final sparsity before the first step
    epochs: float = Field(1.0, ge=0)                 # 0: prune once, no training
    initial_sparsity: float = Field(0.0, ge=0, lt=1)  # s_i
    sparsity_warmup_steps: int | None = Field(None, ge=0)    # t_w; None: 10% of the steps
    sparsity_cooldown_steps: int | None = Field(None, ge=0)  # t_c; None: 20% of the steps
    teacher_soft_targets: bool = False          # 0.5 * KL(T) * T^2 + 0.5 * CE against the teacher
    teacher: str | None = None                  # a fine-tuned model dir; default: the recipe's teacher
    temperature: float = Field(2.0, gt=0)
    method: ClassVar[str] = "prune-magnitude"

    def input_paths(self) -> dict[str, Path]:
        """Dirs whose content the output depends on beyond the config (for cache keys)."""
        return {"teacher": Path(self.teacher)} if self.teacher else {}

    @model_validator(mode="after")
    def _consistent(self) -> SparsityConfig:
        if self.initial_sparsity > self.sparsity:
            raise ValueError(f"initial_sparsity {self.initial_sparsity} is above sparsity {self.sparsity}; "
                             f"expected a schedule that only prunes more")
        if self.teacher_soft_targets and self.epochs == 0:
            raise ValueError("teacher_soft_targets train against the teacher; expected epochs > 0")
        if self.teacher is not None and not self.teacher_soft_targets:
            raise ValueError("teacher names where the soft targets come from; expected teacher_soft_targets: true")
        if self.strategy != "full" or self.intermediate_task or self.tasks or self.domain_corpus:
            raise ValueError(f"{self.method} trains the whole model on the target task alone; expected "
                             f"strategy full without intermediate_task, tasks or domain_corpus")
        return self


class MagnitudeConfig(SparsityConfig):
    pass


class MovementConfig(SparsityConfig):
    scores_lr: float = Field(1e-2, gt=0)        # the scores' own rate (Sanh et al.'s)
    method: ClassVar[str] = "prune-movement"

    @model_validator(mode="after")
    def _learns_scores(self) -> MovementConfig:
        if self.epochs == 0 or self.schedule == "oneshot":
            raise ValueError("movement pruning learns its scores while training; expected epochs > 0 "
                             "and schedule cubic")
        return self


def check_linear_family(cfg: SparsityConfig, family: str) -> None:
    """Refuse families without Linear projections in Transformer layers (BiLM; XLNet's einsums),
    and a named teacher dir that holds no model, before anything trains."""
    record = FAMILIES.get(family)
    if record is not None and cfg.method in record.refusals:     # ALBERT's own reason
        record.check(cfg.method, f"{cfg.method} on model family {family!r}")
    if not linear_family(family):
        supported = ", ".join(f for f in TRANSFORMER_FAMILIES if linear_family(f))
        raise UserError(f"{cfg.method} prunes the Linear weights of Transformer layers, which model family "
                        f"{family!r} does not have; supported families: {supported}")
    if cfg.teacher is not None:
        check_model_ref(cfg.teacher)


def soft_targets_shape(cfg: SparsityConfig, known: Known) -> Shape:
    """Masks keep the shape; soft targets need a teacher of the same labels and token ids."""
    if cfg.teacher_soft_targets:
        teacher = known.teacher if cfg.teacher is None else shape_of(check_model_ref(cfg.teacher))
        check_teacher_fits(cfg.method, teacher, known.model)
    return known.model


def linear_family(family: str) -> bool:
    record = FAMILIES.get(family)
    return record is not None and record.layers is not None and not record.einsum_projections


@dataclass(frozen=True)
class CubicSchedule:
    """Sparsity after `t` optimizer steps of `total` (Zhu & Gupta's cubic ramp)."""

    initial: float
    final: float
    total: int
    warmup: int
    cooldown: int

    def __call__(self, t: int) -> float:
        ramp = self.total - self.warmup - self.cooldown
        if t < self.warmup:
            return self.initial
        if t >= self.total - self.cooldown or ramp <= 0:
            return self.final
        return self.final + (self.initial - self.final) * (1 - (t - self.warmup) / ramp) ** 3


def schedule_for(cfg: SparsityConfig, total_steps: int) -> CubicSchedule:
    """The run's schedule; a one-shot run is a cubic one with nothing left to ramp."""
    if cfg.schedule == "oneshot" or total_steps == 0:
        return CubicSchedule(cfg.sparsity, cfg.sparsity, total_steps, 0, total_steps)
    warmup = cfg.sparsity_warmup_steps
    cooldown = cfg.sparsity_cooldown_steps
    warmup = int(WARMUP_SHARE * total_steps) if warmup is None else warmup
    cooldown = int(COOLDOWN_SHARE * total_steps) if cooldown is None else cooldown
    if warmup + cooldown >= total_steps:
        raise UserError(f"{cfg.method}: sparsity_warmup_steps {warmup} + sparsity_cooldown_steps {cooldown} "
                        f"leave no step to prune in; the run has {total_steps} steps "
                        f"(expected warm-up + cool-down < steps)")
    return CubicSchedule(cfg.initial_sparsity, cfg.sparsity, total_steps, warmup, cooldown)


def planned_steps(cfg: SparsityConfig, train_examples: int) -> int:
    """Optimizer steps `finetune` will take (EpochBatches' count), known before training."""
    examples = min(train_examples, cfg.max_train_samples or train_examples)
    return 0 if cfg.epochs == 0 else max(1, math.ceil(cfg.epochs * math.ceil(examples / cfg.batch_size)))


class Masked(nn.Module):
    """Parametrization W -> W * M. With scores, M's gradient goes straight through to them."""

    def __init__(self, weight: torch.Tensor, with_scores: bool):
        super().__init__()
        self.register_buffer("mask", torch.ones_like(weight))
        # Sanh et al. start every score at 0 (`mask_init constant, mask_scale 0`).
        self.scores = nn.Parameter(torch.zeros_like(weight)) if with_scores else None

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        mask = self.mask
        if self.scores is not None:
            mask = mask + (self.scores - self.scores.detach())   # value M, gradient to S
        return weight * mask


class Pruner:
    """The masks of one run: installed on the encoder's Linears, updated, finally multiplied in."""

    def __init__(self, model: PreTrainedModel, by: Literal["magnitude", "movement"],
                 scope: Literal["global", "per_layer"]):
        self.by, self.scope = by, scope
        self.linears = encoder_linears(model)
        for linear in self.linears.values():
            parametrize.register_parametrization(linear, "weight", Masked(linear.weight, by == "movement"))

    def site(self, linear: nn.Linear) -> Masked:
        return linear.parametrizations.weight[0]

    def importance(self, linear: nn.Linear) -> torch.Tensor:
        if self.by == "movement":
            return self.site(linear).scores.detach()
        return linear.parametrizations.weight.original.detach().abs()

    @torch.no_grad()
    def update(self, sparsity: float) -> None:
        """Masks that keep the top (1 - sparsity) of the importance, exactly that many."""
        linears = list(self.linears.values())
        scores = [self.importance(linear) for linear in linears]
        if self.scope == "global":
            masks = top_k_mask(torch.cat([s.flatten() for s in scores]), sparsity).split([s.numel() for s in scores])
        else:
            masks = [top_k_mask(s.flatten(), sparsity) for s in scores]
        for linear, mask in zip(linears, masks):
            self.site(linear).mask.copy_(mask.view_as(linear.parametrizations.weight.original))
        if self.by == "magnitude":
            self.zero_pruned()

    @torch.no_grad()
    def zero_pruned(self) -> None:
        """Pruned weights back to exactly zero (the optimizer's momentum and decay move them)."""
        for linear in self.linears.values():
            linear.parametrizations.weight.original.mul_(self.site(linear).mask)

    def step_callback(self, schedule: CubicSchedule) -> Callable[[StepLog], None]:
        """After optimizer step t: the masks for step t + 1 at s_t."""
        return lambda log: self.update(schedule(log.step))

    def score_names(self, model: nn.Module) -> list[str]:
        return [name for name, _ in model.named_parameters() if name.endswith(".parametrizations.weight.0.scores")]

    @torch.no_grad()
    def finalize(self) -> None:
        """Multiply the masks in and remove every parametrization, mask and score."""
        for linear in self.linears.values():
            pruned = linear.parametrizations.weight.original * self.site(linear).mask
            parametrize.remove_parametrizations(linear, "weight", leave_parametrized=False)
            linear.weight.copy_(pruned)


def top_k_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """1 at the round((1 - sparsity) * n) largest scores, 0 elsewhere; among scores tied at the
    threshold, the first by position are kept (a stable descending sort's choice).

    This runs after every optimizer step on every encoder matrix, so it finds the threshold
    value and compares rather than scattering topk's indices over the whole matrix: on 2
    cores less than half the time (benchmarks/README.md, "Mask updates"). The values equal
    to the threshold (the k-th value itself and its ties) are set from the bracket's few
    positions, not from a pass over the whole matrix."""
    n = scores.numel()
    keep = round((1 - sparsity) * n)
    if keep in (0, n):
        return torch.full_like(scores, float(keep == n))
    threshold, above, candidates = kth_largest(scores, keep)
    mask = (scores > threshold).to(scores.dtype)
    if above < keep:
        where = torch.arange(n, device=scores.device) if candidates is None else candidates
        mask[where[scores[where] == threshold][:keep - above]] = 1
    return mask


# Scores read from a matrix with this stride-sample size bracket its k-th largest value.
SAMPLE = 4096


def kth_largest(values: torch.Tensor, k: int) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """The k-th largest of the 1-d `values`, how many are strictly larger, and the positions
    (ascending) that hold every value equal to it (None: anywhere).

    For large inputs, a strided sample's quantiles give a bracket about 5 standard errors
    wide around the k-th value; only the values inside it are ranked. The counts check
    that the bracket holds the k-th value; where it does not, everything is ranked."""
    n = values.numel()
    if n > 8 * SAMPLE:
        sample = values[::n // SAMPLE].sort(descending=True).values
        m, share = sample.numel(), k / n
        margin = 5 * math.sqrt(share * (1 - share) / m) + 4 / m
        high = sample[max(0, int((share - margin) * m))]
        low = sample[min(m - 1, int((share + margin) * m))]
        over = int(torch.count_nonzero(values > high))
        inside = ((values >= low) & (values <= high)).nonzero().flatten()
        if over < k <= over + inside.numel():
            bracket = values[inside]
            threshold = torch.topk(bracket, k - over, sorted=False).values.min()
            return threshold, over + int(torch.count_nonzero(bracket > threshold)), inside
    threshold = torch.topk(values, k, sorted=False).values.min()
    return threshold, int(torch.count_nonzero(values > threshold)), None


def soft_target_loss(teacher_logits: TeacherLogits, temperature: float) -> Callable[[nn.Module, Batch], torch.Tensor]:
    """Sanh et al.'s distillation: 0.5 * KL(teacher/T || student/T) * T^2 + 0.5 * CE.

    It reads only logits, so the loop may train the last layer on the first token, and the
    teacher's logits come once per example (TeacherLogits)."""
    def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        out = model(**batch)
        return 0.5 * soft_kl(out.logits, teacher_logits(batch), temperature) + 0.5 * out.loss
    loss.reads_only_logits = True
    return loss


def prune(bundle: ModelBundle, cfg: SparsityConfig, ctx: Context, by: Literal["magnitude", "movement"]
          ) -> ModelBundle:
    """Train (or not, epochs 0) under masks along the schedule; return the model with real zeros."""
    cfg = with_run_defaults(cfg, ctx.seed, ctx.max_train_samples)
    schedule = schedule_for(cfg, planned_steps(cfg, len(ctx.task.split("train"))))   # refuses before training
    model = bundle.copy_model()
    loss_fn, aux = task_loss, []
    if cfg.teacher_soft_targets:
        teacher = ctx.teacher_at(cfg.teacher)
        check_teacher_bundle(cfg.method, teacher, bundle)
        logits = TeacherLogits(teacher.model)
        loss_fn, aux = soft_target_loss(logits, cfg.temperature), [logits.reader]
    pruner = Pruner(model, by, cfg.scope)
    pruner.update(schedule(0))
    if schedule.total:
        checkpoint = Checkpointing(directory=ctx.work_dir / cfg.method) if ctx.work_dir else None
        scores_lr = cfg.scores_lr if isinstance(cfg, MovementConfig) else None

        def score_groups(m: nn.Module) -> list[dict]:
            return [{"params": pruner.score_names(m), "lr": scores_lr, "weight_decay": 0.0}]
        finetune(model, bundle.tokenizer, ctx.task, cfg, desc=cfg.method, show_progress=ctx.show_progress,
                 loss_fn=loss_fn, callbacks=[pruner.step_callback(schedule)], checkpoint=checkpoint,
                 param_groups=score_groups if scores_lr else None, aux_modules=aux)
    pruner.update(cfg.sparsity)
    pruner.finalize()
    return bundle.replace(model=model)


@register("prune-magnitude", MagnitudeConfig, trains=True, check_family=check_linear_family,
          check_shape=soft_targets_shape, trains_embedding=word_embedding_training)
def prune_magnitude(bundle: ModelBundle, cfg: MagnitudeConfig, ctx: Context) -> ModelBundle:
    """Gordon et al.: zero the smallest |W| of the encoder's Linears, gradually while fine-tuning."""
    return prune(bundle, cfg, ctx, "magnitude")


@register("prune-movement", MovementConfig, trains=True, check_family=check_linear_family,
          check_shape=soft_targets_shape, trains_embedding=word_embedding_training)
def prune_movement(bundle: ModelBundle, cfg: MovementConfig, ctx: Context) -> ModelBundle:
    """Sanh et al.: keep the weights whose learned scores (how they move away from 0) are largest."""
    return prune(bundle, cfg, ctx, "movement")
