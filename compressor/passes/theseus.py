"""BERT-of-Theseus (Xu et al. 2020): compress a model by progressive module replacing.

The predecessor (the input bundle) is cut into `successor_layers` blocks of k consecutive
Transformer layers; each block gets one successor layer. While training, per batch, each
block independently runs its successor with probability p (one Bernoulli draw per block
per batch) or else its k predecessor layers, so the successors learn to stand in for their
blocks inside the trained model. Only the successors train: embeddings, predecessor layers
and classifier stay frozen (the official code gives the optimizer only the successor
layers). p follows a schedule: `constant` (p for the replacing phase, then p = 1: successor
fine-tuning) or `linear` (the curriculum p_t = min(1, theta * t + b)). The loss is the task's
cross-entropy, as in the paper; `soft_weight` adds the predecessor's own soft targets to it.

The result is the predecessor's own model class with the successors as its N layers: a plain
smaller model of the same family (no wrapper is left), which saves, loads, exports and
quantizes like any other. The mixing wrapper exists only while the shared loop trains.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import ClassVar, Iterator, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn
from transformers import PreTrainedModel

from compressor.bundle import ModelBundle
from compressor.passes.distill_losses import TeacherLogits, soft_kl
from compressor.passes.registry import Context, Known, Shape, register
from pretrain.errors import UserError
from pretrain.first_token import reader_of
from pretrain.finetune import DEFAULT_LR, FinetuneConfig, finetune, with_run_defaults
from pretrain.models import check_transformer_family, encoder_layers, keep_encoder_layers, set_encoder_layers
from pretrain.train import Batch, Checkpointing, StepLog, epoch_steps, task_loss


# The rate when the pass names none: only the successor layers train, and they move further
# than a whole model would. Measured (benchmarks/README.md, "BERT-of-Theseus"; 6 -> 3 layers,
# 20,000 examples x 1 epoch): 1e-4 0.7806, 3e-4 0.7898, 1e-3 0.7844.
THESEUS_DEFAULT_LR: dict[str, float] = {**DEFAULT_LR, "full": 3e-4}


class TheseusConfig(FinetuneConfig):
    """Training settings (the shared loop's) plus the replacement and its schedule."""

    default_lr: ClassVar[dict[str, float]] = THESEUS_DEFAULT_LR
    successor_layers: int = Field(ge=1)      # N successor modules; each replaces depth / N layers
    schedule: Literal["constant", "linear"] = "linear"
    # constant: the replacing rate before successor fine-tuning (the paper's 0.5)
    p: float = Field(0.5, gt=0, le=1)
    # linear: p at step 0 (the official example's 0.3) and its growth per optimizer step;
    # theta None: the growth that reaches p = 1 at `replacing_fraction` of the run
    b: float = Field(0.3, ge=0, le=1)
    theta: float | None = Field(None, gt=0)
    # constant: share of the steps in the replacing phase (the rest is successor fine-tuning);
    # linear without theta: share of the steps after which p = 1
    replacing_fraction: float = Field(0.5, gt=0, le=1)
    # which predecessor layer each successor starts as: "block" = the first layer of its own
    # block (0, k, 2k, ...: the layers `drop-layers` would keep); "first" = layers 0..N-1,
    # what the official code does (`deepcopy(layer[ix]) for ix in range(scc_n_layer)`)
    init: Literal["block", "first"] = "block"
    # The predecessor's soft targets beside the labels (the paper calls module replacing
    # orthogonal to distillation): loss = CE + soft_weight * KL(T) T^2 against the input
    # model's logits on the same batch. 0, the default, is the paper's Theseus: labels only.
    soft_weight: float = Field(0.0, ge=0)
    temperature: float = Field(2.0, gt=0)     # of the soft targets (DistilBERT's T)
    checkpoint_every: int = Field(200, ge=1)  # optimizer steps between checkpoints in ctx.work_dir

    @model_validator(mode="after")
    def target_task_only(self) -> TheseusConfig:
        """The schedule mixes the target task's batches; other stages and strategies would train
        the predecessor or add modules the plain successor model cannot keep."""
        extras = {"strategy": self.strategy != "full", "intermediate_task": self.intermediate_task is not None,
                  "tasks": bool(self.tasks), "domain_corpus": self.domain_corpus is not None}
        used = [name for name, set_ in extras.items() if set_]
        if used:
            raise ValueError(f"theseus trains successor layers on the target task only; {used[0]} is not "
                             f"supported (expected the default)")
        return self


def check_theseus_family(cfg: TheseusConfig, family: str) -> None:
    check_transformer_family(family, "theseus")


def block_size(depth: int, successors: int) -> int:
    """k, the predecessor layers each successor replaces (one-line UserError if none fits)."""
    if successors >= depth or depth % successors:
        raise UserError(f"theseus: successor_layers {successors} does not split the model's {depth} layers "
                        f"into equal blocks of 2 or more; expected a proper divisor of {depth}")
    return depth // successors


def init_layers(cfg: TheseusConfig, k: int) -> list[int]:
    """The predecessor layer each successor is copied from."""
    n = cfg.successor_layers
    return list(range(n)) if cfg.init == "first" else [i * k for i in range(n)]


def replacing_rate(cfg: TheseusConfig, step: int, total_steps: int) -> float:
    """p for optimizer step `step` (0-based) of a run of `total_steps`."""
    if cfg.schedule == "constant":
        return cfg.p if step < round(cfg.replacing_fraction * total_steps) else 1.0
    theta = cfg.theta if cfg.theta is not None else (1.0 - cfg.b) / max(1.0, cfg.replacing_fraction * total_steps)
    return min(1.0, theta * step + cfg.b)


class TheseusBlock(nn.Module):
    """One entry of the encoder's layer list while training: k predecessors or their successor."""

    def __init__(self, predecessors: list[nn.Module], successor: nn.Module):
        super().__init__()
        self.predecessors = nn.ModuleList(predecessors)
        self.successor = successor
        self.use_successor = True

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        # hidden_states: (batch, seq, hidden); the other arguments (mask, head mask, ...) are
        # the encoder's for this position and the same for every layer of the block.
        if self.use_successor:
            return self.successor(hidden_states, *args, **kwargs)
        out = hidden_states
        for layer in self.predecessors:
            out = layer(hidden_states, *args, **kwargs)
            # Layers return (hidden, ...) (or hidden alone) when attentions are not asked
            # for, which training never does; the next layer reads the hidden state.
            hidden_states = out[0] if isinstance(out, tuple) else out
        return out


class TheseusLayers(nn.ModuleList):
    """The wrapper that stands in for the encoder's layer list while training: N blocks, and
    how many optimizer steps are done (a buffer, so checkpoints carry it and a resumed run
    goes on with the same schedule and draws)."""

    def __init__(self, predecessors: nn.ModuleList, successors: nn.ModuleList):
        k = len(predecessors) // len(successors)
        super().__init__(TheseusBlock(list(predecessors[i * k:(i + 1) * k]), successor)
                         for i, successor in enumerate(successors))
        self.register_buffer("steps_done", torch.zeros((), dtype=torch.long))

    def choose(self, p: float, seed: int) -> list[bool]:
        """One Bernoulli(p) per block for the coming batch: True = it runs its successor.

        The draws depend only on (seed, step), so every DDP rank takes the same path and a
        resumed run draws what the uninterrupted one would have."""
        draws = np.random.default_rng((seed, int(self.steps_done))).random(len(self)) < p
        for block, use in zip(self, draws):
            block.use_successor = bool(use)
        return draws.tolist()

    def successors(self) -> nn.ModuleList:
        return nn.ModuleList(block.successor for block in self)


@contextlib.contextmanager
def replacing(model: PreTrainedModel, predecessors: nn.ModuleList) -> Iterator[TheseusLayers]:
    """Train-time wrapper: `model`'s (successor) layers mixed with the predecessors; only the
    successors trainable. Afterwards the model has its plain successor layers again, with
    every parameter's requires_grad as it was."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    layers = TheseusLayers(predecessors, encoder_layers(model))
    set_encoder_layers(model, layers)
    model.requires_grad_(False)
    layers.successors().requires_grad_(True)
    try:
        yield layers
    finally:
        set_encoder_layers(model, layers.successors())
        for p, flag in flags:
            p.requires_grad_(flag)


def theseus_shape(cfg: TheseusConfig, known: Known) -> Shape:
    """N successor layers, once N is known to split the model's layers into equal blocks."""
    shape = known.model
    # Successors start from the layers' own tensors: whether shared ones stay tied, only the run tells.
    shared = () if shape.shared_attention == () else None
    shared_ffn = () if shape.shared_ffn == () else None
    if shape.layers is not None:
        k = block_size(shape.layers, cfg.successor_layers)
        starts = init_layers(cfg, k)
        heads = tuple(shape.heads[i] for i in starts) if shape.heads else None
        ffn = tuple(shape.ffn[i] for i in starts) if shape.ffn else None
        return dataclasses.replace(shape, layers=cfg.successor_layers, heads=heads, ffn=ffn, shared_attention=shared,
                                   shared_ffn=shared_ffn)
    return dataclasses.replace(shape, layers=cfg.successor_layers, heads=None, ffn=None, shared_attention=shared,
                               shared_ffn=shared_ffn)


@register("theseus", TheseusConfig, trains=True, check_family=check_theseus_family, check_shape=theseus_shape,
          renames_layers=True)
def theseus_pass(bundle: ModelBundle, cfg: TheseusConfig, ctx: Context) -> ModelBundle:
    """Replace every k consecutive layers of the input by one successor layer, trained by
    progressive module replacing in the shared loop."""
    cfg = with_run_defaults(cfg, ctx.seed, ctx.max_train_samples)
    predecessors = copy.deepcopy(encoder_layers(bundle.model))   # frozen, never the input's own
    k = block_size(len(predecessors), cfg.successor_layers)
    model = bundle.copy_model()
    # The successor model itself, initialized: a plain N-layer model (config, pruned heads
    # and structure record follow the layers it keeps).
    keep_encoder_layers(model, init_layers(cfg, k))
    total = epoch_steps(len(ctx.task.split("train").head(cfg.max_train_samples)), cfg)
    checkpoint = None if ctx.work_dir is None else Checkpointing(directory=ctx.work_dir,
                                                                 every_steps=cfg.checkpoint_every)
    # The predecessor as a frozen reader of soft targets: a copy (the loop sets it to eval
    # mode), its last layer on the first token where the family allows (same logits), each
    # example's logits computed once.
    reader = TeacherLogits(reader_of(bundle.model, always_copy=True), first_token=False) \
        if cfg.soft_weight else None
    with replacing(model, predecessors) as layers:
        def loss_fn(trained: nn.Module, batch: Batch) -> torch.Tensor:
            layers.choose(replacing_rate(cfg, int(layers.steps_done), total), cfg.seed)
            loss = task_loss(trained, batch) if reader is None else with_soft_targets(trained, reader, batch, cfg)
            # A batch on which every block drew its predecessors reaches no trainable
            # parameter: the step leaves every gradient empty and so updates nothing, as in
            # the official code (the loop still calls backward, hence a leaf that wants one).
            return loss if loss.requires_grad else loss.requires_grad_()

        def count_step(log: StepLog) -> None:
            layers.steps_done.fill_(log.step)

        finetune(model, bundle.tokenizer, ctx.task, cfg, desc="theseus", show_progress=ctx.show_progress,
                 loss_fn=loss_fn, callbacks=[count_step], checkpoint=checkpoint,
                 aux_modules=[reader.reader] if reader is not None else [])
    return bundle.replace(model=model)


def with_soft_targets(model: nn.Module, reader: TeacherLogits, batch: Batch, cfg: TheseusConfig) -> torch.Tensor:
    """The task's cross-entropy plus soft_weight x the KL to the predecessor's logits."""
    out = model(**batch)
    return out.loss + cfg.soft_weight * soft_kl(out.logits, reader(batch), cfg.temperature)
