"""Latency, throughput and peak memory of deployable models on a hardware profile.

What is timed is one inference call on a prepared batch (`session.run` for ONNX Runtime,
`model(**batch)` under inference mode for PyTorch); inputs are built before the clock
starts, so the harness adds a perf_counter pair per call and nothing else.

Fairness within one run: every model of a measurement sees the same batches (real test
batches in test order, each padded to its longest member, or real texts cut/padded to a
fixed length), and the models are measured in interleaved rounds (A B C, C A B, B C A, ...)
so that drift in machine load lands on all of them alike instead of on whoever runs last.
The order within each round is a fresh permutation drawn from a recorded seed, so no model
always runs right after the same other one (whose cache and thread state it would inherit).

Peak memory is measured in a fresh child process per model (compressor/memory_probe.py):
it loads the model, runs the batches, and reports its peak resident set size. That is the
memory a process serving that model needs, runtime included, and unlike in-process
readings it is not inflated by the models measured before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import numpy as np

from compressor.profiles import Profile, ort_session_options
from pretrain.batching import MAX_LENGTH
from pretrain.data import Split
from pretrain.errors import UserError
from pretrain.models import first_line

Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class Runner:
    """A loaded model: `prepare` turns a batch into the runtime's inputs (untimed), `run` infers."""

    prepare: Callable[[Feed], object]
    run: Callable[[object], object]

MAX_DISTINCT_BATCHES = 64     # real batches cycled through by the timed iterations
ROUND_CALLS = 10              # timed calls per model per interleaved round
ROUND_WARMUP = 2              # untimed calls per model at the start of every round
TIE_THRESHOLD = 0.03          # per-call latency ratios within 3% of 1 rank as ties
BOOTSTRAP_RESAMPLES = 400
ORDER_SEED = 0                # seeds the per-round model order (recorded with the timings)


@dataclass(frozen=True)
class Deployable:
    """A model as it ships: a PyTorch HF dir or an ONNX file."""

    name: str
    kind: Literal["torch", "onnx"]
    path: Path                 # HF model dir (torch) or model .onnx file
    precision: str             # fp32, dynamic-int8, static-int8, fp16, ...
    # (profile name, path) where a profile measures another build of this model: the Optimum
    # baseline is built with each profile's own preset.
    on_profiles: tuple[tuple[str, Path], ...] = ()

    def on(self, profile: str) -> "Deployable":
        """This model as `profile` measures it."""
        path = dict(self.on_profiles).get(profile, self.path)
        return Deployable(self.name, self.kind, path, self.precision)


def input_batches(tokenizer, split: Split, batch_size: int, sequence_length: int | str,
                  count: int = MAX_DISTINCT_BATCHES, max_length: int = MAX_LENGTH) -> list[Feed]:
    """Up to `count` batches of the split in its own order (not sorted by length).

    `real`: each batch padded to its longest member, as a server batching requests would,
    texts cut at `max_length` (pass `usable_length(model)`: the model's positions bound it);
    an int: every text truncated or padded to exactly that many tokens, at most `max_length`.
    """
    max_length = min(max_length, tokenizer.model_max_length)   # the tokenizer knows its family's limit
    n = min(len(split), batch_size * count)
    if n < batch_size:
        raise UserError(f"the test split has {len(split)} examples, fewer than batch size {batch_size}")
    if sequence_length != "real" and int(sequence_length) > max_length:
        raise UserError(f"sequence length {sequence_length} is longer than the model's {max_length} usable "
                        f"positions; expected a sequence length of at most {max_length} (or 'real')")
    n -= n % batch_size
    texts, pairs = split.texts[:n], (split.text_pairs[:n] if split.text_pairs is not None else None)
    padding = dict(padding="longest", max_length=max_length) if sequence_length == "real" else \
        dict(padding="max_length", max_length=int(sequence_length))
    batches = []
    for start in range(0, n, batch_size):
        args = (texts[start:start + batch_size],) + \
            ((pairs[start:start + batch_size],) if pairs is not None else ())
        enc = tokenizer(*args, truncation=True, return_tensors="np", **padding)
        batches.append({k: v.astype(np.int64) for k, v in enc.items()})
    return batches


def onnx_session(path: Path, profile: Profile):
    import onnxruntime as ort
    options = ort_session_options(profile.thread_count(), profile.graph_optimization)
    providers = [profile.provider] + (["CPUExecutionProvider"] if profile.provider != "CPUExecutionProvider" else [])
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as err:  # onnxruntime raises its own exception types for bad files
        raise UserError(f"cannot load ONNX model {path}: {first_line(err)}") from None


