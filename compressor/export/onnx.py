"""Export a bundle to an ONNX model dir, behind a parity gate.

An export dir holds:

    model.onnx       the graph: opset 17, dynamic batch and sequence axes; inputs input_ids,
                     attention_mask (and token_type_ids when the model takes them), output logits
    config.json      the model's HF config (labels, model_type): what Optimum needs to load it
    tokenizer files  so `pipeline("text-classification", ...)` and `compressor evaluate` work
    compressor.json  the source bundle's task, labels, pass history and deploy settings
    export.json      what the export did and measured (parity, accuracy, fusions, sizes)

A `torch-dynamic-int8` export is a PyTorch deployment instead: config, tokenizer,
compressor.json, export.json and model.int8.pt (export/torch_int8.py), no ONNX graph.

Every graph passes the gate (export/gate.py: parity with PyTorch's logits, and for a
quantized graph the test accuracy) before anything is kept. A model that fails is not
written: everything goes to a temporary dir that is renamed only at the end. The graph
itself is traced in export/trace.py.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import PreTrainedModel

from compressor.bundle import ModelBundle
from compressor.export.embedding import factorize_graph
from compressor.export.gate import Gate, GateFailure
from compressor.export.graph_cache import Fp32Graph, Fp32Graphs, fp32_graph_key
from compressor.export.graph_map import embedding_gathers, linear_nodes
from compressor.export.graph_surgery import deduplicate_initializers, has_op, read_initializers_directly
from compressor.export.optimize import Fusion, fuse
from compressor.export.quantize import (LINEAR_SCOPE_UNFUSED, DynamicInt8Config, Fp16Config, IncConfig,
                                        Int4WeightOnlyConfig, Plan, QuantizeConfig, StaticInt8Config,
                                        TorchDynamicInt8Config, check_quantize_family, lstm_handling,
                                        quantize_config_from_record, quantize_onnx)
from compressor.export.torch_int8 import INT8_FILE, quantized_copy, save_int8_model
from compressor.export.trace import OPSET, check_exportable, input_names, write_onnx
from pretrain.atomic import atomic_dir, check_output, scratch_dir, write_json
from pretrain.batching import Encoded, encode
from pretrain.data import TaskData
from pretrain.model_code import ship_model_code
from pretrain.errors import UserError, validation_message
from pretrain.finetune import predict_logits
from pretrain.first_token import first_token_copy, skip_reason

ONNX_FILE = "model.onnx"
EXPORT_FILE = "export.json"


# What the exporter makes of the same model and settings; part of every export's cache key, so
# that a graph traced the old way is not reused. 2: the last layer on the first token only;
# 3: residual LayerNorms unfused where ONNX Runtime's fused kernel is the slower one.
GRAPH_VERSION = 3

# The first onnxruntime release whose CPU SkipLayerNormalization kernel runs slower than
# Sum + LayerNormalization (measured: benchmarks/README.md, "Residual LayerNorms").
SLOW_SKIP_LAYERNORM_SINCE = (1, 30)


class ExportSettings(BaseModel):
    """The recipe's `export:` section (also what `compressor export` builds from its flags)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    onnx: bool = True                                     # write DIR/<stage>-onnx/ per stage
    optimize: bool = True                                 # ORT transformer fusion, with fallback
    parity_tolerance: float = Field(1e-4, gt=0)           # max |logit diff| vs PyTorch, fp32 graphs
    accuracy_tolerance: float = Field(0.01, ge=0, le=1)   # max accuracy drop of a quantized graph
    parity_samples: int = Field(512, ge=1)                # first N test examples for the parity check
    min_accuracy: float | None = Field(None, ge=0, le=1)  # absolute test-accuracy floor, quantized graphs
    cls_only_last_layer: bool = True                      # last layer on the first token only (pretrain/first_token.py)
    # Residual add + LayerNorm as ORT's fused SkipLayerNormalization, or as Sum + LayerNormalization;
    # auto: unfused where the installed onnxruntime's CPU kernel is the slower one (not for fp16)
    skip_layernorm: Literal["auto", "fused", "unfused"] = "auto"


@dataclass(frozen=True)
class Exported:
    """What `export_bundle` (or `export_into`) wrote and measured.

    `predictions` are the shipped model's task class ids on the gate's test examples (the
    ones `record["accuracy"]` scores), so callers need not score the same split again.
    """

    record: dict
    predictions: np.ndarray


