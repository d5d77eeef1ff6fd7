"""Building, exporting and timing structures of a teacher, to fit the latency model on.

A structure is made from the teacher the way the structural passes make it (the first L
layers kept, the last heads of each layer pruned, each FFN sliced to its first neurons,
compressor/modeling/structure.py) and shipped the way a variant ships (the real export:
ONNX, fusion, dynamic int8 for `int8`). The weights do not matter to the latency, so no
structure is trained. All structures of one fit are timed together, interleaved, on the
same real test batches (compressor/bench/timing.py), with the profile's threads and graph
optimization. The model records how much of the CPUs other processes took meanwhile; one
fitted under contention predicts high, so a later search fits it again rather than reuse it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from compressor.bench.contention import contended, summary
from compressor.bench.environment import environment
from compressor.bench.profiles import Profile
from compressor.bench.runners import Deployable, input_batches, load_runner
from compressor.bench.timing import time_interleaved
from compressor.bundle import ModelBundle
from compressor.export.onnx import (GRAPH_VERSION, ONNX_FILE, ExportSettings, export_bundle, last_layer_skip_reason,
                                    skip_layernorm_choice)
from compressor.modeling.structure import prune_heads, set_intermediate_size
from compressor.search.latency import (LatencyModel, Point, Precision, Structure, TeacherShape, fit,
                                       held_out_error, load_or_none, model_key)
from pretrain.data import Split, TaskData
from pretrain.errors import UserError
from pretrain.families import family_of
from pretrain.models import keep_encoder_layers

INT8 = {"mode": "dynamic-int8", "per_channel": True}
# Weights are untrained here: the gate checks parity only (accuracy means nothing), on a few
# examples, so that an export costs seconds.
STRUCTURE_EXPORT = ExportSettings(optimize=True, accuracy_tolerance=1.0)
GATE_SAMPLES = 16
BATCHES = 16            # distinct real batches per batch size
CALLS_PER_BATCH = 6     # timed calls of each batch per structure (its median is one point)


def teacher_shape(bundle: ModelBundle) -> TeacherShape:
    config = bundle.model.config
    family = family_of(config.model_type)
    hidden, heads = getattr(config, family.hidden_field), getattr(config, family.heads_field)
    return TeacherShape(hidden=hidden, head_dim=hidden // heads, heads=heads,
                        layers=getattr(config, family.layer_count_fields[0]),
                        ffn=getattr(config, family.intermediate_field))


def sample_structures(shape: TeacherShape, count: int, precisions: Sequence[Precision], seed: int,
                      ffn_step: int | None = None) -> list[Structure]:
    """`count` random structures per precision (seeded): depth, then each layer's heads and
    FFN width (in steps of ffn/12 by default) drawn uniformly."""
    rng = np.random.default_rng(seed)
    step = ffn_step or max(1, shape.ffn // 12)
    widths = np.arange(step, shape.ffn + 1, step)
    shapes = []
    for _ in range(count):
        depth = int(rng.integers(1, shape.layers + 1))
        shapes.append((tuple(int(h) for h in rng.integers(1, shape.heads + 1, depth)),
                       tuple(int(f) for f in rng.choice(widths, depth))))
    return [Structure(heads=h, ffn=f, precision=p) for p in precisions for h, f in shapes]


def build(teacher: ModelBundle, structure: Structure) -> ModelBundle:
    """The teacher cut to `structure` (first layers, first heads, first FFN neurons)."""
    shape = teacher_shape(teacher)
    if len(structure.heads) > shape.layers or max(structure.heads) > shape.heads or max(structure.ffn) > shape.ffn:
        raise ValueError(f"structure {structure.name} is larger than the teacher "
                         f"({shape.layers} layers, {shape.heads} heads, FFN {shape.ffn})")
    model = teacher.copy_model()
    keep_encoder_layers(model, list(range(len(structure.heads))))
    prune_heads(model, {layer: list(range(h, shape.heads)) for layer, h in enumerate(structure.heads)
                        if h < shape.heads})
    for layer, width in enumerate(structure.ffn):
        if width < shape.ffn:
            set_intermediate_size(model, layer, list(range(width)))
    deploy = {"quantize": INT8} if structure.precision == "int8" else {}
    return teacher.replace(model=model, deploy=deploy)


def export_structures(teacher: ModelBundle, structures: Sequence[Structure], task: TaskData,
                      work: Path, log: Callable[[str], None] = print,
                      deadline: float | None = None) -> dict[Structure, Path]:
    """Each structure's ONNX file under `work` (an export already there is reused; the dir
    names the exporter's graph version, so a graph traced the old way is not). Past
    `deadline` (time.monotonic()), the exports stop with a UserError; those made are kept for
    a rerun."""
    files = {}
    for done, structure in enumerate(structures):
        out = Path(work) / f"{structure.name}-g{GRAPH_VERSION}"
        if deadline is not None and time.monotonic() > deadline and not (out / ONNX_FILE).is_file():
            raise UserError(f"the latency model's structure exports used up the time budget ({done} of "
                            f"{len(structures)} made, kept in {work} for a rerun); expected a larger time budget or "
                            "fewer latency structures")
        if not (out / ONNX_FILE).is_file():
            log(f"latency model: exporting {structure.name}")
            export_bundle(build(teacher, structure), out, STRUCTURE_EXPORT, task, GATE_SAMPLES)
        files[structure] = out / ONNX_FILE
    return files


def measure(files: dict[Structure, Path], profile: Profile, tokenizer, test: Split,
            batch_sizes: Sequence[int], max_length: int) -> tuple[list[Point], list[float | None]]:
    """Every structure timed together, per batch size: one Point per structure and batch, and
    other processes' share of the CPUs while each structure was timed at each batch size."""
    points, shares = [], []
    runners = {s.name: load_runner(Deployable(s.name, "onnx", path, s.precision), profile)
               for s, path in files.items()}
    by_name = {s.name: s for s in files}
    for batch_size in batch_sizes:
        batches = input_batches(tokenizer, test, batch_size, "real", count=BATCHES, max_length=max_length)
        timing = profile.model_copy(update={"iterations": len(batches) * CALLS_PER_BATCH})
        timings = time_interleaved(runners, batches, timing)
        shares += [timings.contention.get(name) for name in timings.times]
        for name, calls in timings.times.items():
            for k, batch in enumerate(batches):
                # call i ran batch i % len(batches) (timing.timed_calls)
                ms = float(np.median(calls[k::len(batches)]))
                points.append(Point(structure=by_name[name], batch=batch_size,
                                    length=int(batch["input_ids"].shape[1]), ms=ms))
    return points, shares


