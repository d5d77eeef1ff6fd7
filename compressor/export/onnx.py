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

The gate runs on real test batches, padded to each batch's longest member as in
pretrain/batching.py. The fp32 graph (and the fused graph) must match PyTorch's logits to
`parity_tolerance`; a quantized graph must keep test accuracy within `accuracy_tolerance`
of the fp32 graph. A model that fails is not written: everything goes to a temporary dir
that is renamed only at the end.
"""

from __future__ import annotations

import inspect
import json
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import PreTrainedModel

from compressor.atomic import atomic_dir, write_json
from compressor.bundle import ModelBundle
from compressor.evaluate import label_permutation, onnx_logits_fn
from compressor.export.optimize import Fusion, fuse
from compressor.export.einsum import weight_einsums_as_matmuls
from compressor.export.embedding import factorize_graph
from compressor.export.graph_map import embedding_gathers, linear_nodes
from compressor.export.inc import check_inc_family
from compressor.export.quantize import (INT8_ONNX_MODES, LINEAR_SCOPE_UNFUSED, Plan, QuantizeConfig,
                                        has_op, lstm_handling, quantize_onnx)
from compressor.export.torch_int8 import INT8_FILE, quantized_copy, save_int8_model
from pretrain.batching import Encoded, encode, usable_length
from pretrain.data import Split, TaskData
from pretrain.errors import UserError
from pretrain.finetune import predict_logits
from pretrain.metrics import agreement, classification_metrics
from pretrain.families import FAMILIES, SUPPORTED_FAMILIES
from pretrain.models import first_line

OPSET = 17
ONNX_FILE = "model.onnx"
EXPORT_FILE = "export.json"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


class ExportSettings(BaseModel):
    """The recipe's `export:` section (also what `compressor export` builds from its flags)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    onnx: bool = True                                     # write DIR/<stage>-onnx/ per stage
    optimize: bool = True                                 # ORT transformer fusion, with fallback
    parity_tolerance: float = Field(1e-4, gt=0)           # max |logit diff| vs PyTorch, fp32 graphs
    accuracy_tolerance: float = Field(0.01, ge=0, le=1)   # max accuracy drop of a quantized graph
    parity_samples: int = Field(512, ge=1)                # first N test examples for the parity check
    min_accuracy: float | None = Field(None, ge=0, le=1)  # absolute test-accuracy floor, quantized graphs


class GateFailure(UserError):
    """An export failed its parity or accuracy gate (a one-line message with the numbers)."""


@dataclass(frozen=True)
class Exported:
    """What `export_into` wrote and measured.

    `predictions` are the shipped model's task class ids on the gate's test examples (the
    ones `record["accuracy"]` scores), so callers need not score the same split again.
    """

    record: dict
    predictions: np.ndarray


def export_bundle(bundle: ModelBundle, out: Path, settings: ExportSettings, task: TaskData,
                  max_eval_samples: int | None = None) -> dict:
    """Export, gate and write `out` atomically; return the export record (also in export.json)."""
    return export_scored(bundle, out, settings, task, max_eval_samples).record


def export_scored(bundle: ModelBundle, out: Path, settings: ExportSettings, task: TaskData,
                  max_eval_samples: int | None = None) -> Exported:
    """`export_bundle`, also returning the shipped model's test predictions."""
    out = Path(out)
    with atomic_dir(out) as tmp:
        exported = export_into(tmp, bundle, settings, task, max_eval_samples)
        exported.record["path"] = str(out)
        write_json(tmp / EXPORT_FILE, exported.record)
    return exported