def onnx_runner(path: Path, profile: Profile) -> Runner:
    session = onnx_session(path, profile)
    wanted = {i.name for i in session.get_inputs()}

    return Runner(prepare=lambda feed: {k: v for k, v in feed.items() if k in wanted},
                  run=lambda feed: session.run(None, feed))


def torch_runner(path: Path, profile: Profile) -> Runner:
    import inspect

    import torch

    model = load_torch_model(Path(path))
    device = torch.device("cuda" if profile.device == "cuda" else "cpu")
    model.to(device).eval()
    wanted = set(inspect.signature(model.forward).parameters)

    def prepare(feed: Feed) -> dict:
        return {k: torch.from_numpy(v).to(device) for k, v in feed.items() if k in wanted}

    def run(batch: dict) -> object:
        with torch.inference_mode():
            out = model(**batch).logits
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out
    return Runner(prepare=prepare, run=run)


def load_torch_model(path: Path):
    """An HF model dir, or a torch-dynamic-int8 deployment dir (int8 state dict + config)."""
    from compressor.export.torch_int8 import is_int8_dir, load_int8_model
    if is_int8_dir(path):
        return load_int8_model(path)
    from pretrain.models import load_saved_classifier
    return load_saved_classifier(path)[0]


def load_runner(model: Deployable, profile: Profile) -> Runner:
    return (onnx_runner if model.kind == "onnx" else torch_runner)(model.path, profile)


def timed_calls(run: Callable[[object], object], inputs: list, start: int, calls: int) -> list[float]:
    """The hot loop: `calls` calls cycling through `inputs` from `start`; milliseconds each."""
    times = []
    clock = time.perf_counter
    for i in range(start, start + calls):
        feed = inputs[i % len(inputs)]
        t0 = clock()
        run(feed)
        times.append((clock() - t0) * 1e3)
    return times


def summarize(times_ms: list[float], samples: int) -> dict:
    t = np.asarray(times_ms)
    return {"p50_ms": float(np.percentile(t, 50)), "p90_ms": float(np.percentile(t, 90)),
            "p99_ms": float(np.percentile(t, 99)), "mean_ms": float(t.mean()),
            "throughput": samples / (t.sum() / 1e3), "iterations": len(t)}


@dataclass(frozen=True)
class Timings:
    """Every timed call of an interleaved measurement, aligned across models.

    times[name][i] is call i of that model; call i of every model ran on the same batch,
    within the same round (rounds[r] is a slice of call indices), so per-call ratios
    between two models are paired measurements.
    """

    times: dict[str, np.ndarray]
    samples: dict[str, int]
    rounds: list[slice]
    orders: list[list[str]] = field(default_factory=list)   # the order the models ran in, per round
    order_seed: int = ORDER_SEED


def time_interleaved(runners: dict[str, Runner], batches: list[Feed], profile: Profile,
                     round_calls: int = ROUND_CALLS, order_seed: int = ORDER_SEED) -> Timings:
    """Time every runner on the same batches in short interleaved rounds (A B C, C A B, ...).

    Short rounds spread slow drift in machine load evenly over the models; the untimed
    calls at the start of each round absorb the switch from the previous model (caches,
    the other runtime's spinning threads). Each round runs the models in a random order
    drawn from `order_seed`, so which model precedes which varies from round to round.
    """
    import torch
    prepared = {name: [runner.prepare(b) for b in batches] for name, runner in runners.items()}
    sizes = [len(next(iter(b.values()))) for b in batches]
    times: dict[str, list[float]] = {name: [] for name in runners}
    rounds = [slice(start, min(start + round_calls, profile.iterations))
              for start in range(0, profile.iterations, round_calls)]
    rng = np.random.default_rng(order_seed)
    orders = [[str(name) for name in rng.permutation(list(runners))] for _ in rounds]
    threads = torch.get_num_threads()
    torch.set_num_threads(profile.thread_count())
    try:
        for name, runner in runners.items():
            timed_calls(runner.run, prepared[name], 0, profile.warmup)
        for span, order in zip(rounds, orders):
            for name in order:
                run = runners[name].run
                timed_calls(run, prepared[name], span.start, ROUND_WARMUP)
                times[name] += timed_calls(run, prepared[name], span.start, span.stop - span.start)
    finally:
        torch.set_num_threads(threads)
    samples = sum(sizes[i % len(sizes)] for i in range(profile.iterations))
    return Timings({name: np.asarray(t) for name, t in times.items()}, dict.fromkeys(runners, samples), rounds,
                   orders, order_seed)


