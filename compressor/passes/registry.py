"""The pass registry: the one extension point of the pipeline.

A pass is a frozen pydantic config plus one function `(bundle, config, ctx) -> bundle`,
registered under the name recipes use. The function must not mutate its input bundle
(copy the model first: `bundle.copy_model()`); `apply` records the pass in the history.
Recipes can only reach code through this registry: names are looked up here, never imported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict
from transformers import PreTrainedTokenizerBase

from compressor.bundle import ModelBundle
from pretrain.data import TaskData
from pretrain.errors import UserError
from pretrain.finetune import with_run_defaults


class PassConfig(BaseModel):
    """Base of every pass config: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


@dataclass
class LazyTeacher:
    """The recipe's teacher for passes that learn from it: loaded on first use, then kept.

    For inference only: the model is in eval mode with requires_grad off, and passes must
    not change it (the same object serves every pass of the run).
    """

    load: Callable[[], ModelBundle]
    _bundle: ModelBundle | None = field(default=None, init=False, repr=False)
    # Its logits per example, by how the reader runs it (Context.kept_logits): the passes of
    # a run that distill from it on the same texts run it once per text between them.
    logits: dict[str, dict] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_dir(cls, path: Path) -> "LazyTeacher":
        return cls(lambda: ModelBundle.load(path))

    @property
    def loaded(self) -> bool:
        return self._bundle is not None

    def get(self) -> ModelBundle:
        if self._bundle is None:
            bundle = self.load()
            bundle.model.eval().requires_grad_(False)
            self._bundle = bundle
        return self._bundle


@dataclass(frozen=True)
class Context:
    """What a pass may use besides its input bundle.

    `teacher` and `work_dir` cost nothing to a pass that does not use them: the teacher
    loads on first access, and the work dir is only a path (created by whoever writes to it).
    """

    task: TaskData
    seed: int = 0
    max_train_samples: int | None = None   # the recipe's data limit, for passes that train
    show_progress: bool = True
    teacher_source: LazyTeacher | None = None   # the pipeline's: the teacher stage's dir
    # Where a pass that trains for minutes keeps checkpoints, so that a rerun of the same
    # step resumes; the pipeline gives each step its own (same step, same dir) and removes
    # it once the step's output is written. None: no resume (a pass must cope).
    work_dir: Path | None = None
    # The pass this context is given to (apply_pass sets it), so that an error about what the
    # context lacks names the pass that needed it. None: a context not yet given to a pass.
    pass_name: str | None = None

    def __post_init__(self) -> None:
        # Built by hand outside the pipeline: a task name or a teacher dir given as such would
        # fail deep inside a pass (a str task read as a train split of one row).
        if not isinstance(self.task, TaskData):
            raise UserError(f"Context: task is a {type(self.task).__name__}; expected a TaskData, e.g. "
                            "pretrain.data.load_task('wordnet-supersense')")
        if self.teacher_source is not None and not isinstance(self.teacher_source, LazyTeacher):
            raise UserError(f"Context: teacher_source is a {type(self.teacher_source).__name__}; expected a "
                            "LazyTeacher, e.g. LazyTeacher.from_dir(path)")

    @property
    def teacher(self) -> ModelBundle:
        """The recipe's teacher (fine-tuned if the recipe says so), for inference only."""
        if self.teacher_source is None:
            which = f"pass {self.pass_name!r}" if self.pass_name else "this pass"
            raise UserError(f"{which} learns from the teacher, but no teacher was given to it; "
                            "expected Context(teacher_source=LazyTeacher(...)) (the pipeline passes the recipe's)")
        return self.teacher_source.get()

    def kept_logits(self, ref: str | None, reader: str) -> dict | None:
        """The store of the recipe's teacher's logits per example that every pass of the run
        shares (`reader`: how it runs, e.g. "first-token" for its first-token copy); None
        for a teacher a pass names by path (`ref`) or a context without the recipe's."""
        if ref is not None or self.teacher_source is None:
            return None
        return self.teacher_source.logits.setdefault(reader, {})

    def teacher_at(self, ref: str | None) -> ModelBundle:
        """The model dir a pass's config names as its teacher (`teacher: PATH`), else the
        recipe's; either for inference only (eval mode, no gradients, never changed)."""
        if ref is None:
            return self.teacher
        teacher = ModelBundle.load(Path(ref))
        teacher.model.eval().requires_grad_(False)
        return teacher


