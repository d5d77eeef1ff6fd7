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

from compressor.export.quiet import quiet_logs
from pretrain.batching import Encoded, inference_order, iterate

Mode = Literal["dynamic-int8", "static-int8", "inc", "torch-dynamic-int8", "fp16", "int4-weight-only"]
ONNX_MODES = ("dynamic-int8", "static-int8", "int4-weight-only", "fp16")
INT8_ONNX_MODES = ("dynamic-int8", "static-int8")

# Every weight-carrying op of a BERT graph, unfused or fused. Gather covers the word,
# position and token-type embedding lookups: the word-embedding matrix alone is half of
# MiniLM's parameters, so leaving it fp32 (Optimum's default list is MatMul/Attention only)
# would keep the file at about 60% of fp32. EmbedLayerNormalization is the same lookups
# once fused.
DYNAMIC_INT8_OPS = ["MatMul", "Attention", "Gather", "EmbedLayerNormalization"]
# Static int8 quantizes the same ops. Residual adds, LayerNorm, Softmax and GELU stay float:
# their outputs carry the outlier channels that make BERT's activations hard to fit in 8 bits.
STATIC_INT8_OPS = DYNAMIC_INT8_OPS
CALIBRATION_BATCH = 32

# Options that only mean something for some modes: setting one for another mode is an error
# (a recipe that asks for `calibration: entropy` with dynamic-int8 would silently get nothing).
MODE_OPTIONS = {
    "per_channel": ("dynamic-int8", "static-int8", "inc"),
    "reduce_range": ("dynamic-int8", "static-int8", "inc"),
    "weight_type": ("dynamic-int8", "static-int8"),
    "calibration": ("static-int8",),
    "format": ("static-int8",),
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
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of 2, got {self.block_size}")
        return self


@dataclass(frozen=True)
class Plan:
    """What the quantizer needs besides the config: data, and what other passes decided."""

    calibration: Encoded | None = None                          # static-int8: train examples
    exclude_nodes: tuple[str, ...] = ()                         # graph nodes kept in float
    activation_ranges: dict[str, float] = field(default_factory=dict)   # tensor -> max|x| (QAT)


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
    with quiet_logs():
        quantize_dynamic(str(source), str(target), op_types_to_quantize=DYNAMIC_INT8_OPS,
                         per_channel=bool(cfg.per_channel), reduce_range=cfg.reduce_range,
                         weight_type=quant_type(cfg.weight_type),
                         nodes_to_exclude=list(plan.exclude_nodes),
                         # Fused graphs lose the type of some weights; without a default the
                         # quantizer stops with "Unable to find data type for weight_name".
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


def quant_type(name: str):
    from onnxruntime.quantization import QuantType
    return {"qint8": QuantType.QInt8, "quint8": QuantType.QUInt8}[name]


def static_int8(source: Path, target: Path, cfg: QuantizeConfig, plan: Plan) -> None:
    """int8 weights and activations, activation ranges calibrated on train examples.

    Activations are uint8 with a zero point (U8S8, ONNX Runtime's CPU recommendation),
    weights int8 symmetric. Ranges QAT learned (`plan.activation_ranges`) replace the
    calibrated ones of the tensors they cover, as symmetric [-t, t] ranges.
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    if plan.calibration is None or len(plan.calibration) == 0:
        raise ValueError("static-int8 needs calibration examples")
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[cfg.calibration]
    import numpy as np
    overrides = {name: [{"rmin": np.float32(-t), "rmax": np.float32(t)}]   # ORT wants numpy scalars
                 for name, t in plan.activation_ranges.items()}
    with tempfile.TemporaryDirectory(prefix="compressor-static-") as work, quiet_logs(), \
            contextlib.redirect_stdout(io.StringIO()):   # the histogram calibrators print progress
        prepared = Path(work) / "prepared.onnx"
        with_shapes(source, prepared)
        quantize_static(
            str(prepared), str(target), CalibrationReader(plan.calibration, graph_inputs(prepared)),
            quant_format=QuantFormat.QDQ if cfg.format == "qdq" else QuantFormat.QOperator,
            op_types_to_quantize=STATIC_INT8_OPS, per_channel=bool(cfg.per_channel),
            reduce_range=cfg.reduce_range, activation_type=QuantType.QUInt8,
            weight_type=quant_type(cfg.weight_type), calibrate_method=method,
            nodes_to_exclude=list(plan.exclude_nodes),
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT,
                           # One batch per collection step: the histogram calibrators stack
                           # the outputs of a step, which fails on batches of different lengths.
                           "CalibStridedMinMax": 1,
                           **({"TensorQuantOverrides": overrides} if overrides else {})})


def with_shapes(source: Path, target: Path) -> None:
    """Annotate every tensor with its type: the static quantizer skips tensors of unknown type.

    ORT's symbolic shape inference understands the fused contrib ops (Attention,
    EmbedLayerNormalization); on graphs where it gives up, ONNX's own inference covers the
    standard ops.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process
    source, target = Path(source).resolve(), Path(target).resolve()
    # When symbolic inference gives up, ORT saves its partial model as
    # ./sym_shape_infer_temp.onnx (+ a 90 MB external-data file): run it from the target's
    # (temporary) dir so that nothing lands in the user's working dir.
    with contextlib.chdir(target.parent):
        try:
            quant_pre_process(str(source), str(target), skip_optimization=True)
        except Exception:  # "Incomplete symbolic shape inference" and friends
            quant_pre_process(str(source), str(target), skip_optimization=True, skip_symbolic_shape=True)


def graph_inputs(path: Path) -> set[str]:
    import onnx
    return {i.name for i in onnx.load(str(path), load_external_data=False).graph.input}


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


def fp16(source: Path, target: Path) -> None:
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel
    with quiet_logs():
        model = OnnxModel(onnx.load(str(source)))
        model.convert_float_to_float16(keep_io_types=True, op_block_list=FP16_FP32_OPS)
        model.save_model_to_file(str(target), use_external_data_format=False)
