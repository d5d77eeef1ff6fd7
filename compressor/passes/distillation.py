"""Knowledge distillation: `student` (build the model to distill into) and `distill` (train it
on the teacher's outputs and inner states).

`student` takes layers of the recipe's teacher (`layers: [0, 2, 4]`, DistilBERT's init), of
the current bundle (`from: bundle`, e.g. after pruning), or draws a fresh model of a given
shape whose embeddings come from the teacher's. `distill` trains the bundle against a
teacher in the one shared loop (`finetune(..., loss_fn=, aux_modules=[teacher])`) with any
weighted combination of DistilBERT's, TinyBERT's, MiniLM's and MobileBERT's losses
(distill_losses.py holds the math). Everything that could stop a run (labels, vocabularies,
widths, layer maps, head counts, what a family can give) is checked before training.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Iterator, Literal, Sequence

import numpy as np
import torch
from pydantic import ConfigDict, Field, field_validator, model_validator
from torch import nn
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from compressor.bundle import ModelBundle
from compressor.passes import distill_losses as dl
from compressor.passes.distill_augment import (AugmentConfig, check_augment_fit, check_unlabeled_fit,
                                              transfer_data)
from compressor.passes.registry import (Context, Known, PassConfig, Shape, check_teacher_bundle, check_teacher_fits,
                                       kept_groups, register, shape_of, word_embedding_training)
from pretrain.batching import MAX_LENGTH, encode, iterate, inference_order, usable_length
from pretrain.errors import UserError
from pretrain.families import FAMILIES
from pretrain.finetune import FinetuneConfig, finetune, with_run_defaults
from pretrain.first_token import reader_of
from pretrain.models import (check_model_ref, check_transformer_family, encoder_layers, keep_encoder_layers,
                             read_model_type)
from pretrain.structured import RECORD_FIELD
from pretrain.train import Batch, Checkpointing, accepts_token_types

# --- student ---


class StudentShape(PassConfig):
    """A fresh student's size; a field left out is the teacher's."""

    layers: int | None = Field(None, ge=1)
    hidden: int | None = Field(None, ge=1)
    heads: int | None = Field(None, ge=1)
    ffn: int | None = Field(None, ge=1)


class StudentConfig(PassConfig):
    # `from` is a Python keyword: the field is `source`, written `from` in recipes and dumps.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)

    layers: tuple[int, ...] | None = Field(None, min_length=1)   # layer indices of the source, in order
    source: Literal["teacher", "bundle"] = Field("teacher", alias="from")
    shape: StudentShape | None = None      # instead of layers: a fresh model of this size

    @model_validator(mode="after")
    def _one_way(self) -> StudentConfig:
        if (self.layers is None) == (self.shape is None):
            raise ValueError("give either layers (indices to keep) or shape ({layers, hidden, heads, ffn}), "
                             "not both or neither")
        if self.shape is not None and self.source == "bundle":
            raise ValueError("a fresh student (shape) takes its embeddings from the teacher; from: bundle "
                             "goes with layers")
        if self.layers is not None and len(set(self.layers)) != len(self.layers):
            raise ValueError(f"layer indices must be distinct, got {list(self.layers)}")
        return self


def student_shape(cfg: StudentConfig, known: Known) -> Shape:
    """The student's shape, after checking its layer indices or size fit its source."""
    if cfg.source == "teacher" and known.steps_before:
        # Built from the recipe's teacher, the student would silently drop what they did,
        # while the variant's record still listed them.
        raise UserError(f"student: builds from the recipe's teacher, so the steps before it "
                        f"({', '.join(known.steps_before)}) would be discarded; expected student as the "
                        "variant's first step, or `from: bundle` (with layers) to build from their result")
    source = known.model if cfg.source == "bundle" else known.teacher
    if cfg.shape is not None:
        layers = cfg.shape.layers or source.layers
        hidden = cfg.shape.hidden or source.hidden
        heads = cfg.shape.heads or (source.heads[0] if source.heads and len(set(source.heads)) == 1 else None)
        if hidden is not None and heads is not None:
            check_head_size(hidden, heads)
        return Shape(source.family, layers, (heads,) * layers if heads and layers else None, hidden, known.model.labels,
                     source.vocab)   # one FFN width (the config's) in every layer: ffn unknown, none scored
    check_student_layers(cfg, source.layers)
    heads = tuple(source.heads[i] for i in cfg.layers) if source.heads else None
    ffn = tuple(source.ffn[i] for i in cfg.layers) if source.ffn else None
    return Shape(source.family, len(cfg.layers), heads, source.hidden, known.model.labels, source.vocab,
                 source.embedding, embedding_rank=source.embedding_rank, heads_vary=source.heads_vary,
                 shared_attention=kept_groups(source.shared_attention, cfg.layers), ffn=ffn,
                 shared_ffn=kept_groups(source.shared_ffn, cfg.layers), ffn_vary=source.ffn_vary)


