"""Domain-adaptive pretraining: continue masked-LM training on in-domain text, then fine-tune.

The survey's first two-stage variant (Sun et al. 2019, "How to fine-tune BERT for text
classification?": further pretraining on in-domain text; Gururangan et al. 2020, "Don't stop
pretraining"): before fine-tuning, the encoder keeps training with its pretraining objective
on text of the target's domain. Here that objective is the project's `mlm` (15% of tokens,
80/10/10, a fresh mask every step; pretrain/objectives/mlm.py), its batches streamed from the
corpus by `ChunkStream` exactly as `compressor pretrain` streams them, trained by the one loop.

The MLM model is a Transformers `AutoModelForMaskedLM` built from the classifier's config
whose encoder *is* the classifier's encoder (the same module), with the output projection
tied to the shared word embedding. Its head (transform, LayerNorm, output bias) is read
from the checkpoint when the checkpoint has one (a dir `compressor pretrain --objective mlm`
wrote) and freshly initialised otherwise (a sentence encoder such as the bundled MiniLM
ships none). The head is dropped afterwards; the encoder keeps what it learned.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoModelForMaskedLM, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.data.stream import ChunkStream
from pretrain.errors import UserError
from pretrain.families import FAMILIES, families_supporting
from pretrain.objectives import Batch, get_objective
from pretrain.objectives.mlm import masked_lm_loss, vocab_of
from pretrain.pretraining import PretrainBatches, PretrainConfig
from pretrain.train import TrainResult, train

@dataclass(frozen=True)
class DomainResult:
    train: TrainResult
    head: str                 # "checkpoint" (the checkpoint's MLM head) or "fresh"

    def summary(self, corpus: str) -> dict:
        return {"task": f"mlm on {corpus}", "corpus": corpus, "steps": self.train.steps, "samples": self.train.samples,
                "seconds": round(self.train.seconds, 2), "initial_loss": self.train.initial_loss,
                "final_loss": self.train.final_loss, "head": self.head}


def check_domain(cfg: PretrainConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Everything that can fail on bad input, before any training: the family, the tokenizer
    and the corpus (one chunk is read from it)."""
    family = model.config.model_type
    if family not in FAMILIES or not FAMILIES[family].mlm_head:
        raise UserError(f"domain MLM needs a masked-LM head, which model family {family!r} does not have; "
                        f"expected one of: {', '.join(families_supporting('domain-mlm'))}")
    try:
        vocab_of(tokenizer)
    except UserError as err:
        raise UserError(f"domain MLM: {err}") from None
    probe = ChunkStream(cfg.corpus, tokenizer, cfg.max_length, buffer_size=1, seed=cfg.seed, min_tokens=2)
    probe.take(1)


def domain_adapt(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: PretrainConfig,
                 head_from: Path | None = None, desc: str = "domain mlm", show_progress: bool = True
                 ) -> DomainResult:
    """Train `model`'s encoder in place with `cfg.objective` (mlm) on `cfg.corpus` for `cfg.steps` steps."""
    mlm, head = masked_lm_sharing_encoder(model, cfg.seed, head_from)
    stream = ChunkStream(cfg.corpus, tokenizer, cfg.max_length, buffer_size=cfg.buffer_size, seed=cfg.seed,
                         min_tokens=2)
    source = PretrainBatches(get_objective(cfg.objective), stream, tokenizer, cfg)
    # Dense embedding updates: the tied output projection gives the embedding a dense gradient.
    result = train(mlm, source, cfg.train_config(), loss_fn=domain_mlm_loss, desc=desc,
                   show_progress=show_progress)
    return DomainResult(train=result, head=head)


def domain_mlm_loss(model: PreTrainedModel, batch: Batch) -> torch.Tensor:
    """The mlm objective's loss (vocabulary projection on the selected positions only), for any
    family with an MLM head (pretrain/families.py)."""
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
    return masked_lm_loss(hidden, batch["labels"], mlm_head(model))


def mlm_head(model: PreTrainedModel) -> nn.Module:
    """The masked-LM model's prediction head as one module: (N, hidden) -> (N, vocab)."""
    parts = [getattr(model, name) for name in FAMILIES[model.config.model_type].mlm_head]
    return parts[0] if len(parts) == 1 else nn.Sequential(*parts)


def masked_lm_sharing_encoder(model: PreTrainedModel, seed: int, head_from: Path | None
                              ) -> tuple[PreTrainedModel, str]:
    """An MLM model around `model`'s encoder (shared, not copied); (model, where its head came from)."""
    config = copy.deepcopy(model.config)
    torch.manual_seed(seed)                        # a fresh head is drawn from torch's RNG
    mlm = AutoModelForMaskedLM.from_config(config)
    setattr(mlm, mlm.base_model_prefix, model.base_model)
    mlm.tie_weights()                              # output projection = the shared word embedding
    head = "checkpoint" if head_from is not None and load_head(mlm, Path(head_from)) else "fresh"
    return mlm, head


def load_head(mlm: PreTrainedModel, directory: Path) -> bool:
    """Load the MLM head saved in `directory/model.safetensors` if every head tensor is there."""
    weights = directory / "model.safetensors"
    if not weights.is_file():
        return False
    prefix = mlm.base_model_prefix + "."
    seen = {id(t) for k, t in mlm.state_dict(keep_vars=True).items() if k.startswith(prefix)}
    wanted = {}
    for k, t in mlm.state_dict(keep_vars=True).items():
        # A tied tensor is saved once: the projection is the embedding, the decoder bias the head's bias.
        if id(t) not in seen:
            seen.add(id(t))
            wanted[k] = t
    with safe_open(str(weights), framework="pt") as f:
        present = set(f.keys())
        if not all(k in present and tuple(f.get_slice(k).get_shape()) == tuple(t.shape)
                   for k, t in wanted.items()):
            return False
        saved = {k: f.get_tensor(k) for k in wanted}
    mlm.load_state_dict(saved, strict=False)
    return True
