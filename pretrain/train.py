"""The one training loop.

Every stage that trains (fine-tuning, pretraining, quantization-aware training, any pass
with a loss of its own) calls `train` with its own `loss_fn(model, batch)` and a source of
batches: an `Encoded` split (epochs of shuffled, length-grouped batches) or any
`BatchSource` (a step count plus `batch(step)`, e.g. an MLM objective masking its own
batches). The loop owns the optimizers, the schedule, clipping, progress, checkpoints and
data parallelism.

One process or many: started by `torchrun --nproc_per_node=N`, the model is wrapped in
DistributedDataParallel (gloo on CPU, NCCL on GPU) and each rank trains on its slice of
every global batch, so N processes take the same steps as one process would (see
TRAIN_API.md). Only rank 0 shows progress and writes checkpoints.

Where the time goes on a small CPU, and what the loop does about it:
- padding: batches are padded to their longest member and grouped by length (batching.py);
- the word-embedding matrix (half of MiniLM's 22.7M parameters) would get a dense
  30522 x 384 gradient and a dense AdamW update every step although a batch touches a few
  hundred rows. With `embedding_updates="sparse"` the embedding emits a sparse gradient
  and SparseAdam updates only the rows seen (`"frozen"` skips them, `"dense"` is the
  textbook behaviour). DDP all-reduces sparse gradients on gloo; NCCL cannot, so on GPU
  "sparse" falls back to "dense";
- the optimizer step over the dense parameters uses the fused AdamW kernel;
- torch's dropout draws one random number per element on one thread, 12-13% of a MiniLM
  step on 2 cores; with `dropout_masks="packed"` (the default) the model's dropout modules
  draw 16 bits per element instead, four elements per 64-bit word, for the same rate, and
  BERT-layout SDPA attention runs eagerly so that its attention dropout does too
  (pretrain/dropout.py);
- clipping hands its factor to the fused AdamW kernel (`grad_scale`) rather than rewriting
  every gradient first.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pretrain import distributed
from pretrain.atomic import atomic_write
from pretrain.batching import Encoded, collate, training_order
from pretrain.dropout import packed_dropout
from pretrain.errors import UserError
from pretrain.limits import MAX_SEED

Batch = dict[str, torch.Tensor]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
# model -> optimizer groups of their own, each {"params": [parameter names], "lr": ..., ...}
# (names as in model.named_parameters(); options a group leaves out are the config's).
ParamGroups = Callable[[nn.Module], list[dict[str, Any]]]


class TrainConfig(BaseModel):
    """Optimisation settings shared by every stage that trains."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    epochs: float = Field(1.0, gt=0)
    batch_size: int = Field(32, ge=1)         # the global batch, split over DDP processes
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)
    max_grad_norm: float | None = Field(1.0, gt=0)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    embedding_updates: Literal["sparse", "dense", "frozen"] = "sparse"
    group_by_length: bool = True
    # "sgd": plain SGD without momentum over every parameter, sparse gradients included
    # (word2vec's update; Adam's per-coordinate scaling collapses skip-gram vectors).
    optimizer: Literal["adamw", "sgd"] = "adamw"
    # "bf16": mixed precision, the forward pass and loss under torch.autocast (bfloat16 matrix
    # products; weights, gradients and optimizer state stay fp32). Fast where the CPU has
    # AVX-512 BF16 or AMX (or on a GPU); slower than fp32 on CPUs without them.
    precision: Literal["fp32", "bf16"] = "fp32"
    # "packed": dropout masks from 16-bit slices of random words (pretrain/dropout.py);
    # "torch": torch's own dropout, one random draw per element.
    dropout_masks: Literal["packed", "torch"] = "packed"


