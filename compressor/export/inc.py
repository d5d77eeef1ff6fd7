"""`inc`: Intel Neural Compressor accuracy-aware post-training quantization, shipped as ONNX.

What INC 3.x's PyTorch API offers on a CPU without intel-extension-for-pytorch: weight-only
quantization (RTN, GPTQ, AWQ, ...) and PT2E static/dynamic int8, which quantizes a
`torch.export` graph into a GraphModule of reference quantize/dequantize ops. That
GraphModule cannot become ONNX here: the TorchScript exporter has no symbolics for the
quantized_decomposed ops and the dynamo exporter needs onnxscript, which is not a
dependency. So INC does what it is good at, and ONNX Runtime realises the result:

1. the model is exported with torch.export (dynamic batch and sequence) and INC's
   `autotune` quantizes it with each candidate DynamicQuantConfig (symmetric int8 weights,
   per-channel or per-tensor; int8 activations quantized per batch), evaluating each
   INC-quantized PyTorch model on validation examples until one keeps the accuracy within
   `tolerable_loss` (relative, as INC defines it) or `max_trials` is spent;
2. the configuration INC chose is realised in the exported graph by ONNX Runtime's dynamic
   int8 quantization with the same weight granularity (both quantize weights
   per channel or tensor with round-to-nearest, and activations per batch, uint8 with a
   zero point), and that graph goes through the same accuracy gate as every other mode.

The export record keeps every trial (config, validation accuracy) and the choice. A
`sensitivity` pass's kept layers stay float in the realised graph, as with dynamic-int8.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings
import numpy as np
import torch

from compressor.bundle import ModelBundle
from compressor.export.quantize import DynamicInt8Config, IncConfig
from pretrain.batching import Encoded, in_data_order, iterate
from pretrain.errors import UserError
from pretrain.models import first_line
from pretrain.train import accepts_token_types

EVAL_BATCH = 64


def candidates(cfg: IncConfig) -> list[dict]:
    """The weight granularities, the requested one first.

    Symmetric int8 weights only: INC's x86 PT2E quantizer rejects asymmetric per-channel
    weights ("Unsupported quantization_spec"), and ORT's dynamic activations are uint8 with
    a zero point whatever INC's act_sym says, so neither symmetry is a real choice here.
    """
    granularities = ["per_channel", "per_tensor"] if cfg.per_channel else ["per_tensor", "per_channel"]
    return [{"w_granularity": g, "w_sym": True} for g in granularities][:cfg.max_trials]


def inc_choice(bundle: ModelBundle, cfg: IncConfig, validation: Encoded | None,
               gate) -> tuple[DynamicInt8Config, dict]:
    """Run INC's autotune on the torch model; return the ORT config that realises its choice."""
    if validation is None or len(validation) == 0:
        raise ValueError("inc needs validation examples")
    to_task = gate.to_task
    labels = np.asarray(validation.labels)
    example = example_batch(bundle.model, validation)
    accuracies: list[float] = []

    def eval_fn(model) -> float:
        logits = graph_logits(model, validation, list(example))
        accuracies.append(float(np.mean(to_task[logits.argmax(axis=1)] == labels)))
        return accuracies[-1]

    options = candidates(cfg)
    with inc_quiet():
        from neural_compressor.torch.quantization import DynamicQuantConfig, TuningConfig, autotune
        tuning = TuningConfig(config_set=[DynamicQuantConfig(**o) for o in options],
                              tolerable_loss=cfg.tolerable_loss, max_trials=len(options))
        exported = export_for_inc(bundle.model, example)
        try:
            autotune(exported, tuning, eval_fn=eval_fn, example_inputs=tuple(example.values()))
        except Exception as err:  # INC raises many types on graphs it cannot quantize
            raise UserError(f"inc: Intel Neural Compressor could not quantize the "
                            f"{bundle.model.config.model_type} model: {first_line(err)}") from None
    baseline, trials = accuracies[0], accuracies[1:]
    chosen = chosen_trial(baseline, trials, cfg.tolerable_loss)
    pick = options[chosen]
    realised = DynamicInt8Config(per_channel=pick["w_granularity"] == "per_channel", reduce_range=cfg.reduce_range,
                                 weight_type="qint8" if pick["w_sym"] else "quint8")
    record = {"validation_samples": len(validation), "tolerable_loss": cfg.tolerable_loss,
              "baseline_accuracy": baseline,
              "trials": [{"config": o, "accuracy": a} for o, a in zip(options, trials)],
              "chosen": pick, "met_tolerable_loss": trials[chosen] >= baseline * (1 - cfg.tolerable_loss),
              "realised_as": realised.model_dump(mode="json")}
    return realised, record


