"""The export gate: every graph must match PyTorch's logits, and a quantized one must keep
test accuracy.

The gate runs on real test batches, padded to each batch's longest member as in
pretrain/batching.py. The fp32 graph (and the fused graph) must match PyTorch's logits to
`parity_tolerance`; a quantized graph must keep test accuracy within `accuracy_tolerance`
of the fp32 graph (and above `min_accuracy` when set).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from compressor.bundle import ModelBundle
from compressor.evaluate import label_permutation, onnx_logits_fn
from compressor.export.quantize import QuantizeConfig
from pretrain.batching import Encoded, encode
from pretrain.data import Split, TaskData
from pretrain.errors import UserError
from pretrain.finetune import predict_logits
from pretrain.metrics import agreement, classification_metrics

if TYPE_CHECKING:   # the settings live with the export that reads them
    from compressor.export.onnx import ExportSettings


class GateFailure(UserError):
    """An export failed its parity or accuracy gate (a one-line message with the numbers);
    `setting`: the ExportSettings field that decides it, for the caller to name as the
    remedy the way its user sets it (a recipe's `export.` key, a command's flag)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class Gate:
    """Reference logits and test data of one export, and the checks every graph must pass."""

    def __init__(self, settings: ExportSettings, bundle: ModelBundle, task: TaskData, test: Split) -> None:
        self.settings = settings
        self.labels = np.asarray(test.labels)
        self.to_task = label_permutation(bundle.label_names, task)   # model class id -> task class id
        length = bundle.usable_length      # its fine-tuning length, within its positions
        self.data = encode(bundle.tokenizer, test, length)
        parity_split = test.head(settings.parity_samples)
        self.parity_data = encode(bundle.tokenizer, parity_split, length)
        self.parity_samples = len(parity_split)
        self.model = bundle.model

    @functools.cached_property
    def reference(self) -> np.ndarray:
        """PyTorch's logits on the parity examples; computed at the first parity check (an
        export that starts from a graph already checked makes none)."""
        return predict_logits(self.model, self.parity_data)

    def onnx_logits(self, graph: Path, data: Encoded | None = None) -> np.ndarray:
        return onnx_logits_fn(graph)(self.data if data is None else data)

    def parity(self, graph: Path, what: str) -> dict:
        diff = max_abs_diff(self.reference, self.onnx_logits(graph, self.parity_data))
        tolerance = self.settings.parity_tolerance
        if not diff <= tolerance:   # also catches NaN
            raise GateFailure(f"{what} does not match PyTorch: max |logit difference| {diff:.3g} on "
                              f"{self.parity_samples} test examples exceeds parity_tolerance "
                              f"{tolerance:g} by {diff - tolerance:.3g}", setting="parity_tolerance")
        return {"parity_max_abs_diff": diff}

    def predictions(self, logits: np.ndarray) -> np.ndarray:
        return self.to_task[logits.argmax(axis=1)]

    def fp32_metrics(self, logits: np.ndarray, graph: Path | None) -> dict:
        metrics = classification_metrics(self.labels, self.predictions(logits))
        return {"precision": "fp32", "quantization": None, "accuracy": metrics["accuracy"],
                "macro_f1": metrics["macro_f1"], "eval_samples": metrics["samples"],
                "accuracy_fp32": metrics["accuracy"], "accuracy_change": 0.0,
                "accuracy_tolerance": self.settings.accuracy_tolerance,
                "agreement_with_fp32": None,
                "fp32_size_bytes": graph.stat().st_size if graph is not None else None}

    def quantized_metrics(self, fp32_logits: np.ndarray, logits: np.ndarray, cfg: QuantizeConfig) -> dict:
        fp32 = self.predictions(fp32_logits)
        quantized = self.predictions(logits)
        fp32_accuracy = classification_metrics(self.labels, fp32)["accuracy"]
        metrics = classification_metrics(self.labels, quantized)
        change = metrics["accuracy"] - fp32_accuracy
        agree = agreement(quantized, fp32)
        tolerance = self.settings.accuracy_tolerance
        # Only a drop fails: a quantized model may score higher by chance on near-ties.
        if not -change <= tolerance + 1e-12:
            raise GateFailure(
                f"{cfg.mode} model fails the accuracy gate: test accuracy {metrics['accuracy']:.4f} vs "
                f"fp32 {fp32_accuracy:.4f} on {len(fp32)} examples, a drop of {-change * 100:.2f} "
                f"points where accuracy_tolerance allows {tolerance * 100:.2f} (agreement with fp32 "
                f"{agree:.3f}{one_example_note(len(fp32), tolerance)}); not written", setting="accuracy_tolerance")
        floor = self.settings.min_accuracy
        if floor is not None and not metrics["accuracy"] >= floor:
            raise GateFailure(
                f"{cfg.mode} model falls below the accuracy floor (min_accuracy, --min-accuracy): test accuracy "
                f"{metrics['accuracy']:.4f} on {len(fp32)} examples is {(floor - metrics['accuracy']) * 100:.2f} "
                f"points under min_accuracy {floor:.4f} (fp32 {fp32_accuracy:.4f}); not written", setting="min_accuracy")
        return {"precision": cfg.mode, "quantization": cfg.model_dump(mode="json"),
                "accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"],
                "accuracy_change": change, "agreement_with_fp32": agree}


def one_example_note(examples: int, tolerance: float) -> str:
    """Where one example weighs more than the tolerance, any changed prediction fails the gate."""
    step = 100 / max(examples, 1)
    if step <= tolerance * 100:
        return ""
    return f"; one of the {examples} test examples is {step:.2f} points, more than the tolerance: any changed " \
           "prediction fails it"


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float(np.abs(a - b).max()) if a.size else 0.0
