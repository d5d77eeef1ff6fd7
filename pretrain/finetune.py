"""Fine-tuning a classifier on a task with one of the survey's strategies, and evaluating one.

`finetune` is what both `compressor finetune` and the `finetune` pass call:

- strategy (pretrain/strategies.py): `full`, `frozen` (feature extraction), `scalar-mix`
  (ELMo-style mix of all layers), `adapters` (Houlsby bottlenecks);
- `intermediate_task` (two-stage): first fine-tune on another task, then on the target.
  Label sets must be identical (the head carries over) or disjoint (a new head for the
  target); a partial overlap is refused as a clash, since the same label name would mean
  one thing to the head and another to the data;
- `tasks` (multi-task): the target and the listed tasks train together, one head per task
  around one shared encoder; every step's batch holds `batch_size` examples of each task,
  so the target gets as many steps as on its own;
- `domain_corpus` (two-stage, domain-adaptive): first `domain_steps` steps of the `mlm`
  objective on in-domain text (pretrain/domain.py), then the rest as above.

Order: domain MLM (the whole encoder), then the strategy's modules are added, then the
intermediate task, then the target (with its partner tasks).

Extra heads are ordinary Transformers classifiers whose encoder *is* the target model's
encoder (the same module object), so training any of them trains the shared encoder.

A single-task stage on the model's own loss trains the last layer on the first token only
(`cls_only_last_layer`, pretrain/first_token.py): the head reads nothing else, so the
gradients are the whole layer's, for less compute. `FinetuneResult.last_layer_skipped` says
why a run kept the whole layer.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar, Sequence, TypeVar

import numpy as np
import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator
from torch import nn
from transformers import AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.batching import MAX_LENGTH, Encoded, collate, encode, in_data_order, usable_length
from pretrain.data import Split, TaskData, load_task
from pretrain.domain import check_domain, domain_adapt
from pretrain.errors import AcrossFields, UserError
from pretrain.first_token import first_token_last_layer, skip_reason
from pretrain.metrics import classification_metrics
from pretrain.models import count_params
from pretrain.pretraining import PretrainConfig
from pretrain.strategies import ADAPTER_INIT_STD, Strategy, prepare, trainable_for
from pretrain.train import (Batch, Checkpointing, EpochBatches, LossFn, ParamGroups, StepCallback, TrainConfig,
                            TrainResult, accepts_token_types, epoch_batches, task_loss, train)

TaskSpec = str | dict   # a built-in task name, or a data file spec {path, text, label, ...}

# The learning rate a fine-tuning run gets when it names none: what trains differs by
# strategy, and so does the rate that moves it (measured on all-MiniLM-L6-v2 and
# wordnet-supersense; benchmarks/README.md, "Fine-tuning strategies").
DEFAULT_LR: dict[str, float] = {
    # every weight trains: the usual BERT fine-tuning rate (the recorded 0.7397 used it)
    "full": 1e-4,
    # fresh near-identity adapters (+ LayerNorms, head): Houlsby et al.'s rate, 97.3% of
    # full; at 1e-4 they reach 44% of full in 2 epochs
    "adapters": 1e-3,
    # only the head trains, on a CLS vector that barely varies (std 0.04 after MiniLM's
    # pooler): at 1e-3 the head stays at the majority class. Short probe (6,000 examples,
    # benchmarks/results/strategy_default_lr_probe.json): majority 0.110, 1e-3 0.110,
    # 1e-2 0.301, 3e-2 0.363
    "frozen": 3e-2,
    # the head reads a learned mix of all layers, the encoder frozen: as `frozen`, the head
    # needs a large rate to leave the majority class (same probe: 1e-2 0.1085 = the
    # majority, 3e-2 0.313)
    "scalar-mix": 3e-2,
}


class FinetuneConfig(TrainConfig):
    """Training settings plus which data to train on and how."""

    # None (the default): the strategy's rate from `default_lr`; after validation `lr` always
    # holds the rate the run uses, so dumps (metrics.json, cache keys) show it.
    lr: float | None = Field(None, gt=0)
    default_lr: ClassVar[dict[str, float]] = DEFAULT_LR
    max_train_samples: int | None = Field(None, ge=1)   # per task
    max_length: int = Field(MAX_LENGTH, ge=8, le=512)
    strategy: Strategy = "full"
    adapter_size: int = Field(64, ge=1)                  # Houlsby bottleneck width
    adapter_init_std: float = Field(ADAPTER_INIT_STD, gt=0, le=1)   # std of the adapters' initial weights
    intermediate_task: TaskSpec | None = None            # two-stage: train on this first
    tasks: tuple[TaskSpec, ...] = ()                     # multi-task: trained with the target
    domain_corpus: str | None = None                     # domain MLM on this corpus first ('wordnet' or a file)
    domain_steps: int = Field(100, ge=1)                 # its optimizer steps, `batch_size` sequences each
    domain_lr: float = Field(5e-5, gt=0)                 # Sun et al. 2019's further-pretraining rate
    # Train the last layer on the first token only where the loss reads nothing else (see module doc).
    cls_only_last_layer: bool = True

    @model_validator(mode="after")
    def strategy_lr(self) -> FinetuneConfig:
        """Fill an unset `lr` with the strategy's default; an explicit `lr` always wins.

        The field stays out of `model_fields_set` (the user did not set it); the config is
        frozen, hence the direct write.
        """
        if self.lr is None:
            object.__setattr__(self, "lr", self.default_lr[self.strategy])
        return self

    def derived_defaults(self) -> dict:
        """Defaults that follow from other fields (cache keys leave them out at that value)."""
        return {"lr": self.default_lr[self.strategy]}

    @field_validator("domain_steps", "domain_lr")
    @classmethod
    def only_with_a_corpus(cls, value: float, info: ValidationInfo) -> float:
        # The default passes, so a dumped config (which lists every field) validates back.
        if info.data.get("domain_corpus") is None and value != cls.model_fields[info.field_name].default:
            raise AcrossFields("set without {domain_corpus}; expected a corpus to run MLM on")
        return value

    def domain_config(self) -> PretrainConfig | None:
        """The domain stage as an `mlm` pretraining run (same batch size, length, seed, decay, warm-up)."""
        if self.domain_corpus is None:
            return None
        return PretrainConfig(objective="mlm", corpus=self.domain_corpus, steps=self.domain_steps,
                              batch_size=self.batch_size, lr=self.domain_lr, weight_decay=self.weight_decay,
                              warmup_ratio=self.warmup_ratio, max_length=self.max_length, seed=self.seed)


Trained = TypeVar("Trained", bound=FinetuneConfig)


def with_run_defaults(cfg: Trained, seed: int, max_train_samples: int | None) -> Trained:
    """`cfg` with the run's seed and training-sample limit where it does not set its own.

    A seed counts as set when the user wrote it (even `seed: 0`); a limit when it is not None.
    The recipe's `data.max_train_samples` is a default cap: a pass's own limit wins.
    """
    update: dict = {}
    if "seed" not in cfg.model_fields_set:
        update["seed"] = seed
    if cfg.max_train_samples is None and max_train_samples is not None:
        update["max_train_samples"] = max_train_samples
    return cfg.model_copy(update=update) if update else cfg


@dataclass(frozen=True)
class LoopHooks:
    """What a caller adds to the target stage's `train` call besides the data (see TRAIN_API.md)."""

    loss_fn: LossFn = task_loss
    callbacks: Sequence[StepCallback] = ()
    checkpoint: Checkpointing | None = None
    param_groups: ParamGroups | None = None
    aux_modules: Sequence[nn.Module] = ()

    def custom_loss(self) -> bool:
        return self.loss_fn is not task_loss


