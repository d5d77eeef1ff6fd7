"""Quantization passes: `quantize` (choose the precision), `qat`, `sensitivity`.

ONNX Runtime quantization acts on the exported graph, so these passes record what the
exporter should do on the bundle (`deploy`, saved in compressor.json) and the exporter
quantizes, then gates accuracy, when the recipe's `export:` section is on:

    deploy["quantize"]     the precision (QuantizeConfig)
    deploy["qat"]          activation ranges learned by quantization-aware training
    deploy["sensitivity"]  the Linear layers to keep in float, with every layer's score

`quantize` and `sensitivity` leave the torch weights as they are (preserves_function);
`qat` trains them with fake quantization in the loop.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from pydantic import Field, model_validator

from compressor.bundle import ModelBundle
from compressor.export.quantize import QuantizeConfig, StaticInt8Config, check_quantize_family
from compressor.modeling.fake_quant import input_maxima, linear_layers, one_layer_quantized, q8bert_fake_quant
from compressor.modeling.importance import encode_for_model
from compressor.passes.registry import Context, PassConfig, register, word_embedding_training
from compressor.passes.training import CHECKPOINT_EVERY
from pretrain.batching import Encoded, in_data_order
from pretrain.data import TaskData
from pretrain.errors import UserError
from pretrain.families import FAMILIES, TRANSFORMER_FAMILIES
from pretrain.finetune import DEFAULT_LR, FinetuneConfig, finetune, with_run_defaults
from pretrain.train import Checkpointing, accepts_token_types

QAT_CALIBRATION_SAMPLES = 128   # for a Linear QAT did not observe (all others use QAT's ranges)


@register("quantize", QuantizeConfig, preserves_function=True, check_family=check_quantize_family)
def quantize_pass(bundle: ModelBundle, cfg: QuantizeConfig, ctx: Context) -> ModelBundle:
    # `cfg` is the mode's own config type (QuantizeConfig.model_validate picks it).
    # A copy, not the input model: passes never hand their input on (the registry checks),
    # and later passes may train this one.
    return bundle.replace(model=bundle.copy_model(),
                          deploy={**bundle.deploy, "quantize": cfg.model_dump(mode="json")})


# QAT's rate when the pass names none, by strategy. `full`: QAT starts from a trained model,
# so a small continuation rate (Q8BERT fine-tunes at 2e-5). The other strategies train only
# their own modules (adapters, a head on frozen features), which a full-model rate hardly
# moves: they keep their fine-tuning defaults (DEFAULT_LR; not measured under QAT).
QAT_DEFAULT_LR: dict[str, float] = {**DEFAULT_LR, "full": 2e-5}


class QATConfig(FinetuneConfig):
    """Fine-tuning settings for quantization-aware training, plus the range statistics."""

    default_lr: ClassVar[dict[str, float]] = QAT_DEFAULT_LR
    ema_decay: float = Field(0.9999, gt=0, lt=1)   # activation-range EMA (Q8BERT's value)

    @model_validator(mode="after")
    def fp32_only(self) -> "QATConfig":
        # Fake quantization rounds fp32 values onto the int8 grid the export will use; under
        # bf16 autocast the products it simulates would not be the ones the export runs.
        if self.precision != "fp32":
            raise ValueError(f"qat trains in fp32 (it simulates int8 on fp32 products); got precision "
                             f"{self.precision!r}")
        return self


def check_qat_family(cfg: QATConfig, family: str) -> None:
    """Refuse a family whose blocks are not Linear layers (the BiLM's LSTMs, the CNN's
    convolutions): QAT would train only the classifier head and word embedding quantized, and
    its `scope: linears` export would keep the rest in float, larger than plain dynamic int8."""
    if not has_linear_blocks(family):
        raise UserError(f"qat: a {family!r} model has no Linear layers to train quantized but its classifier head "
                        f"(its {blocks_of(family)} would stay float in the export it sets); expected quantize: "
                        f"{{mode: dynamic-int8}} for a {family} model, or qat on a model with Linear layers in "
                        f"every block (families {', '.join(TRANSFORMER_FAMILIES)})")


def has_linear_blocks(family: str) -> bool:
    return family in TRANSFORMER_FAMILIES or (family in FAMILIES and bool(FAMILIES[family].layer_groups))


def blocks_of(family: str) -> str:
    """What a family without Linear blocks computes with, for its refusals."""
    return {"bilm": "LSTMs", "textcnn": "convolutions"}.get(family, "blocks")


@register("qat", QATConfig, trains=True, names_layers=True, trains_embedding=word_embedding_training,
          check_family=check_qat_family)
def qat_pass(bundle: ModelBundle, cfg: QATConfig, ctx: Context) -> ModelBundle:
    """Q8BERT quantization-aware training, then an int8 export that uses the learned ranges.

    Training is the shared loop (`finetune`, the model's own cross-entropy) with every
    Linear's weight and input and the word embedding fake-quantized
    (compressor/modeling/fake_quant.py). The export quantizes exactly those tensors and no
    others: static int8 with `scope: linears`, per-tensor symmetric weights as trained, and
    each Linear's input range the EMA threshold learned here instead of a calibrated one.
    (The same export without QAT, `quantize: {mode: static-int8, scope: linears,
    per_channel: false, calibration: minmax}`, is the baseline QAT is measured against.)
    """
    cfg = with_run_defaults(cfg, ctx.seed, ctx.max_train_samples)
    model = bundle.copy_model()
    # Checkpoints in the stage's work dir, as `finetune` does: the learned ranges are buffers
    # of the fake-quantized model, so a stopped QAT resumes with them, not from its first step.
    checkpoint = Checkpointing(directory=ctx.work_dir, every_steps=CHECKPOINT_EVERY) if ctx.work_dir else None
    with q8bert_fake_quant(model, cfg.ema_decay) as ranges:
        result = finetune(model, bundle.tokenizer, ctx.task, cfg, desc="qat", show_progress=ctx.show_progress,
                          checkpoint=checkpoint)
    thresholds = {name: float(r.threshold) for name, r in ranges.items() if r.observed}
    calibration = min(QAT_CALIBRATION_SAMPLES, len(ctx.task.split("train")))
    # Calibration only covers a Linear the training never reached (every other range is
    # QAT's); MinMax, as Q8BERT's ranges are max-based too.
    export = StaticInt8Config(scope="linears", per_channel=False, calibration="minmax",
                              calibration_samples=calibration)
    qat = {"activation_ranges": thresholds, "ema_decay": cfg.ema_decay, "steps": result.train.steps,
           "samples": result.train.samples, "final_loss": result.train.final_loss}
    return bundle.replace(model=model, deploy={**bundle.deploy, "quantize": export.model_dump(mode="json"),
                                               "qat": qat})


class SensitivityConfig(PassConfig):
    keep_fraction: float = Field(0.1, gt=0, lt=1)   # most sensitive share of Linear layers kept in float
    samples: int = Field(256, ge=1)                  # first N train examples the loss is measured on
    # 32, not 64: each Linear costs one pass over the samples, and a batch pads to its longest
    # member; on 128 WordNet glosses 32 took 17 s where 64 took 23 (benchmarks/README.md)
    batch_size: int = Field(32, ge=1)


def check_rankable(cfg: SensitivityConfig, family: str) -> None:
    """Refuse a family whose Linear layers are no ranking: the BiLM.

    The pass scores Linear layers (what the int8 exports quantize in every Transformer
    block). A BiLM's only Linear layer is its classifier head; its LSTMs, where its
    quantization error arises, are not Linear layers, so a ranking would always keep the
    head in float and say nothing about the LSTMs.
    """
    if not has_linear_blocks(family):
        raise UserError(f"sensitivity: a {family!r} model has no Linear layers to rank but its classifier "
                        f"head (its {blocks_of(family)} are not scored); expected a model with Linear layers in every "
                        f"block (families {', '.join(TRANSFORMER_FAMILIES)})")


@register("sensitivity", SensitivityConfig, preserves_function=True, check_family=check_rankable, names_layers=True)
def sensitivity_pass(bundle: ModelBundle, cfg: SensitivityConfig, ctx: Context) -> ModelBundle:
    """Per-layer sensitivity: how far the model moves when only that Linear is quantized to int8.

    Each Linear in turn gets per-channel int8 weights and an int8 input over its observed
    range (what static int8 does to it), all others stay float. The score is the mean KL
    divergence of the model's predictions from the float model's on a slice of the train
    split; the change of the task loss is recorded beside it. (Ranking by the loss change
    alone is noisy on a few hundred examples and can reward a layer whose quantization
    happens to lower the loss there; the divergence is what the export's agreement with
    fp32 measures.) The highest-scoring fraction is recorded for the int8 export to leave
    in float (nodes_to_exclude).
    """
    model = bundle.copy_model().eval()
    data = sensitivity_data(bundle, ctx.task, cfg.samples)
    with torch.no_grad():
        with input_maxima(model) as maxima:
            base_loss, base_logp = predictions(model, data, cfg.batch_size)
        divergence, loss_change = {}, {}
        for name, linear in linear_layers(model).items():
            if name in maxima:   # a Linear the forward never reaches has no range and no effect
                with one_layer_quantized(linear, maxima[name]):
                    loss, logp = predictions(model, data, cfg.batch_size)
                divergence[name] = float((base_logp.exp() * (base_logp - logp)).sum(dim=1).mean())
                loss_change[name] = loss - base_loss
    ranked = sorted(divergence, key=divergence.get, reverse=True)
    keep = ranked[:max(1, math.ceil(cfg.keep_fraction * len(ranked)))]
    record = {"keep": keep, "keep_fraction": cfg.keep_fraction, "samples": len(data),
              "score": "mean KL(fp32 || only this layer int8)", "baseline_loss": base_loss,
              "divergence": {name: divergence[name] for name in ranked},
              "loss_change": {name: loss_change[name] for name in ranked}}
    return bundle.replace(model=model, deploy={**bundle.deploy, "sensitivity": record})


def sensitivity_data(bundle: ModelBundle, task: TaskData, samples: int) -> Encoded:
    """The first train examples, labelled with the model's class ids."""
    train = task.split("train")
    if len(train) < samples:
        raise UserError(f"sensitivity: samples={samples} but the train split of {task.name!r} has "
                        f"{len(train)} examples; lower samples to at most {len(train)}")
    return encode_for_model(bundle.model, bundle.tokenizer, task, train.head(samples), bundle.max_length)


def predictions(model: torch.nn.Module, data: Encoded, batch_size: int) -> tuple[float, torch.Tensor]:
    """Mean task loss and the log-probabilities of every example (in data order)."""
    losses = []

    def log_softmax(batch: dict) -> torch.Tensor:
        out = model(**batch)
        losses.append(float(out.loss) * len(batch["labels"]))
        return torch.log_softmax(out.logits.float(), dim=-1)
    log_probs = in_data_order(data, batch_size, log_softmax, accepts_token_types(model),
                              columns=model.config.num_labels)
    return sum(losses) / len(data), torch.from_numpy(log_probs)
