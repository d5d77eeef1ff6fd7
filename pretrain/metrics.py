"""Classification metrics (numpy only; macro-F1 as scikit-learn's 'macro' average)."""

from __future__ import annotations

import numpy as np


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    return float(np.mean(labels == predictions)) if len(labels) else float("nan")


def macro_f1(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Unweighted mean of per-class F1 over classes present in labels or predictions."""
    classes = np.union1d(labels, predictions)
    if len(classes) == 0:
        return float("nan")
    scores = []
    for c in classes:
        tp = np.sum((predictions == c) & (labels == c))
        fp = np.sum((predictions == c) & (labels != c))
        fn = np.sum((predictions != c) & (labels == c))
        denom = 2 * tp + fp + fn
        scores.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(scores))


def agreement(predictions: np.ndarray, reference: np.ndarray) -> float:
    """Fraction of items where two models predict the same class."""
    return float(np.mean(predictions == reference)) if len(reference) else float("nan")


def classification_metrics(labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    return {"accuracy": accuracy(labels, predictions), "macro_f1": macro_f1(labels, predictions),
            "samples": int(len(labels))}