def export_bundle(bundle: ModelBundle, out: Path, settings: ExportSettings, task: TaskData,
                  max_eval_samples: int | None = None) -> Exported:
    """Export, gate and write `out` atomically: the export record (also in export.json) and
    the shipped model's test predictions. The one entry point of the exporter; the pipeline,
    whose cached stages own their temporary dir, calls `export_into` itself."""
    if not isinstance(task, TaskData):
        raise UserError(f"export_bundle: task must be loaded task data, got {type(task).__name__}; expected "
                        "pretrain.data.load_task(spec)")
    out = Path(out)
    # replaced whole: a user's dir is refused rather than emptied (the CLI checks the same)
    check_output(out, [], owner_files=(EXPORT_FILE,), flag="export path")
    with atomic_dir(out) as tmp:
        return export_into(tmp, bundle, settings, task, max_eval_samples, final_path=out)


def export_into(directory: Path, bundle: ModelBundle, settings: ExportSettings, task: TaskData,
                max_eval_samples: int | None = None, *, final_path: Path | None = None,
                graphs: Fp32Graphs | None = None) -> Exported:
    """Write the export files into an existing (temporary) dir; raise GateFailure on a bad graph.

    export.json records `final_path` (where the caller renames `directory` to) as the export's
    path. `graphs`: the fp32 graphs of the caller's earlier exports (export/graph_cache.py).
    """
    check_exportable(bundle.model)
    quantize = requested_quantization(bundle)
    if quantize is not None:
        check_quantize_family(quantize, bundle.model.config.model_type)   # before any work
    test = task.split("test").head(max_eval_samples)
    calibration = calibration_split(bundle, quantize, task)   # checked before any work
    gate = Gate(settings, bundle, task, test)
    if isinstance(quantize, TorchDynamicInt8Config):
        record, logits = torch_int8_into(directory, bundle, gate, quantize)
    else:
        record, logits = onnx_into(directory, bundle, settings, gate, quantize, calibration, graphs)
    bundle.model.config.save_pretrained(str(directory))
    ship_model_code(directory)     # BiLSTM and CNN students: what Optimum needs to read their config
    record["max_length"] = save_deployed_tokenizer(bundle, directory)
    bundle.write_provenance(directory)
    record["path"] = str(final_path or directory)
    write_json(Path(directory) / EXPORT_FILE, record)
    return Exported(record, gate.predictions(logits))


def onnx_into(directory: Path, bundle: ModelBundle, settings: ExportSettings, gate: Gate,
              quantize: QuantizeConfig | None, calibration: Encoded | None,
              graphs: Fp32Graphs | None = None) -> tuple[dict, np.ndarray]:
    """Export, fuse and quantize; the record and the shipped graph's test logits. `graphs`: the
    run's fp32 graphs so far, which an export of the same model starts from (export/graph_cache.py)."""
    if isinstance(quantize, Fp16Config):
        warn_fp16_on_cpu()
    with scratch_dir("export") as work_dir:
        work = Path(work_dir)
        fp32 = shared_fp32_graph(work, bundle, settings, gate, quantize, graphs)
        graph, record, fp32_logits = fp32.path, dict(fp32.record), fp32.logits
        shipped_logits = fp32_logits
        if quantize is not None:
            realised = quantize
            if isinstance(quantize, IncConfig):   # INC chooses the config; ORT realises it (export/inc.py)
                from compressor.export.inc import inc_choice
                realised, record["inc"] = inc_choice(bundle, quantize, calibration, gate)
            plan, plan_record = quantization_plan(bundle, graph, realised, calibration)
            record.update(plan_record)
            quantized = work / "quantized.onnx"
            quantize_onnx(graph, quantized, realised, plan)
            record["quantized_duplicates_merged"] = deduplicate_initializers(quantized)
            if has_op(graph, "LSTM"):
                record["lstm_quantization"] = lstm_handling(realised)
            shipped_logits = gate.onnx_logits(quantized)
            record.update(gate.quantized_metrics(fp32_logits, shipped_logits, quantize))
            graph = quantized
        record["size_bytes"] = graph.stat().st_size
        record["size_ratio_to_fp32"] = record["size_bytes"] / record["fp32_size_bytes"]
        shutil.copyfile(graph, directory / ONNX_FILE)
    return record, shipped_logits


def shared_fp32_graph(work: Path, bundle: ModelBundle, settings: ExportSettings, gate: Gate,
                      quantize: QuantizeConfig | None, graphs: Fp32Graphs | None) -> Fp32Graph:
    """`fp32_graph`, or a copy in `work` of the one an earlier export of the same model made."""
    fusion = fusion_plan(settings, quantize)
    if graphs is None:
        return fp32_graph(work, bundle, settings, gate, fusion)
    key = fp32_graph_key(bundle, settings.model_dump_json(), gate, fusion)
    kept = graphs.get(key)
    if kept is None:
        graph = fp32_graph(work, bundle, settings, gate, fusion)
        graphs.keep(key, graph)
        return graph
    copy_path = work / kept.path.name   # quantizing reads the graph: no step may touch the store's copy
    shutil.copyfile(kept.path, copy_path)
    return Fp32Graph(copy_path, dict(kept.record), kept.logits)