def check_head_size(hidden: int, heads: int) -> None:
    if hidden % heads:
        raise UserError(f"student: hidden width {hidden} is not a multiple of the {heads} heads; "
                        f"expected hidden = heads x head size")


def check_student_layers(cfg: StudentConfig, n_layers: int | None) -> None:
    out_of_range = [i for i in cfg.layers if n_layers is not None and not 0 <= i < n_layers]
    if out_of_range:
        raise UserError(f"student: layer index {out_of_range[0]} out of range; the {cfg.source} has "
                        f"{n_layers} layers (0..{n_layers - 1})")


@register("student", StudentConfig, check_family=lambda cfg, family: check_transformer_family(family, "student"),
          check_shape=student_shape, renames_layers=True)
def student_pass(bundle: ModelBundle, cfg: StudentConfig, ctx: Context) -> ModelBundle:
    """The model to distill into: kept layers of the teacher or the bundle, or a fresh model."""
    source = bundle if cfg.source == "bundle" else ctx.teacher
    if source.label_names != bundle.label_names:
        raise UserError(f"student: the teacher's labels ({', '.join(source.label_names[:3])}, ...) differ from "
                        f"the bundle's ({', '.join(bundle.label_names[:3])}, ...); expected one task's labels")
    if cfg.shape is not None:
        return bundle.replace(model=fresh_student(source.model, cfg.shape, ctx.seed), tokenizer=source.tokenizer,
                              deploy={})
    check_student_layers(cfg, len(encoder_layers(source.model)))
    model = copy.deepcopy(source.model).requires_grad_(True)   # the teacher's copy is frozen
    keep_encoder_layers(model, list(cfg.layers))
    return bundle.replace(model=model, tokenizer=source.tokenizer, deploy=dict(source.deploy))


def fresh_student(teacher: PreTrainedModel, shape: StudentShape, seed: int) -> PreTrainedModel:
    """A randomly initialised classifier of the teacher's family and labels, of `shape`, whose
    embeddings (and embedding LayerNorm) are the teacher's: copied when the widths match,
    else projected onto the top principal directions of the teacher's word embedding."""
    family = FAMILIES[teacher.config.model_type]
    config = copy.deepcopy(teacher.config)
    for name, value in ((family.hidden_field, shape.hidden), (family.heads_field, shape.heads),
                        (family.intermediate_field, shape.ffn)):
        if value is not None:
            setattr(config, name, value)
    for name in family.layer_count_fields:
        if shape.layers is not None:
            setattr(config, name, shape.layers)
    hidden = getattr(config, family.hidden_field)
    check_head_size(hidden, getattr(config, family.heads_field))
    if hasattr(config, "embedding_size"):           # ELECTRA: embeddings of their own width
        config.embedding_size = hidden
    config.pruned_heads = {}
    for name in (RECORD_FIELD, "auto_map"):
        if name in vars(config):
            delattr(config, name)
    torch.manual_seed(seed)
    student = AutoModelForSequenceClassification.from_config(config)
    copy_embeddings(teacher, student)
    return student.eval()


def embedding_projection(weight: torch.Tensor, width: int) -> torch.Tensor:
    """(teacher width, width): the top right singular vectors of the (vocab, teacher width)
    embedding matrix (a truncated SVD: the directions keeping most of its energy); columns
    past the teacher's width are zero (a wider student starts in the teacher's subspace)."""
    _, _, vh = torch.linalg.svd(weight.double(), full_matrices=False)
    directions = vh[:width].T.to(weight.dtype)
    return nn.functional.pad(directions, (0, width - directions.shape[1]))