PassFn = Callable[[ModelBundle, BaseModel, Context], ModelBundle]
# Raises UserError when the pass, so configured, cannot apply to a model family: run before
# any stage, so that a recipe is refused before it fine-tunes or writes anything.
FamilyCheck = Callable[[BaseModel, str], None]
# Raises UserError when the pass cannot work with a tokenizer (trim-vocab and byte-level
# BPE): run before any stage with the teacher's tokenizer, like the family check.
TokenizerCheck = Callable[[BaseModel, PreTrainedTokenizerBase], None]


@dataclass(frozen=True)
class Shape:
    """What is known of a model before the steps that make it run, so that an index, count,
    width or family that cannot fit is refused before anything trains. A field is None where
    only running the steps before would tell (which layers a measured `count` keeps)."""

    family: str
    layers: int | None = None
    heads: tuple[int, ...] | None = None       # attention heads of each layer
    hidden: int | None = None
    labels: tuple[str, ...] | None = None
    # The token ids the model reads: a fingerprint of its tokenizer's vocabulary, or
    # "trimmed:<fingerprint>" after trim-vocab cut that vocabulary (the exact subset is only
    # known once the pass has read the task's texts).
    vocab: str | None = None
    embedding: tuple[int, int] | None = None   # the word embedding's rows x width
    # Passes before whose deploy records name this model's Linear modules (`sensitivity`,
    # `qat`): a later step that renumbers or replaces layers would leave the names on others.
    layers_named_by: tuple[str, ...] = ()
    # factorize-embedding's rank: the export stores the word embedding as two factors of it,
    # so a later step that trains the embedding would move it off that rank.
    embedding_rank: int | None = None
    # Groups (2 or more) of layers that compute with one set of attention weights (share-layers),
    # which lose the same heads: () where none do, None where the steps before hide it.
    shared_attention: tuple[tuple[int, ...], ...] | None = ()
    # Why layers may keep different head counts where `heads` is None (the same only within a
    # shared_attention group), and what to do instead: the step that chooses them when it runs
    # (a scored prune-heads; drop-layers by count among layers of different counts), so that
    # sharing them is refused before that step runs. None where nothing makes them differ.
    heads_vary: str | None = None
    # The same for the FFN: each layer's width (intermediate size), the groups of layers that
    # compute with one FFN (share-layers, mode all or ffn), and why the widths may differ
    # (a prune-ffn of global scope chose them; except within a shared_ffn group).
    ffn: tuple[int, ...] | None = None
    shared_ffn: tuple[tuple[int, ...], ...] | None = ()
    ffn_vary: str | None = None


@dataclass(frozen=True)
class Known:
    """What a step's up-front check sees: the shapes of the model entering it and of the recipe's
    teacher, how many examples the task's train split holds (for passes that read a sample) and
    the recipe's cap on the examples a training pass takes."""

    model: Shape
    teacher: Shape
    train_rows: int | None = None
    pair_task: bool | None = None          # whether the task's examples are text pairs (None: unknown)
    max_train_samples: int | None = None   # the recipe's cap for training passes that set none
    steps_before: tuple[str, ...] = ()     # the variant's steps before this one


def kept_groups(groups: tuple[tuple[int, ...], ...] | None,
                keep: tuple[int, ...] | None) -> tuple[tuple[int, ...], ...] | None:
    """Shared layer groups (Shape.shared_attention) renumbered as the layers `keep` lists, in its
    order (a group left with one layer shares nothing); unknown where `keep` is None (a
    measurement will choose the layers)."""
    if not groups:
        return groups
    if keep is None:
        return None
    position = {layer: new for new, layer in enumerate(keep)}
    renamed = (tuple(sorted(position[i] for i in g if i in position)) for g in groups)
    return tuple(sorted(g for g in renamed if len(g) > 1))


# (config, shapes before) -> the model's shape after the step; raises UserError for what
# cannot fit. Passes without one keep the shape.
ShapeCheck = Callable[[BaseModel, Known], Shape]