@dataclass(frozen=True)
class FusionPlan:
    """Whether the fp32 graph is fused, the fusions left out, and what the record says why."""

    fused: bool
    left_out: tuple[str, ...] = ()
    residual: str | None = None
    residual_reason: str | None = None
    not_fused_reason: str | None = None


def fusion_plan(settings: ExportSettings, quantize: QuantizeConfig | None) -> FusionPlan:
    if settings.optimize and type(quantize) not in UNFUSED_MODES:
        residual, why = skip_layernorm_choice(settings, quantize)
        left_out = unfused_ops(quantize) + (("SkipLayerNormalization",) if residual == "unfused" else ())
        return FusionPlan(True, left_out, residual, why)
    return FusionPlan(False, not_fused_reason=UNFUSED_MODES.get(type(quantize)) if settings.optimize else None)


def fp32_graph(work: Path, bundle: ModelBundle, settings: ExportSettings, gate: Gate, fusion: FusionPlan) -> Fp32Graph:
    """The model traced to ONNX, its embedding factorized where the bundle asks, fused as
    `fusion` says; each graph checked for parity with PyTorch, the last one scored on the test split."""
    graph = work / "fp32.onnx"
    names = input_names(bundle.model, bundle.tokenizer.model_input_names)
    traced, last_layer = model_to_trace(bundle.model, settings)
    write_onnx(traced, graph, names)
    read_initializers_directly(graph)   # layers that share a weight: int8 must reach them all
    rank = bundle.deploy.get("embedding_rank")
    factorized = factorize_graph(graph, bundle.model.get_input_embeddings().weight, rank) if rank else None
    record = {"format": "onnx", "opset": OPSET, "inputs": list(names), "embedding_factorized": factorized,
              **last_layer,
              "parity_tolerance": settings.parity_tolerance,
              "parity_samples": gate.parity_samples, **gate.parity(graph, "the ONNX export")}
    if fusion.fused:
        graph, fusion_record = optimized(graph, work / "fused.onnx", gate, fusion.left_out, bundle.model.config)
        record.update(fusion_record)
        if fusion_record["optimized"]:   # what was fused and left out describes a fused graph
            record.update(skip_layernorm=fusion.residual, skip_layernorm_reason=fusion.residual_reason)
    else:
        record.update({"optimized": False, "fusions": {}, "fusion_fallback": fusion.not_fused_reason})
    logits = gate.onnx_logits(graph)
    record.update(gate.fp32_metrics(logits, graph))
    return Fp32Graph(graph, record, logits)


def last_layer_skip_reason(model: PreTrainedModel, settings: ExportSettings) -> str | None:
    """Why the export traces `model`'s last layer whole; None when it runs the first token only."""
    return skip_reason(model) if settings.cls_only_last_layer else "not asked (cls_only_last_layer: false)"


def model_to_trace(model: PreTrainedModel, settings: ExportSettings) -> tuple[PreTrainedModel, dict]:
    """The model the graph is traced from, and the record of its last layer: computed for the
    first token only where the settings ask and the model allows (pretrain/first_token.py)."""
    reason = last_layer_skip_reason(model, settings)
    record = {"cls_only_last_layer": reason is None, "cls_only_last_layer_skipped": reason}
    return (first_token_copy(model) if reason is None else model), record


def skip_layernorm_choice(settings: ExportSettings, quantize: QuantizeConfig | None) -> tuple[str, str]:
    """How the residual LayerNorms are written ("fused" or "unfused"), and why."""
    if settings.skip_layernorm != "auto":
        return settings.skip_layernorm, "asked (skip_layernorm)"
    if isinstance(quantize, Fp16Config):
        return "fused", "fp16 targets GPU providers, whose fused kernel is the fast one"
    import onnxruntime as ort
    version = tuple(int(part) for part in ort.__version__.split(".")[:2])
    if version >= SLOW_SKIP_LAYERNORM_SINCE:
        return "unfused", (f"onnxruntime {ort.__version__}: its CPU SkipLayerNormalization kernel is slower "
                           "than Sum + LayerNormalization")
    return "fused", f"onnxruntime {ort.__version__}: its CPU SkipLayerNormalization kernel is the fast one"