@torch.no_grad()
def copy_embeddings(teacher: PreTrainedModel, student: PreTrainedModel) -> None:
    """Every embedding table (words, positions, token types) and LayerNorm of the student's base
    model from the teacher's module of the same name: copied, or projected when only the width
    differs (one projection for all tables, so their sums stay in one space)."""
    teacher_modules = dict(teacher.base_model.named_modules())
    words = teacher.get_input_embeddings().weight
    width = student.get_input_embeddings().weight.shape[1]
    projection = embedding_projection(words, width) if width != words.shape[1] else None
    for name, module in student.base_model.named_modules():
        source = teacher_modules.get(name)
        if isinstance(module, nn.Embedding) and isinstance(source, nn.Embedding):
            if source.weight.shape == module.weight.shape:
                module.weight.copy_(source.weight)
            elif source.num_embeddings == module.num_embeddings and projection is not None:
                module.weight.copy_(source.weight @ projection)
        elif (isinstance(module, nn.LayerNorm) and isinstance(source, nn.LayerNorm) and "embed" in name
              and source.weight.shape == module.weight.shape):
            module.load_state_dict(source.state_dict())


# --- distill ---

LossName = Literal["soft", "hard", "cosine", "hidden", "attention", "value-relation", "progressive"]
PREDICTION_LOSSES = ("soft", "hard")
LAYER_LOSSES = ("cosine", "hidden", "attention", "value-relation", "progressive")   # read layer states
ATTENTION_LOSSES = ("attention", "value-relation", "progressive")                  # read q / k / v
PROJECTED_LOSSES = ("cosine", "hidden", "progressive")     # compare states: widths must meet
# MobileBERT's weights of a progressive phase: feature-map MSE and attention KL.
PROGRESSIVE_WEIGHTS = {"hidden": 100.0, "attention": 1.0}
PROJECTION_ATTR = "distill_projection"   # the W_h attached to the student while it trains


class DistillConfig(FinetuneConfig):
    """Fine-tuning settings plus what the student learns from the teacher."""

    losses: tuple[LossName, ...] = Field(("soft",), min_length=1)
    weights: dict[LossName, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)   # a loss left out weighs 1
    temperature: float = Field(2.0, gt=0)      # of `soft` (DistilBERT's T)
    teacher: str | None = None                 # a model dir; default: the recipe's teacher
    # Student layer j learns from teacher layer map[j] (0-based): `uniform` is TinyBERT's
    # (j + 1) * N // M - 1; `auto` picks by linear CKA on `map_samples` train examples.
    layer_map: Literal["uniform", "auto"] | tuple[int, ...] = "uniform"
    map_samples: int = Field(256, ge=2)
    attention_kind: Literal["scores", "distribution"] = "scores"    # TinyBERT MSE | MiniLM KL
    attention_layers: Literal["mapped", "last"] = "mapped"          # every mapped pair | MiniLM: last only
    projection: bool = True                    # a learnable W_h where the widths differ
    two_stage: bool = False                    # TinyBERT: layer losses first, then prediction losses
    augment: AugmentConfig | None = None       # noised copies of the train texts, learnt from soft targets
    unlabeled_samples: int = Field(0, ge=0)    # train texts after the labelled ones, labels withheld

    @field_validator("losses")
    @classmethod
    def _distinct(cls, losses: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(losses)) != len(losses):
            raise ValueError(f"a loss is listed twice in {list(losses)}")
        return losses

    @field_validator("layer_map")
    @classmethod
    def _non_negative(cls, layer_map):
        if not isinstance(layer_map, str) and (not layer_map or min(layer_map) < 0):
            raise ValueError(f"a layer map lists teacher layer indices >= 0, one per student layer; got {list(layer_map)}")
        return layer_map

    @model_validator(mode="after")
    def _consistent(self) -> DistillConfig:
        unused = sorted(set(self.weights) - set(self.losses))
        if unused:
            raise ValueError(f"weights name {unused}, which losses does not list; expected weights of "
                             f"listed losses only")
        if self.tasks:
            raise ValueError("distillation trains the target task alone; expected no multi-task tasks")
        layered = [name for name in self.losses if name in LAYER_LOSSES]
        if self.two_stage and (not layered or not self.prediction_losses()):
            raise ValueError("two_stage needs layer losses (cosine, hidden, attention, value-relation) for "
                             "the first stage and soft or hard for the second")
        if self.augment is not None and "soft" not in self.losses:
            raise ValueError("augment adds copies that only the teacher's soft targets label; expected soft "
                             "among the losses")
        if self.unlabeled_samples and "soft" not in self.losses:
            raise ValueError("unlabeled_samples adds texts that only the teacher's soft targets label; expected "
                             "soft among the losses")
        if "progressive" in self.losses and len(layered) > 1:
            raise ValueError("progressive trains layer by layer with its own hidden + attention losses; "
                             "expected no other layer loss beside it (soft / hard follow it)")
        return self

    def weight(self, name: str) -> float:
        return self.weights.get(name, 1.0)

    def prediction_losses(self) -> tuple[str, ...]:
        return tuple(name for name in self.losses if name in PREDICTION_LOSSES)

    def layer_losses(self) -> tuple[str, ...]:
        return tuple(name for name in self.losses if name in LAYER_LOSSES)

    def input_paths(self) -> dict[str, Path]:
        """Dirs whose content the output depends on beyond the config (for cache keys)."""
        paths = {"teacher": Path(self.teacher)} if self.teacher else {}
        return paths | ({"augment_mlm": Path(self.augment.mlm)} if self.augment else {})