def export_into(directory: Path, bundle: ModelBundle, settings: ExportSettings, task: TaskData,
                max_eval_samples: int | None = None) -> Exported:
    """Write the export files into an existing (temporary) dir; raise GateFailure on a bad graph."""
    check_exportable(bundle.model)
    quantize = requested_quantization(bundle)
    if quantize is not None and quantize.mode == "inc":
        check_inc_family(bundle.model.config.model_type)       # before any work
    test = task.split("test").head(max_eval_samples)
    calibration = calibration_split(bundle, quantize, task)   # checked before any work
    gate = Gate(settings, bundle, task, test)
    if quantize is not None and quantize.mode == "torch-dynamic-int8":
        record, logits = torch_int8_into(directory, bundle, gate, quantize)
    else:
        record, logits = onnx_into(directory, bundle, settings, gate, quantize, calibration)
    bundle.model.config.save_pretrained(str(directory))
    bundle.tokenizer.save_pretrained(str(directory))
    bundle.write_provenance(directory)
    return Exported(record, gate.predictions(logits))


def onnx_into(directory: Path, bundle: ModelBundle, settings: ExportSettings, gate: "Gate",
              quantize: QuantizeConfig | None, calibration: Encoded | None) -> tuple[dict, np.ndarray]:
    """Export, fuse and quantize; the record and the shipped graph's test logits."""
    if quantize is not None and quantize.mode == "fp16":
        warn_fp16_on_cpu()
    with tempfile.TemporaryDirectory(prefix="compressor-export-") as work_dir:
        work = Path(work_dir)
        graph = work / "fp32.onnx"
        names = input_names(bundle.model, bundle.tokenizer.model_input_names)
        write_onnx(bundle.model, graph, names)
        rank = bundle.deploy.get("embedding_rank")
        factorized = factorize_graph(graph, bundle.model.get_input_embeddings().weight, rank) if rank else None
        record = {"format": "onnx", "opset": OPSET, "inputs": list(names), "embedding_factorized": factorized,
                  "parity_tolerance": settings.parity_tolerance,
                  "parity_samples": gate.parity_samples, **gate.parity(graph, "the ONNX export")}
        if settings.optimize and not (quantize and quantize.mode in UNFUSED_MODES):
            graph, fusion_record = optimized(graph, work / "fused.onnx", gate, unfused_ops(quantize),
                                             bundle.model.config)
            record.update(fusion_record)
        else:
            why = UNFUSED_MODES.get(quantize.mode) if settings.optimize and quantize else None
            record.update({"optimized": False, "fusions": {}, "fusion_fallback": why})
        fp32_logits = shipped_logits = gate.onnx_logits(graph)
        record.update(gate.fp32_metrics(fp32_logits, graph))
        if quantize is not None:
            realised = quantize
            if quantize.mode == "inc":   # INC chooses the config; ORT realises it (export/inc.py)
                from compressor.export.inc import inc_choice
                realised, record["inc"] = inc_choice(bundle, quantize, calibration, gate)
            plan, plan_record = quantization_plan(bundle, graph, realised, calibration)
            record.update(plan_record)
            quantized = work / "quantized.onnx"
            quantize_onnx(graph, quantized, realised, plan)
            if has_op(graph, "LSTM"):
                record["lstm_quantization"] = lstm_handling(realised)
            shipped_logits = gate.onnx_logits(quantized)
            record.update(gate.quantized_metrics(fp32_logits, shipped_logits, quantize))
            graph = quantized
        record["size_bytes"] = graph.stat().st_size
        record["size_ratio_to_fp32"] = record["size_bytes"] / record["fp32_size_bytes"]
        shutil.copyfile(graph, directory / ONNX_FILE)
    return record, shipped_logits


# Modes that quantize the unfused graph, and why (recorded as the fusion fallback).
UNFUSED_MODES = {"int4-weight-only": "int4-weight-only quantizes the unfused graph: fused Attention and "
                                     "EmbedLayerNormalization nodes hide their weights from MatMulNBits"}


def unfused_ops(quantize: QuantizeConfig | None) -> tuple[str, ...]:
    """Fusions left out: static int8 of the Linear layers only needs each Linear as its own
    MatMul (a fused Attention holds Q, K and V in one node) and a plain embedding Gather."""
    if quantize is not None and quantize.mode == "static-int8" and quantize.scope == "linears":
        return LINEAR_SCOPE_UNFUSED
    return ()