class Checkpointing(BaseModel):
    """Where and how often the loop saves a resumable checkpoint.

    A run given a directory that already holds its checkpoint resumes from it exactly
    (model, optimizers, schedules, RNG states, step and data position).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    directory: Path
    every_steps: int = Field(200, ge=1)


CHECKPOINT_FILE = "checkpoint.pt"


@dataclass(frozen=True)
class StepLog:
    """What a callback sees after each optimizer step (global numbers, same on every rank)."""

    step: int                # steps done, 1-based
    total_steps: int
    loss: float              # mean loss over the global batch
    samples: int             # examples seen so far (all ranks)
    tokens: int              # non-padding tokens seen so far (all ranks)
    seconds: float           # training time so far, including before a resume
    lr: float                # learning rate of the step just taken


StepCallback = Callable[[StepLog], None]


@dataclass
class TrainResult:
    steps: int
    samples: int
    seconds: float
    losses: list[float] = field(repr=False)
    tokens: int = 0

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def initial_loss(self) -> float:
        head = self.losses[:10]
        return float(np.mean(head)) if head else float("nan")

    @property
    def final_loss(self) -> float:
        tail = self.losses[-50:]
        return float(np.mean(tail)) if tail else float("nan")


@runtime_checkable
class BatchSource(Protocol):
    """Where a run's batches come from: `steps` optimizer steps, global batch `batch(step)`.

    A batch is a dict of tensors whose first dimension is the example; under DDP the loop
    gives each rank its slice. Steps are asked for in order, from 0 (or from the resume
    step). A source whose batch is a pure function of the step (seed its RNG with the
    step) resumes exactly with no further help; a source with internal state (a stream)
    also defines `state_dict()` and `load_state_dict(state)`, which checkpoints carry.
    """

    steps: int

    def batch(self, step: int) -> Batch: ...


@dataclass(frozen=True)
class StepBatches:
    """A BatchSource from a function: `make(step)` builds global batch `step`."""

    steps: int
    make: Callable[[int], Batch]

    def batch(self, step: int) -> Batch:
        return self.make(step)


class EpochBatches:
    """Epochs over an Encoded split: a fresh shuffle each epoch, cut at cfg.epochs.

    The whole plan of index batches is drawn up front from cfg.seed, so the data
    position of a resumed run is just its step.
    """

    def __init__(self, data: Encoded, cfg: TrainConfig, with_token_types: bool):
        if len(data) == 0:
            raise ValueError("no training examples")
        self.data, self.with_token_types = data, with_token_types
        self.steps = epoch_steps(len(data), cfg)
        self.plan = epoch_batches(data, cfg, np.random.default_rng(cfg.seed), self.steps)

    def batch(self, step: int) -> Batch:
        return collate(self.data, self.plan[step], self.with_token_types)


def epoch_steps(examples: int, cfg: TrainConfig) -> int:
    """Optimizer steps of cfg.epochs epochs over `examples` (a partial last batch is a step)."""
    return max(1, math.ceil(cfg.epochs * math.ceil(examples / cfg.batch_size)))


def task_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The model's own loss (cross-entropy for a classification head)."""
    return model(**batch).loss