@dataclass
class FinetuneResult:
    train: TrainResult            # the target stage
    trainable_params: int         # under the strategy, target stage (shared encoder + its head)
    total_params: int             # of the target model, added modules included
    stages: list[dict] = field(default_factory=list)   # one summary per training stage
    domain: dict | None = None    # the domain MLM stage's summary (also in stages), if one ran
    last_layer_skipped: str | None = None   # why the target stage trained the whole last layer

    @property
    def trainable_percent(self) -> float:
        return 100.0 * self.trainable_params / self.total_params


def finetune(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: TaskData,
             cfg: FinetuneConfig, desc: str = "finetune", show_progress: bool = True,
             mlm_head_from: Path | None = None, *, loss_fn: LossFn = task_loss,
             callbacks: Sequence[StepCallback] = (), checkpoint: Checkpointing | None = None,
             param_groups: ParamGroups | None = None, aux_modules: Sequence[nn.Module] = ()) -> FinetuneResult:
    """Train `model` in place on the task's train split (the first max_train_samples).

    `mlm_head_from`: the model dir whose masked-LM head the domain stage starts from, if it has one.
    `loss_fn`, `callbacks`, `checkpoint`, `param_groups`, `aux_modules` go to `train` for the
    target stage only (the domain and intermediate stages keep the model's own loss), so a
    pass with a loss of its own reuses this data preparation. On resume
    from `checkpoint` the earlier stages run again (deterministically) and the target stage
    continues from the saved step.
    """
    hooks = LoopHooks(loss_fn, tuple(callbacks), checkpoint, param_groups, tuple(aux_modules))
    intermediate = load_intermediate(cfg, task)
    partners = load_partners(cfg, task)          # every input is checked before training starts
    if partners and hooks.custom_loss():
        raise ValueError("a custom loss_fn trains the target task alone; multi-task training (tasks) "
                         "uses the heads' own losses")
    domain = cfg.domain_config()
    if domain is not None:
        check_domain(domain, model, tokenizer)
    stages, domain_summary = [], None
    if domain is not None:
        adapted = domain_adapt(model, tokenizer, domain, mlm_head_from, f"{desc} (mlm on {domain.corpus})",
                               show_progress)
        domain_summary = adapted.summary(domain.corpus)
        stages.append(domain_summary)
    # New adapters draw their weights from the run's seed, not from whatever the process ran
    # before (a resumed recipe skips the cached stages that ran first in the original run).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        prepare(model, cfg.strategy, cfg.adapter_size, cfg.adapter_init_std)
    if intermediate is not None:
        first = model if intermediate.label_names == task.label_names else with_head(model, intermediate.label_names,
                                                                                      cfg.seed)
        result, _ = train_stage([first], [intermediate], tokenizer, cfg, f"{desc} ({intermediate.name})",
                                show_progress)
        stages.append(stage_summary(intermediate.name, result))
    heads = [model] + [with_head(model, t.label_names, cfg.seed + i + 1) for i, t in enumerate(partners)]
    result, trainable = train_stage(heads, [task, *partners], tokenizer, cfg, desc, show_progress, hooks)
    stages.append(stage_summary("+".join(t.name for t in [task, *partners]), result))
    return FinetuneResult(train=result, trainable_params=trainable, total_params=count_params(model),
                          stages=stages, domain=domain_summary,
                          last_layer_skipped=whole_last_layer_reason(heads, cfg, hooks))


