"""ModelBundle: what flows between passes.

A bundle is a Transformers classifier, its tokenizer, the task it solves and the history
of passes that produced it. It saves as an ordinary Hugging Face model dir (config.json,
model.safetensors, tokenizer files) plus `compressor.json` for the task and history, so
any Transformers or Optimum code can load what this tool writes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from compressor import __version__
from compressor.modeling.structure import save_structure_code, update_record
from pretrain.batching import MAX_LENGTH, usable_length
from pretrain.model_code import ship_model_code
from pretrain.atomic import atomic_dir, check_output
from pretrain.errors import UserError
from pretrain.models import count_params, label_names_of, load_saved_classifier, not_a_classifier

PROVENANCE_FILE = "compressor.json"


@dataclass(frozen=True)
class ModelBundle:
    """What passes take and return: `ModelBundle.load(path)` reads a model dir, a pass changes a
    copy (`copy_model()`) and returns `replace(model=...)`, never touching its input, and
    `save(path)` writes an HF model dir plus compressor.json."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    task: Any                              # the task spec: a built-in name or a file spec dict
    history: tuple[dict, ...] = ()         # one {"pass": name, "config": {...}} per pass applied
    # Settings that act at deployment, not on the torch weights: {"quantize": {...}} asks the
    # exporter for that precision (ONNX quantization modes take effect at export).
    deploy: dict[str, Any] = field(default_factory=dict)
    # The seed the task's splits were drawn with when the model was trained (its test split is
    # the one evaluate, export and bench then score by default); None where not known.
    task_seed: int | None = None
    # The tokens per example the model was fine-tuned at: what evaluation, export (gate and
    # shipped tokenizer), calibration and benchmarks cut a text to. compressor.json records it
    # (`max_length`) only where it is not the default, so a dir trained at the default reads,
    # writes and is keyed as before.
    max_length: int = MAX_LENGTH
    # Whether the task it was fine-tuned on gives text pairs (compressor.json `pair_task`):
    # a pair model scored on single texts (or the reverse) reads inputs of the wrong shape
    # and still predicts, so evaluate, export and bench refuse that task. None: not known (a
    # dir written before the field was, or an HF dir), so nothing is refused.
    pair_task: bool | None = None

    @property
    def usable_length(self) -> int:
        """`max_length` within the model's positions: the length every later stage encodes at."""
        return usable_length(self.model, self.max_length)

    @property
    def label_names(self) -> tuple[str, ...]:
        return label_names_of(self.model)

    @property
    def params(self) -> int:
        """Parameters as deployed: a factorized embedding (`deploy.embedding_rank`) counts as
        its two factors, V x r and r x H, which is what the exporter stores, not as the dense
        V x H matrix the torch model keeps."""
        count = count_params(self.model)
        rank = self.deploy.get("embedding_rank")
        if rank:
            vocab, hidden = self.model.get_input_embeddings().weight.shape
            count += rank * (vocab + hidden) - vocab * hidden
        return count

    def replace(self, **changes: Any) -> "ModelBundle":
        return dataclasses.replace(self, **changes)

    def copy_model(self) -> PreTrainedModel:
        """A deep copy of the model, for passes to change without touching their input."""
        return copy.deepcopy(self.model)

    def save(self, path: Path) -> Path:
        """Write the bundle as an HF model dir, atomically (temp dir, then rename). `path` is
        replaced whole, so it must be new, empty, or a dir this method wrote (compressor.json)."""
        check_output(Path(path), [], owner_files=(PROVENANCE_FILE,), flag="save path")
        with atomic_dir(Path(path)) as tmp:
            self.save_into(tmp)
        return Path(path)

    def save_into(self, directory: Path) -> None:
        # A structure the config cannot express (per-layer FFN widths, shared layers) goes
        # into the config first, its modeling file beside the weights (compressor/modeling/structure.py).
        update_record(self.model)
        self.model.save_pretrained(str(directory), safe_serialization=True)
        save_structure_code(self.model, directory)
        ship_model_code(directory)
        self.tokenizer.save_pretrained(str(directory))
        self.write_provenance(directory)

    def write_provenance(self, directory: Path) -> None:
        """compressor.json: the task, labels, pass history and deploy settings."""
        provenance = {"task": self.task, "task_seed": self.task_seed, "label_names": list(self.label_names),
                      "history": list(self.history), "deploy": dict(self.deploy),
                      "compressor_version": __version__}
        if self.max_length != MAX_LENGTH:
            provenance["max_length"] = self.max_length
        if self.pair_task is not None:
            provenance["pair_task"] = self.pair_task
        (Path(directory) / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> "ModelBundle":
        path = Path(path)
        if not path.is_dir():
            raise UserError(not_a_classifier(str(path)) or
                            f"model dir {path} not found: expected a dir written by this tool or an HF model dir")
        model, tokenizer = load_saved_classifier(path)
        provenance = read_provenance(path)
        return cls(model=model, tokenizer=tokenizer, task=provenance.get("task"),
                   history=tuple(provenance.get("history", ())), deploy=dict(provenance.get("deploy") or {}),
                   task_seed=provenance.get("task_seed"), max_length=recorded_length(provenance, path),
                   pair_task=recorded_pair_task(provenance, path))


def read_provenance(path: Path) -> dict:
    file = Path(path) / PROVENANCE_FILE
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text())
    except ValueError as err:
        raise UserError(f"{file} is not valid JSON: {err}") from None


def recorded_length(provenance: dict, path: Path) -> int:
    """The length a model dir records it was fine-tuned at (compressor.json `max_length`;
    absent: the default, as every dir written before the field was)."""
    length = provenance.get("max_length", MAX_LENGTH)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise UserError(f"{Path(path) / PROVENANCE_FILE}: max_length is {length!r}; expected a positive "
                        "integer (the tokens per example the model was fine-tuned at)")
    return length


def recorded_pair_task(provenance: dict, path: Path) -> bool | None:
    """Whether a model dir records its task as one of text pairs (compressor.json
    `pair_task`; absent: not known, as in every dir written before the field was)."""
    pair_task = provenance.get("pair_task")
    if pair_task is not None and not isinstance(pair_task, bool):
        raise UserError(f"{Path(path) / PROVENANCE_FILE}: pair_task is {pair_task!r}; expected true or false "
                        "(whether the model was fine-tuned on text pairs)")
    return pair_task


# The files that hold a saved model's weights: safetensors in an HF dir, the int8 state dict
# (model.int8.pt) in a torch-dynamic-int8 deployment dir. What every size in a report counts.
WEIGHT_FILES = ("*.safetensors", "*.pt")


def weights_size(path: Path) -> int:
    """Bytes of the weights in a saved model dir (tokenizer and config files not counted)."""
    return sum(f.stat().st_size for pattern in WEIGHT_FILES for f in Path(path).glob(pattern))