def calibration_split(bundle: ModelBundle, quantize: QuantizeConfig | None, task: TaskData) -> Encoded | None:
    """The first calibration_samples examples: train ones to calibrate static-int8 ranges,
    validation ones for inc's accuracy-aware tuning (which must not see the test split)."""
    if quantize is None or quantize.mode not in ("static-int8", "inc"):
        return None
    name = "train" if quantize.mode == "static-int8" else "validation"
    split = task.split(name)
    wanted = quantize.calibration_samples
    if len(split) < wanted:
        raise UserError(f"calibration set too small: {quantize.mode} asks for calibration_samples="
                        f"{wanted} but the {name} split of {task.name!r} has {len(split)} examples; "
                        f"lower calibration_samples to at most {len(split)}")
    return encode(bundle.tokenizer, split.head(wanted), usable_length(bundle.model))


def quantization_plan(bundle: ModelBundle, graph: Path, cfg: QuantizeConfig,
                      calibration: Encoded | None) -> tuple[Plan, dict]:
    """What the `sensitivity` and `qat` passes recorded, translated to this graph's nodes."""
    keep = tuple((bundle.deploy.get("sensitivity") or {}).get("keep", ()))
    ranges = (bundle.deploy.get("qat") or {}).get("activation_ranges") or {}
    linears = cfg.mode == "static-int8" and cfg.scope == "linears"
    if not keep and not ranges and not linears or cfg.mode not in INT8_ONNX_MODES:
        return Plan(calibration=calibration), {}
    nodes = linear_nodes(graph, bundle.model)
    exclude = sorted({nodes[name].node for name in keep if name in nodes})
    scope = {}
    if linears:
        scope = {"linear_nodes": tuple(sorted({n.node for n in nodes.values()})),
                 "embedding_gathers": tuple(embedding_gathers(graph, bundle.model))}
    activation_ranges = {}
    if cfg.mode == "static-int8":
        for name, threshold in ranges.items():
            if name in nodes and nodes[name].node not in exclude:
                # Q, K and V read one tensor: the widest of their ranges covers all three.
                tensor = nodes[name].activation
                activation_ranges[tensor] = max(threshold, activation_ranges.get(tensor, 0.0))
    record = {"kept_in_float": exclude, "kept_layers": list(keep),
              "qat_ranges_applied": len(activation_ranges)}
    if linears:
        record["quantized_linears"] = len(scope["linear_nodes"])
        record["quantized_embedding_lookups"] = len(scope["embedding_gathers"])
    return Plan(calibration, tuple(exclude), activation_ranges, **scope), record


def torch_int8_into(directory: Path, bundle: ModelBundle, gate: "Gate",
                    cfg: QuantizeConfig) -> tuple[dict, np.ndarray]:
    """The PyTorch deployment: int8 state dict + config + tokenizer, gated like ONNX modes;
    the record and the int8 model's test logits."""
    model = quantized_copy(bundle.model)
    fp32_logits = predict_logits(bundle.model, gate.data)
    with tempfile.TemporaryDirectory(prefix="compressor-export-") as work_dir:
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


def optimized(graph: Path, target: Path, gate: "Gate", unfused: tuple[str, ...] = (),
              config=None) -> tuple[Path, dict]:
    """The fused graph if fusion applies and keeps parity; otherwise the input graph."""
    fusion, parity = fuse(graph, target, unfused, config), {}
    if fusion.path is not None:
        try:
            parity = gate.parity(fusion.path, "the fused graph")   # the shipped graph's parity
        except GateFailure as err:
            fusion = Fusion(None, {}, f"fused graph failed parity: {err}")
    record = {"optimized": fusion.path is not None, "fusions": fusion.fusions,
              "fusion_fallback": fusion.fallback, **parity}
    if unfused:
        record["fusions_left_out"] = list(unfused)
    return (fusion.path or graph), record


