"""Quantization of an exported ONNX graph: the ONNX modes of the `quantize` pass.

The pass only records the requested precision on the bundle (`bundle.deploy["quantize"]`);
the exporter calls `quantize_onnx` on the fp32 (or fused) graph, which hands it to the
function registered for the config's type (`onnx_quantizer`; one frozen config type per mode,
`QuantizeConfig` picks it from `mode`):

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator
from typing_extensions import TypedDict   # pydantic validates typing_extensions' TypedDict on 3.11

from compressor.export.graph_surgery import (gathered_tables, graph_inputs, has_op, keep_float_elsewhere,
                                             unshare_initializers, with_shapes)
from compressor.export.quiet import import_keeping_root_logging, quiet_logs
from pretrain.batching import Encoded, inference_order, iterate
from pretrain.errors import AcrossFields, UserError
from pretrain.families import FAMILIES
from pretrain.atomic import scratch_dir

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


class QuantizeConfig(BaseModel):
    """What the `quantize` pass asks of the exporter: one frozen config type per mode, each
    with only the options that mode uses (so an option another mode uses is an error).

    `QuantizeConfig.model_validate({"mode": "static-int8", ...})` and
    `QuantizeConfig(mode="static-int8", ...)` return the mode's type (a discriminated union
    on `mode`, dynamic-int8 when absent), the recipe form `quantize: {mode: ..., ...}`; each
    type can also be built directly (`DynamicInt8Config(per_channel=True)`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mode: str

    def __new__(cls, *args, **data):
        if cls is QuantizeConfig:   # the base picks the mode's type, like model_validate
            return QuantizeConfig.model_validate(data)
        return super().__new__(cls)

    def __init__(self, **data):
        if "__pydantic_fields_set__" not in vars(self):   # not yet built by the base's __new__
            super().__init__(**data)

    @classmethod
    def model_validate(cls, obj, *args, **kwargs):
        if cls is QuantizeConfig and isinstance(obj, dict):
            # The mode first (an unknown one: an error on `mode` listing the known ones), then
            # its type; errors keep plain field paths (no union tag in them).
            data = {"mode": DEFAULT_MODE, **obj}
            mode = MODE_FIELD.validate_python(data)["mode"]
            return MODE_CONFIGS[mode].model_validate(data, *args, **kwargs)
        return super().model_validate(obj, *args, **kwargs)

    @model_validator(mode="before")
    @classmethod
    def _options_fit_the_mode(cls, data):
        # An option of another mode (a recipe asking for `calibration: entropy` with
        # dynamic-int8 would silently get nothing) gets a message naming the modes it fits.
        if isinstance(data, dict) and cls is not QuantizeConfig:
            for name in data:
                if name not in cls.model_fields and name in OPTION_MODES:
                    raise AcrossFields(f"{{{name}}} applies to quantize mode {' or '.join(OPTION_MODES[name])}, "
                                       f"not {cls.model_fields['mode'].default}")
        return data


class DynamicInt8Config(QuantizeConfig):
    mode: Literal["dynamic-int8"] = "dynamic-int8"
    per_channel: bool = False         # one weight scale per output channel
    reduce_range: bool = False        # 7-bit weights: avoids VPMADDUBSW saturation on non-VNNI x86
    weight_type: Literal["qint8", "quint8"] = "qint8"


class StaticInt8Config(QuantizeConfig):
    mode: Literal["static-int8"] = "static-int8"
    # Per-channel weight scales are what works on transformers for static int8 (a per-tensor
    # scale is set by the one outlier row of each matrix).
    per_channel: bool = True
    reduce_range: bool = False
    weight_type: Literal["qint8", "quint8"] = "qint8"
    # Entropy by default: BERT's activations have rare outliers that MinMax lets set the whole
    # range. (A first check on the MiniLM teacher, 1,000 test examples: Entropy -0.5 points,
    # MinMax -1.4; benchmarks/quantization_accuracy.py compares all three on 5,000.)
    calibration: Literal["minmax", "entropy", "percentile"] = "entropy"
    format: Literal["qdq", "qoperator"] = "qdq"      # graph form
    scope: Literal["ops", "linears"] = "ops"         # what becomes int8 (LINEAR_SCOPE_OPS note)
    calibration_samples: int = Field(512, ge=1)      # first N train examples

    @model_validator(mode="after")
    def _linears_are_qdq(self) -> "StaticInt8Config":
        if self.scope == "linears" and self.format != "qdq":
            raise AcrossFields("{scope:linears} writes a QDQ graph; expected {format:qdq} with it, or {scope:ops}")
        return self


class Int4WeightOnlyConfig(QuantizeConfig):
    mode: Literal["int4-weight-only"] = "int4-weight-only"
    block_size: int = Field(32, ge=16)               # weights per scale (a power of 2)

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, block_size: int) -> int:
        # A check of the one field: its error names it (`--block-size`), not the whole config.
        if block_size & (block_size - 1):
            raise ValueError("expected a power of 2 >= 16, such as 32 or 64")
        return block_size


class Fp16Config(QuantizeConfig):
    mode: Literal["fp16"] = "fp16"


class TorchDynamicInt8Config(QuantizeConfig):
    mode: Literal["torch-dynamic-int8"] = "torch-dynamic-int8"


class IncConfig(QuantizeConfig):
    mode: Literal["inc"] = "inc"
    per_channel: bool = True
    reduce_range: bool = False
    calibration_samples: int = Field(512, ge=1)        # first N validation examples
    tolerable_loss: float = Field(0.01, ge=0, le=1)    # relative accuracy loss allowed (INC's definition)
    max_trials: int = Field(8, ge=1)                   # autotune trials