@dataclass(frozen=True)
class PassSpec:
    name: str
    config_type: type[BaseModel]
    run: PassFn
    preserves_function: bool   # output computes (numerically) the same function as input
    # trains the model (minutes of work): the pipeline keeps its output as a shared prefix
    # (DIR/prefixes/<key>/) so that a later variant with the same first steps starts there
    trains: bool
    check_family: FamilyCheck | None = None
    check_tokenizer: TokenizerCheck | None = None
    check_shape: ShapeCheck | None = None
    # its deploy record names the model's Linear modules (the export finds them by name)
    names_layers: bool = False
    # renumbers, removes or replaces encoder layers: names recorded before point elsewhere
    # (a function of the config where only some settings do)
    renames_layers: bool | Callable[[BaseModel], bool] = False
    # how the step trains the model's word embedding (config -> e.g. "sparse updates"), None
    # where it never does (it freezes it, or builds a new network)
    trains_embedding: Callable[[BaseModel], str | None] | None = None


_REGISTRY: dict[str, PassSpec] = {}


def register(name: str, config_type: type[BaseModel], *, preserves_function: bool = False,
             trains: bool = False, check_family: FamilyCheck | None = None,
             check_tokenizer: TokenizerCheck | None = None,
             check_shape: ShapeCheck | None = None, names_layers: bool = False,
             renames_layers: bool | Callable[[BaseModel], bool] = False,
             trains_embedding: Callable[[BaseModel], str | None] | None = None) -> Callable[[PassFn], PassFn]:
    """Decorator: register `fn(bundle, config, ctx) -> bundle` as the pass `name`, configured by
    `config_type` (a PassConfig subclass). The keywords say what the pipeline must know of it to
    refuse, before any stage runs, a recipe it cannot do (PassSpec's fields, README "Adding a pass"):
    `check_family` / `check_tokenizer` (a one-line UserError for a family / tokenizer it cannot
    work with), `check_shape` (the shape after the step; a pass that changes layers, heads or
    widths without one leaves later steps checked against the shape before it), `names_layers` /
    `renames_layers` (records naming Linear modules, passes that renumber layers),
    `trains_embedding`, `trains` and `preserves_function`."""
    check_config_type(name, config_type)

    def decorate(fn: PassFn) -> PassFn:
        if name in _REGISTRY:
            raise ValueError(f"pass {name!r} registered twice")
        _REGISTRY[name] = PassSpec(name, config_type, fn, preserves_function, trains, check_family,
                                   check_tokenizer, check_shape, names_layers, renames_layers, trains_embedding)
        return fn
    return decorate


def check_config_type(name: str, config_type: type) -> None:
    """A pass config is a frozen pydantic model that refuses unknown fields (PassConfig is one):
    recipes are parsed into it, stage keys hash it, and a misspelt field must fail, not vanish."""
    settings = getattr(config_type, "model_config", None) if isinstance(config_type, type) else None
    if not (isinstance(config_type, type) and issubclass(config_type, BaseModel)) or not settings \
            or not settings.get("frozen") or settings.get("extra") != "forbid":
        raise TypeError(f"pass {name!r}: its config type {getattr(config_type, '__name__', config_type)!r} must be "
                        "a pydantic model with frozen=True and extra='forbid' (subclass PassConfig)")


def check_pass_family(name: str, config: BaseModel, family: str) -> None:
    """Refuse (UserError) a pass that cannot apply to a model of `family`."""
    spec = get_pass(name)
    if spec.check_family is not None:
        spec.check_family(config, family)


def shape_of(path: Path, labels: tuple[str, ...] | None = None) -> Shape:
    """A saved model's shape from its config.json (heads net of `pruned_heads`); `labels`
    where the model will get them from elsewhere (a teacher fine-tuned on the recipe's task)."""
    from transformers import AutoConfig

    from pretrain.families import family_of
    config = AutoConfig.from_pretrained(str(path))
    family = family_of(config.model_type)
    layers = getattr(config, family.layer_count_fields[0]) if family.layer_count_fields else None
    heads = None
    if family.heads_field and layers is not None:
        pruned = {int(k): len(v) for k, v in (getattr(config, "pruned_heads", None) or {}).items()}
        heads = tuple(getattr(config, family.heads_field) - pruned.get(i, 0) for i in range(layers))
    hidden = getattr(config, family.hidden_field) if family.hidden_field else None
    if labels is None and getattr(config, "id2label", None):
        labels = tuple(config.id2label[i] for i in sorted(config.id2label))
    # ALBERT and ELECTRA may embed narrower than their hidden width (`embedding_size`).
    width = getattr(config, "embedding_size", None) or hidden
    embedding = (config.vocab_size, width) if getattr(config, "vocab_size", None) and width else None
    return Shape(config.model_type, layers, heads, hidden, labels, vocabulary_of(path), embedding,
                 shared_attention=recorded_groups(config, "attention"), ffn=ffn_widths(config, family, layers),
                 shared_ffn=recorded_groups(config, "ffn"))


