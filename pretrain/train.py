"""The one training loop.

Every stage that trains (fine-tuning, and later pretraining, distillation, module
replacing, quantization-aware training) calls `train` with its own `loss_fn(model, batch)`.
The loop owns batching, the optimizer, the schedule, clipping and the progress bar.

Where the time goes on a small CPU, and what the loop does about it:
- padding: batches are padded to their longest member and grouped by length (batching.py);
- the word-embedding matrix (half of MiniLM's 22.7M parameters) would get a dense
  30522 x 384 gradient and a dense AdamW update every step although a batch touches a few
  hundred rows. With `embedding_updates="sparse"` the embedding emits a sparse gradient
  and SparseAdam updates only the rows seen (`"frozen"` skips them, `"dense"` is the
  textbook behaviour);
- the optimizer step over the dense parameters uses the fused AdamW kernel.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from torch import nn

from pretrain.batching import Encoded, iterate, training_order

LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


class TrainConfig(BaseModel):
    """Optimisation settings shared by every stage that trains."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epochs: float = Field(1.0, gt=0)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)
    max_grad_norm: float | None = Field(1.0, gt=0)
    seed: int = 0
    embedding_updates: Literal["sparse", "dense", "frozen"] = "sparse"
    group_by_length: bool = True


@dataclass
class TrainResult:
    steps: int
    samples: int
    seconds: float
    losses: list[float] = field(repr=False)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def final_loss(self) -> float:
        tail = self.losses[-50:]
        return float(np.mean(tail)) if tail else float("nan")


def task_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's own loss (cross-entropy for a classification head)."""
    return model(**batch).loss


def train(model: nn.Module, data: Encoded, cfg: TrainConfig, loss_fn: LossFn = task_loss,
          desc: str = "training", show_progress: bool = True) -> TrainResult:
    """Train `model` in place on `data` and return what happened."""
    if len(data) == 0:
        raise ValueError("no training examples")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    steps_per_epoch = math.ceil(len(data) / cfg.batch_size)
    total_steps = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    wants_token_types = accepts_token_types(model)

    model.train()
    losses: list[float] = []
    samples = 0
    start = time.perf_counter()
    with embedding_mode(model, cfg.embedding_updates) as sparse_params:
        optimizers = make_optimizers(model, cfg, sparse_params)
        schedules = [torch.optim.lr_scheduler.LambdaLR(o, warmup_then_linear_decay(cfg, total_steps))
                     for o in optimizers]
        with progress_bar(desc, total_steps, show_progress) as advance:
            for _, batch in iterate(data, epoch_batches(data, cfg, rng, total_steps), wants_token_types):
                loss = loss_fn(model, batch)
                loss.backward()
                clip_dense_gradients(model, cfg.max_grad_norm)
                for opt, sched in zip(optimizers, schedules):
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
                samples += len(batch["input_ids"])
                advance(losses[-1], samples / (time.perf_counter() - start))
    model.eval()
    return TrainResult(steps=len(losses), samples=samples,
                       seconds=time.perf_counter() - start, losses=losses)


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


@contextlib.contextmanager
def embedding_mode(model: nn.Module, mode: str) -> Iterator[list[nn.Parameter]]:
    """Switch the word embedding to sparse gradients or freeze it; restore afterwards."""
    embedding = model.get_input_embeddings()
    was_sparse, was_trainable = embedding.sparse, embedding.weight.requires_grad
    try:
        if mode == "sparse":
            embedding.sparse = True
            yield [embedding.weight]
        else:
            if mode == "frozen":
                embedding.weight.requires_grad_(False)
            yield []
    finally:
        embedding.sparse = was_sparse
        embedding.weight.requires_grad_(was_trainable)


def make_optimizers(model: nn.Module, cfg: TrainConfig, sparse_params: list[nn.Parameter]
                    ) -> list[torch.optim.Optimizer]:
    """AdamW (no decay on biases and LayerNorm) plus SparseAdam for sparse-gradient params."""
    sparse_ids = {id(p) for p in sparse_params}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in sparse_ids:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
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


def clip_dense_gradients(model: nn.Module, max_norm: float | None) -> None:
    """Clip the global norm of dense gradients (sparse ones are few rows and left as is)."""
    if max_norm is None:
        return
    grads = [p for p in model.parameters() if p.grad is not None and not p.grad.is_sparse]
    if grads:
        torch.nn.utils.clip_grad_norm_(grads, max_norm)


@contextlib.contextmanager
def progress_bar(desc: str, total: int, enabled: bool):
    """Progress on stderr showing loss, samples/s and ETA; yields advance(loss, rate).

    On a terminal it is a live bar; in a log file (CI, background runs) a plain line is
    written every LOG_EVERY_SECONDS instead, since a live bar would only show at the end.
    """
    console = Console(stderr=True)
    if enabled and not console.is_terminal:
        yield log_lines(desc, total)
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.4f}"), TextColumn("{task.fields[rate]:.1f} samples/s"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not enabled) as bar:
        task = bar.add_task(desc, total=total, loss=float("nan"), rate=0.0)

        def advance(loss: float, rate: float) -> None:
            bar.update(task, advance=1, loss=loss, rate=rate)
        yield advance


LOG_EVERY_SECONDS = 30.0


def log_lines(desc: str, total: int) -> Callable[[float, float], None]:
    start = last = time.perf_counter()
    done = 0

    def advance(loss: float, rate: float) -> None:
        nonlocal done, last
        done += 1
        now = time.perf_counter()
        if now - last >= LOG_EVERY_SECONDS or done == total:
            last = now
            eta = (now - start) / done * (total - done)
            print(f"{desc}: step {done}/{total} loss {loss:.4f} {rate:.1f} samples/s "
                  f"elapsed {now - start:.0f}s ETA {eta:.0f}s", file=sys.stderr, flush=True)
    return advance
