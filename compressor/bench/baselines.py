"""The baselines every benchmark is measured against: what a user would otherwise ship.

- `pytorch-eager-fp32`: the teacher as it is, in PyTorch (what fine-tuning produced);
- `onnxruntime-fp32`: the teacher exported to ONNX as is (no offline fusion, fp32);
- `optimum-default-int8`: the teacher through Hugging Face Optimum's documented CPU
  recipe: `ORTModelForSequenceClassification(export=True)`, `ORTOptimizer` at O2, then
  `ORTQuantizer` with the `AutoQuantizationConfig` preset Optimum provides for the CPU the
  profile runs on (`arm64`, `avx2`, `avx512`, `avx512_vnni`), dynamic, with the preset's own
  defaults (per-channel, weight type, operators). The preset is chosen from the CPU's flags
  the way Optimum's docs tell a user to choose it; a profile may name one (`optimum_preset`).
  Where one run measures several profiles, each is measured against its own preset's build.

A built baseline's dir describes itself as an export dir does: `compressor.json` (the
teacher's task, the seed its splits were drawn with, labels and pass history, and which
baseline this is) and `export.json` (format and precision, as the report names them), so
`compressor evaluate` and `compressor bench` score it on the teacher's test rows with no
--task, and name its precision as the report does.

Optimum's own classes build the Optimum baseline. One step is added, and only because the
stock recipe otherwise stops: ONNX Runtime >= 1.20's quantizer cannot find the element
type of tensors produced by O2's fused contrib ops ("Unable to find data type for
weight_name") and Optimum gives no way to pass the quantizer's `DefaultTensorType`
option. Running ONNX Runtime's symbolic shape inference on the O2 graph first records
those types; the graph's computation is unchanged.
"""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

from compressor import __version__
from compressor.bundle import PROVENANCE_FILE, read_provenance, recorded_length
from compressor.export.onnx import EXPORT_FILE, ONNX_FILE, cutting_at
from compressor.export.quiet import quiet_logs, scratch_cwd
from compressor.export.trace import write_onnx
from pretrain.atomic import write_json
from pretrain.batching import usable_length
from pretrain.errors import UserError
from pretrain.families import FAMILIES
from pretrain.models import load_saved_classifier

BASELINES = ("pytorch-eager-fp32", "onnxruntime-fp32", "optimum-default-int8")
OPTIMUM_FILE = "model_optimized_quantized.onnx"
OPTIMUM = "optimum-default-int8"

# Optimum's AutoQuantizationConfig presets and the CPU flags their kernels need. A preset
# run on a CPU without them would be measured on kernels it was not made for.
OPTIMUM_PRESETS = ("arm64", "avx2", "avx512", "avx512_vnni")
PRESET_NEEDS = {"arm64": (), "avx2": ("avx2",), "avx512": ("avx512f",), "avx512_vnni": ("avx512f", "avx512_vnni")}
ARM_MACHINES = ("aarch64", "arm64")


def distinct_baselines(names: list[str]) -> list[str]:
    """A baseline listed twice would be measured and reported twice, in rows no one could tell apart."""
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"baseline {', '.join(twice)} listed more than once; expected each baseline once")
    return names


def check_baselines(names: list[str], family: str) -> None:
    """Refuse, before anything is written, a baseline that cannot be built for the teacher."""
    # A family Optimum's ONNX exporter has no config for: its default int8 recipe cannot run on it.
    if "optimum-default-int8" in names and family in FAMILIES and not FAMILIES[family].supports("optimum-export"):
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


def describe_baseline(directory: Path, teacher_dir: Path, name: str, preset: str | None) -> None:
    """Write compressor.json and export.json into a built baseline's dir (see the module doc)."""
    kind, precision = baseline_kind(name)
    # The teacher's deploy settings (a quantize it asked for) were for its own export: this is deployed.
    provenance = {**read_provenance(teacher_dir), "deploy": {}, "compressor_version": __version__,
                  "baseline": name}
    record = {"format": kind, "precision": precision, "baseline": name,
              "file": model_file(name, directory).name, **({"optimum_preset": preset} if preset else {})}
    write_json(Path(directory) / PROVENANCE_FILE, provenance)
    write_json(Path(directory) / EXPORT_FILE, record)


def is_described(directory: Path) -> bool:
    """Whether a baseline's dir holds its description (one cached by an earlier build of the tool may not)."""
    return all((Path(directory) / f).is_file() for f in (PROVENANCE_FILE, EXPORT_FILE))


def build_onnxruntime_fp32(teacher_dir: Path, out: Path, preset: str | None = None) -> None:
    """The plain export: our exporter without fusion or quantization."""
    model, tokenizer = load_saved_classifier(teacher_dir)
    write_onnx(model, out / ONNX_FILE)
    model.config.save_pretrained(str(out))
    save_scored_tokenizer(teacher_dir, model, tokenizer, out)


def save_scored_tokenizer(teacher_dir: Path, model, tokenizer, out: Path) -> None:
    """The teacher's tokenizer, cutting texts at the length the baseline is scored and timed at
    (the teacher's fine-tuning length), as our exports ship theirs: deployed as it is, it
    would otherwise cut at the model's positions and see text the measurements never did."""
    length = usable_length(model, recorded_length(read_provenance(teacher_dir), teacher_dir))
    cutting_at(tokenizer, length).save_pretrained(str(out))