class Gate:
    """Reference logits and test data of one export, and the checks every graph must pass."""

    def __init__(self, settings: ExportSettings, bundle: ModelBundle, task: TaskData, test: Split) -> None:
        self.settings = settings
        self.labels = np.asarray(test.labels)
        self.to_task = label_permutation(bundle.label_names, task)   # model class id -> task class id
        length = usable_length(bundle.model)      # within the model's positions
        self.data = encode(bundle.tokenizer, test, length)
        parity_split = test.head(settings.parity_samples)
        self.parity_data = encode(bundle.tokenizer, parity_split, length)
        self.parity_samples = len(parity_split)
        self.reference = predict_logits(bundle.model, self.parity_data)

    def onnx_logits(self, graph: Path, data: Encoded | None = None) -> np.ndarray:
        return onnx_logits_fn(graph)(self.data if data is None else data)

    def parity(self, graph: Path, what: str) -> dict:
        diff = max_abs_diff(self.reference, self.onnx_logits(graph, self.parity_data))
        tolerance = self.settings.parity_tolerance
        if not diff <= tolerance:   # also catches NaN
            raise GateFailure(f"{what} does not match PyTorch: max |logit difference| {diff:.3g} on "
                              f"{self.parity_samples} test examples exceeds parity_tolerance "
                              f"{tolerance:g} by {diff - tolerance:.3g}")
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
                f"{agree:.3f}); not written")
        floor = self.settings.min_accuracy
        if floor is not None and not metrics["accuracy"] >= floor:
            raise GateFailure(
                f"{cfg.mode} model falls below the recipe's accuracy floor: test accuracy "
                f"{metrics['accuracy']:.4f} on {len(fp32)} examples is {(floor - metrics['accuracy']) * 100:.2f} "
                f"points under min_accuracy {floor:.4f} (fp32 {fp32_accuracy:.4f}); not written")
        return {"precision": cfg.mode, "quantization": cfg.model_dump(mode="json"),
                "accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"],
                "accuracy_change": change, "agreement_with_fp32": agree}


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float(np.abs(a - b).max()) if a.size else 0.0


def check_exportable(model: PreTrainedModel) -> None:
    family = model.config.model_type
    if family not in SUPPORTED_FAMILIES:
        raise UserError(f"cannot export model family {family!r}: the ONNX exporter supports "
                        f"{', '.join(SUPPORTED_FAMILIES)}")


def requested_quantization(bundle: ModelBundle) -> QuantizeConfig | None:
    """The precision a `quantize` pass recorded on the bundle, if any."""
    spec = bundle.deploy.get("quantize")
    if spec is None:
        return None
    try:
        return QuantizeConfig.model_validate(spec)
    except ValidationError as err:   # a hand-edited compressor.json
        raise UserError(f"compressor.json deploy.quantize: {err.errors()[0]['msg']}") from None


def input_names(model: PreTrainedModel, tokenizer_outputs: list[str] | None = None) -> tuple[str, ...]:
    """The graph's inputs, in the order of model.forward's parameters.

    token_type_ids only when the tokenizer produces them too: a RoBERTa tokenizer does not,
    and a graph that required them would fail on what the tokenizer feeds it (the model
    then uses its own all-zero default, traced into the graph).
    """
    params = list(inspect.signature(model.forward).parameters)
    wanted = [n for n in INPUT_NAMES if n in params]
    if tokenizer_outputs is not None and "token_type_ids" not in tokenizer_outputs:
        wanted = [n for n in wanted if n != "token_type_ids"]
    return tuple(sorted(wanted, key=params.index))