def whole_last_layer_reason(models: list[PreTrainedModel], cfg: FinetuneConfig,
                            hooks: LoopHooks = LoopHooks()) -> str | None:
    """Why a stage trains the whole last layer; None when it trains on the first token only."""
    if not cfg.cls_only_last_layer:
        return "not asked (cls_only_last_layer: false)"
    if hooks.custom_loss() and not getattr(hooks.loss_fn, "reads_only_logits", False):
        return "the caller's loss may read more than the logits"
    if len(models) > 1:
        return "multi-task heads share the encoder"
    return skip_reason(models[0])


def last_layer_for(models: list[PreTrainedModel], cfg: FinetuneConfig, hooks: LoopHooks):
    """The stage's context: the last layer on the first token where it may, else nothing."""
    if whole_last_layer_reason(models, cfg, hooks) is None:
        return first_token_last_layer(models[0])
    return contextlib.nullcontext()


def train_stage(models: list[PreTrainedModel], tasks: list[TaskData], tokenizer: PreTrainedTokenizerBase,
                cfg: FinetuneConfig, desc: str, show_progress: bool,
                hooks: LoopHooks = LoopHooks()) -> tuple[TrainResult, int]:
    """One training run: a single task as before, or several heads on mixed batches.

    With several heads the loss is always multitask_loss, and param_groups name parameters
    of the joint module (`heads.0.bert...`)."""
    train_cfg = TrainConfig(**cfg.model_dump(include=set(TrainConfig.model_fields)))
    max_length = usable_length(models[0], cfg.max_length)
    data = [encode(tokenizer, t.split("train").head(cfg.max_train_samples), max_length) for t in tasks]
    encoder = models[0].base_model
    if len(models) == 1:
        with trainable_for(models[0], cfg.strategy, encoder) as trainable, last_layer_for(models, cfg, hooks):
            trainable -= kept_fixed_by_loop(models[0], cfg)
            return train(models[0], data[0], train_cfg, desc=desc, show_progress=show_progress,
                         **loop_kwargs(hooks)), trainable
    joint = MultiTask(models)
    with trainable_for(joint, cfg.strategy, encoder):
        # reported: what the target model trains (shared encoder part + its own head)
        trainable = sum(p.numel() for p in models[0].parameters() if p.requires_grad)
        trainable -= kept_fixed_by_loop(models[0], cfg)
        source = MultiTaskBatches(data, train_cfg, accepts_token_types(models[0]))
        result = train(joint, source, train_cfg, desc=desc, show_progress=show_progress,
                       **{**loop_kwargs(hooks), "loss_fn": multitask_loss})
    return result, trainable