def losses_family_cannot_give(losses: tuple[str, ...], family: str) -> list[str]:
    record = FAMILIES.get(family)
    if record is None or record.layers is None:
        return [name for name in losses if name in LAYER_LOSSES]
    if record.einsum_projections:   # XLNet: relative attention, (T, B, D) states, einsum weights
        return [name for name in losses if name in LAYER_LOSSES]
    return []


def check_distill_family(cfg: DistillConfig, family: str) -> None:
    """Refuse losses the student's family (or a named teacher's) cannot give, up front."""
    refuse_losses(cfg.losses, family, "student")
    if cfg.teacher is not None:
        refuse_losses(cfg.losses, read_model_type(check_model_ref(cfg.teacher)), "teacher")


def refuse_losses(losses: tuple[str, ...], family: str, role: str) -> None:
    refused = losses_family_cannot_give(losses, family)
    if refused:
        record = FAMILIES.get(family)
        why = (record.refusals.get("layer-distill") if record else None) or \
            "no Transformer layers with query/key/value modules to read"
        raise UserError(f"distill: the {role}'s model family {family!r} cannot give the {', '.join(refused)} "
                        f"loss ({why}); expected soft and hard only for this family")


def check_layer_map(cfg: DistillConfig, n_student: int | None, n_teacher: int | None) -> None:
    """A listed map: one teacher layer per student layer, each within the teacher (where known)."""
    if isinstance(cfg.layer_map, str) or not cfg.layer_losses():
        return
    if n_student is not None and len(cfg.layer_map) != n_student:
        raise UserError(f"distill: layer_map has {len(cfg.layer_map)} entries for a student of {n_student} "
                        f"layers; expected one teacher layer per student layer")
    if n_teacher is not None and max(cfg.layer_map) >= n_teacher:
        raise UserError(f"distill: layer_map names teacher layer {max(cfg.layer_map)}, past the teacher's "
                        f"{n_teacher} layers (0..{n_teacher - 1})")


def distill_shape(cfg: DistillConfig, known: Known) -> Shape:
    """Distillation keeps the student's shape; the teacher must have its labels, the student's
    family must give the losses, the layer map fit both models, and hidden states of different
    widths need the projection."""
    student = known.model
    teacher = known.teacher if cfg.teacher is None else shape_of(check_model_ref(cfg.teacher))
    refuse_losses(cfg.losses, student.family, "student")
    check_teacher_fits("distill", teacher, student)
    check_unlabeled_fit(cfg, known)
    check_augment_fit(cfg, known)
    if not cfg.layer_losses():
        return student
    check_projection(cfg, student.hidden, teacher.hidden)
    check_layer_map(cfg, student.layers, teacher.layers)
    if any(name in ATTENTION_LOSSES for name in cfg.losses) and student.heads and teacher.heads:
        check_head_counts(student.heads, teacher.heads, cfg)
    return student


def check_projection(cfg: DistillConfig, student_width: int | None, teacher_width: int | None) -> None:
    projected = [name for name in cfg.losses if name in PROJECTED_LOSSES]
    if projected and None not in (student_width, teacher_width) and student_width != teacher_width \
            and not cfg.projection:
        raise UserError(f"distill: {', '.join(projected)} compares hidden states of width {student_width} (student) "
                        f"and {teacher_width} (teacher), and projection is off; expected projection: true or equal "
                        "widths")


