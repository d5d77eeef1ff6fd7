"""The finals' cost, estimated from a search's own measurements (compressor/search/budget.py)."""

from __future__ import annotations

import pytest

from compressor.bench.measure import PROBE_CALLS, PROBE_RESERVE_S
from compressor.bench.profiles import load_profile
from compressor.search.budget import (EXPORT_S, MARGIN, REPORT_S, FinalsRates, benchmark_calls, finals_seconds,
                                      teacher_seconds)
from compressor.search.plans import Plan
from compressor.search.settings import SearchSettings
from compressor.search.study import completed
from tests.compressor.search.test_study import study_of, trial

RATES = FinalsRates(benchmark_calls=100, scoring_calls=10, teacher_torch_ms=50.0,
                    teacher_onnx_ms={"fp32": 20.0, "int8": 10.0})


def test_the_benchmark_calls_follow_the_profile():
    """The finals' benchmark was a fixed 300 s in the estimate, whatever the profile's calls: the
    default cpu profile times 300 calls a model, with a warm-up and two more per round of 10."""
    cpu = load_profile("cpu")
    assert benchmark_calls(cpu) == 10 + 300 + 2 * 30 + PROBE_CALLS
    assert benchmark_calls(cpu.model_copy(update={"iterations": 3000})) > 9 * benchmark_calls(cpu)


def test_the_teacher_and_each_baseline_cost_their_calls_at_their_measured_speed():
    scored = 10 * (50.0 + 20.0) / 1e3 + EXPORT_S                  # the teacher stage and its export
    per_model = {"pytorch-eager-fp32": 110 * 50.0 / 1e3 + PROBE_RESERVE_S,
                 "onnxruntime-fp32": EXPORT_S + 110 * 20.0 / 1e3 + PROBE_RESERVE_S,
                 "optimum-default-int8": EXPORT_S + 110 * 10.0 / 1e3 + PROBE_RESERVE_S}
    assert teacher_seconds(RATES, list(per_model)) == pytest.approx(scored + sum(per_model.values()))
    assert teacher_seconds(RATES, []) == pytest.approx(scored)


def test_finalists_cost_their_training_export_and_calls_and_compared_variants_their_own_training():
    plain = SearchSettings(latency_budget_ms=10, finalists=1, proxy_train_samples=100, train_samples=1000,
                           baselines=[])
    done = completed(study_of(trial(Plan(layers=2), 0.5, 9.0)))    # prep 1 s, 2 s per 100 examples, 9 ms a call
    picks = list(done)
    finalist = 1 + 2 * 10 + EXPORT_S + 110 * 9.0 / 1e3 + PROBE_RESERVE_S
    fixed = teacher_seconds(RATES, []) + REPORT_S
    assert finals_seconds(picks, plain, RATES, []) == pytest.approx(MARGIN * (finalist + fixed))
    # + 1,000 examples at the finalist's 0.02 s each, exported, and timed as the teacher exported
    compared = 1000 * 0.02 + EXPORT_S + 110 * 20.0 / 1e3 + PROBE_RESERVE_S
    assert finals_seconds(picks, plain, RATES, [1000]) == pytest.approx(MARGIN * (finalist + compared + fixed))
    # Three finalists asked for, one found: the two to come cost what it does.
    three = plain.model_copy(update={"finalists": 3})
    assert finals_seconds(picks, three, RATES, []) == pytest.approx(MARGIN * (3 * finalist + fixed))
    assert finals_seconds(picks, three, RATES, [], count=1) == pytest.approx(MARGIN * (finalist + fixed))
    assert finals_seconds([], plain, RATES, []) == pytest.approx(MARGIN * fixed)      # before any proxy