def kept_fixed_by_loop(model: PreTrainedModel, cfg: FinetuneConfig) -> int:
    """Parameters the strategy trains but the loop keeps fixed: the word embedding under
    `embedding_updates: frozen` (the loop freezes it itself, after the strategy's count)."""
    weight = model.get_input_embeddings().weight
    return weight.numel() if cfg.embedding_updates == "frozen" and weight.requires_grad else 0


def loop_kwargs(hooks: LoopHooks) -> dict:
    """The hooks as `train` keywords (not dataclasses.asdict: that would deep-copy the modules)."""
    return {f.name: getattr(hooks, f.name) for f in fields(hooks)}


def stage_summary(name: str, result: TrainResult) -> dict:
    return {"task": name, "steps": result.steps, "samples": result.samples,
            "seconds": round(result.seconds, 2), "final_loss": result.final_loss}


def load_intermediate(cfg: FinetuneConfig, target: TaskData) -> TaskData | None:
    if cfg.intermediate_task is None:
        return None
    inter = load_task(cfg.intermediate_task, seed=cfg.seed)
    if inter.spec == target.spec:
        raise UserError(f"intermediate task {inter.name!r} is the target task itself; "
                        f"expected another task to fine-tune on first")
    shared = set(inter.label_names) & set(target.label_names)
    if shared and set(inter.label_names) != set(target.label_names):
        raise UserError(f"intermediate task {inter.name!r} labels clash with {target.name!r}: they share "
                        f"{', '.join(sorted(shared)[:3])} but not all labels; expected identical label sets "
                        f"(the head carries over) or disjoint ones (a new head)")
    if inter.label_names != target.label_names and set(inter.label_names) == set(target.label_names):
        raise UserError(f"intermediate task {inter.name!r} has the target's labels in another order; "
                        f"expected the same order ({', '.join(target.label_names[:3])}, ...)")
    return inter


def load_partners(cfg: FinetuneConfig, target: TaskData) -> list[TaskData]:
    """The multi-task tasks besides the target (which may be listed too)."""
    partners: list[TaskData] = []
    seen = [target.spec]
    for spec in cfg.tasks:
        t = load_task(spec, seed=cfg.seed)
        if t.spec == target.spec:
            continue
        if t.spec in seen:
            raise UserError(f"task {t.name!r} is listed twice in tasks; expected each task once")
        seen.append(t.spec)
        partners.append(t)
    if cfg.tasks and not partners:
        raise UserError("tasks lists only the target task; expected at least one other task for multi-task training")
    return partners


