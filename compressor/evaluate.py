"""Evaluate a saved model (HF dir or ONNX dir) on a task split, optionally against a reference."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Literal

import numpy as np
from transformers import AutoConfig, PretrainedConfig

from compressor.bundle import read_provenance, recorded_length, recorded_pair_task
from compressor.export.torch_int8 import is_int8_dir, load_int8_model
from pretrain.batching import MAX_LENGTH, Encoded, encode, in_data_order, model_positions, usable_length
from pretrain.data import WHOLE, TaskData, absolute_paths, load_task, task_files, whole_task
from pretrain.data.files import file_spec, spec_key
from pretrain.data.overlap import scored_overlap
from pretrain.errors import UserError
from pretrain.finetune import predict_logits
from pretrain.metrics import agreement, classification_metrics
from pretrain.models import first_line, load_saved_classifier, load_tokenizer, not_a_classifier


@dataclass(frozen=True)
class Predictor:
    """Anything that maps encoded examples to logits, with the labels it was trained on."""

    # The runtime and precision as report.json and `compressor bench` name them: a
    # torch-dynamic-int8 export is kind "torch", precision "torch-dynamic-int8".
    kind: Literal["torch", "onnx"]
    precision: str                              # fp32, dynamic-int8, torch-dynamic-int8, int8, ...
    label_names: tuple[str, ...]
    tokenizer: object
    logits: Callable[[Encoded], np.ndarray]
    task: object                                # task spec recorded at save time, if any
    max_length: int = MAX_LENGTH                # tokens per example, within the model's positions
    positions: int = MAX_LENGTH                 # the longest sequence the model can run (model_positions)
    task_seed: int | None = None                # the seed `task`'s splits were drawn with, if recorded
    pair_task: bool | None = None               # whether it was fine-tuned on text pairs, if recorded


def load_predictor(path: str | Path, max_length: int | None = None) -> Predictor:
    """The model at `path`, cutting texts at the length it records (or at `max_length`)."""
    predictor = saved_predictor(Path(path))
    if max_length is None:
        return predictor
    length = check_max_length(max_length, predictor.positions, path)
    # A copy: the tokenizer an export ships caps texts at the length its gate measured.
    tokenizer = copy.copy(predictor.tokenizer)
    tokenizer.model_max_length = length
    return replace(predictor, max_length=length, tokenizer=tokenizer)


def check_max_length(max_length: int, positions: int, model: str | Path) -> int:
    """A --max-length the model can run at: at least one token, at most its positions."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or not 1 <= max_length <= positions:
        raise UserError(f"--max-length {max_length!r}: expected a positive number of tokens, at most the "
                        f"{positions} position embeddings of {model}")
    return max_length


def check_holds_text(max_length: int | None, tokenizer, task: TaskData, model: str | Path) -> None:
    """A --max-length (None: none given) with room for the special tokens the tokenizer adds
    ([CLS] and [SEP] for BERT, one more [SEP] between a pair's texts) and one text token: at
    a shorter length the tokenizer cuts nothing at all, and every text is scored whole."""
    if max_length is None:
        return
    added = tokenizer.num_special_tokens_to_add(pair=task.is_pair_task)
    if max_length <= added:
        raise UserError(f"--max-length {max_length}: expected at least {added + 1} tokens for {model} on task "
                        f"{task.name!r} (its tokenizer adds {added} special tokens to each "
                        f"{'text pair' if task.is_pair_task else 'text'}, and at least one text token must fit)")


def check_pair_task(pair_task: bool | None, task: TaskData, model: str | Path) -> None:
    """Refuse a task whose examples are not of the shape the model was fine-tuned on (text
    pairs or single texts; `pair_task` None: not recorded, nothing refused). Scored anyway, a
    pair model reads each first text alone, and a single-text model two texts joined: the
    labels match, so it would predict, and its score would mean nothing."""
    if pair_task is None or pair_task == task.is_pair_task:
        return
    if pair_task:
        raise UserError(f"{model} was fine-tuned on text pairs (text, text_pair); task {task.name!r} gives single "
                        "texts: expected a task with a text_pair column, or a model fine-tuned on single texts")
    raise UserError(f"{model} was fine-tuned on single texts; task {task.name!r} gives text pairs (text, text_pair): "
                    "expected a task without a text_pair column, or a model fine-tuned on text pairs")


