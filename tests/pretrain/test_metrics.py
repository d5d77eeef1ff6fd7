"""Accuracy, macro-F1 and agreement against hand-computed values (and scikit-learn if present)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pretrain.metrics import accuracy, agreement, classification_metrics, macro_f1

# labels / predictions / hand-computed accuracy / hand-computed macro-F1.
CASES = [
    # Per class: 0: tp1 fp1 fn1 -> 1/2; 1: tp2 fp1 fn0 -> 4/5; 2: tp1 fp0 fn1 -> 2/3.
    ([0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0], 4 / 6, (1 / 2 + 4 / 5 + 2 / 3) / 3),
    # A class only predicted (3) counts with F1 0; class 0: tp1 fn1 -> 2/3.
    ([0, 0], [0, 3], 1 / 2, (2 / 3 + 0) / 2),
    # All right.
    ([2, 1, 2], [2, 1, 2], 1.0, 1.0),
    # All wrong: every class present scores 0.
    ([0, 1], [1, 0], 0.0, 0.0),
    # Imbalanced: macro averages classes, not examples. 0: tp3 fp1 fn0 -> 6/7; 1: tp0 fn1 -> 0.
    ([0, 0, 0, 1], [0, 0, 0, 0], 3 / 4, (6 / 7 + 0) / 2),
]


@pytest.mark.parametrize("labels, predictions, acc, f1", CASES)
def test_against_hand_computed_values(labels, predictions, acc, f1):
    y, p = np.array(labels), np.array(predictions)
    assert accuracy(y, p) == pytest.approx(acc)
    assert macro_f1(y, p) == pytest.approx(f1)
    m = classification_metrics(y, p)
    assert m == {"accuracy": pytest.approx(acc), "macro_f1": pytest.approx(f1), "samples": len(labels)}


def test_empty_inputs_give_nan():
    empty = np.array([], dtype=np.int64)
    assert math.isnan(accuracy(empty, empty))
    assert math.isnan(macro_f1(empty, empty))
    assert math.isnan(agreement(empty, empty))


def test_agreement_is_the_fraction_of_equal_predictions():
    assert agreement(np.array([0, 1, 2, 3]), np.array([0, 1, 0, 0])) == pytest.approx(0.5)
    assert agreement(np.array([4, 4]), np.array([4, 4])) == 1.0


def test_matches_scikit_learn_on_random_labels():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for n_classes in (2, 5, 45):
        labels = rng.integers(0, n_classes, 300)
        # Mostly right, with some classes never predicted and some only predicted.
        predictions = np.where(rng.random(300) < 0.6, labels, rng.integers(0, n_classes + 3, 300))
        assert accuracy(labels, predictions) == pytest.approx(sk.accuracy_score(labels, predictions))
        assert macro_f1(labels, predictions) == pytest.approx(
            sk.f1_score(labels, predictions, average="macro", zero_division=0))