DEFAULT_MODE = "dynamic-int8"       # a quantize step that names no mode
MODE_CONFIGS: dict[str, type[QuantizeConfig]] = {
    cls.model_fields["mode"].default: cls for cls in (DynamicInt8Config, StaticInt8Config, IncConfig,
                                                      TorchDynamicInt8Config, Fp16Config, Int4WeightOnlyConfig)}
MODE_FIELD = TypeAdapter(TypedDict("ModeField", {"mode": Literal[tuple(MODE_CONFIGS)]}))
# option -> the modes that use it (for the error on an option of another mode, and the CLI)
OPTION_MODES: dict[str, tuple[str, ...]] = {}
for _mode, _config in MODE_CONFIGS.items():
    for _name in _config.model_fields:
        if _name != "mode":
            OPTION_MODES.setdefault(_name, ())
            OPTION_MODES[_name] += (_mode,)


def mode_config_type(data: dict) -> type[QuantizeConfig] | None:
    """The type `QuantizeConfig.model_validate(data)` hands `data` to (its mode's), whose fields
    an error about one of them is looked up on; None for a mode that is no known one."""
    mode = data.get("mode", DEFAULT_MODE)
    return MODE_CONFIGS.get(mode) if isinstance(mode, str) else None


def quantize_config_from_record(spec: dict) -> QuantizeConfig:
    """A config this tool recorded (compressor.json `deploy.quantize`). Records written before
    each mode had its own type hold every mode's options at their defaults: those are dropped."""
    mode = spec.get("mode", DEFAULT_MODE)
    own = MODE_CONFIGS[mode].model_fields if mode in MODE_CONFIGS else spec
    return QuantizeConfig.model_validate({k: v for k, v in spec.items() if k in own})


def check_quantize_family(cfg: QuantizeConfig, family: str) -> None:
    """Refuse, before any work, a mode that cannot quantize a model of `family`: the quantize
    pass's registered family check, and the export's for a bundle whose deploy settings were
    written by hand."""
    if isinstance(cfg, IncConfig) and family in FAMILIES and not FAMILIES[family].supports("inc"):
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


# config type -> the function that writes its quantized graph (`onnx_quantizer` registers one).
ONNX_QUANTIZERS: dict[type[QuantizeConfig], Callable[[Path, Path, QuantizeConfig, "Plan"], None]] = {}


def onnx_quantizer(config_type: type[QuantizeConfig]):
    def register(fn):
        ONNX_QUANTIZERS[config_type] = fn
        return fn
    return register


def quantize_onnx(source: Path, target: Path, cfg: QuantizeConfig, plan: Plan = Plan()) -> None:
    """Write the quantized form of the graph at `source` to `target`."""
    if type(cfg) not in ONNX_QUANTIZERS:
        raise ValueError(f"quantize mode {cfg.mode} does not act on an ONNX graph")
    ONNX_QUANTIZERS[type(cfg)](source, target, cfg, plan)


@onnx_quantizer(DynamicInt8Config)
def dynamic_int8(source: Path, target: Path, cfg: DynamicInt8Config, plan: Plan = Plan()) -> None:
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


@onnx_quantizer(StaticInt8Config)
def static_int8(source: Path, target: Path, cfg: StaticInt8Config, plan: Plan) -> None:
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
    with scratch_dir("static") as work, quiet_logs(), \
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
    if isinstance(cfg, (DynamicInt8Config, IncConfig)):
        return "dynamic int8 (DynamicQuantizeLSTM): int8 weights, inputs quantized per batch"
    if isinstance(cfg, TorchDynamicInt8Config):
        return "fp32: torch's dynamic quantization is applied to the Linear layers and the word embedding"
    if isinstance(cfg, StaticInt8Config) and cfg.scope == "ops":
        return ("dynamic int8 (DynamicQuantizeLSTM): ONNX Runtime has no static int8 LSTM; "
                "the other ops are static int8")
    if isinstance(cfg, StaticInt8Config):
        return "fp32: scope linears quantizes Linear layers and the word embedding only"
    if isinstance(cfg, Int4WeightOnlyConfig):
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


@onnx_quantizer(Int4WeightOnlyConfig)
def int4_weight_only(source: Path, target: Path, cfg: Int4WeightOnlyConfig, plan: Plan = Plan()) -> None:
    """4-bit symmetric block-quantized weights: MatMul -> MatMulNBits, Gather -> GatherBlockQuantized.

    Both have CPU kernels; activations stay fp32. The graph must be unfused: a fused
    Attention or EmbedLayerNormalization node holds its weights where the quantizer does
    not look (the exporter passes the unfused graph).
    """
    import onnx
    nbits = import_keeping_root_logging("onnxruntime.quantization.matmul_nbits_quantizer")
    algo = nbits.DefaultWeightOnlyQuantConfig(block_size=cfg.block_size, is_symmetric=True,
                                        op_types_to_quantize=("MatMul", "Gather"),
                                        quant_axes=(("MatMul", 0), ("Gather", 1)))
    import numpy as np
    # An all-zero block (e.g. an unused embedding row) has scale 0; ORT maps it to 0 after
    # a harmless 0/0 that numpy would report.
    with quiet_logs(), np.errstate(divide="ignore", invalid="ignore"):
        quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(source)), algo_config=algo)
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


@onnx_quantizer(Fp16Config)
def fp16(source: Path, target: Path, cfg: Fp16Config = Fp16Config(), plan: Plan = Plan()) -> None:
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel
    with quiet_logs():
        model = OnnxModel(onnx.load(str(source)))
        has_lstm = any(node.op_type == "LSTM" for node in model.nodes())
        block = FP16_FP32_OPS + (FP16_LSTM_GRAPH_FP32_OPS if has_lstm else [])
        model.convert_float_to_float16(keep_io_types=True, op_block_list=block)
        model.save_model_to_file(str(target), use_external_data_format=False)