def with_head(model: PreTrainedModel, label_names: tuple[str, ...], seed: int) -> PreTrainedModel:
    """A classifier for other labels whose encoder is `model`'s encoder (shared, not copied)."""
    config = copy.deepcopy(model.config)
    config.num_labels = len(label_names)
    config.id2label = dict(enumerate(label_names))
    config.label2id = {name: i for i, name in enumerate(label_names)}
    torch.manual_seed(seed)
    other = AutoModelForSequenceClassification.from_config(config)
    setattr(other, other.base_model_prefix, model.base_model)
    if hasattr(model, "scalar_mix"):      # the mix hooks sit on the shared encoder: share its weights too
        other.scalar_mix = model.scalar_mix
    return other


class MultiTask(nn.Module):
    """Classifiers sharing one encoder; row i of a batch belongs to heads[batch["task"][i]]."""

    def __init__(self, models: list[PreTrainedModel]):
        super().__init__()
        self.heads = nn.ModuleList(models)

    def get_input_embeddings(self) -> nn.Module:
        return self.heads[0].get_input_embeddings()


def multitask_loss(model: MultiTask, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy over all rows of the mixed batch, each row scored by its task's head."""
    task = batch["task"]
    total = torch.zeros(())
    for t, head in enumerate(model.heads):
        rows = torch.nonzero(task == t).flatten()
        if len(rows):
            part = {k: v.index_select(0, rows) for k, v in batch.items() if k != "task"}
            total = total + head(**part).loss * len(rows)
    return total / len(task)


class MultiTaskBatches:
    """Steps of the first (target) task's epochs; each step adds a batch of every other task,
    cycling through their own shuffled epochs."""

    def __init__(self, data: list[Encoded], cfg: TrainConfig, with_token_types: bool):
        target = EpochBatches(data[0], cfg, with_token_types)
        self.steps = target.steps
        self.data, self.with_token_types = data, with_token_types
        self.plans = [target.plan] + [epoch_batches(d, cfg, np.random.default_rng((cfg.seed, i)), self.steps)
                                      for i, d in enumerate(data[1:], start=1)]

    def batch(self, step: int) -> Batch:
        parts = [collate(d, plan[step], self.with_token_types) for d, plan in zip(self.data, self.plans)]
        for t, part in enumerate(parts):
            part["task"] = torch.full((len(part["labels"]),), t, dtype=torch.long)
        return concat_padded(parts, self.data[0].pad_id, self.data[0].pad_left)


def concat_padded(parts: list[Batch], pad_id: int, pad_left: bool = False) -> Batch:
    """Stack batches of different widths: pad input_ids with pad_id, masks and types with 0
    (on the left for a left-padding tokenizer)."""
    width = max(p["input_ids"].shape[1] for p in parts)
    out = {}
    for key in parts[0]:
        tensors = [p[key] for p in parts]
        if tensors[0].ndim == 2:
            fill = pad_id if key == "input_ids" else 0
            tensors = [nn.functional.pad(t, (width - t.shape[1], 0) if pad_left else (0, width - t.shape[1]),
                                         value=fill) for t in tensors]
        out[key] = torch.cat(tensors)
    return out


@torch.inference_mode()
def predict_logits(model: PreTrainedModel, data: Encoded, batch_size: int = 64) -> np.ndarray:
    """Logits for every example, in the original order: (n, num_labels) float32."""
    model.eval()

    def logits(batch: dict) -> torch.Tensor:
        batch.pop("labels")
        return model(**batch).logits
    return in_data_order(data, batch_size, logits, accepts_token_types(model), columns=model.config.num_labels)


def evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, split: Split,
             max_length: int = MAX_LENGTH) -> tuple[dict[str, float], np.ndarray]:
    """Accuracy and macro-F1 on a split, plus the predicted class of every example."""
    data = encode(tokenizer, split, usable_length(model, max_length))
    predictions = predict_logits(model, data).argmax(axis=1)
    return classification_metrics(data.labels, predictions), predictions