# Modes that quantize the unfused graph, and why (recorded as the fusion fallback).
UNFUSED_MODES = {Int4WeightOnlyConfig: "int4-weight-only quantizes the unfused graph: fused Attention and "
                                     "EmbedLayerNormalization nodes hide their weights from MatMulNBits"}


def unfused_ops(quantize: QuantizeConfig | None) -> tuple[str, ...]:
    """Fusions left out: static int8 of the Linear layers only needs each Linear as its own
    MatMul (a fused Attention holds Q, K and V in one node) and a plain embedding Gather."""
    if isinstance(quantize, StaticInt8Config) and quantize.scope == "linears":
        return LINEAR_SCOPE_UNFUSED
    return ()


def calibration_split(bundle: ModelBundle, quantize: QuantizeConfig | None, task: TaskData) -> Encoded | None:
    """The first calibration_samples examples: train ones to calibrate static-int8 ranges,
    validation ones for inc's accuracy-aware tuning (which must not see the test split)."""
    rows = calibration_rows(quantize, task)
    return None if rows is None else encode(bundle.tokenizer, rows, bundle.usable_length)


def save_deployed_tokenizer(bundle: ModelBundle, directory: Path) -> int:
    """The tokenizer, its `model_max_length` set to the length the gate's accuracy was measured
    at (what `pipeline(..., truncation=True)` then cuts a text to); returns that length. The
    bundle's own tokenizer keeps its value (later steps of the tool read it)."""
    length = bundle.usable_length
    cutting_at(bundle.tokenizer, length).save_pretrained(str(directory))
    return length


def cutting_at(tokenizer, length: int):
    """A copy of `tokenizer` whose `model_max_length` is `length`, and so is the `max_length`
    a tokenizer_config.json may carry from an older save (MiniLM's hub files: 128): saved
    unchanged, it said 128 beside a `model_max_length` of 64. A fast tokenizer is copied
    deeply: a shallow copy shares its Rust backend, whose batching `batching_as_the_gate` sets."""
    cut = copy.deepcopy(tokenizer) if tokenizer.is_fast else copy.copy(tokenizer)
    cut.model_max_length = length
    if "max_length" in tokenizer.init_kwargs:
        cut.init_kwargs = {**tokenizer.init_kwargs, "max_length": length}
    if tokenizer.is_fast:
        batching_as_the_gate(cut, length)
    return cut


def batching_as_the_gate(tokenizer, length: int) -> None:
    """Set the truncation and padding that tokenizer.json stores to the gate's: cut at `length`,
    pad each batch to its longest row on the tokenizer's side. A serving process that reads
    tokenizer.json with the `tokenizers` package alone applies them as stored; Transformers'
    fast tokenizer stores whatever its last call left there (none at all after a call
    without truncation, another length after a call with another max_length)."""
    backend = tokenizer.backend_tokenizer
    backend.enable_truncation(length, strategy="longest_first", direction=tokenizer.truncation_side)
    if tokenizer.pad_token_id is None:      # nothing to pad with (GPT-2): the caller batches
        backend.no_padding()
        return
    backend.enable_padding(direction=tokenizer.padding_side, pad_id=tokenizer.pad_token_id,
                           pad_type_id=tokenizer.pad_token_type_id, pad_token=tokenizer.pad_token)


def calibration_rows(quantize: QuantizeConfig | None, task: TaskData):
    """The examples a quantize mode calibrates on (None: it calibrates on none), after checking
    the split holds that many (`compressor run` checks it before anything runs)."""
    if not isinstance(quantize, (StaticInt8Config, IncConfig)):
        return None
    name = "train" if isinstance(quantize, StaticInt8Config) else "validation"
    split = task.split(name)
    wanted = quantize.calibration_samples
    if len(split) < wanted:
        raise UserError(f"calibration set too small: {quantize.mode} asks for calibration_samples="
                        f"{wanted} but the {name} split of {task.name!r} has {len(split)} examples; "
                        f"lower calibration_samples to at most {len(split)}")
    return split.head(wanted)


