"""Quantization of an exported ONNX graph: the ONNX modes of the `quantize` pass.

The pass only records the requested precision on the bundle (`bundle.deploy["quantize"]`);
the exporter calls `quantize_onnx` on the fp32 (or fused) graph:

    dynamic-int8      int8 weights offline, activations quantized per batch at run time
    static-int8       int8 weights and activations; activation ranges calibrated on the
                      task's train split (MinMax, Entropy or Percentile), QDQ or QOperator
    int4-weight-only  4-bit block-quantized MatMul weights (MatMulNBits, which has a CPU
                      kernel) and 4-bit word embeddings (GatherBlockQuantized)
    fp16              half-precision weights and activations (for GPU providers)

`torch-dynamic-int8` and `inc` are realised elsewhere (export/torch_int8.py, export/inc.py).
What other passes learned reaches the quantizer as a `Plan`: node names to keep in fp32
(the `sensitivity` pass) and activation ranges to use instead of calibrated ones (`qat`).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from compressor.export.graph_surgery import (gathered_tables, graph_inputs, has_op, keep_float_elsewhere,
                                             unshare_initializers, with_shapes)
from compressor.export.quiet import quiet_logs
from pretrain.batching import Encoded, inference_order, iterate
from pretrain.errors import UserError
from pretrain.families import FAMILIES

Mode = Literal["dynamic-int8", "static-int8", "inc", "torch-dynamic-int8", "fp16", "int4-weight-only"]
ONNX_MODES = ("dynamic-int8", "static-int8", "int4-weight-only", "fp16")
INT8_ONNX_MODES = ("dynamic-int8", "static-int8")

# Every weight-carrying op of a BERT graph, unfused or fused. Gather covers the word,
# position and token-type embedding lookups: the word-embedding matrix alone is half of
# MiniLM's parameters, so leaving it fp32 would keep the file at about 60% of fp32.
# EmbedLayerNormalization is the same lookups once fused. Optimum's dynamic presets quantize
# these too (their list is Conv, MatMul, Attention, LSTM, Gather, Transpose and
# EmbedLayerNormalization); benchmarks/int8_side_by_side.py measures what the differences do.
TRANSFORMER_INT8_OPS = ["MatMul", "Attention", "Gather", "EmbedLayerNormalization"]
# LSTM (the BiLM teacher): ORT's DynamicQuantizeLSTM keeps both weight matrices in int8.
DYNAMIC_INT8_OPS = TRANSFORMER_INT8_OPS + ["LSTM"]
# Static int8 quantizes the Transformer ops. Residual adds, LayerNorm, Softmax and GELU
# stay float: their outputs carry the outlier channels that make BERT's activations hard
# to fit in 8 bits. ORT has no static int8 LSTM (its QDQ and QOperator registries lack
# one): with `scope: ops` a graph's LSTMs get the one int8 LSTM ORT has, DynamicQuantizeLSTM
# (int8 weights, inputs quantized per batch), after the static pass (`lstm_handling`).
STATIC_INT8_OPS = TRANSFORMER_INT8_OPS
CALIBRATION_BATCH = 32

# static-int8 `scope`: which tensors become int8.
#   ops      every op of STATIC_INT8_OPS in the fused graph, the way ORT's static quantizer
#            treats it: a fused Attention or EmbedLayerNormalization gets all its inputs
#            (weights, biases, LayerNorm gains) and its output quantized as activations, a
#            MatMul its output too, and a quantized tensor reaches every consumer through one
#            shared Q/DQ pair, residual connections included.
#   linears  what Q8BERT (and the `qat` pass) quantize and nothing else: each Linear layer's
#            weight and input, and the word-embedding table (symmetric int8, per-tensor
#            scale). Outputs, residual paths, LayerNorm, softmax and attention products stay
#            float. The exporter leaves attention and embedding-layernorm unfused so that
#            every Linear is its own MatMul; each then runs as an integer kernel
#            (MatMulIntegerToFloat) and the embedding is gathered in int8, then dequantized.
LINEAR_SCOPE_OPS = ["MatMul", "Gemm", "Gather"]
LINEAR_SCOPE_UNFUSED = ("Attention", "EmbedLayerNormalization")

# Options that only mean something for some modes: setting one for another mode is an error
# (a recipe that asks for `calibration: entropy` with dynamic-int8 would silently get nothing).
MODE_OPTIONS = {
    "per_channel": ("dynamic-int8", "static-int8", "inc"),
    "reduce_range": ("dynamic-int8", "static-int8", "inc"),
    "weight_type": ("dynamic-int8", "static-int8"),
    "calibration": ("static-int8",),
    "format": ("static-int8",),
    "scope": ("static-int8",),
    "calibration_samples": ("static-int8", "inc"),
    "block_size": ("int4-weight-only",),
    "tolerable_loss": ("inc",),
    "max_trials": ("inc",),
}
# Per-channel weight scales are what works on transformers for static int8 (a per-tensor
# scale is set by the one outlier row of each matrix); dynamic-int8 keeps its old default.
PER_CHANNEL_DEFAULT = {"dynamic-int8": False, "static-int8": True, "inc": True}


class QuantizeConfig(BaseModel):
    """What the `quantize` pass asks of the exporter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = "dynamic-int8"
    per_channel: bool | None = None   # one weight scale per output channel; None: the mode's default
    reduce_range: bool = False        # 7-bit weights: avoids VPMADDUBSW saturation on non-VNNI x86
    weight_type: Literal["qint8", "quint8"] = "qint8"
    # static-int8 ranges. Entropy by default: BERT's activations have rare outliers that
    # MinMax lets set the whole range. (A first check on the MiniLM teacher, 1,000 test
    # examples: Entropy -0.5 points, MinMax -1.4; benchmarks/quantization_accuracy.py
    # compares all three on 5,000.)
    calibration: Literal["minmax", "entropy", "percentile"] = "entropy"
    format: Literal["qdq", "qoperator"] = "qdq"                            # static-int8 graph form
    scope: Literal["ops", "linears"] = "ops"      # static-int8: what becomes int8 (LINEAR_SCOPE_OPS note)
    calibration_samples: int = Field(512, ge=1)   # first N train (static-int8) / validation (inc) examples
    block_size: int = Field(32, ge=16)            # int4: weights per scale (a power of 2)
    tolerable_loss: float = Field(0.01, ge=0, le=1)   # inc: relative accuracy loss allowed (INC's definition)
    max_trials: int = Field(8, ge=1)                   # inc: autotune trials

    @model_validator(mode="before")
    @classmethod
    def _mode_defaults(cls, data):
        if isinstance(data, dict) and data.get("per_channel") is None:
            mode = data.get("mode", "dynamic-int8")
            data = {**data, "per_channel": PER_CHANNEL_DEFAULT.get(mode, False)}
        return data

    @model_validator(mode="after")
    def _options_fit_the_mode(self) -> "QuantizeConfig":
        defaults = {name: f.default for name, f in type(self).model_fields.items()}
        defaults["per_channel"] = PER_CHANNEL_DEFAULT.get(self.mode, False)
        for name, modes in MODE_OPTIONS.items():
            if self.mode not in modes and getattr(self, name) != defaults[name]:
                raise ValueError(f"{name} applies to quantize mode {' or '.join(modes)}, not {self.mode}")
        if self.scope == "linears" and self.format != "qdq":
            raise ValueError("scope linears is a QDQ graph: set format: qdq (or scope: ops)")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of 2, got {self.block_size}")
        return self