def preset_for_cpu(flags: set[str], machine: str) -> str:
    """The preset Optimum's docs point a user of this CPU to: arm64 on ARM; on x86 the most
    capable of avx512_vnni, avx512, avx2 that the CPU runs (AMX parts take avx512_vnni:
    Optimum has no AMX preset)."""
    if machine in ARM_MACHINES:
        return "arm64"
    for preset in ("avx512_vnni", "avx512"):
        if all(f in flags for f in PRESET_NEEDS[preset]):
            return preset
    return "avx2"


def preset_for_this_cpu() -> str:
    from compressor.bench.environment import cpu_flags
    return preset_for_cpu(cpu_flags(), platform.machine())


def preset_unsupported(preset: str, flags: set[str], machine: str) -> str | None:
    """Why this CPU cannot run `preset`'s kernels, or None when it can."""
    if preset == "arm64" and machine not in ARM_MACHINES:
        return f"needs an ARM64 CPU; this one is {machine}"
    if preset != "arm64" and machine in ARM_MACHINES:
        return f"needs an x86 CPU; this one is {machine}"
    missing = [f for f in PRESET_NEEDS[preset] if f not in flags]
    return f"needs the CPU flags {', '.join(missing)}, which this CPU lacks" if missing else None


def optimum_preset(profile) -> str:
    """The preset the Optimum baseline uses on `profile`: its `optimum_preset`, else the
    preset for this machine's CPU (a profile that runs here runs on this CPU)."""
    from compressor.bench.environment import cpu_flags
    flags, machine = cpu_flags(), platform.machine()
    if profile.optimum_preset is None:
        return preset_for_cpu(flags, machine)
    reason = preset_unsupported(profile.optimum_preset, flags, machine)
    if reason is not None:
        runnable = [p for p in OPTIMUM_PRESETS if preset_unsupported(p, flags, machine) is None]
        raise UserError(f"profile {profile.name}: optimum_preset {profile.optimum_preset} {reason}; expected "
                        f"one this CPU runs ({', '.join(runnable)}) or no optimum_preset (chosen from the CPU)")
    return profile.optimum_preset


def quantization_config(preset: str):
    """Optimum's preset as its docs build it: dynamic, every other argument its default."""
    from optimum.onnxruntime.configuration import AutoQuantizationConfig
    return getattr(AutoQuantizationConfig, preset)(is_static=False)


def preset_settings(preset: str) -> dict:
    """What the preset sets, as recorded in the report and in the baseline's cache key."""
    config = quantization_config(preset)
    plain = lambda v: getattr(v, "name", v)   # enums (QuantType, QuantFormat) by name
    return {"preset": preset, "is_static": config.is_static, "format": plain(config.format),
            "mode": plain(config.mode), "activations_dtype": plain(config.activations_dtype),
            "activations_symmetric": config.activations_symmetric,
            "weights_dtype": plain(config.weights_dtype), "weights_symmetric": config.weights_symmetric,
            "per_channel": config.per_channel, "reduce_range": config.reduce_range,
            "operators_to_quantize": list(config.operators_to_quantize)}


def build_optimum_default_int8(teacher_dir: Path, out: Path, preset: str) -> None:
    """Optimum's CPU recipe: export, O2 graph optimization, the preset's dynamic int8."""
    out = Path(out).resolve()
    optimum_quantize(optimum_o2(teacher_dir, out / "work"), out, quantization_config(preset))
    shutil.rmtree(out / "work")
    save_scored_tokenizer(teacher_dir, *load_saved_classifier(teacher_dir), out)


def optimum_o2(teacher_dir: Path, work: Path) -> Path:
    """Optimum's export and O2 graph optimization of the teacher; the O2 .onnx file."""
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from optimum.onnxruntime import ORTModelForSequenceClassification, ORTOptimizer
    from optimum.onnxruntime.configuration import AutoOptimizationConfig

    teacher_dir, work = Path(teacher_dir).resolve(), Path(work).resolve()
    with quiet_logs(), scratch_cwd():
        exported = ORTModelForSequenceClassification.from_pretrained(str(teacher_dir), export=True)
        exported.save_pretrained(str(work / "export"))
        ORTOptimizer.from_pretrained(str(work / "export")).optimize(
            save_dir=str(work / "o2"), optimization_config=AutoOptimizationConfig.O2())
        o2_file = work / "o2" / "model_optimized.onnx"
        typed = SymbolicShapeInference.infer_shapes(onnx.load(str(o2_file)), auto_merge=True)
        onnx.save(typed, str(o2_file))
    return o2_file


def optimum_quantize(o2_file: Path, out: Path, config) -> Path:
    """ORTQuantizer on an O2 graph with a QuantizationConfig; the quantized .onnx file."""
    from optimum.onnxruntime import ORTQuantizer
    with quiet_logs(), scratch_cwd():
        quantizer = ORTQuantizer.from_pretrained(str(o2_file.parent), file_name=o2_file.name)
        quantizer.quantize(save_dir=str(out), quantization_config=config)
    return Path(out) / OPTIMUM_FILE


BUILDERS = {"onnxruntime-fp32": build_onnxruntime_fp32, "optimum-default-int8": build_optimum_default_int8}