def measure_interleaved(runners: dict[str, Runner], batches: list[Feed], profile: Profile) -> dict[str, dict]:
    """Time every runner on the same batches, in interleaved rounds; stats per runner."""
    timings = time_interleaved(runners, batches, profile)
    return {name: summarize(list(t), timings.samples[name]) for name, t in timings.times.items()}


def paired_ratio(timings: Timings, a: str, b: str, seed: int = 0) -> dict:
    """a's latency over b's: the median per-call ratio on the same batches, a 95% interval
    for it, and the ratio of their p50s.

    The interval resamples whole rounds (a block bootstrap), so noise lasting a round widens
    it as it should. Pairing calls removes the batch-to-batch variation (real batches differ
    in length) that the p50s carry.
    """
    log_ratio = np.log(timings.times[a]) - np.log(timings.times[b])
    blocks = [log_ratio[span] for span in timings.rounds]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(blocks), size=(BOOTSTRAP_RESAMPLES, len(blocks)))
    medians = [np.median(np.concatenate([blocks[i] for i in pick])) for pick in picks]
    low, high = np.percentile(medians, [2.5, 97.5])
    return {"ratio": float(np.exp(np.median(log_ratio))), "ci95": [float(np.exp(low)), float(np.exp(high))],
            "p50_ratio": float(np.median(timings.times[a]) / np.median(timings.times[b]))}


def tied(pair: dict) -> bool:
    """Two models tie unless one is clearly faster: the per-call ratio is more than the
    threshold away from 1, its interval excludes 1, and the p50s agree on the direction."""
    low, high = pair["ci95"]
    same_direction = (pair["ratio"] > 1) == (pair["p50_ratio"] > 1)
    return abs(pair["ratio"] - 1) < TIE_THRESHOLD or low <= 1 <= high or not same_direction


def tied_pairs(timings: Timings) -> list[list[str]]:
    """Every pair of models that tie (so neither may be called faster than the other)."""
    names = list(timings.times)
    return [[a, b] for i, a in enumerate(names) for b in names[i + 1:]
            if tied(paired_ratio(timings, a, b))]


def ranking_with_ties(timings: Timings) -> list[dict]:
    """Models by p50, fastest first, grouped: a model joins the current group while it ties
    with the group's fastest member. Each group holds its members' ratios to its first
    model, and its first model's ratio to the previous group's first (paired_ratio)."""
    order = sorted(timings.times, key=lambda name: float(np.median(timings.times[name])))
    groups: list[dict] = []
    for name in order:
        if groups:
            pair = paired_ratio(timings, name, groups[-1]["models"][0])
            if tied(pair):
                groups[-1]["models"].append(name)
                groups[-1]["ratios_to_first"].append(pair)
                continue
            groups.append({"models": [name], "ratios_to_first": [], "vs_previous_group": pair})
        else:
            groups.append({"models": [name], "ratios_to_first": [], "vs_previous_group": None})
    return groups


def peak_rss_mb(model: Deployable, profile: Profile, batch_sets: list[list[Feed]],
                calls: int = 20) -> list[float | None]:
    """Peak RSS of a fresh process serving `model`, one reading per set of batches.

    The child loads the model once; before each set it resets the kernel's high-water mark
    (so each reading is the peak while serving that batch size, model included) and runs
    `calls` batches. Readings are None if the child fails.
    """
    with tempfile.TemporaryDirectory(prefix="compressor-mem-") as tmp:
        inputs = []
        for n, batches in enumerate(batch_sets):
            inputs.append(str(Path(tmp) / f"set{n}.npz"))
            np.savez(inputs[-1], **{f"{i}:{k}": v for i, b in enumerate(batches) for k, v in b.items()})
        job = {"kind": model.kind, "path": str(model.path), "inputs": inputs, "calls": calls,
               "threads": profile.thread_count(), "provider": profile.provider, "device": profile.device,
               "graph_optimization": profile.graph_optimization}
        try:
            done = subprocess.run([sys.executable, "-m", "compressor.memory_probe", json.dumps(job)],
                                  capture_output=True, text=True, timeout=900)
            readings = json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mb"]
            return [float(r) for r in readings]
        except (subprocess.SubprocessError, ValueError, IndexError, KeyError, TypeError):
            return [None] * len(batch_sets)