def ffn_widths(config, family, layers: int | None) -> tuple[int, ...] | None:
    """Each layer's FFN width: the structure record's (a model pruned by an earlier run), else
    the config's one width."""
    from pretrain.structured import record_of
    recorded = (record_of(config) or {}).get("intermediate_sizes")
    if recorded:
        return tuple(recorded)
    width = getattr(config, family.intermediate_field, None) if family.intermediate_field else None
    return (width,) * layers if width and layers is not None else None


def recorded_groups(config, sublayer: str) -> tuple[tuple[int, ...], ...]:
    """The layers a saved model's structure record says share `sublayer` ("attention" or "ffn"):
    whole layers, or that sublayer alone (a model shared by an earlier run)."""
    from pretrain.structured import record_of
    record = record_of(config) or {}
    part = (record.get("shared_sublayers") or {}).get(sublayer) or {}
    return tuple(sorted(tuple(g) for g in [*(record.get("shared_layers") or []), *part.get("groups", [])]))


def vocabulary_of(path: Path) -> str | None:
    """A fingerprint of the vocabulary of the tokenizer saved in `path`; None without one
    (the steps that need it say so when they load it)."""
    from pretrain.models import load_tokenizer
    try:
        vocab = load_tokenizer(path).get_vocab()
    except UserError:
        return None
    return hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()[:16]


def check_teacher_fits(pass_name: str, teacher: Shape, student: Shape) -> None:
    """Refuse (UserError) a teacher whose outputs the student cannot learn from, where the
    shapes tell: other labels, or other token ids (a student trimmed from this teacher's
    vocabulary, or two known vocabularies that differ)."""
    check_same_labels(pass_name, teacher.labels, student.labels)
    if teacher.vocab is None or student.vocab is None or teacher.vocab == student.vocab:
        return
    if student.vocab == f"trimmed:{teacher.vocab}":
        raise UserError(f"{pass_name}: trim-vocab before it cut the student's vocabulary, and the teacher reads the "
                        "whole one; expected trim-vocab after the steps that learn from the teacher")
    if not student.vocab.startswith("trimmed:") and not teacher.vocab.startswith("trimmed:"):
        raise other_vocabulary(pass_name)


def check_teacher_bundle(pass_name: str, teacher: ModelBundle, student: ModelBundle) -> None:
    """The same refusal once both models are loaded: labels and vocabularies compared whole."""
    check_same_labels(pass_name, tuple(teacher.label_names), tuple(student.label_names))
    if teacher.tokenizer.get_vocab() != student.tokenizer.get_vocab():
        raise other_vocabulary(pass_name)


def check_same_labels(pass_name: str, teacher: tuple[str, ...] | None, student: tuple[str, ...] | None) -> None:
    if teacher is not None and student is not None and tuple(teacher) != tuple(student):
        raise UserError(f"{pass_name}: the teacher's labels ({', '.join(teacher[:3])}, ... {len(teacher)}) differ "
                        f"from the student's ({', '.join(student[:3])}, ... {len(student)}); expected a teacher of "
                        "the same task")


def other_vocabulary(pass_name: str) -> UserError:
    return UserError(f"{pass_name}: the teacher's tokenizer has another vocabulary than the student's; expected one "
                     "tokenizer (both models read the same token ids)")