def saved_predictor(path: Path) -> Predictor:
    if not path.exists():
        raise UserError(not_a_classifier(str(path)) or
                        f"model {path} not found: expected an HF model dir, an ONNX model dir, a .onnx file "
                        "or a torch-dynamic-int8 export dir")
    if is_int8_dir(path):   # a torch-dynamic-int8 export: int8 state dict + config + tokenizer
        model = load_int8_model(path)
        provenance = read_provenance(path)
        return Predictor("torch", recorded_precision(path) or "torch-dynamic-int8", config_labels(path),
                         load_tokenizer(path),
                         lambda data: predict_logits(model, data), provenance.get("task"),
                         usable_length(model.config, recorded_length(provenance, path)), model_positions(model.config),
                         provenance.get("task_seed"), recorded_pair_task(provenance, path))
    onnx_file = path if path.suffix == ".onnx" else find_onnx(path)
    model_dir = onnx_file.parent if onnx_file else path
    provenance = read_provenance(model_dir)
    task, seed = provenance.get("task"), provenance.get("task_seed")
    length = recorded_length(provenance, model_dir)     # what it was fine-tuned (and exported) at
    pair_task = recorded_pair_task(provenance, model_dir)
    if onnx_file is None:
        model, tokenizer = load_saved_classifier(model_dir)
        labels = tuple(model.config.id2label[i] for i in sorted(model.config.id2label))
        return Predictor("torch", "fp32", labels, tokenizer, lambda data: predict_logits(model, data), task,
                         usable_length(model, length), model_positions(model), seed, pair_task)
    logits = onnx_logits_fn(onnx_file)      # first: a graph ONNX Runtime cannot load is refused in one line
    precision = recorded_precision(model_dir) or graph_precision(onnx_file)
    return Predictor("onnx", precision, config_labels(model_dir), load_tokenizer(model_dir),
                     logits, task, usable_length(saved_config(model_dir), length),
                     model_positions(saved_config(model_dir)), seed, pair_task)


def recorded_precision(model_dir: Path) -> str | None:
    """The precision an export (or a run's baseline) recorded in its export.json, if any."""
    from compressor.export.onnx import read_export_record   # imported here: the exporter imports this module
    return read_export_record(model_dir).get("precision")


# Operators that only a quantized graph holds (ORT's quantizers write them), by precision.
QUANTIZED_OPS = (("int4", ("MatMulNBits",)),
                 ("int8", ("MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "QAttention",
                           "QLinearMatMul", "QuantizeLinear", "DynamicQuantizeLSTM", "QGemm")))


def graph_precision(onnx_file: Path) -> str:
    """The precision a graph without this tool's export record computes in, from its operators
    and initializers (another tool's export, Optimum's int8 among them)."""
    import onnx
    graph = onnx.load(str(onnx_file), load_external_data=False).graph
    ops = {node.op_type for node in graph.node}
    for precision, markers in QUANTIZED_OPS:
        if ops & set(markers):
            return precision
    if any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer):
        return "fp16"
    return "fp32"


def split_seed(given: int | None, recorded: int | None, task_given: str | dict | None,
               task_recorded: str | dict | None) -> int:
    """The seed to draw a task's splits with: the one asked for; else, for the task recorded
    with a model (left out, or named again), the seed recorded beside it (so its test split is
    the one it was scored on, not rows it trained on); else 0."""
    if given is not None:
        return given
    same_task = task_given is None or same_task_spec(task_given, task_recorded)
    return recorded if same_task and recorded is not None else 0


