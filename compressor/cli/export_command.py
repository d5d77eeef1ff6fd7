"""`compressor export`: an HF model dir -> a gated ONNX model dir (optionally fused, int8)."""

from __future__ import annotations

import copy
from pathlib import Path

from compressor.bundle import ModelBundle, read_provenance
from compressor.cli.flags import validated
from compressor.evaluate import (check_holds_text, check_max_length, check_pair_task, find_onnx, split_seed,
                                 task_or_recorded)
from compressor.export.gate import GateFailure
from compressor.export.onnx import EXPORT_FILE, ExportSettings, export_bundle
from compressor.export.quantize import QuantizeConfig
from pretrain.atomic import check_output, claimed_output
from pretrain.batching import model_positions
from pretrain.data import load_task, task_files
from pretrain.errors import UserError
from pretrain.models import set_threads

NO_QUANTIZATION = "none"
# Config fields whose flag is not --<field>; None: a check across fields (the mode's).
FLAGS = {"mode": "--quantize", None: "--quantize"}


def export_command(model: Path, out: Path, task_spec: str | dict | None, settings: dict,
                   quantize: str | None, quantize_options: dict, max_eval_samples: int | None = None,
                   seed: int | None = None, max_length: int | None = None) -> dict:
    """Validate everything, then export; return the export record. `max_length`: the tokens per
    example the gate, calibration and shipped tokenizer use, instead of the recorded length."""
    export_settings = validated(ExportSettings, settings, FLAGS)
    if export_settings.skip_layernorm != "auto" and not export_settings.optimize:
        raise UserError("--skip-layernorm: only meaningful with --optimize (it chooses how the fused graph writes "
                        "its residual LayerNorms)")
    check_source(model)
    recorded = (read_provenance(model).get("deploy") or {}).get("quantize")
    quantize_cfg = quantize_config(quantize, quantize_options, recorded)
    bundle = at_length(ModelBundle.load(model), max_length, model)
    seed = split_seed(seed, bundle.task_seed, task_spec, bundle.task)
    task_spec = task_or_recorded(task_spec, bundle.task, model)
    if task_spec is None:
        raise UserError(f"no --task given and {model} records no task; pass --task")
    check_output(out, [model, *task_files(task_spec)], owner_files=(EXPORT_FILE,))
    task = load_task(task_spec, seed=seed)
    check_pair_task(bundle.pair_task, task, model)
    check_holds_text(max_length, bundle.tokenizer, task, model)
    # The export records the task it was gated on.
    bundle = bundle.replace(task=task.spec, task_seed=seed, pair_task=task.is_pair_task)
    if quantize_cfg is not None or quantize is not None:   # the flags win over what a `quantize` pass recorded
        deploy = {k: v for k, v in bundle.deploy.items() if k != "quantize"}
        if quantize_cfg is not None:
            deploy["quantize"] = quantize_cfg.model_dump(mode="json")
        bundle = bundle.replace(deploy=deploy)
    set_threads(None)
    try:
        with claimed_output(out):     # a second export into `out` meanwhile is refused
            return export_bundle(bundle, out, export_settings, task, max_eval_samples).record
    except GateFailure as err:
        if err.setting not in GATE_FLAGS:
            raise
        value = getattr(export_settings, err.setting)
        raise GateFailure(f"{err}; expected {GATE_FLAGS[err.setting].format(value=value)}", err.setting) from None


def at_length(bundle: ModelBundle, max_length: int | None, model: Path) -> ModelBundle:
    """The bundle exported at `max_length` tokens (the export dir then records it), where given."""
    if max_length is None:
        return bundle
    length = check_max_length(max_length, model_positions(bundle.model), model)
    # A copy whose cap is the length asked for: a tokenizer saved with a lower one would cut there.
    tokenizer = copy.copy(bundle.tokenizer)
    tokenizer.model_max_length = length
    return bundle.replace(max_length=length, tokenizer=tokenizer)


# What each gate setting's flag must become to accept a model the gate refused.
GATE_FLAGS = {"accuracy_tolerance": "a larger --accuracy-tolerance (now {value:g}) to accept the drop, or more "
                                    "test examples (--max-eval-samples) to measure it finer",
              "min_accuracy": "a lower --min-accuracy (now {value:g}) to accept it"}


def quantize_config(mode: str | None, options: dict, recorded: dict | None = None) -> QuantizeConfig | None:
    """The quantize settings the flags give: a --quantize mode with its options; without one,
    options change the mode the model's `quantize` pass recorded (None: use the record)."""
    given = {k: v for k, v in options.items() if v is not None}
    if mode is None and recorded and given:
        try:
            return validated(QuantizeConfig, {**recorded, **given}, FLAGS)
        except UserError as err:
            raise UserError(f"{err}; the mode is the one the model's quantize pass recorded (pass --quantize to "
                            "choose another)") from None
    if mode in (None, NO_QUANTIZATION):
        if given:
            flags = ", ".join(("--no-" if v is False else "--") + k.replace("_", "-") for k, v in given.items())
            raise UserError(f"{flags}: only meaningful with a --quantize mode (the model records none)")
        return None
    return validated(QuantizeConfig, {"mode": mode, **given}, FLAGS)


def check_source(model: Path) -> None:
    """Export starts from the PyTorch model: an ONNX file or dir is not a valid source."""
    is_onnx = model.suffix == ".onnx" or (find_onnx(model) is not None and not any(
        (model / name).is_file() for name in ("model.safetensors", "pytorch_model.bin")))
    if is_onnx:
        raise UserError(f"{model} is an ONNX model; export takes the Hugging Face model dir "
                        "(config.json + model.safetensors) it was made from")