def train(model: nn.Module, data: Encoded | BatchSource, cfg: TrainConfig, loss_fn: LossFn = task_loss,
          desc: str = "training", show_progress: bool = True, checkpoint: Checkpointing | None = None,
          callbacks: Sequence[StepCallback] = (), param_groups: ParamGroups | None = None,
          aux_modules: Sequence[nn.Module] = ()) -> TrainResult:
    """Train `model` in place and return what happened (the same on every rank).

    `param_groups(model)`: optimizer groups with their own options (see ParamGroups).
    `aux_modules`: modules loss_fn uses but does not train (e.g. a teacher model): on the
    training device, in eval mode and without gradients while the loop runs, outside the
    DDP wrapper and the optimizers.
    """
    source = EpochBatches(data, cfg, accepts_token_types(model)) if isinstance(data, Encoded) else data
    place = distributed.world()
    if isinstance(data, Encoded):
        check_shares(len(data), cfg.batch_size, place)
    home = next(model.parameters()).device
    device = distributed.device() if place.distributed else home
    model.to(device)
    torch.manual_seed(cfg.seed + place.rank)   # dropout differs per rank, like different data
    progress = Counters(losses=[])

    model.train()
    with embedding_mode(model, embedding_mode_for(cfg.embedding_updates)) as sparse_params, \
            frozen_on(aux_modules, device, model), dropout_kind(model, cfg.dropout_masks):
        groups = param_groups(model) if param_groups is not None else []
        optimizers = make_optimizers(model, cfg, sparse_params, groups)
        schedules = [torch.optim.lr_scheduler.LambdaLR(o, warmup_then_linear_decay(cfg, source.steps))
                     for o in optimizers]
        run = Run(model, optimizers, schedules, source, cfg, place)
        if checkpoint is not None:
            run.resume(checkpoint.directory, progress)
        step_loss = loss_step(model, loss_fn, place, device, cfg.precision)
        start = time.perf_counter() - progress.seconds
        with progress_bar(desc, source.steps, show_progress and place.is_main, progress.step) as advance:
            for step in range(progress.step, source.steps):
                batch = source.batch(step)
                loss = step_loss(batch)          # forward + backward (+ DDP all-reduce)
                if not math.isfinite(loss):      # diverged: what followed would be NaN weights, saved as a result
                    raise UserError(f"{desc}: the loss is {loss} at step {step + 1} of {source.steps}: training "
                                    "diverged; expected a smaller learning rate")   # (callers may scale it)
                clip_dense_gradients(model, cfg.max_grad_norm, optimizers[0])
                lr = schedules[0].get_last_lr()[0]
                for opt, sched in zip(optimizers, schedules):
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                progress.record(loss, len(batch["input_ids"]), count_tokens(batch), time.perf_counter() - start)
                log = StepLog(progress.step, source.steps, loss, progress.samples, progress.tokens,
                              progress.seconds, lr)
                for callback in callbacks:
                    callback(log)
                advance(loss, progress.samples / max(progress.seconds, 1e-9))
                if checkpoint is not None and (progress.step % checkpoint.every_steps == 0
                                               or progress.step == source.steps):
                    run.save(checkpoint.directory, progress)
    model.eval()
    model.to(home)
    return TrainResult(steps=progress.step, samples=progress.samples, seconds=progress.seconds,
                       losses=progress.losses, tokens=progress.tokens)


@dataclass
class Counters:
    """Counters a checkpoint carries so a resumed run reports the whole run."""

    losses: list[float]
    step: int = 0
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def record(self, loss: float, samples: int, tokens: int, seconds: float) -> None:
        self.losses.append(loss)
        self.step += 1
        self.samples += samples
        self.tokens += tokens
        self.seconds = seconds


def loss_step(model: nn.Module, loss_fn: LossFn, place: distributed.World, device: torch.device,
              precision: str = "fp32") -> Callable[[Batch], float]:
    """forward + backward of one global batch on this rank; returns the global mean loss.

    Under DDP the model and loss_fn are wrapped as one module, so DDP's hooks see the whole
    loss computation whatever submodules loss_fn calls. Each rank's loss is weighted by its
    share of the batch: DDP averages gradients over ranks, so the result is the gradient
    of the mean over the global batch, as on one process, even for unequal shares.
    """
    def forward(fn: Callable[[Batch], torch.Tensor], batch: Batch) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            return fn(batch).float()

    if not place.distributed:
        def single(batch: Batch) -> float:
            loss = forward(lambda b: loss_fn(model, b), to_device(batch, device))
            loss.backward()
            return loss.item()
        return single

    # find_unused_parameters: scalar-mix and multi-task heads leave some parameters out
    # of a step's graph; the graph walk it costs is small next to the step.
    ddp = DistributedDataParallel(WithLoss(model, loss_fn), find_unused_parameters=True)

    def data_parallel(batch: Batch) -> float:
        share, weight = rank_share(batch, place)
        loss = forward(ddp, to_device(share, device)) * weight
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total.item() / place.size
    return data_parallel


class WithLoss(nn.Module):
    """A model and its loss as one module: what DDP wraps."""

    def __init__(self, model: nn.Module, loss_fn: LossFn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.loss_fn(self.model, batch)


def rank_share(batch: Batch, place: distributed.World) -> tuple[Batch, float]:
    """This rank's rows of a global batch, and the weight that makes its loss a share of the mean.

    A rank left without rows (a last batch smaller than the world) runs one row with
    weight 0: it must still take part in DDP's all-reduce.
    """
    n = len(batch["input_ids"])
    rows = np.array_split(np.arange(n), place.size)[place.rank]
    weight = len(rows) * place.size / n
    if len(rows) == 0:
        rows = np.arange(1)
    index = torch.from_numpy(rows)
    return {k: v.index_select(0, index) for k, v in batch.items()}, weight


def check_shares(examples: int, batch_size: int, place: distributed.World) -> None:
    """Every process needs at least one example of every full batch."""
    per_batch = min(examples, batch_size)
    if place.size > per_batch:
        raise UserError(f"cannot split batches of {per_batch} examples over {place.size} processes; "
                        f"expected --nproc_per_node <= {per_batch} (or a larger --batch-size)")


def to_device(batch: Batch, device: torch.device) -> Batch:
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def count_tokens(batch: Batch) -> int:
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())