def chosen_trial(baseline: float, trials: list[float], tolerable_loss: float) -> int:
    """INC's rule: the first trial within the relative loss, else the most accurate one."""
    for index, accuracy in enumerate(trials):
        if accuracy >= baseline * (1 - tolerable_loss):
            return index
    return int(np.argmax(trials))


def example_batch(model, data: Encoded) -> dict[str, torch.Tensor]:
    _, batch = next(iterate(data, [np.arange(min(8, len(data)))], accepts_token_types(model)))
    batch.pop("labels")
    return batch


def export_for_inc(model, example: dict[str, torch.Tensor]):
    """torch.export with dynamic batch and sequence axes (what INC's PT2E path quantizes)."""
    from neural_compressor.torch.export import export
    # Dim.AUTO: dynamic axes whose range torch.export derives from the model's own guards.
    # A named range would have to be proven for every length in it, which fails on guards
    # that hold for every real input: XLNet's relative-attention shift guards on
    # (2 * sequence - 1) % sequence != 0 (true for sequence >= 2), BART on sequence >= 3.
    shapes = (tuple({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO} for _ in example),)  # the view's *inputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = export(traceable(copy.deepcopy(model).eval(), tuple(example)),
                          example_inputs=tuple(example.values()), dynamic_shapes=shapes)
    if exported is None:
        raise UserError(f"inc: torch.export failed on the {model.config.model_type} model")
    return exported


def traceable(model, names: tuple[str, ...]) -> torch.nn.Module:
    """The model as a module of positional inputs returning logits, without caches (XLNet's
    mems, BART's past key values), in a form torch.export can trace."""
    from compressor.export.trace import LogitsOnly
    if model.config.model_type == "bart":
        return BartLastEosLogits(model, names)
    return LogitsOnly(model, names)


class BartLastEosLogits(torch.nn.Module):
    """BartForSequenceClassification's logits, computed by its own modules in a traceable form.

    Transformers' forward checks that all rows have the same number of EOS tokens (a branch
    on data, which torch.export cannot trace) and picks each row's last EOS state by boolean
    indexing (a shape that depends on data). Here each row's last EOS position is found with
    argmax and its state gathered: the same state whenever the rows have equal EOS counts,
    which the tokenizer guarantees (one per segment, README "Teacher families").
    """

    def __init__(self, model, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        batch = dict(zip(self.names, inputs))
        ids = batch["input_ids"]
        hidden = self.model.model(input_ids=ids, attention_mask=batch.get("attention_mask"),
                                  use_cache=False).last_hidden_state
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        last_eos = torch.where(ids == self.model.config.eos_token_id, positions, -1).argmax(dim=1)
        state = hidden[torch.arange(ids.shape[0], device=ids.device), last_eos]
        return self.model.classification_head(state)


@torch.no_grad()
def graph_logits(model, data: Encoded, names: list[str]) -> np.ndarray:
    """Logits of an exported (positional-input) model, in data order."""
    def logits(batch: dict) -> torch.Tensor:
        result = model(*(batch[name] for name in names))
        if not isinstance(result, torch.Tensor):   # a model output (or tuple) rather than the logits
            result = result.logits if hasattr(result, "logits") else result[0]
        return result
    return in_data_order(data, EVAL_BATCH, logits, "token_type_ids" in names)


@contextlib.contextmanager
def inc_quiet():
    """INC logs every trial as tables on its own logger and prints; keep the CLI's one line."""
    logger = logging.getLogger("neural_compressor")
    disabled = logger.disabled
    logger.disabled = True   # INC resets its logger's level itself; disabling sticks
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.disabled = disabled
