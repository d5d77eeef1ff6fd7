"""Quantization of an exported ONNX graph: the modes of the `quantize` pass.

The pass only records the requested precision on the bundle (`bundle.deploy["quantize"]`);
the exporter calls `quantize_onnx` on the fp32 (or fused) graph. Only `dynamic-int8` is
implemented; the other modes of issue 5 are accepted names that fail validation with a
clear message, so recipes written against the contract get an honest answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from compressor.export.quiet import quiet_logs

Mode = Literal["dynamic-int8", "static-int8", "inc", "torch-dynamic-int8", "fp16", "int4-weight-only"]
IMPLEMENTED_MODES = ("dynamic-int8",)

# Every weight-carrying op of a BERT graph, unfused or fused. Gather covers the word,
# position and token-type embedding lookups: the word-embedding matrix alone is half of
# MiniLM's parameters, so leaving it fp32 (Optimum's default list is MatMul/Attention only)
# would keep the file at about 60% of fp32. EmbedLayerNormalization is the same lookups
# once fused.
DYNAMIC_INT8_OPS = ["MatMul", "Attention", "Gather", "EmbedLayerNormalization"]


class QuantizeConfig(BaseModel):
    """What the `quantize` pass asks of the exporter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = "dynamic-int8"
    per_channel: bool = False      # one scale per output channel instead of per tensor
    reduce_range: bool = False     # 7-bit weights: avoids VPMADDUBSW saturation on non-VNNI x86
    weight_type: Literal["qint8", "quint8"] = "qint8"

    @field_validator("mode")
    @classmethod
    def _implemented(cls, mode: str) -> str:
        if mode not in IMPLEMENTED_MODES:
            raise ValueError(f"quantize mode {mode!r} is not implemented yet; "
                             f"implemented: {', '.join(IMPLEMENTED_MODES)}")
        return mode


def quantize_onnx(source: Path, target: Path, cfg: QuantizeConfig) -> None:
    """Write the quantized form of the graph at `source` to `target`."""
    if cfg.mode == "dynamic-int8":
        dynamic_int8(source, target, cfg)
    else:  # unreachable while validation rejects unimplemented modes
        raise NotImplementedError(cfg.mode)


def dynamic_int8(source: Path, target: Path, cfg: QuantizeConfig) -> None:
    """Weights to int8 offline, activations quantized per batch at run time (no calibration)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    weight_type = QuantType.QInt8 if cfg.weight_type == "qint8" else QuantType.QUInt8
    with quiet_logs():
        quantize_dynamic(str(source), str(target), op_types_to_quantize=DYNAMIC_INT8_OPS,
                         per_channel=cfg.per_channel, reduce_range=cfg.reduce_range,
                         weight_type=weight_type,
                         # Fused graphs lose the type of some weights; without a default the
                         # quantizer stops with "Unable to find data type for weight_name".
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