def embedding_mode_for(requested: str) -> str:
    """NCCL has no sparse all-reduce: on GPU data parallelism, sparse updates become dense."""
    if requested == "sparse" and dist.is_initialized() and dist.get_backend() == "nccl":
        return "dense"
    return requested


class Run:
    """The state a checkpoint holds, and saving / resuming it."""

    def __init__(self, model: nn.Module, optimizers: list[torch.optim.Optimizer],
                 schedules: list[Any], source: BatchSource, cfg: TrainConfig, place: distributed.World):
        self.model, self.optimizers, self.schedules = model, optimizers, schedules
        self.source, self.cfg, self.place = source, cfg, place

    def fingerprint(self) -> dict:
        """What must match for a checkpoint to belong to this run."""
        return {"config": self.cfg.model_dump(mode="json"), "steps": self.source.steps}

    def save(self, directory: Path, progress: Counters) -> None:
        rng = rng_state()
        states = [rng]
        if self.place.distributed:
            states = [None] * self.place.size
            dist.all_gather_object(states, rng)
        if self.place.is_main:
            state = {"fingerprint": self.fingerprint(), "world_size": self.place.size,
                     "model": self.model.state_dict(),
                     "optimizers": [o.state_dict() for o in self.optimizers],
                     "schedules": [s.state_dict() for s in self.schedules],
                     "rng": states, "progress": vars(progress).copy(),
                     "source": self.source.state_dict() if hasattr(self.source, "state_dict") else None}
            atomic_write(Path(directory) / CHECKPOINT_FILE, lambda f: torch.save(state, f))

    def resume(self, directory: Path, progress: Counters) -> None:
        path = Path(directory) / CHECKPOINT_FILE
        if not path.is_file():
            return
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a truncated or foreign file: one line, not a traceback
            # (nor torch's own message: it advises weights_only=False, i.e. running the file's code)
            raise UserError(f"{path} is not a readable training checkpoint (truncated, or not written by this "
                            f"tool); expected one a run of this tool wrote: delete {path.parent} to start the "
                            "training over") from None
        if state.get("fingerprint") != self.fingerprint():
            raise UserError(f"checkpoint {path} was written by a run with other settings "
                            f"({fingerprint_differences(state.get('fingerprint'), self.fingerprint())}); "
                            f"expected the same training config and step count (or remove it)")
        self.model.load_state_dict(state["model"])
        for opt, saved in zip(self.optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(saved)
        for sched, saved in zip(self.schedules, state["schedules"], strict=True):
            sched.load_state_dict(saved)
        if state["source"] is not None:
            self.source.load_state_dict(state["source"])
        # RNG streams are per rank; on a different number of processes the run goes on,
        # but no longer bit-for-bit as uninterrupted.
        if state["world_size"] == self.place.size:
            set_rng_state(state["rng"][self.place.rank])
        for key, value in state["progress"].items():
            setattr(progress, key, value)


def fingerprint_differences(saved: Any, now: dict) -> str:
    """The settings a checkpoint's fingerprint and this run's disagree on, as `name: old -> new`
    (a setting the checkpoint lacks, say one a later version added, reads `absent`)."""
    if not isinstance(saved, dict):
        return "no fingerprint"
    old = {**saved.get("config", {}), "steps": saved.get("steps")}
    new = {**now["config"], "steps": now["steps"]}
    return ", ".join(f"{name}: {old.get(name, 'absent')} -> {new.get(name, 'absent')}"
                     for name in sorted(old.keys() | new.keys()) if old.get(name, "absent") != new.get(name, "absent"))


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": (np_state[0], np_state[1].tolist(), *np_state[2:])}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))


def accepts_token_types(model: nn.Module) -> bool:
    """DistilBERT-style models take no token_type_ids; BERT-style ones do."""
    return "token_type_ids" in inspect.signature(model.forward).parameters


def epoch_batches(data: Encoded, cfg: TrainConfig, rng: np.random.Generator,
                  total_steps: int) -> list[np.ndarray]:
    """Concatenate epochs of batches (a fresh shuffle each) and cut at total_steps."""
    lengths = data.lengths()
    batches: list[np.ndarray] = []
    while len(batches) < total_steps:
        batches += training_order(lengths, cfg.batch_size, rng, cfg.group_by_length)
    return batches[:total_steps]


def dropout_kind(model: nn.Module, masks: str) -> contextlib.AbstractContextManager:
    """The model's dropout as `TrainConfig.dropout_masks` asks, for the duration of a run."""
    return packed_dropout(model) if masks == "packed" else contextlib.nullcontext()


@contextlib.contextmanager
def embedding_mode(model: nn.Module, mode: str) -> Iterator[list[nn.Parameter]]:
    """Switch the word embedding to sparse gradients or freeze it; restore afterwards.

    An embedding a fine-tuning strategy has frozen stays frozen whatever the mode. Every
    lookup module sharing the word embedding's weight switches together: BART looks the
    shared table up through separate encoder and decoder modules, and one dense lookup
    would make the whole gradient dense."""
    embedding = model.get_input_embeddings()
    lookups = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.weight is embedding.weight]
    was_sparse, was_trainable = [m.sparse for m in lookups], embedding.weight.requires_grad
    try:
        if mode == "sparse" and was_trainable:
            for m in lookups:
                m.sparse = True
            yield [embedding.weight]
        else:
            if mode == "frozen":
                embedding.weight.requires_grad_(False)
            yield []
    finally:
        for m, sparse in zip(lookups, was_sparse):
            m.sparse = sparse
        embedding.weight.requires_grad_(was_trainable)