def shape_after(name: str, config: BaseModel, known: Known) -> Known:
    """The shapes after a step, refusing (UserError) what cannot fit the model it gets: its
    family (`check_family`, against the model's family as the steps before leave it), then
    its indices, counts and widths (`check_shape`)."""
    spec = get_pass(name)
    check_pass_family(name, config, known.model.family)
    check_layer_names_hold(name, config, known.model.layers_named_by)
    check_embedding_rank_kept(name, config, known.model.embedding_rank)
    model = spec.check_shape(config, known) if spec.check_shape is not None else known.model
    if spec.names_layers:
        model = dataclasses.replace(model, layers_named_by=model.layers_named_by + (name,))
    return dataclasses.replace(known, model=model, steps_before=known.steps_before + (name,))


def check_embedding_rank_kept(name: str, config: BaseModel, rank: int | None) -> None:
    """Refuse (UserError) a step that would train a factorized word embedding off its rank:
    the export re-factorizes at that rank, and its parity check fails after the training."""
    spec = get_pass(name)
    how = spec.trains_embedding(config) if rank is not None and spec.trains_embedding is not None else None
    if how is not None:
        remedy = "no domain_corpus" if getattr(config, "domain_corpus", None) else "embedding_updates: frozen"
        raise UserError(f"{name}: factorize-embedding before it left the word embedding at rank {rank}, which the "
                        f"export stores as two factors, and {name} would train it ({how}) off that rank; "
                        f"expected {remedy}")


def word_embedding_training(config: BaseModel) -> str | None:
    """How a step with the `finetune` settings trains the word embedding; None where it does
    not: no epochs, or a strategy that trains only its own modules on a frozen encoder. The
    domain MLM of a two-stage run updates it densely whatever `embedding_updates` says."""
    if getattr(config, "epochs", 1) == 0:
        return None
    if getattr(config, "domain_corpus", None) is not None:
        return "its domain MLM, dense updates"
    updates = getattr(config, "embedding_updates", "frozen")
    return f"{updates} updates" if getattr(config, "strategy", "full") == "full" and updates != "frozen" else None


def check_layer_names_hold(name: str, config: BaseModel, named_by: Iterable[str]) -> None:
    """Refuse (UserError) a pass that renumbers or replaces layers after one whose record names
    them (`sensitivity`'s float layers, `qat`'s activation ranges), or that trains them after a
    record learned in training (`qat`'s ranges fit the weights it left): the export would apply
    the record to other layers, or to weights it was not learned with, without a word."""
    named_by, spec = list(named_by), get_pass(name)
    renames = spec.renames_layers(config) if callable(spec.renames_layers) else spec.renames_layers
    if named_by and renames:
        raise UserError(f"{name}: {named_by[0]} before it recorded the model's Linear layers by name, and {name} "
                        f"renumbers or replaces layers; expected {named_by[0]} after every step that changes the "
                        "layers")
    learned = [n for n in named_by if get_pass(n).trains and n != name]   # a second qat replaces the record
    if learned and spec.trains:
        raise UserError(f"{name}: {learned[0]} before it learned its record for the weights it left, and {name} "
                        f"trains them on; expected {learned[0]} after the last step that trains")


