"""The baselines every benchmark is measured against: what a user would otherwise ship.

- `pytorch-eager-fp32`: the teacher as it is, in PyTorch (what fine-tuning produced);
- `onnxruntime-fp32`: the teacher exported to ONNX as is (no offline fusion, fp32);
- `optimum-default-int8`: the teacher through Hugging Face Optimum's documented default
  recipe: `ORTModelForSequenceClassification(export=True)`, `ORTOptimizer` at O2, then
  `ORTQuantizer` with `AutoQuantizationConfig.avx2(is_static=False)` (dynamic int8).

Optimum's own classes build the Optimum baseline. One step is added, and only because the
stock recipe otherwise stops: ONNX Runtime >= 1.20's quantizer cannot find the element
type of tensors produced by O2's fused contrib ops ("Unable to find data type for
weight_name") and Optimum gives no way to pass the quantizer's `DefaultTensorType`
option. Running ONNX Runtime's symbolic shape inference on the O2 graph first records
those types; the graph's computation is unchanged.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from compressor.export.onnx import ONNX_FILE, write_onnx
from compressor.export.quiet import quiet_logs, scratch_cwd
from pretrain.errors import UserError
from pretrain.models import load_saved_classifier

BASELINES = ("pytorch-eager-fp32", "onnxruntime-fp32", "optimum-default-int8")
OPTIMUM_FILE = "model_optimized_quantized.onnx"


# Families Optimum's ONNX exporter has no config for: its default int8 recipe cannot run on them.
OPTIMUM_UNSUPPORTED = ("xlnet", "bilm")


def check_baselines(names: list[str], family: str) -> None:
    """Refuse, before anything is written, a baseline that cannot be built for the teacher."""
    if "optimum-default-int8" in names and family in OPTIMUM_UNSUPPORTED:
        others = [b for b in BASELINES if b != "optimum-default-int8"]
        raise UserError(f"baseline optimum-default-int8 cannot be built for a {family!r} teacher: Optimum's ONNX "
                        f"exporter does not support that family; expected benchmark.baselines from "
                        f"{', '.join(others)}")


def baseline_kind(name: str) -> tuple[str, str]:
    """(kind, precision) of a baseline."""
    return {"pytorch-eager-fp32": ("torch", "fp32"), "onnxruntime-fp32": ("onnx", "fp32"),
            "optimum-default-int8": ("onnx", "dynamic-int8")}[name]


def model_file(name: str, directory: Path) -> Path:
    """The file the benchmark loads: the HF dir for torch, the .onnx file otherwise."""
    if name == "pytorch-eager-fp32":
        return directory
    return directory / (OPTIMUM_FILE if name == "optimum-default-int8" else ONNX_FILE)


def build_onnxruntime_fp32(teacher_dir: Path, out: Path) -> None:
    """The plain export: our exporter without fusion or quantization."""
    model, tokenizer = load_saved_classifier(teacher_dir)
    write_onnx(model, out / ONNX_FILE)
    model.config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def build_optimum_default_int8(teacher_dir: Path, out: Path) -> None:
    """Optimum's default CPU recipe: export, O2 graph optimization, avx2 dynamic int8."""
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from optimum.onnxruntime import ORTModelForSequenceClassification, ORTOptimizer, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoOptimizationConfig, AutoQuantizationConfig

    teacher_dir, out = Path(teacher_dir).resolve(), Path(out).resolve()
    work = out / "work"
    with quiet_logs(), scratch_cwd():
        exported = ORTModelForSequenceClassification.from_pretrained(str(teacher_dir), export=True)
        exported.save_pretrained(str(work / "export"))
        ORTOptimizer.from_pretrained(str(work / "export")).optimize(
            save_dir=str(work / "o2"), optimization_config=AutoOptimizationConfig.O2())
        o2_file = work / "o2" / "model_optimized.onnx"
        typed = SymbolicShapeInference.infer_shapes(onnx.load(str(o2_file)), auto_merge=True)
        onnx.save(typed, str(o2_file))
        quantizer = ORTQuantizer.from_pretrained(str(work / "o2"), file_name=o2_file.name)
        quantizer.quantize(save_dir=str(out),
                           quantization_config=AutoQuantizationConfig.avx2(is_static=False, per_channel=False))
    shutil.rmtree(work)
    _, tokenizer = load_saved_classifier(teacher_dir)
    tokenizer.save_pretrained(str(out))


BUILDERS = {"onnxruntime-fp32": build_onnxruntime_fp32, "optimum-default-int8": build_optimum_default_int8}
