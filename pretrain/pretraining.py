"""`compressor pretrain`: pretrain a Transformers model from scratch with a named objective
(or, `init`, continue a BERT model's masked-LM pretraining on a corpus).

The pieces: a tokenizer (MiniLM's by default, or one `compressor tokenizer` trained), a
`ChunkStream` over the corpus (bounded memory, resumable position), an objective from the
registry (model, batches, loss), and the project's one loop (`pretrain.train.train`) with
its checkpointing. Batches are built per step: `batch_size` chunks from the stream, masked
or paired by the objective with a generator seeded by (seed, step), so a resumed run draws
exactly what the uninterrupted run would have drawn.

The command (compressor/cli/pretrain_command.py) writes the objective's deliverable as an HF
model dir (config, safetensors weights, tokenizer) plus `metrics.json` in one rename when
training ends. Checkpoints go to the sibling dir `<out>.checkpoint/`, removed once the output
is written; `--resume` continues from it, after `check_resume` (pretrain/resume.py) has
confirmed it was written with the same settings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import AutoConfig, BertForMaskedLM, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.data import check_utf8
from pretrain.data.stream import ChunkStream
from pretrain.errors import UserError, number_problem, validation_message
from pretrain.limits import MAX_SEED
from pretrain.models import check_model_ref, count_params, load_tokenizer, load_weights, resolve_model_path
from pretrain.objectives import SIZES, Batch, Objective, get_objective
from pretrain.train import Checkpointing, StepCallback, TrainConfig, train

MAX_POSITIONS = 512          # BERT's position table; longer sequences need another architecture
SETTINGS_FILE = "pretrain_settings.json"
CONTINUABLE = ("mlm", "mlm-wwm")     # objectives whose model is a plain BertForMaskedLM (--init)


class PretrainConfig(BaseModel):
    """Everything that decides what a pretraining run computes (a resume must match it)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    objective: str
    objective_options: str = ""              # canonical options string (dae: its noise functions)
    corpus: str
    size: str = "small"
    tokenizer: str = "minilm"
    steps: int = Field(1000, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(5e-4, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)
    max_length: int = Field(128, ge=8, le=MAX_POSITIONS)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    buffer_size: int = Field(10_000, ge=1)   # chunks held by the shuffle buffer
    # Continued pretraining (mlm, mlm-wwm): start from this BERT model's weights ('minilm' or an
    # HF dir) instead of a fresh `size` model; its MLM head is trained (drawn fresh if it has none).
    init: str | None = None

    def train_config(self) -> TrainConfig:
        # Dense embedding updates: MLM heads tie the output projection to the word
        # embedding, whose gradient is then dense anyway (SparseAdam would refuse it).
        return TrainConfig(batch_size=self.batch_size, lr=self.lr, weight_decay=self.weight_decay,
                           warmup_ratio=self.warmup_ratio, seed=self.seed, embedding_updates="dense")


class PretrainBatches:
    """The loop's batch source: step -> the objective's batch of the next chunks."""

    def __init__(self, objective: Objective, stream: ChunkStream, tokenizer: PreTrainedTokenizerBase,
                 cfg: PretrainConfig):
        self.objective, self.stream, self.tokenizer, self.cfg = objective, stream, tokenizer, cfg
        self.steps = cfg.steps

    def batch(self, step: int) -> Batch:
        docs = self.stream.take(self.cfg.batch_size)
        rng = np.random.default_rng((self.cfg.seed, step))   # masks drawn afresh every step
        return self.objective.make_batch(docs, self.tokenizer, rng, self.cfg.max_length)

    def state_dict(self) -> dict:
        return self.stream.state()

    def load_state_dict(self, state: dict) -> None:
        self.stream.restore(state)


def make_config(**settings) -> PretrainConfig:
    # Paths are recorded absolute: a resume from another working dir must match.
    for key in ("corpus", "tokenizer", "init"):
        if settings.get(key) and Path(settings[key]).exists():
            settings[key] = str(Path(settings[key]).resolve())
    try:
        cfg = PretrainConfig(**{k: v for k, v in settings.items() if v is not None})
    except ValidationError as err:     # named by the flag that set it: settings are `pretrain`'s flags
        first = err.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else None
        field = PretrainConfig.model_fields.get(name) if len(first["loc"]) == 1 else None
        problem = number_problem(first, field) or validation_message(first)
        raise UserError(f"{'--' + name.replace('_', '-') if name else 'pretrain settings'}: {problem}") from None
    if cfg.size not in SIZES:
        raise UserError(f"unknown size {cfg.size!r}; expected one of {', '.join(SIZES)}")
    if cfg.init is not None and cfg.objective not in CONTINUABLE:
        raise UserError(f"--init continues masked-LM pretraining; --objective {cfg.objective} builds its own "
                        f"model: expected --objective {' or '.join(CONTINUABLE)}, or no --init")
    if cfg.objective_options:   # validated now; stored canonical, so equal options resume alike
        canonical = get_objective(cfg.objective, cfg.objective_options).options
        cfg = cfg.model_copy(update={"objective_options": canonical})
    return cfg


def objective_options(objective: str, dae_noise: str | None = None, mask_ratio: float | None = None,
                      options: tuple[str, ...] = ()) -> str:
    """The options string from the command's flags: `--dae-noise` and `--mask-ratio` (dae
    only) and any `--objective-option KEY[=VALUE]`."""
    if objective != "dae":
        if dae_noise is not None or mask_ratio is not None:
            raise UserError(f"--dae-noise and --mask-ratio configure --objective dae, not {objective!r}; "
                            "expected --objective dae or neither flag")
        return ",".join(options)
    from pretrain.objectives.dae import compose_options
    return compose_options(dae_noise, mask_ratio, options)


def load_pretrain_tokenizer(ref: str) -> PreTrainedTokenizerBase:
    if ref == "minilm":
        return load_tokenizer(resolve_model_path("minilm"))
    path = Path(ref)
    if not path.is_dir():
        raise UserError(f"tokenizer {ref!r} not found: expected a dir written by `compressor tokenizer` "
                        "(or any HF tokenizer dir) or 'minilm'")
    return load_tokenizer(path)


def prepare(cfg: PretrainConfig) -> tuple[Objective, PreTrainedTokenizerBase, PreTrainedModel]:
    """Everything that can fail on bad input, done before anything is written: the objective,
    the tokenizer and the model to train (built once; an --init model is read once).

    One batch is built from a separate stream: an empty corpus, a batch too small for the
    objective or a tokenizer it cannot use fails here.
    """
    objective = get_objective(cfg.objective, cfg.objective_options)
    if Path(cfg.corpus).is_file():
        check_utf8(Path(cfg.corpus))      # the whole file, before the first checkpoint
    if cfg.init is not None:              # named as --init, before its tokenizer is looked for
        try:
            check_model_ref(cfg.init)
        except UserError as err:
            raise UserError(f"--init: {err}") from None
    tokenizer = load_pretrain_tokenizer(cfg.tokenizer)
    model = build_model(objective, tokenizer, cfg)
    probe = ChunkStream(cfg.corpus, tokenizer, cfg.max_length, buffer_size=1, seed=cfg.seed, min_tokens=2)
    objective.make_batch(probe.take(cfg.batch_size), tokenizer, np.random.default_rng(0), cfg.max_length)
    return objective, tokenizer, model


def build_model(objective: Objective, tokenizer: PreTrainedTokenizerBase, cfg: PretrainConfig) -> PreTrainedModel:
    """The objective's fresh model of `cfg.size`, or (`init`) an existing BERT as a masked LM."""
    if cfg.init is None:
        return objective.build_model(tokenizer, SIZES[cfg.size], cfg.max_length, cfg.seed)
    path = resolve_model_path(cfg.init)           # checked by prepare, named as --init
    config = AutoConfig.from_pretrained(path)
    if config.model_type != "bert":
        raise UserError(f"--init {cfg.init}: a {config.model_type!r} model; continued masked-LM pretraining "
                        "starts from a BERT model (the mlm objectives' architecture)")
    if cfg.max_length > config.max_position_embeddings:
        raise UserError(f"max length {cfg.max_length} is longer than --init's {config.max_position_embeddings} "
                        f"positions; expected at most {config.max_position_embeddings}")
    init_vocab = load_tokenizer(path).get_vocab() if (path / "vocab.txt").is_file() or \
        (path / "tokenizer.json").is_file() else None
    if init_vocab is not None and init_vocab != tokenizer.get_vocab():
        raise UserError(f"--tokenizer {cfg.tokenizer} has another vocabulary than --init {cfg.init}; expected "
                        "the init model's own tokenizer (its embedding rows are its token ids)")
    torch.manual_seed(cfg.seed)                 # a missing MLM head is drawn from torch's RNG
    # Checked as a checkpoint to fine-tune is: the MLM head may be new, but the embeddings
    # and layers must be the file's (a config.json of 7 layers beside 6 would draw one).
    try:
        return load_weights(config, path, as_is=False, model_class=BertForMaskedLM)
    except UserError as err:
        raise UserError(f"--init: {err}") from None


def run_pretraining(cfg: PretrainConfig, objective: Objective, tokenizer: PreTrainedTokenizerBase,
                    model: PreTrainedModel, ckpt: Path, show_progress: bool = True, checkpoint_every: int = 200,
                    callbacks: tuple[StepCallback, ...] = ()) -> tuple[PreTrainedModel, dict]:
    """Train `model` (prepare's; resuming from `ckpt` if it holds this run's checkpoint):
    (deliverable, metrics)."""
    stream = ChunkStream(cfg.corpus, tokenizer, cfg.max_length, buffer_size=cfg.buffer_size,
                         seed=cfg.seed, min_tokens=2)
    source = PretrainBatches(objective, stream, tokenizer, cfg)
    result = train(model, source, cfg.train_config(), loss_fn=objective.loss,
                   desc=f"pretrain {cfg.objective}", show_progress=show_progress,
                   checkpoint=Checkpointing(directory=ckpt, every_steps=checkpoint_every),
                   callbacks=callbacks)
    delivered = objective.deliverable(model)
    # Recorded in config.json, so the model says where it came from.
    delivered.config.pretraining = {"objective": cfg.objective, "objective_options": cfg.objective_options,
                                    "steps": result.steps, "corpus": cfg.corpus, "init": cfg.init}
    metrics = {"objective": cfg.objective, "objective_options": cfg.objective_options, "steps": result.steps, "samples": result.samples,
               "tokens": result.tokens, "initial_loss": result.initial_loss, "final_loss": result.final_loss,
               "tokens_per_second": round(result.tokens_per_second, 1),
               "samples_per_second": round(result.samples_per_second, 2),
               "train_seconds": round(result.seconds, 2), "architecture": type(delivered).__name__,
               "params": count_params(delivered), "config": cfg.model_dump(mode="json"),
               "loss_curve": loss_curve(result.losses)}
    return delivered, metrics


def loss_curve(losses: list[float], points: int = 50) -> list[list[float]]:
    """[step, mean loss] at about `points` evenly spaced places (the whole list is too long)."""
    if not losses:
        return []
    edges = np.linspace(0, len(losses), min(points, len(losses)) + 1).astype(int)
    return [[int(hi), float(np.mean(losses[lo:hi]))] for lo, hi in zip(edges[:-1], edges[1:])]