def fit_latency_model(teacher: ModelBundle, task: TaskData, profile: Profile, batch_sizes: Sequence[int], *,
                      work: Path, cache: Path | None = None, fit_count: int = 12, held_out_count: int = 6,
                      precisions: Sequence[Precision] = ("fp32", "int8"), seed: int = 0,
                      log: Callable[[str], None] = print, deadline: float | None = None) -> LatencyModel:
    """The profile's latency model for this teacher: from `cache` if it was fitted on this
    machine for the same profile, teacher shape, batch sizes, precisions, structure counts and
    seed, else measured (`fit_count` random structures per precision plus the teacher itself
    to fit, `held_out_count` more to score it) and saved to `cache`. A cached model fitted
    while other processes took the CPUs (`contended`) is fitted again."""
    shape = teacher_shape(teacher)
    machine = environment()
    # Everything that decides what is measured and fitted: the structures drawn (count and
    # seed) and those held out to score it, as well as the batch sizes and precisions.
    profile_identity = {**profile.model_dump(mode="json", exclude={"name", "iterations", "warmup"}),
                        "batch_sizes": sorted(batch_sizes), "precisions": sorted(precisions),
                        "structures": {"fit": fit_count, "held_out": held_out_count, "seed": seed}}
    first_token_last = last_layer_skip_reason(teacher.model, STRUCTURE_EXPORT) is None   # as the exports trace it
    residual = skip_layernorm_choice(STRUCTURE_EXPORT, None)[0]                          # likewise
    key = model_key(machine, profile_identity, shape, first_token_last, residual)
    if cache is not None and (saved := load_or_none(cache, key)) is not None:
        if not contended(saved.contention):
            log(f"latency model: reusing {cache} (fitted on this machine for this profile and teacher)")
            return saved
        # Its predictions run high: reused, it would keep discarding plans that fit the budget.
        log(f"latency model: refitting {cache}: it was fitted while other processes used "
            f"{saved.contention['median']:.0%} of the CPUs (median over its structures)")
    whole = [Structure(heads=(shape.heads,) * shape.layers, ffn=(shape.ffn,) * shape.layers, precision=p)
             for p in precisions]
    fitting = whole + sample_structures(shape, fit_count, precisions, seed)
    held_out = [s for s in sample_structures(shape, held_out_count, precisions, seed + 1) if s not in fitting]
    files = export_structures(teacher, fitting + held_out, task, work, log, deadline)
    test = task.split("test")
    points, shares = measure(files, profile, teacher.tokenizer, test, batch_sizes, teacher.usable_length)
    seen = set(fitting)
    model = fit([p for p in points if p.structure in seen], shape, machine, key, first_token_last)
    unseen = [p for p in points if p.structure not in seen]
    model = model.model_copy(update={"held_out": held_out_error(model, unseen) if unseen else None,
                                     "contention": summary(shares)})
    if cache is not None:
        model.save(cache)
    return model