@contextlib.contextmanager
def frozen_on(modules: Sequence[nn.Module], device: torch.device, model: nn.Module) -> Iterator[None]:
    """Auxiliary modules on the training device, in eval mode and without gradients, for the
    duration of a run; their device, mode and requires_grad flags come back afterwards.

    They stay out of the trained model: a parameter shared with it would be trained (and
    checkpointed) as part of the model, so that is refused.
    """
    own = {id(p) for p in model.parameters()}
    if any(id(p) in own for m in modules for p in m.parameters()):
        raise ValueError("an aux module shares parameters with the trained model; expected modules "
                         "the loss only reads (e.g. a teacher), not parts of the model")
    saved = [(m, m.training, first_device(m), [p.requires_grad for p in m.parameters()]) for m in modules]
    for m in modules:
        m.to(device).eval().requires_grad_(False)
    try:
        yield
    finally:
        for m, training, home, flags in saved:
            m.to(home).train(training)
            for p, flag in zip(m.parameters(), flags):
                p.requires_grad_(flag)


def first_device(module: nn.Module) -> torch.device:
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def named_groups(model: nn.Module, groups: list[dict[str, Any]], sparse_ids: set[int]) -> list[dict[str, Any]]:
    """param_groups' groups with their parameter names replaced by the (trainable) parameters."""
    params = dict(model.named_parameters())
    named = Counter(n for group in groups for n in group["params"])
    unknown = sorted(set(named) - set(params))
    twice = sorted(n for n, count in named.items() if count > 1)
    if unknown or twice:
        raise ValueError(f"param_groups names parameters the model does not have ({unknown[:3]}) "
                         f"or names some twice ({twice[:3]}); expected names from model.named_parameters()")
    if any(id(params[n]) in sparse_ids for n in named):
        raise ValueError("param_groups names the sparse word embedding (SparseAdam updates it); "
                         "use embedding_updates='dense' to give it options of its own")
    return [{**group, "params": [params[n] for n in group["params"] if params[n].requires_grad]}
            for group in groups]