@register("distill", DistillConfig, trains=True, check_family=check_distill_family, check_shape=distill_shape,
          trains_embedding=word_embedding_training)
def distill_pass(bundle: ModelBundle, cfg: DistillConfig, ctx: Context) -> ModelBundle:
    """Train the bundle (the student) against the teacher; the teacher is only read."""
    cfg = with_run_defaults(cfg, ctx.seed, ctx.max_train_samples)
    teacher = ctx.teacher_at(cfg.teacher)
    check_pair(bundle, teacher, cfg)
    model = bundle.copy_model()
    record: dict = {"teacher": cfg.teacher or "recipe", "losses": list(cfg.losses)}
    task, cfg = transfer_data(cfg, ctx, record)
    layer_map: tuple[int, ...] = ()
    if cfg.layer_losses():
        layer_map, similarity = choose_layer_map(model, teacher, cfg, ctx)
        record["layer_map"] = list(layer_map)
        record["layer_map_kind"] = cfg.layer_map if isinstance(cfg.layer_map, str) else "given"
        if similarity is not None:
            record["layer_cka"] = similarity
    stages = []
    with projection_attached(model, teacher.model, cfg):
        for stage in plan_stages(cfg, len(encoder_layers(model)) if cfg.layer_losses() else 0):
            reader = teacher_reader(teacher.model, stage.weights, cfg)
            # Logits alone come once per example (once per run for the recipe's teacher, shared
            # with every other pass that reads them); layer states are too large to keep.
            logits = None
            if runs_teacher(stage.weights) and reads_only_logits(stage.weights):
                kept = ctx.kept_logits(cfg.teacher, "first-token" if reader is not teacher.model else "whole")
                logits = dl.TeacherLogits(reader, first_token=False, cache=True if kept is None else kept)
            loss = DistillLoss(reader, stage.weights, layer_map, cfg.temperature, cfg.attention_kind,
                               cfg.attention_layers, stage.layers, teacher_logits=logits)
            checkpoint = Checkpointing(directory=ctx.work_dir / stage.name) if ctx.work_dir is not None else None
            with frozen_below(model, stage.frozen_below):
                result = finetune(model, bundle.tokenizer, task, stage.config(cfg), desc=f"distill {stage.name}",
                                  show_progress=ctx.show_progress, loss_fn=loss, aux_modules=[reader],
                                  checkpoint=checkpoint)
            stages.append({"stage": stage.name, "losses": stage.weights, "steps": result.train.steps,
                           "samples": result.train.samples, "final_loss": result.train.final_loss,
                           "last_layer_skipped": result.last_layer_skipped,
                           "last_terms": {k: round(v, 6) for k, v in loss.last.items()}})
    record["stages"] = stages
    return bundle.replace(model=model, deploy={**bundle.deploy, "distill": record})


def teacher_reader(teacher: PreTrainedModel, weights: dict[str, float], cfg: DistillConfig) -> PreTrainedModel:
    """The teacher as the stage's loss runs it: where the loss reads only logits, a copy whose
    last layer computes the first token only (same logits, less work per step; the teacher
    itself is never changed), else the teacher."""
    if cfg.cls_only_last_layer and runs_teacher(weights) and reads_only_logits(weights):
        return reader_of(teacher)
    return teacher


def runs_teacher(weights: dict[str, float]) -> bool:
    """The task labels alone need no teacher."""
    return set(weights) != {"hard"}


def reads_only_logits(weights: dict[str, float]) -> bool:
    """Losses that read nothing but the logits (student's and teacher's)."""
    return set(weights) <= set(PREDICTION_LOSSES)


def check_pair(student: ModelBundle, teacher: ModelBundle, cfg: DistillConfig) -> None:
    """Everything about this student and teacher that would fail in training, as one line now."""
    check_teacher_bundle("distill", teacher, student)
    for role, bundle in (("student", student), ("teacher", teacher)):
        refuse_losses(cfg.losses, bundle.model.config.model_type, role)
    if not cfg.layer_losses():
        return
    s_model, t_model = student.model, teacher.model
    check_projection(cfg, dl.hidden_width(s_model), dl.hidden_width(t_model))
    check_layer_map(cfg, len(encoder_layers(s_model)), len(encoder_layers(t_model)))
    if any(name in ATTENTION_LOSSES for name in cfg.losses):
        check_heads(s_model, t_model, cfg)


