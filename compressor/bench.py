"""Latency, throughput and peak memory of deployable models on a hardware profile.

What is timed is one inference call on a prepared batch (`session.run` for ONNX Runtime,
`model(**batch)` under inference mode for PyTorch); inputs are built before the clock
starts, so the harness adds a perf_counter pair per call and nothing else.

Fairness within one run: every model of a measurement sees the same batches (real test
batches in test order, each padded to its longest member, or real texts cut/padded to a
fixed length), and the models are measured in interleaved rounds (A B C, A B C, ...) so
that drift in machine load lands on all of them alike instead of on whoever runs last.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import numpy as np

from compressor.profiles import Profile
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
ROUNDS = 5                    # interleaved rounds the iterations are split into
ROUND_WARMUP = 2              # untimed calls per model at the start of every round


@dataclass(frozen=True)
class Deployable:
    """A model as it ships: a PyTorch HF dir or an ONNX file."""

    name: str
    kind: Literal["torch", "onnx"]
    path: Path                 # HF model dir (torch) or model .onnx file
    precision: str             # fp32, dynamic-int8, static-int8, fp16, ...


def input_batches(tokenizer, split: Split, batch_size: int, sequence_length: int | str,
                  count: int = MAX_DISTINCT_BATCHES) -> list[Feed]:
    """Up to `count` batches of the split in its own order (not sorted by length).

    `real`: each batch padded to its longest member, as a server batching requests would;
    an int: every text truncated or padded to exactly that many tokens.
    """
    n = min(len(split), batch_size * count)
    if n < batch_size:
        raise UserError(f"the test split has {len(split)} examples, fewer than batch size {batch_size}")
    n -= n % batch_size
    texts, pairs = split.texts[:n], (split.text_pairs[:n] if split.text_pairs is not None else None)
    padding = dict(padding="longest") if sequence_length == "real" else \
        dict(padding="max_length", max_length=int(sequence_length))
    batches = []
    for start in range(0, n, batch_size):
        args = (texts[start:start + batch_size],) + \
            ((pairs[start:start + batch_size],) if pairs is not None else ())
        enc = tokenizer(*args, truncation=True, return_tensors="np",
                        **({"max_length": 128} | padding))
        batches.append({k: v.astype(np.int64) for k, v in enc.items()})
    return batches


def onnx_session(path: Path, profile: Profile):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = profile.thread_count()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[profile.graph_optimization]
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


def measure_interleaved(runners: dict[str, Runner], batches: list[Feed], profile: Profile,
                        rounds: int = ROUNDS) -> dict[str, dict]:
    """Time every runner on the same batches, in interleaved rounds; stats per runner."""
    import torch
    prepared = {name: [runner.prepare(b) for b in batches] for name, runner in runners.items()}
    sizes = [len(next(iter(b.values()))) for b in batches]
    per_round = [profile.iterations // rounds + (1 if r < profile.iterations % rounds else 0)
                 for r in range(rounds)]
    times: dict[str, list[float]] = {name: [] for name in runners}
    samples = dict.fromkeys(runners, 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(profile.thread_count())
    try:
        for name, runner in runners.items():
            timed_calls(runner.run, prepared[name], 0, profile.warmup)
        position = 0
        for calls in filter(None, per_round):
            for name, runner in runners.items():
                timed_calls(runner.run, prepared[name], position, ROUND_WARMUP)
                times[name] += timed_calls(runner.run, prepared[name], position, calls)
                samples[name] += sum(sizes[i % len(sizes)] for i in range(position, position + calls))
            position += calls
    finally:
        torch.set_num_threads(threads)
    return {name: summarize(times[name], samples[name]) for name in runners}


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
               "threads": profile.thread_count(), "provider": profile.provider, "device": profile.device}
        try:
            done = subprocess.run([sys.executable, "-m", "compressor.memory_probe", json.dumps(job)],
                                  capture_output=True, text=True, timeout=900)
            readings = json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mb"]
            return [float(r) for r in readings]
        except (subprocess.SubprocessError, ValueError, IndexError, KeyError, TypeError):
            return [None] * len(batch_sets)