def task_or_recorded(given: str | dict | None, recorded: str | dict | None, model: str | Path) -> str | dict | None:
    """The task to score a model on: the one given, else the one it records (None where it
    records none). A recorded file that is gone is named as the model's record, with the flag
    to point elsewhere: the user never typed that path, so 'data file not found' alone misleads."""
    if given is not None or recorded is None:
        return given
    gone = [name for name in task_files(recorded) if not Path(name).is_file()]
    if gone:
        raise UserError(f"{model} records its task's data file {gone[0]}, which is not there (moved or deleted?); "
                        "expected --task naming the task's file where it is now")
    return recorded


def recorded_task_seed(model_dir: Path, task: str | dict) -> int | None:
    """The seed a model records beside its task, where that task is `task`: its splits drawn
    with any other seed would put rows it trained on into the test split. None where it
    records none, or records another task."""
    provenance = read_provenance(model_dir)
    seed = provenance.get("task_seed")
    return seed if seed is not None and same_task_spec(task, provenance.get("task")) else None


def same_task_spec(a: str | dict | None, b: str | dict | None) -> bool:
    """Whether two task specs name the same task: a built-in name, or the same data files
    (paths compared resolved: a model records them absolute) with the same other settings,
    defaults filled in (a bare path names the default columns a model may record by name)."""
    def normal(spec):
        spec = file_spec(spec) if isinstance(spec, str) else spec
        return spec_key(absolute_paths(spec)) if isinstance(spec, dict) else spec
    return normal(a) == normal(b)


def find_onnx(directory: Path) -> Path | None:
    if not directory.is_dir():
        return None
    preferred = directory / "model.onnx"
    if preferred.is_file():
        return preferred
    found = sorted(directory.glob("*.onnx"))
    return found[0] if found else None


def config_labels(model_dir: Path) -> tuple[str, ...]:
    try:
        config = json.loads((model_dir / "config.json").read_text())
        id2label = config["id2label"]
    except (OSError, ValueError, KeyError):
        raise UserError(f"{model_dir} has no config.json with id2label beside the ONNX model") from None
    return tuple(id2label[k] for k in sorted(id2label, key=int))


def saved_config(model_dir: Path) -> PretrainedConfig:
    """The Transformers config saved beside an ONNX graph (its positions bound the input length)."""
    try:
        return AutoConfig.from_pretrained(str(model_dir))
    except (OSError, ValueError) as err:
        raise UserError(f"{model_dir} has no readable config.json beside the ONNX model: {first_line(err)}") from None


def onnx_logits_fn(onnx_file: Path, batch_size: int = 64) -> Callable[[Encoded], np.ndarray]:
    import onnxruntime as ort
    import torch
    options = ort.SessionOptions()
    # Same thread budget as PyTorch (set_threads), so side-by-side numbers are comparable
    # and a shared machine is not oversubscribed by ORT's one-thread-per-core default.
    options.intra_op_num_threads = torch.get_num_threads()
    try:
        session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types for bad files
        raise UserError(f"cannot load ONNX model {onnx_file}: {first_line(err)}") from None
    input_names = {i.name for i in session.get_inputs()}

    def run(batch: dict) -> np.ndarray:
        return session.run(None, {k: v.numpy() for k, v in batch.items() if k in input_names})[0]

    def logits(data: Encoded) -> np.ndarray:
        return in_data_order(data, batch_size, run)
    return logits


def label_permutation(model_labels: tuple[str, ...], task: TaskData) -> np.ndarray:
    """Index map from model class ids to task class ids; error when the label sets differ."""
    if set(model_labels) != set(task.label_names):
        lacks = sorted(set(task.label_names) - set(model_labels))
        extra = sorted(set(model_labels) - set(task.label_names))
        why = (f"the model lacks {len(lacks)} of the task's {len(task.label_names)} labels (e.g. {lacks[:3]})"
               if lacks else f"the task lacks {len(extra)} of the model's labels (e.g. {extra[:3]})")
        raise UserError(f"model labels do not match task {task.name!r}: {why}; "
                        "expected a model fine-tuned on this task")
    index = {name: i for i, name in enumerate(task.label_names)}
    return np.array([index[name] for name in model_labels])


