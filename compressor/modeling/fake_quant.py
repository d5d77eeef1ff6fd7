"""Fake quantization of Linear layers, as in Q8BERT (Zafrir et al. 2019).

Symmetric linear 8-bit quantization, x -> round(x * 127 / t) * t / 127 clipped to +-t:
- weights: t = max|W| of the whole matrix, recomputed at every forward;
- activations (each Linear's input): t = an exponential moving average of max|x| over
  training batches (decay 0.9999 in the paper; the first batch sets it), frozen in eval;
  the range [-t, t] is rounded on the export's uint8 grid (step 2t/255, see
  `fake_quantize_activation`), a 0.4% finer step than the paper's t/127;
- the word embedding: t = max|E| of the table (Q8BERT quantizes embeddings too), applied
  to the looked-up rows, which equals looking up rows of the quantized table and keeps the
  embedding's sparse gradients;
- gradients pass straight through the rounding (straight-through estimator).

These are exactly the tensors the `qat` pass's export makes int8 (static-int8 with
`scope: linears`, export/quantize.py); everything else (Linear outputs, residual paths,
LayerNorm, attention products) is float in both.

It attaches to an ordinary Transformers model without changing its module types: the
weight through `torch.nn.utils.parametrize`, the input through a forward pre-hook whose
range lives in a submodule of the Linear (so the model's state_dict, and thus a training
checkpoint, holds it). Leaving the context removes all three and leaves the trained float
weights, so the model stays a plain Transformers model that saves with `save_pretrained`;
what the training learned about activations is returned as thresholds, which the int8
export uses as its ranges.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch
from torch import nn
from torch.nn.utils import parametrize

LEVELS = 127   # symmetric int8: [-127, 127]
RANGE_MODULE = "input_range"   # the ActivationRange's name on its Linear while the context is open


def fake_quantize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize x to 8 bits in [-threshold, threshold]; identity gradient (STE)."""
    scale = LEVELS / threshold.clamp(min=1e-8)
    quantized = torch.clamp(torch.round(x * scale), -LEVELS, LEVELS) / scale
    return x + (quantized - x).detach()


ACTIVATION_STEPS = 255   # a symmetric range [-t, t] on ORT's uint8 grid: scale 2t/255, zero point 128


def fake_quantize_activation(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize x as the int8 export does a Linear's input: symmetric range
    [-t, t] stored as uint8 with zero point 128, i.e. integers -128..127 times 2t/255.

    (Q8BERT's own grid is -127..127 times t/127; the export keeps activations uint8, the
    integer kernels ONNX Runtime runs fastest, and the training simulates that grid exactly.)
    """
    scale = 2 * threshold.clamp(min=1e-8) / ACTIVATION_STEPS
    quantized = torch.clamp(torch.round(x / scale), -128, 127) * scale
    return x + (quantized - x).detach()


def fake_quantize_per_channel(weight: torch.Tensor) -> torch.Tensor:
    """Per-output-row symmetric int8, as the static-int8 export quantizes weights."""
    return fake_quantize(weight, weight.detach().abs().amax(dim=1, keepdim=True))


class WeightFakeQuant(nn.Module):
    """The parametrization: the weight the Linear computes with is its fake-quantized form."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return fake_quantize(weight, weight.detach().abs().max())


class ActivationRange(nn.Module):
    """The EMA of max|input| of one Linear (meaningless until the first training batch).

    A module with buffers, attached to its Linear while the context is open, so that the
    range and its observation count are part of the model's state_dict: the training loop's
    checkpoints carry them, and a resumed QAT goes on from the range it had learned.
    """

    def __init__(self, decay: float):
        super().__init__()
        self.decay = decay
        self.register_buffer("threshold", torch.zeros(()))
        self.register_buffer("observations", torch.zeros((), dtype=torch.long))

    @property
    def observed(self) -> bool:
        return bool(self.observations > 0)

    def observe(self, x: torch.Tensor) -> torch.Tensor:
        current = x.detach().abs().max().to(self.threshold.dtype)
        if self.observed:
            current = self.decay * self.threshold + (1 - self.decay) * current
        self.threshold.copy_(current)
        self.observations += 1
        return self.threshold


def linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


@contextlib.contextmanager
def q8bert_fake_quant(model: nn.Module, ema_decay: float) -> Iterator[dict[str, ActivationRange]]:
    """Fake-quantize every Linear's weight and input while the context is open."""
    ranges: dict[str, ActivationRange] = {}
    with contextlib.ExitStack() as undo:   # every hook and parametrization goes on exit
        for name, linear in linear_layers(model).items():
            ranges[name] = ActivationRange(ema_decay)
            linear.add_module(RANGE_MODULE, ranges[name])
            undo.callback(delattr, linear, RANGE_MODULE)
            parametrize.register_parametrization(linear, "weight", WeightFakeQuant())
            # leave_parametrized=False: keep the float weight that training updated.
            undo.callback(parametrize.remove_parametrizations, linear, "weight", leave_parametrized=False)
            undo.callback(linear.register_forward_pre_hook(input_hook(ranges[name])).remove)
        embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        if isinstance(embedding, nn.Embedding):
            undo.callback(embedding.register_forward_hook(embedding_hook).remove)
        yield ranges


def input_hook(observed: ActivationRange):
    def hook(module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        if module.training:
            threshold = observed.observe(x)
        elif observed.observed:
            threshold = observed.threshold
        else:
            return args   # evaluated before any training step: nothing learned yet
        return (fake_quantize_activation(x, threshold), *args[1:])
    return hook


def embedding_hook(module: nn.Embedding, args: tuple, rows: torch.Tensor) -> torch.Tensor:
    """Rows of the table quantized with one symmetric scale for the whole table."""
    return fake_quantize(rows, module.weight.detach().abs().max())


@contextlib.contextmanager
def one_layer_quantized(linear: nn.Linear, input_threshold: torch.Tensor) -> Iterator[None]:
    """Quantize one Linear as the int8 export would (per-channel weights, calibrated input)."""
    original = linear.weight.data
    linear.weight.data = fake_quantize_per_channel(original)
    handle = linear.register_forward_pre_hook(
        lambda module, args: (fake_quantize(args[0], input_threshold), *args[1:]))
    try:
        yield
    finally:
        handle.remove()
        linear.weight.data = original


@contextlib.contextmanager
def input_maxima(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Record max|input| of every Linear over the forwards run inside the context."""
    maxima: dict[str, torch.Tensor] = {}

    def hook(module, args, name):
        current = args[0].detach().abs().max()
        maxima[name] = torch.maximum(maxima[name], current) if name in maxima else current
    with contextlib.ExitStack() as undo:
        for name, linear in linear_layers(model).items():
            undo.callback(linear.register_forward_pre_hook(functools.partial(hook, name=name)).remove)
        yield maxima