def check_quantize_family(cfg: QuantizeConfig, family: str) -> None:
    """Refuse, before any work, a mode that cannot quantize a model of `family`: the quantize
    pass's registered family check, and the export's for a bundle whose deploy settings were
    written by hand."""
    if cfg.mode == "inc" and family in FAMILIES and not FAMILIES[family].supports("inc"):
        raise UserError(f"inc: Intel Neural Compressor cannot quantize a {family!r} model: "
                        f"{FAMILIES[family].refusals['inc']}")


@dataclass(frozen=True)
class Plan:
    """What the quantizer needs besides the config: data, and what other passes decided."""

    calibration: Encoded | None = None                          # static-int8: train examples
    exclude_nodes: tuple[str, ...] = ()                         # graph nodes kept in float
    activation_ranges: dict[str, float] = field(default_factory=dict)   # tensor -> max|x| (QAT)
    linear_nodes: tuple[str, ...] = ()        # scope linears: the nodes computing Linear layers
    embedding_gathers: tuple[str, ...] = ()   # scope linears: the word-embedding lookups


def quantize_onnx(source: Path, target: Path, cfg: QuantizeConfig, plan: Plan = Plan()) -> None:
    """Write the quantized form of the graph at `source` to `target`."""
    if cfg.mode == "dynamic-int8":
        dynamic_int8(source, target, cfg, plan)
    elif cfg.mode == "static-int8":
        static_int8(source, target, cfg, plan)
    elif cfg.mode == "int4-weight-only":
        int4_weight_only(source, target, cfg)
    elif cfg.mode == "fp16":
        fp16(source, target)
    else:
        raise ValueError(f"quantize mode {cfg.mode} does not act on an ONNX graph")