def write_onnx(model: PreTrainedModel, path: Path, names: tuple[str, ...] | None = None) -> None:
    """Trace `model` to an ONNX file with dynamic batch and sequence axes.

    The TorchScript exporter (dynamo=False), because it is the one that works here: the
    dynamo exporter needs onnxscript, which is not a dependency, and torch.export
    specialises on the example's shapes unless every dimension is declared. Tracing records
    each layer's own head count and FFN width as constants, so models with per-layer head
    counts (prune_heads) or sliced FFNs export as they are.
    """
    check_exportable(model)
    names = names or input_names(model)
    example = example_inputs(names, model.config)
    axes = {name: {0: "batch", 1: "sequence"} for name in names} | {"logits": {0: "batch"}}
    model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")   # the TorchScript exporter's tracer notices
            torch.onnx.export(LogitsOnly(model, names), tuple(example[n] for n in names), str(path),
                              input_names=list(names), output_names=["logits"],
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    except Exception as err:  # tracing raises many types on modules it cannot follow
        raise UserError(f"ONNX export of the {model.config.model_type} model failed: {first_line(err)}") from None
    if any(isinstance(m, torch.nn.LSTM) for m in model.modules()):   # spare other graphs a reload
        lstm_weights_as_initializers(path)
    if FAMILIES[model.config.model_type].einsum_projections:
        # einsums over [hidden, heads, head_dim] weights: rewritten as MatMuls so that
        # quantization reaches them (export/einsum.py)
        weight_einsums_as_matmuls(path)


def lstm_weights_as_initializers(path: Path) -> None:
    """Turn the Constant nodes feeding LSTM weights (W, R) into initializers.

    The BiLM's recurrent weight is a product computed outside the trace
    (pretrain/objectives/bilm.py `lstmp`), which the exporter writes as a Constant node;
    ONNX Runtime's quantizer only quantizes LSTM weights held as initializers. Graphs
    without LSTMs are left untouched.
    """
    import onnx
    proto = onnx.load(str(path))
    producers = {out: node for node in proto.graph.node for out in node.output}
    moved = []
    for node in proto.graph.node:
        if node.op_type != "LSTM":
            continue
        for name in node.input[1:3]:
            source = producers.get(name)
            if source is not None and source.op_type == "Constant" and source not in moved:
                tensor = onnx.helper.get_attribute_value(source.attribute[0])
                tensor.name = name
                proto.graph.initializer.append(tensor)
                moved.append(source)
    if moved:
        for node in moved:
            proto.graph.node.remove(node)
        onnx.save(proto, str(path))


class LogitsOnly(torch.nn.Module):
    """The graph's one output: logits. Encoder-decoders (BART) and XLNet also return caches
    (past key values, mems) and encoder states that a classifier never needs; asking for
    none keeps them out of the graph."""

    NO_CACHE = {"use_cache": False, "use_mems": False}   # forward flags that turn caches off

    def __init__(self, model: PreTrainedModel, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names
        params = inspect.signature(model.forward).parameters
        self.flags = {k: v for k, v in self.NO_CACHE.items() if k in params}

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs)), **self.flags).logits


def example_inputs(names: tuple[str, ...], config) -> dict[str, torch.Tensor]:
    """A padded batch of 2 x 8: the second row ends in padding so the mask path is traced.

    (An all-ones mask lets some attention implementations skip the mask, which tracing
    would then bake into the graph.) Families that read the end-of-sequence token (BART
    classifies from the last EOS of each row) get one EOS as each row's last real token and
    nowhere else, as a tokenized batch has.
    """
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, config.vocab_size, (2, 8), generator=generator)
    mask = torch.ones((2, 8), dtype=torch.long)
    mask[1, 5:] = 0
    eos = getattr(config, "eos_token_id", None)
    if eos is not None:
        ids[ids == eos] = 1 if eos != 1 else 2
        ids[0, 7] = ids[1, 4] = eos
        ids[1, 5:] = config.pad_token_id if config.pad_token_id is not None else 0
    return {"input_ids": ids, "attention_mask": mask,
            "token_type_ids": torch.zeros((2, 8), dtype=torch.long)}


def read_export_record(path: Path) -> dict:
    try:
        return json.loads((Path(path) / EXPORT_FILE).read_text())
    except (OSError, ValueError):
        return {}
