"""`distill-structure`: distil the teacher into a small non-Transformer network (Tang et al. 2019).

The student is a new network of another structure, trained on the task's train split in the
shared loop, on the teacher's logits:

- `kind: bilstm`: the BiLM classifier of pretrain/bilm_model.py with one layer (a
  bidirectional LSTM with projection, ELMo's scalar mix, mean pooling, a linear head);
- `kind: cnn`: the 1-D CNN of pretrain/textcnn.py (Kim 2014; Tang et al.'s CNN kind).

Both read the input bundle's tokenizer, so the teacher scores exactly the batch the student
sees. Loss, as Tang et al.: `alpha` x cross-entropy on the labels + (1 - alpha) x the logit
loss, `mse` between student and teacher logits (their choice) or `kl`
(KL(teacher/T || student/T) x T^2, DistilBERT's). `alpha: 1` trains the same network on
the labels alone, without the teacher: the control that shows what distillation adds.
`augment: {copies, mlm}` adds noised copies of the train texts that only the teacher labels
(Tang et al.'s transfer-set augmentation; distill_augment.py), and `unlabeled_samples: N` the
next N train texts with their labels withheld; the labels' cross-entropy skips both.

Word embeddings (`embeddings`): `teacher` (default) takes the input model's word embedding
projected onto its top `embedding_dim` principal directions (a copy when the widths are
equal); a dir written by `compressor embeddings` gives each whole-word token its word2vec
vector (other rows drawn at the vectors' scale); `random` draws them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from compressor.bundle import ModelBundle
from compressor.passes.distill_augment import (AugmentConfig, check_augment_fit, check_unlabeled_fit,
                                              transfer_data)
from compressor.passes.distill_losses import TeacherLogits, hard_ce, soft_kl
from compressor.passes.registry import Context, Known, Shape, check_teacher_bundle, check_teacher_fits, register
from pretrain.errors import UserError
from pretrain.finetune import DEFAULT_LR, FinetuneConfig, finetune, with_run_defaults
from pretrain.bilm_model import BiLMConfig, BiLMForSequenceClassification
from pretrain.static_embeddings import load_embeddings
from pretrain.textcnn import TextCNNConfig, TextCNNForSequenceClassification
from pretrain.train import Batch, Checkpointing

# A freshly initialised small network learns at Adam's usual 1e-3, not at the 1e-4 that
# suits continuing a pretrained Transformer.
STUDENT_DEFAULT_LR: dict[str, float] = {**DEFAULT_LR, "full": 1e-3}


class DistillStructure(FinetuneConfig):
    """Which network to build and how it learns from the teacher, plus the training settings."""

    default_lr: ClassVar[dict[str, float]] = STUDENT_DEFAULT_LR
    kind: Literal["bilstm", "cnn"]
    embedding_dim: int = Field(256, ge=8)
    hidden_size: int = Field(512, ge=8)            # bilstm: LSTM cell width (above embedding_dim)
    filters: int = Field(128, ge=1)                # cnn: feature maps per kernel size
    kernel_sizes: tuple[int, ...] = Field((3, 4, 5), min_length=1)   # cnn
    dropout: float = Field(0.2, ge=0, lt=1)
    embeddings: str = "teacher"                    # "teacher", "random" or an embeddings dir
    alpha: float = Field(0.0, ge=0, le=1)          # weight of the labels' cross-entropy
    logit_loss: Literal["mse", "kl"] = "mse"
    temperature: float = Field(2.0, gt=0)          # for kl
    augment: AugmentConfig | None = None           # noised copies of the train texts, teacher-labelled
    unlabeled_samples: int = Field(0, ge=0)        # train texts after the labelled ones, teacher-labelled

    @model_validator(mode="after")
    def a_new_network_trains_whole(self) -> DistillStructure:
        if self.strategy != "full":
            raise ValueError(f"strategy {self.strategy!r} does not apply to a new student network; "
                             "expected 'full' (every weight trains)")
        if self.kind == "bilstm" and self.hidden_size <= self.embedding_dim:
            raise ValueError(f"hidden_size ({self.hidden_size}) must exceed embedding_dim ({self.embedding_dim}) "
                             "for kind bilstm: its LSTM cells project down to the embedding width")
        if any(k < 1 for k in self.kernel_sizes):
            raise ValueError(f"kernel_sizes must be positive, got {list(self.kernel_sizes)}")
        if self.augment is not None and self.alpha == 1:
            raise ValueError("augment adds copies that only the teacher's logits label; expected alpha < 1 "
                             "(alpha 1 trains on the labels alone)")
        if self.unlabeled_samples and self.alpha == 1:
            raise ValueError("unlabeled_samples adds texts that only the teacher's logits label; expected "
                             "alpha < 1 (alpha 1 trains on the labels alone)")
        return self

    def input_paths(self) -> dict[str, Path]:
        """Dirs whose content the output depends on beyond the config (for cache keys)."""
        paths = {"augment_mlm": Path(self.augment.mlm)} if self.augment else {}
        if self.embeddings not in ("teacher", "random"):
            paths["embeddings"] = Path(self.embeddings)
        return paths


def structure_shape(cfg: "DistillStructure", known: Known) -> Shape:
    """A BiLSTM or CNN classifier of the same labels and token ids: no Transformer layers for
    later steps. Learning from the teacher needs its vocabulary."""
    if cfg.alpha < 1:
        check_teacher_fits("distill-structure", known.teacher, known.model)
    check_unlabeled_fit(cfg, known)
    check_augment_fit(cfg, known)
    if cfg.embeddings not in ("teacher", "random") and Path(cfg.embeddings).is_dir():
        check_embedding_width(Path(cfg.embeddings), cfg.embedding_dim)   # a missing dir: run.py says so
    return Shape(family="bilm" if cfg.kind == "bilstm" else "textcnn", labels=known.model.labels,
                 vocab=known.model.vocab)


@register("distill-structure", DistillStructure, trains=True, check_shape=structure_shape)
def distill_structure(bundle: ModelBundle, cfg: DistillStructure, ctx: Context) -> ModelBundle:
    """A new BiLSTM or CNN classifier trained on the teacher's logits (and/or the labels)."""
    cfg = with_run_defaults(cfg, ctx.seed, ctx.max_train_samples)
    teacher = ctx.teacher.model if cfg.alpha < 1 else None
    if teacher is not None:
        check_teacher_bundle("distill-structure", ctx.teacher, bundle)
    table = initial_embeddings(bundle.model, bundle.tokenizer, cfg)   # bad input refused before building
    torch.manual_seed(cfg.seed)
    student = build_student(bundle.model, bundle.tokenizer, cfg)
    if table is not None:
        with torch.no_grad():
            student.get_input_embeddings().weight.copy_(table)
    checkpoint = Checkpointing(directory=ctx.work_dir / "distill-structure") if ctx.work_dir else None
    record: dict = {}
    task, train_cfg = transfer_data(cfg, ctx, record)
    logits = TeacherLogits(teacher) if teacher is not None else None
    finetune(student, bundle.tokenizer, task, train_cfg, desc=f"distill-structure ({cfg.kind})",
             show_progress=ctx.show_progress, loss_fn=student_loss(logits, cfg), checkpoint=checkpoint,
             aux_modules=[logits.reader] if logits is not None else [])
    # Deployment settings that name the old model's layers (qat ranges, kept-float layers) do
    # not carry over to a new network; the requested precision does.
    deploy = {key: value for key, value in bundle.deploy.items() if key == "quantize"}
    if record:
        deploy["distill-structure"] = record
    return bundle.replace(model=student, deploy=deploy)