def dynamic_int8(source: Path, target: Path, cfg: QuantizeConfig, plan: Plan = Plan()) -> None:
    """Weights to int8 offline, activations quantized per batch at run time (no calibration)."""
    import onnx
    from onnxruntime.quantization import quantize_dynamic
    # The dynamic quantizer first rewrites every Gemm as MatMul + Add, naming the MatMul
    # "<gemm>_MatMul": an excluded Gemm (a classifier or pooler kept in float by the
    # `sensitivity` pass) must be excluded under that name too, or it is quantized anyway.
    exclude = [*plan.exclude_nodes, *(f"{name}_MatMul" for name in plan.exclude_nodes)]
    with quiet_logs():
        quantize_dynamic(str(source), str(target), op_types_to_quantize=DYNAMIC_INT8_OPS,
                         per_channel=bool(cfg.per_channel), reduce_range=cfg.reduce_range,
                         weight_type=quant_type(cfg.weight_type),
                         nodes_to_exclude=exclude,
                         # Fused graphs lose the type of some weights; without a default the
                         # quantizer stops with "Unable to find data type for weight_name".
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


def quant_type(name: str):
    from onnxruntime.quantization import QuantType
    return {"qint8": QuantType.QInt8, "quint8": QuantType.QUInt8}[name]


def static_int8(source: Path, target: Path, cfg: QuantizeConfig, plan: Plan) -> None:
    """int8 weights and activations, activation ranges calibrated on train examples.

    Activations are uint8 with a zero point (U8S8, ONNX Runtime's CPU recommendation),
    weights int8 symmetric; with `scope: linears`, activation ranges are symmetric as in
    Q8BERT (uint8 with zero point 128). Ranges QAT learned (`plan.activation_ranges`) replace the calibrated ones of the
    tensors they cover, as symmetric [-t, t] ranges.
    """
    import onnx
    from onnxruntime.quantization import (CalibrationMethod, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    if plan.calibration is None or len(plan.calibration) == 0:
        raise ValueError("static-int8 needs calibration examples")
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[cfg.calibration]
    import numpy as np
    overrides = {name: [{"rmin": np.float32(-t), "rmax": np.float32(t)}]   # ORT wants numpy scalars
                 for name, t in plan.activation_ranges.items()}
    options = {"DefaultTensorType": onnx.TensorProto.FLOAT,
               # One batch per collection step: the histogram calibrators stack
               # the outputs of a step, which fails on batches of different lengths.
               "CalibStridedMinMax": 1}
    op_types, nodes = STATIC_INT8_OPS, None
    if cfg.scope == "linears":
        if not plan.linear_nodes:
            raise ValueError("static-int8 scope linears needs the graph nodes of the Linear layers")
        op_types, nodes = LINEAR_SCOPE_OPS, [*plan.linear_nodes, *plan.embedding_gathers]
        options["OpTypesToExcludeOutputQuantization"] = ["MatMul", "Gemm"]
        # Symmetric ranges as in Q8BERT, on ORT's fast uint8 grid: scale 2t/255, zero point
        # 128 (the qat pass trains with exactly this grid). Symmetric int8 activations would
        # match Q8BERT's 127/t, but ORT then leaves Q, K and V (one shared input) as float MatMuls.
        options["ActivationSymmetric"] = True
    with tempfile.TemporaryDirectory(prefix="compressor-static-") as work, quiet_logs(), \
            contextlib.redirect_stdout(io.StringIO()):   # the histogram calibrators print progress
        prepared = Path(work) / "prepared.onnx"
        with_shapes(source, prepared)
        if nodes:
            unshare_initializers(prepared, set(nodes))
        for table in gathered_tables(prepared, plan.embedding_gathers):
            # As the weights: symmetric int8, one scale for the table (Q8BERT's embedding).
            overrides[table] = [{"quant_type": QuantType.QInt8, "symmetric": True}]
        if overrides:
            options["TensorQuantOverrides"] = overrides
        quantize_static(
            str(prepared), str(target), CalibrationReader(plan.calibration, graph_inputs(prepared)),
            quant_format=QuantFormat.QDQ if cfg.format == "qdq" else QuantFormat.QOperator,
            op_types_to_quantize=op_types, nodes_to_quantize=nodes, per_channel=bool(cfg.per_channel),
            reduce_range=cfg.reduce_range, activation_type=QuantType.QUInt8,
            weight_type=quant_type(cfg.weight_type), calibrate_method=method,
            nodes_to_exclude=list(plan.exclude_nodes), extra_options=options)
    if cfg.scope == "linears":
        keep_float_elsewhere(target, set(nodes) - set(plan.exclude_nodes))
    elif has_op(target, "LSTM"):
        with quiet_logs():
            quantize_dynamic(str(target), str(target), op_types_to_quantize=["LSTM"],
                             per_channel=bool(cfg.per_channel), reduce_range=cfg.reduce_range,
                             weight_type=quant_type(cfg.weight_type), nodes_to_exclude=list(plan.exclude_nodes),
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


def lstm_handling(cfg: QuantizeConfig) -> str:
    """What a mode does to a graph's LSTM nodes (recorded by the export for LSTM graphs)."""
    if cfg.mode in ("dynamic-int8", "inc"):
        return "dynamic int8 (DynamicQuantizeLSTM): int8 weights, inputs quantized per batch"
    if cfg.mode == "torch-dynamic-int8":
        return "fp32: torch's dynamic quantization is applied to the Linear layers and the word embedding"
    if cfg.mode == "static-int8" and cfg.scope == "ops":
        return ("dynamic int8 (DynamicQuantizeLSTM): ONNX Runtime has no static int8 LSTM; "
                "the other ops are static int8")
    if cfg.mode == "static-int8":
        return "fp32: scope linears quantizes Linear layers and the word embedding only"
    if cfg.mode == "int4-weight-only":
        return "fp32: ONNX Runtime's 4-bit weight-only quantizer covers MatMul and Gather only"
    return "fp16 weights and activations"


class CalibrationReader:
    """Feeds calibration batches (padded to their longest member, like inference) to ORT.

    `__len__` and `set_range` let ORT's strided calibration collect one batch at a time.
    """

    def __init__(self, data: Encoded, names: set[str]) -> None:
        order = inference_order(data.lengths(), CALIBRATION_BATCH)
        self.batches = [{k: v.numpy() for k, v in batch.items() if k in names}
                        for _, batch in iterate(data, order)]
        self.set_range(0, len(self.batches))

    def __len__(self) -> int:
        return len(self.batches)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._next = iter(self.batches[start_index:end_index])

    def get_next(self) -> dict | None:
        return next(self._next, None)

    def rewind(self) -> None:
        self.set_range(0, len(self.batches))


def int4_weight_only(source: Path, target: Path, cfg: QuantizeConfig) -> None:
    """4-bit symmetric block-quantized weights: MatMul -> MatMulNBits, Gather -> GatherBlockQuantized.

    Both have CPU kernels; activations stay fp32. The graph must be unfused: a fused
    Attention or EmbedLayerNormalization node holds its weights where the quantizer does
    not look (the exporter passes the unfused graph).
    """
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                  MatMulNBitsQuantizer)
    algo = DefaultWeightOnlyQuantConfig(block_size=cfg.block_size, is_symmetric=True,
                                        op_types_to_quantize=("MatMul", "Gather"),
                                        quant_axes=(("MatMul", 0), ("Gather", 1)))
    import numpy as np
    # An all-zero block (e.g. an unused embedding row) has scale 0; ORT maps it to 0 after
    # a harmless 0/0 that numpy would report.
    with quiet_logs(), np.errstate(divide="ignore", invalid="ignore"):
        quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), algo_config=algo)
        quantizer.process()
        quantizer.model.save_model_to_file(str(target), use_external_data_format=False)


# Ops whose fp16 arithmetic loses too much (reductions over the sequence, exponentials):
# kept in fp32 with casts around them. keep_io_types keeps the graph's inputs and logits fp32.
FP16_FP32_OPS = ["SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "Softmax",
                 "ReduceMean", "Pow", "Sqrt", "Erf"]
# Graphs with LSTMs (the BiLM) also keep their Transposes fp32: ONNX Runtime 1.32 crashes
# (segfault while creating the session, in the NCHWc layout optimizer of ORT_ENABLE_ALL) on
# the fp16 Transposes that turn batch-first tensors into the LSTM's sequence-first layout.
# A Transpose only moves data, so keeping it fp32 costs two casts and no precision.
FP16_LSTM_GRAPH_FP32_OPS = ["Transpose"]


def fp16(source: Path, target: Path) -> None:
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel
    with quiet_logs():
        model = OnnxModel(onnx.load(str(source)))
        has_lstm = any(node.op_type == "LSTM" for node in model.nodes())
        block = FP16_FP32_OPS + (FP16_LSTM_GRAPH_FP32_OPS if has_lstm else [])
        model.convert_float_to_float16(keep_io_types=True, op_block_list=block)
        model.save_model_to_file(str(target), use_external_data_format=False)