def quantization_plan(bundle: ModelBundle, graph: Path, cfg: QuantizeConfig,
                      calibration: Encoded | None) -> tuple[Plan, dict]:
    """What the `sensitivity` and `qat` passes recorded, translated to this graph's nodes."""
    keep = tuple((bundle.deploy.get("sensitivity") or {}).get("keep", ()))
    ranges = (bundle.deploy.get("qat") or {}).get("activation_ranges") or {}
    linears = isinstance(cfg, StaticInt8Config) and cfg.scope == "linears"
    if not keep and not ranges and not linears or not isinstance(cfg, (DynamicInt8Config, StaticInt8Config)):
        return Plan(calibration=calibration), {}
    nodes = linear_nodes(graph, bundle.model)
    exclude = sorted({n.node for name in keep for n in nodes.get(name, ())})
    scope = {}
    if linears:
        scope = {"linear_nodes": tuple(sorted({n.node for found in nodes.values() for n in found})),
                 "embedding_gathers": tuple(embedding_gathers(graph, bundle.model))}
    activation_ranges = {}
    if isinstance(cfg, StaticInt8Config):
        for name, threshold in ranges.items():
            for node in nodes.get(name, ()):
                if node.node not in exclude:
                    # Q, K and V read one tensor: the widest of their ranges covers all three.
                    tensor = node.activation
                    activation_ranges[tensor] = max(threshold, activation_ranges.get(tensor, 0.0))
    record = {"kept_in_float": exclude, "kept_layers": list(keep),
              "qat_ranges_applied": len(activation_ranges)}
    if linears:
        record["quantized_linears"] = len(scope["linear_nodes"])
        record["quantized_embedding_lookups"] = len(scope["embedding_gathers"])
    return Plan(calibration, tuple(exclude), activation_ranges, **scope), record


def torch_int8_into(directory: Path, bundle: ModelBundle, gate: Gate,
                    cfg: QuantizeConfig) -> tuple[dict, np.ndarray]:
    """The PyTorch deployment: int8 state dict + config + tokenizer, gated like ONNX modes;
    the record and the int8 model's test logits."""
    model = quantized_copy(bundle.model)
    fp32_logits = predict_logits(bundle.model, gate.data)
    with scratch_dir("export") as work_dir:
        # save_pretrained writes tied weights once (BART's encoder and decoder share one
        # embedding table; safetensors refuses a state dict with shared tensors).
        bundle.model.save_pretrained(work_dir, safe_serialization=True)
        fp32_size = (Path(work_dir) / "model.safetensors").stat().st_size
    int8_logits = predict_logits(model, gate.data)
    record = {"format": "torch", "file": INT8_FILE, "inputs": list(bundle.tokenizer.model_input_names),
              **gate.fp32_metrics(fp32_logits, None), "fp32_size_bytes": fp32_size,
              **gate.quantized_metrics(fp32_logits, int8_logits, cfg)}
    size = save_int8_model(model, directory).stat().st_size
    record.update({"size_bytes": size, "size_ratio_to_fp32": size / fp32_size})
    if any(isinstance(m, torch.nn.LSTM) for m in bundle.model.modules()):
        record["lstm_quantization"] = lstm_handling(cfg)
    return record, int8_logits


def warn_fp16_on_cpu() -> None:
    """fp16 halves the file, but ONNX Runtime's CPU provider computes most ops in fp32 anyway."""
    import onnxruntime as ort
    accelerated = [p for p in ort.get_available_providers()
                   if p not in ("CPUExecutionProvider", "AzureExecutionProvider")]
    if not accelerated:
        print("warning: fp16 requested but ONNX Runtime has only the CPU provider here: the model "
              "will be half the size but not faster (fp16 pays off on GPU providers)",
              file=sys.stderr, flush=True)


def optimized(graph: Path, target: Path, gate: Gate, unfused: tuple[str, ...] = (),
              config=None) -> tuple[Path, dict]:
    """The fused graph if fusion applies and keeps parity; otherwise the input graph."""
    fusion, parity, merged = fuse(graph, target, unfused, config), {}, 0
    if fusion.path is not None:
        merged = deduplicate_initializers(fusion.path)   # fused layers that share weights
        try:
            parity = gate.parity(fusion.path, "the fused graph")   # the shipped graph's parity
        except GateFailure as err:
            fusion = Fusion(None, {}, f"fused graph failed parity: {err}")
    record = {"optimized": fusion.path is not None, "fusions": fusion.fusions,
              "fusion_fallback": fusion.fallback, "fused_duplicates_merged": merged, **parity}
    if unfused and fusion.path is not None:
        record["fusions_left_out"] = list(unfused)
    return (fusion.path or graph), record


def requested_quantization(bundle: ModelBundle) -> QuantizeConfig | None:
    """The precision a `quantize` pass recorded on the bundle, if any."""
    spec = bundle.deploy.get("quantize")
    if spec is None:
        return None
    try:
        return quantize_config_from_record(spec)
    except ValidationError as err:   # a hand-edited compressor.json
        raise UserError(f"compressor.json deploy.quantize: {validation_message(err.errors()[0])}") from None


def read_export_record(path: Path) -> dict:
    try:
        return json.loads((Path(path) / EXPORT_FILE).read_text())
    except (OSError, ValueError):
        return {}