def make_optimizers(model: nn.Module, cfg: TrainConfig, sparse_params: list[nn.Parameter],
                    param_groups: list[dict[str, Any]] = ()) -> list[torch.optim.Optimizer]:
    """AdamW (no decay on biases and LayerNorm) plus SparseAdam for sparse-gradient params;
    or, with cfg.optimizer "sgd", one plain SGD over everything (it takes sparse gradients,
    though not with weight decay: those params get none, as SparseAdam gives them none).

    `param_groups` (parameter names + options) come after the default groups, so the first
    group's rate is still the one progress and StepLog report; the parameters they name
    leave the default groups.
    """
    sparse_ids = {id(p) for p in sparse_params}
    own = [{"weight_decay": cfg.weight_decay, **g} for g in named_groups(model, list(param_groups), sparse_ids)]
    grouped = {id(p) for g in own for p in g["params"]}
    rest = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in grouped]
    if cfg.optimizer == "sgd":
        dense = [p for _, p in rest if id(p) not in sparse_ids]
        sparse = [p for _, p in rest if id(p) in sparse_ids]
        groups = [{"params": dense}, *own] + ([{"params": sparse, "weight_decay": 0.0}] if sparse else [])
        return [torch.optim.SGD(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)]
    decay, no_decay = [], []
    for name, p in rest:
        if id(p) in sparse_ids:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}, *own]
    try:
        optimizers = [torch.optim.AdamW(groups, lr=cfg.lr, fused=True)]
    except (RuntimeError, TypeError):  # a build without the fused CPU kernel
        optimizers = [torch.optim.AdamW(groups, lr=cfg.lr)]
    if sparse_params:
        optimizers.append(torch.optim.SparseAdam(sparse_params, lr=cfg.lr))
    return optimizers


def warmup_then_linear_decay(cfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
    warmup = int(cfg.warmup_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))
    return factor


def clip_dense_gradients(model: nn.Module, max_norm: float | None, optimizer: torch.optim.Optimizer) -> None:
    """Clip the global norm of dense gradients (sparse ones are few rows and left as is).

    With a fused AdamW over them, the clipping factor goes to its kernel as `grad_scale` (the
    divisor it applies to every gradient as it reads it, the hook GradScaler uses) instead of
    a pass that rewrites every gradient first: the same update, one pass over the gradients
    fewer (about 2% of a MiniLM step on 2 cores). Elsewhere torch's clip_grad_norm_ scales them."""
    if max_norm is None:
        return
    params = [p for p in model.parameters() if p.grad is not None and not p.grad.is_sparse]
    if not params:
        return
    if not takes_grad_scale(optimizer):
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    total = torch.nn.utils.get_total_norm([p.grad for p in params])
    # clip_grad_norm_'s factor, min(1, max_norm / (norm + 1e-6)), as the divisor the kernel takes
    optimizer.grad_scale = torch.clamp((total + 1e-6) / max_norm, min=1.0).to(torch.float32)


def takes_grad_scale(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step()` divides gradients by `optimizer.grad_scale`: torch's fused
    Adam and AdamW do (their unfused forms refuse it)."""
    return isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and bool(optimizer.defaults.get("fused"))


@contextlib.contextmanager
def progress_bar(desc: str, total: int, enabled: bool, done: int = 0):
    """Progress on stderr showing loss, samples/s and ETA; yields advance(loss, rate).

    On a terminal it is a live bar; in a log file (CI, background runs) a plain line is
    written every LOG_EVERY_SECONDS instead, since a live bar would only show at the end.
    """
    console = Console(stderr=True)
    if enabled and not console.is_terminal:
        yield log_lines(desc, total, done)
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.4f}"), TextColumn("{task.fields[rate]:.1f} samples/s"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not enabled) as bar:
        task = bar.add_task(desc, total=total, completed=done, loss=float("nan"), rate=0.0)

        def advance(loss: float, rate: float) -> None:
            bar.update(task, advance=1, loss=loss, rate=rate)
        yield advance


LOG_EVERY_SECONDS = 30.0


def log_lines(desc: str, total: int, done: int = 0) -> Callable[[float, float], None]:
    start = last = time.perf_counter()
    resumed_at = done

    def advance(loss: float, rate: float) -> None:
        nonlocal done, last
        done += 1
        now = time.perf_counter()
        if now - last >= LOG_EVERY_SECONDS or done == total:
            last = now
            eta = (now - start) / (done - resumed_at) * (total - done)
            print(f"{desc}: step {done}/{total} loss {loss:.4f} {rate:.1f} samples/s "
                  f"elapsed {now - start:.0f}s ETA {eta:.0f}s", file=sys.stderr, flush=True)
    return advance