HELD_OUT = ("validation", "test")     # the splits drawn apart from train (split all has no train)


def evaluate_path(model: str, task_spec: str | dict | None, split: str = "test",
                  max_samples: int | None = None, reference: str | None = None, seed: int | None = None,
                  max_length: int | None = None) -> dict:
    """Scores of `model` on a split; `max_length` (the reference's too) instead of the
    length each model records."""
    predictor = load_predictor(model, max_length)
    seed = split_seed(seed, predictor.task_seed, task_spec, predictor.task)
    task_spec = task_or_recorded(task_spec, predictor.task, model)
    if task_spec is None:
        raise UserError(f"no --task given and {model} records no task; pass --task")
    loaded = whole_task(task_spec) if split == WHOLE else \
        load_task(task_spec, seed=seed, scored=split if split in HELD_OUT else None)    # its `warnings` say split's
    check_pair_task(predictor.pair_task, loaded, model)
    task = on_labels(loaded, split, predictor.label_names)
    check_holds_text(max_length, predictor.tokenizer, task, model)
    data_split = task.split(split).head(max_samples)
    predictions = predict_classes(predictor, data_split, task)
    result = {"model": str(model), "kind": predictor.kind, "precision": predictor.precision,
              "task": task.name, "split": split, "max_length": predictor.max_length,
              **classification_metrics(np.asarray(data_split.labels), predictions)}
    if split in HELD_OUT:
        result.update(scored_overlap(task, split, max_samples))
    if reference is not None:
        predicted = np.asarray(task.label_names)[predictions]
        result.update(reference_agreement(reference, loaded, split, max_samples, max_length, predicted))
    return result


def reference_agreement(reference: str, loaded: TaskData, split: str, max_samples: int | None,
                        max_length: int | None, predicted: np.ndarray) -> dict:
    """The share of examples where `reference` predicts the label named in `predicted` (the
    model's predictions, by name). The reference's labels are checked as the model's are: the
    task's, or with split all, a set that holds the file's (each model numbers them its way)."""
    try:
        ref_predictor = load_predictor(reference, max_length)
        check_pair_task(ref_predictor.pair_task, loaded, reference)
        task = on_labels(loaded, split, ref_predictor.label_names)
        check_holds_text(max_length, ref_predictor.tokenizer, task, reference)
        ref_predictions = predict_classes(ref_predictor, task.split(split).head(max_samples), task)
    except UserError as err:
        raise UserError(f"--reference {reference}: {err}") from None
    return {"reference": str(reference),
            "agreement": agreement(predicted, np.asarray(task.label_names)[ref_predictions])}


def on_labels(loaded: TaskData, split: str, model_labels: tuple[str, ...]) -> TaskData:
    """The task a model is scored on: a whole file's numbered by the model's labels
    (`on_model_labels`); one with drawn splits as it is (`label_permutation` checks it)."""
    return on_model_labels(loaded, model_labels) if split == WHOLE else loaded


def on_model_labels(task: TaskData, model_labels: tuple[str, ...]) -> TaskData:
    """A whole file's task numbered by the model's labels: a held-out file may lack some of
    them (a rare class), but a label the model lacks could never be predicted."""
    unknown = sorted(set(task.label_names) - set(model_labels))
    if unknown:
        raise UserError(f"model labels do not match task {task.name!r}: its rows hold {len(unknown)} label(s) the "
                        f"model lacks (e.g. {unknown[:3]}); expected a model fine-tuned on these labels")
    index = {name: i for i, name in enumerate(model_labels)}
    splits = {name: replace(split, labels=[index[task.label_names[label]] for label in split.labels])
              for name, split in task.splits.items()}
    return TaskData(task.name, tuple(model_labels), splits, spec=task.spec)


def predict_classes(predictor: Predictor, split, task: TaskData) -> np.ndarray:
    mapping = label_permutation(predictor.label_names, task)
    data = encode(predictor.tokenizer, split, predictor.max_length)
    return mapping[predictor.logits(data).argmax(axis=1)]
