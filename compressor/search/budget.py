"""What the search's finals will cost, estimated from this search's own measurements, so that
`time_budget_min` holds: the proxy phase stops when the time left is this estimate, and the
finals train only as many finalists as it says fit.

The finals (compressor/search/run.py) train each finalist fully, export it behind the gate,
score it and the teacher on the test rows, build the baselines, and time every model in one
benchmark (its profile's warm-up, rounds and timed calls, then a memory probe). Each part
comes from a measurement of this machine:

    training      a finalist's proxy: its scoring and cutting, plus its training time scaled
                  by train_samples / proxy_train_samples * epochs; a compared variant at the
                  slowest finalist's rate per example
    calls         per model: the benchmark's calls and the test scoring's batches, at the
                  latency model's per-call prediction (fitted on the target here) for an
                  ONNX model, at the teacher's measured PyTorch scoring time for the teacher
    exports       EXPORT_S each (tracing, graph fusion, the gate), the one figure not measured

The sum is taken MARGIN times: the load of other processes may rise after the measurements,
and the benchmark's deadline (compressor/bench/measure.py) absorbs what the margin does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from compressor.bench.measure import PROBE_CALLS, PROBE_RESERVE_S
from compressor.bench.profiles import Profile
from compressor.bench.timing import ROUND_CALLS, ROUND_WARMUP, round_count
from compressor.search.settings import SearchSettings

EXPORT_S = 60.0          # an export: tracing, graph fusion, quantization, the gate
REPORT_S = 15.0          # report.json, report.md, report.html and the chart
MARGIN = 1.25            # on the whole estimate: the machine's load may rise after it was measured


@dataclass(frozen=True)
class FinalsRates:
    """This search's measurements the finals' cost is estimated from."""

    benchmark_calls: int                 # per model: warm-up, rounds' warm-ups, timed calls, memory probe
    scoring_calls: int                   # per model: the test rows' batches it is scored on
    teacher_torch_ms: float              # a call of the teacher in PyTorch at the search's batch size
    teacher_onnx_ms: dict[str, float]    # ... exported, by precision (the latency model's prediction)

    def model_seconds(self, call_ms: float) -> float:
        """One model's scoring, benchmark calls and memory probe."""
        return (self.benchmark_calls + self.scoring_calls) * call_ms / 1e3 + PROBE_RESERVE_S


def benchmark_calls(profile: Profile) -> int:
    """Calls of each model in the finals' benchmark at one batch size and length: the profile's
    warm-up, every round's warm-up calls, the timed calls, and the memory probe's."""
    rounds = round_count(profile.iterations, ROUND_CALLS)
    return max(profile.warmup, 1) + profile.iterations + ROUND_WARMUP * rounds + PROBE_CALLS


def teacher_seconds(rates: FinalsRates, baselines: list[str]) -> float:
    """The teacher's part of the finals: scored in PyTorch and exported and scored (the teacher
    stage, its export), and each baseline built from it and measured."""
    fp32 = rates.teacher_onnx_ms["fp32"]
    seconds = rates.scoring_calls * (rates.teacher_torch_ms + fp32) / 1e3 + EXPORT_S
    for name in baselines:
        if name == "pytorch-eager-fp32":
            seconds += rates.model_seconds(rates.teacher_torch_ms)
        else:       # onnxruntime-fp32; optimum-default-int8 as the latency model's int8 where it has one
            call_ms = rates.teacher_onnx_ms.get("int8", fp32) if "int8" in name else fp32
            seconds += EXPORT_S + rates.model_seconds(call_ms)
    return seconds


def finals_seconds(picks: list, settings: SearchSettings, rates: FinalsRates, compared_samples: list[float],
                   count: int | None = None) -> float:
    """Seconds the finals of `count` finalists (default: settings.finalists) will take, `picks`
    the trials found so far (with their proxy's timings); `compared_samples` is each compared
    variant's training examples. Without a trained proxy yet, only the teacher's part and the
    compared variants' exports (the first proxy then runs, and the estimate has its data)."""
    scale = settings.train_samples / settings.proxy_train_samples * settings.epochs
    finalists = [t.user_attrs["prep_seconds"] + t.user_attrs["train_seconds"] * scale + EXPORT_S
                 + rates.model_seconds(t.user_attrs["predicted_ms"]) for t in picks]
    # Finalists still to be found cost what the dearest found does.
    missing = max(0, (count or settings.finalists) - len(finalists)) * max(finalists, default=0.0)
    # A compared variant is not a plan: trained at the slowest finalist's rate, timed as the teacher.
    per_sample = max((t.user_attrs["train_seconds"] for t in picks), default=0.0) / settings.proxy_train_samples
    compared = sum(per_sample * samples + EXPORT_S + rates.model_seconds(rates.teacher_onnx_ms["fp32"])
                   for samples in compared_samples)
    fixed = teacher_seconds(rates, list(settings.baselines)) + REPORT_S
    return MARGIN * (sum(finalists) + missing + compared + fixed)