def build_student(source: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                  cfg: DistillStructure) -> PreTrainedModel:
    labels = {"num_labels": source.config.num_labels, "id2label": dict(source.config.id2label),
              "label2id": dict(source.config.label2id)}
    vocab = {"vocab_size": source.get_input_embeddings().weight.shape[0],
             "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0}
    if cfg.kind == "bilstm":
        config = BiLMConfig(embedding_dim=cfg.embedding_dim, hidden_size=cfg.hidden_size, num_layers=1,
                            dropout=cfg.dropout, **vocab, **labels)
        return BiLMForSequenceClassification(config)
    config = TextCNNConfig(embedding_dim=cfg.embedding_dim, kernel_sizes=cfg.kernel_sizes, filters=cfg.filters,
                           dropout=cfg.dropout, **vocab, **labels)
    return TextCNNForSequenceClassification(config)


def initial_embeddings(source: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                       cfg: DistillStructure) -> torch.Tensor | None:
    """The student's word-embedding table [vocab, embedding_dim], or None for `random`."""
    if cfg.embeddings == "random":
        return None
    weight = getattr(source.get_input_embeddings(), "weight", None)
    if weight is None:
        raise UserError("distill-structure: the model's word embedding is not one matrix (factorized?); "
                        "expected embeddings: random or an embeddings dir")
    if cfg.embeddings == "teacher":
        table = principal_projection(weight.detach().float(), cfg.embedding_dim)
    else:
        table = static_table(Path(cfg.embeddings), tokenizer, weight.shape[0], cfg.embedding_dim, cfg.seed)
    if tokenizer.pad_token_id is not None:
        table[tokenizer.pad_token_id] = 0.0     # padding carries nothing (padding_idx keeps it so)
    return table


def principal_projection(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows of `weight` [V, H] in its top-`dim` principal directions [V, dim] (a copy if dim == H)."""
    width = weight.shape[1]
    if dim > width:
        raise UserError(f"distill-structure: embedding_dim {dim} exceeds the model's embedding width {width}; "
                        f"expected at most {width} with embeddings: teacher")
    if dim == width:
        return weight.clone()
    centered = weight - weight.mean(0)
    _, _, directions = torch.linalg.svd(centered, full_matrices=False)   # [H, H], rows by variance
    return centered @ directions[:dim].T                                  # [V, H] @ [H, dim]


def check_embedding_width(directory: Path, dim: int, matrix: np.ndarray | None = None) -> None:
    """The embeddings dir's vectors have `embedding_dim` components (read without loading them)."""
    if matrix is None:
        try:
            matrix = np.load(directory / "embeddings.npy", mmap_mode="r")
        except (OSError, ValueError) as err:
            raise UserError(f"distill-structure: {directory} is not an embeddings dir (embeddings.npy + vocab.txt): "
                            f"{err}") from None
    if matrix.ndim != 2 or matrix.shape[1] != dim:
        width = matrix.shape[1] if matrix.ndim == 2 else "?"
        raise UserError(f"distill-structure: the embeddings in {directory} are {width}-dimensional; "
                        f"expected embedding_dim: {width}")


def static_table(directory: Path, tokenizer: PreTrainedTokenizerBase, rows: int, dim: int,
                 seed: int) -> torch.Tensor:
    """word2vec vectors for the tokens that are whole words of the embeddings' vocabulary.

    WordPiece continuation pieces (##ing) and words the corpus lacked get random rows at the
    vectors' own scale, so they start neither dominant nor silent.
    """
    if not directory.is_dir():
        raise UserError(f"distill-structure: embeddings {str(directory)!r} is neither 'teacher', 'random' "
                        "nor a dir written by `compressor embeddings`")
    words, matrix = load_embeddings(directory)
    check_embedding_width(directory, dim, matrix)
    generator = np.random.default_rng(seed)
    table = generator.normal(0.0, float(matrix.std()), size=(rows, dim)).astype(np.float32)
    index = {word: i for i, word in enumerate(words)}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id < rows and token in index:
            table[token_id] = matrix[index[token]]
    return torch.from_numpy(table)


def student_loss(teacher_logits: TeacherLogits | None, cfg: DistillStructure):
    """alpha x CE(labels) + (1 - alpha) x logit loss against the teacher (Tang et al. 2019);
    the teacher's logits come once per example (TeacherLogits)."""
    def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        # hard_ce skips augmented copies (no label); they learn from the teacher alone
        total = cfg.alpha * hard_ce(logits, batch["labels"]) if cfg.alpha > 0 else logits.new_zeros(())
        if teacher_logits is None:
            return total
        return total + (1 - cfg.alpha) * logit_loss(logits, teacher_logits(batch), cfg)
    return loss


def logit_loss(student: torch.Tensor, teacher: torch.Tensor, cfg: DistillStructure) -> torch.Tensor:
    if cfg.logit_loss == "mse":
        return F.mse_loss(student, teacher)
    return soft_kl(student, teacher, cfg.temperature)