def check_heads(student: PreTrainedModel, teacher: PreTrainedModel, cfg: DistillConfig) -> None:
    check_head_counts(dl.heads_per_layer(student), dl.heads_per_layer(teacher), cfg)


def check_head_counts(s_heads: Sequence[int], t_heads: Sequence[int], cfg: DistillConfig) -> None:
    """Attention losses compare heads one to one: the compared layers need equal head counts."""
    pairs = [(len(s_heads) - 1, len(t_heads) - 1)]      # value-relation, attention_layers: last
    if isinstance(cfg.layer_map, tuple):
        pairs += list(enumerate(cfg.layer_map))
    elif cfg.layer_map == "uniform":
        pairs += list(enumerate(uniform_map(len(s_heads), len(t_heads))))
    else:   # auto: any teacher layer may be chosen
        pairs += [(j, i) for j in range(len(s_heads)) for i in range(len(t_heads))]
    for j, i in pairs:
        if s_heads[j] != t_heads[i]:
            raise UserError(f"distill: attention losses compare heads one to one, but student layer {j} has "
                            f"{s_heads[j]} heads and teacher layer {i} has {t_heads[i]}; expected equal head "
                            f"counts (or losses without attention / value-relation)")


def uniform_map(n_student: int, n_teacher: int) -> tuple[int, ...]:
    """TinyBERT's map: student layer m (1-based) learns from teacher layer m * N / M."""
    return tuple((j + 1) * n_teacher // n_student - 1 for j in range(n_student))


def choose_layer_map(model: PreTrainedModel, teacher: ModelBundle, cfg: DistillConfig, ctx: Context
                     ) -> tuple[tuple[int, ...], list[list[float]] | None]:
    """The layer map, and for `auto` the CKA matrix it was chosen from (student x teacher layers)."""
    n_student, n_teacher = len(encoder_layers(model)), len(encoder_layers(teacher.model))
    if isinstance(cfg.layer_map, tuple):
        return cfg.layer_map, None
    if cfg.layer_map == "uniform":
        return uniform_map(n_student, n_teacher), None
    similarity = layer_similarity(model, teacher, ctx.task.split("train").head(cfg.map_samples), cfg.batch_size,
                                  cfg.max_length)
    chosen = tuple(int(i) for i in np.argmax(similarity, axis=1))
    return chosen, [[round(float(v), 4) for v in row] for row in similarity]


@torch.no_grad()
def layer_similarity(model: PreTrainedModel, teacher: ModelBundle, split, batch_size: int,
                     max_length: int = MAX_LENGTH) -> np.ndarray:
    """Linear CKA between every student layer's output and every teacher layer's, over the real
    tokens of `split` cut at `max_length` (the length the pass trains at), both models in eval
    mode, so without dropout: (student, teacher) layers."""
    length = min(usable_length(model, max_length), usable_length(teacher.model, max_length))
    data = encode(teacher.tokenizer, split, length)
    states: dict[str, list[list[torch.Tensor]]] = {"student": [], "teacher": []}
    was_training = model.training
    model.eval()
    for _, batch in iterate(data, inference_order(data.lengths(), batch_size), accepts_token_types(model)):
        real = batch["attention_mask"].bool()
        for role, m in (("student", model), ("teacher", teacher.model)):
            with dl.tapped(m, hidden=True) as taps:
                m(**inputs_for(m, batch))
            states[role].append([taps.hidden[i + 1][real] for i in range(len(taps.hidden) - 1)])
    model.train(was_training)
    joined = {role: [torch.cat(layer) for layer in zip(*per_batch)] for role, per_batch in states.items()}
    return np.array([[dl.linear_cka(s, t) for t in joined["teacher"]] for s in joined["student"]])


def inputs_for(model: nn.Module, batch: Batch) -> Batch:
    """The batch as `model` takes it: no labels, no token types for a model without them."""
    return {k: v for k, v in batch.items()
            if k != "labels" and (k != "token_type_ids" or accepts_token_types(model))}


@dataclass(frozen=True)
class Stage:
    """One training run of the pass: its losses and weights, and which layers it concerns."""

    name: str
    weights: dict[str, float]
    epochs_share: float = 1.0                 # of the config's epochs
    layers: tuple[int, ...] | None = None     # student layers the layer losses read (None: all)
    frozen_below: int = 0                     # embeddings and layers below this index stay fixed

    def config(self, cfg: DistillConfig) -> FinetuneConfig:
        return FinetuneConfig(**cfg.model_dump(include=set(FinetuneConfig.model_fields)) |
                              {"epochs": cfg.epochs * self.epochs_share})


def plan_stages(cfg: DistillConfig, n_layers: int) -> list[Stage]:
    """One stage with every loss; or TinyBERT's two (layer losses, then prediction losses);
    or MobileBERT's progressive phases (layer j alone, lower ones frozen, the epochs shared
    out) followed by the prediction losses."""
    weights = {name: cfg.weight(name) for name in cfg.losses}
    prediction = {name: w for name, w in weights.items() if name in PREDICTION_LOSSES}
    if "progressive" in weights:
        phases = [Stage(f"layer-{j}", {"progressive": weights["progressive"]}, 1 / n_layers, (j,), j)
                  for j in range(n_layers)]
        return phases + ([Stage("prediction", prediction)] if prediction else [])
    if cfg.two_stage:
        layered = {name: w for name, w in weights.items() if name in LAYER_LOSSES}
        return [Stage("intermediate", layered), Stage("prediction", prediction)]
    return [Stage("distill", weights)]


@contextlib.contextmanager
def frozen_below(model: PreTrainedModel, index: int) -> Iterator[None]:
    """Embeddings and encoder layers below `index` without gradients (MobileBERT's lower
    layers while a higher one learns); restored afterwards."""
    if index == 0:
        yield
        return
    frozen = [p for layer in list(encoder_layers(model))[:index] for p in layer.parameters()]
    frozen += list(model.get_input_embeddings().parameters())
    embeddings = getattr(model.base_model, "embeddings", None)
    if isinstance(embeddings, nn.Module):
        frozen += list(embeddings.parameters())
    flags = [p.requires_grad for p in frozen]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(frozen, flags):
            p.requires_grad_(flag)


@contextlib.contextmanager
def projection_attached(model: PreTrainedModel, teacher: PreTrainedModel, cfg: DistillConfig) -> Iterator[None]:
    """TinyBERT's W_h (student width -> teacher width) as a submodule of the student while it
    trains, so the loop optimises and checkpoints it with the model; removed afterwards, so
    it never reaches the saved model."""
    projected = any(name in PROJECTED_LOSSES for name in cfg.losses)    # widths exist only then
    s_width, t_width = (dl.hidden_width(model), dl.hidden_width(teacher)) if projected else (0, 0)
    if s_width == t_width:
        yield
        return
    torch.manual_seed(cfg.seed)
    model.add_module(PROJECTION_ATTR, nn.Linear(s_width, t_width))
    try:
        yield
    finally:
        delattr(model, PROJECTION_ATTR)


@dataclass
class DistillLoss:
    """loss_fn(student, batch) for the loop: the weighted sum of the stage's losses.

    The teacher runs first, without gradients; hooks read the layer states each loss needs.
    `last` keeps the latest value of every term (for the record)."""

    teacher: PreTrainedModel
    weights: dict[str, float]
    layer_map: tuple[int, ...]
    temperature: float
    attention_kind: str
    attention_layers: str
    layers: tuple[int, ...] | None = None
    teacher_logits: dl.TeacherLogits | None = None   # where the losses read only logits
    last: dict[str, float] = field(default_factory=dict)

    @property
    def reads_only_logits(self) -> bool:
        """The loop may train the student's last layer on the first token only (pretrain/finetune.py)."""
        return reads_only_logits(self.weights)

    def __call__(self, model: PreTrainedModel, batch: Batch) -> torch.Tensor:
        needs_hidden = any(name in self.weights for name in ("cosine", "hidden", "progressive"))
        s_qkv, t_qkv = self.projection_requests(model)
        t_logits, teacher = None, dl.Taps()
        if self.teacher_logits is not None:
            t_logits = self.teacher_logits(batch)
        elif runs_teacher(self.weights):
            with torch.no_grad(), dl.tapped(self.teacher, needs_hidden, t_qkv) as teacher:
                t_logits = self.teacher(**inputs_for(self.teacher, batch)).logits
        with dl.tapped(model, needs_hidden, s_qkv) as student:
            s_logits = model(**inputs_for(model, batch)).logits
        mask = batch["attention_mask"]
        total = torch.zeros((), device=s_logits.device)
        for name, weight in self.weights.items():
            term = self.term(name, model, student, teacher, s_logits, t_logits, batch["labels"], mask)
            self.last[name] = float(term.detach())
            total = total + weight * term
        return total

    def attention_pairs(self, model: PreTrainedModel) -> list[tuple[int, int]]:
        """(student layer, teacher layer) pairs the attention loss compares."""
        n_student, n_teacher = len(self.layer_map), len(encoder_layers(self.teacher))
        if self.attention_layers == "last":
            return [(n_student - 1, n_teacher - 1)]
        return [(j, self.layer_map[j]) for j in self.scope()]

    def scope(self) -> tuple[int, ...]:
        return self.layers if self.layers is not None else tuple(range(len(self.layer_map)))

    def projection_requests(self, model: PreTrainedModel) -> tuple[dict, dict]:
        student: dict[int, set] = {}
        teacher: dict[int, set] = {}

        def ask(j: int, i: int, parts: tuple[str, ...]) -> None:
            student.setdefault(j, set()).update(parts)
            teacher.setdefault(i, set()).update(parts)
        if "attention" in self.weights:
            for j, i in self.attention_pairs(model):
                ask(j, i, ("query", "key"))
        if "progressive" in self.weights:
            for j in self.scope():
                ask(j, self.layer_map[j], ("query", "key"))
        if "value-relation" in self.weights:
            ask(len(self.layer_map) - 1, len(encoder_layers(self.teacher)) - 1, ("value",))
        return ({k: tuple(v) for k, v in student.items()}, {k: tuple(v) for k, v in teacher.items()})

    def term(self, name: str, model: PreTrainedModel, student: dl.Taps, teacher: dl.Taps, s_logits: torch.Tensor,
             t_logits: torch.Tensor | None, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        project = getattr(model, PROJECTION_ATTR, None) or (lambda x: x)
        if name == "soft":
            return dl.soft_kl(s_logits, t_logits, self.temperature)
        if name == "hard":
            return dl.hard_ce(s_logits, labels)
        if name == "cosine":
            return dl.cosine_distance(project(student.hidden[len(student.hidden) - 1]),
                                      teacher.hidden[len(teacher.hidden) - 1], mask)
        if name == "hidden":
            pairs = [(0, 0)] + [(j + 1, self.layer_map[j] + 1) for j in self.scope()]
            return sum(dl.hidden_mse(project(student.hidden[s]), teacher.hidden[t], mask) for s, t in pairs)
        if name == "attention":
            compare = dl.scores_mse if self.attention_kind == "scores" else dl.relation_kl
            return sum(compare(self.scores(model, student, j), self.scores(self.teacher, teacher, i), mask)
                       for j, i in self.attention_pairs(model))
        if name == "value-relation":
            j, i = len(self.layer_map) - 1, len(encoder_layers(self.teacher)) - 1
            return dl.relation_kl(dl.value_relation(student.projections[(j, "value")], dl.head_size(model)),
                                  dl.value_relation(teacher.projections[(i, "value")], dl.head_size(self.teacher)),
                                  mask)
        if name == "progressive":    # MobileBERT: this phase's layer, feature map MSE + attention KL
            j, = self.scope()
            i = self.layer_map[j]
            hidden = dl.hidden_mse(project(student.hidden[j + 1]), teacher.hidden[i + 1], mask)
            attention = dl.relation_kl(self.scores(model, student, j), self.scores(self.teacher, teacher, i), mask)
            return PROGRESSIVE_WEIGHTS["hidden"] * hidden + PROGRESSIVE_WEIGHTS["attention"] * attention
        raise ValueError(f"unknown loss {name!r}")

    @staticmethod
    def scores(model: PreTrainedModel, taps: dl.Taps, layer: int) -> torch.Tensor:
        return dl.attention_scores(taps.projections[(layer, "query")], taps.projections[(layer, "key")],
                                   dl.head_size(model))