def check_pass_tokenizer(name: str, config: BaseModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Refuse (UserError) a pass that cannot work with `tokenizer`."""
    spec = get_pass(name)
    if spec.check_tokenizer is not None:
        spec.check_tokenizer(config, tokenizer)


def pass_names() -> list[str]:
    return sorted(_REGISTRY)


def pass_name_of(config: BaseModel) -> str:
    """The registered name whose config type `config` is (for the Python API)."""
    # Its own type, or a subtype of a config base that picks a type per value (the quantize
    # modes: QuantizeConfig -> DynamicInt8Config, ...) when no pass registers the subtype itself.
    names = [spec.name for spec in _REGISTRY.values() if type(config) is spec.config_type] or \
        [spec.name for spec in _REGISTRY.values() if isinstance(config, spec.config_type)]
    if len(names) != 1:
        known = ", ".join(f"{s.config_type.__name__} ({s.name})" for s in _REGISTRY.values())
        why = "is shared by several passes; pass a (name, config) pair" if names else "is not a pass config"
        raise UserError(f"{type(config).__name__} {why}; pass configs: {known}")
    return names[0]


def config_type_problem(name: str, config: BaseModel) -> str | None:
    """Why `config` is not a config of pass `name` (None where it is): of another type, or of a
    subtype another pass registers (QATConfig is a FinetuneConfig, but qat's), whose fields the
    pass would take for its own. Subtypes no pass registers (the quantize modes) are the pass's."""
    spec = get_pass(name)
    owners = [s.name for s in _REGISTRY.values() if type(config) is s.config_type]
    if isinstance(config, spec.config_type) and (not owners or name in owners):
        return None
    whose = f" (the config of pass {owners[0]!r})" if owners else ""
    return f"pass {name!r} takes a {spec.config_type.__name__}, not {type(config).__name__}{whose}"


def config_as_written(config: BaseModel) -> dict:
    """The fields a user set, as a recipe writes them: defaults stay defaults (a pass that
    trains takes the run's), but a type tag (a field of one literal value, as the quantize
    modes' `mode`) is always kept: it is the choice of type, and without it the recipe would
    read back as the default type (Fp16Config() -> `quantize: {}` -> dynamic-int8)."""
    written = config.model_dump(mode="json", exclude_unset=True)
    for name, field_info in type(config).model_fields.items():
        if get_origin(field_info.annotation) is Literal and len(get_args(field_info.annotation)) == 1:
            written[name] = getattr(config, name)
    return written


def get_pass(name: str) -> PassSpec:
    if name not in _REGISTRY:
        raise UserError(f"unknown pass {name!r}; known passes: {', '.join(pass_names())}")
    return _REGISTRY[name]


def apply_pass(bundle: ModelBundle, name: str, config: BaseModel, ctx: Context) -> ModelBundle:
    """Run one pass and record it in the output's history."""
    if not isinstance(bundle, ModelBundle) or not isinstance(ctx, Context):
        wrong, expected = (bundle, "a ModelBundle, e.g. ModelBundle.load(path)") if not isinstance(bundle, ModelBundle) \
            else (ctx, "a Context, e.g. Context(task=load_task(...))")
        raise UserError(f"apply_pass({name!r}): got a {type(wrong).__name__}; expected {expected}")
    spec = get_pass(name)
    problem = config_type_problem(name, config)
    if problem:
        raise UserError(f"{problem}; expected e.g. get_pass({name!r}).config_type(...)")
    # The same refusals the pipeline gives up front, for passes called one by one.
    if spec.trains and tuple(bundle.label_names) != tuple(ctx.task.label_names):
        raise UserError(f"pass {name!r} trains on task {ctx.task.name!r} but the model's head is for other labels "
                        f"({', '.join(bundle.label_names[:3])}, ... {len(bundle.label_names)}); expected a model "
                        f"of that task's {len(ctx.task.label_names)} labels, in its order")
    check_pass_family(name, config, bundle.model.config.model_type)
    check_pass_tokenizer(name, config, bundle.tokenizer)
    check_layer_names_hold(name, config, [h["pass"] for h in bundle.history
                                  if h.get("pass") in _REGISTRY and _REGISTRY[h["pass"]].names_layers])
    config = at_model_length(config, bundle)
    out = spec.run(bundle, config, dataclasses.replace(ctx, pass_name=name))
    if out is bundle or out.model is bundle.model:
        raise RuntimeError(f"pass {name!r} returned its input model; passes must copy before changing")
    record = {"pass": name, "config": as_run(config, ctx).model_dump(mode="json")}
    trained_at = getattr(config, "max_length", out.max_length) if spec.trains else out.max_length
    return out.replace(history=bundle.history + (record,), max_length=trained_at)


def at_model_length(config: BaseModel, bundle: ModelBundle) -> BaseModel:
    """A training pass trains at the length its input model was fine-tuned at, unless its
    config sets `max_length` itself (the output then records the length it trained at)."""
    if not hasattr(config, "max_length") or "max_length" in config.model_fields_set \
            or config.max_length == bundle.max_length:
        return config
    return config.model_copy(update={"max_length": bundle.max_length})


def as_run(config: BaseModel, ctx: Context) -> BaseModel:
    """A training pass's config as it ran: the run's seed and training-sample cap filled in
    where it sets none (what `with_run_defaults` gives the pass), so the history says how
    many examples it trained on."""
    if not hasattr(config, "max_train_samples") or not hasattr(config, "seed"):
        return config
    return with_run_defaults(config, ctx.seed, ctx.max_train_samples)
