"""The recipe: YAML in, validated typed objects out.

The format is a contract (README "Recipe format"): fields are added, never changed.
Validation happens before anything is written, and every error names the field's path:
`variants.three-layers[0].drop-layers.keep: Input should be a valid tuple (got 'all')`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

from compressor.bench.baselines import BASELINES, distinct_baselines
from compressor.bench.profiles import MAX_ITERATIONS
from compressor.export.onnx import ExportSettings
from compressor.export.quantize import QuantizeConfig, mode_config_type
from compressor.passes import config_as_written, get_pass
from compressor.search.settings import SearchSettings
from compressor.yamlfile import (choices_at, field_at, field_suggestion, is_type_tag, load_yaml, location,
                                 mapping_value, refuse_bool_numbers, yaml_problem)
from pretrain.errors import UserError, choice_problem, given_text, number_problem, number_range, validation_message
from pretrain.finetune import FinetuneConfig
from pretrain.limits import MAX_SEED

VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# A dir name is at most 255 bytes; a variant's export dir and the temporary dir a stage is written
# in (".tmp-" prefix, random suffix) add to it.
MAX_VARIANT_NAME = 200
EXPORT_SUFFIX = "-onnx"            # stage `x` exports to DIR/x-onnx/
TORCH_INT8_SUFFIX = "-torch-int8"  # ... or to DIR/x-torch-int8/ when it is a torch-dynamic-int8 deployment
RUN_FILE = "run.json"              # which recipe owns an output dir
BASELINES_DIR = "baselines"        # DIR/baselines/<name>/
BENCHMARK_DIR = "benchmark"        # DIR/benchmark/benchmark.json
PREFIXES_DIR = "prefixes"          # DIR/prefixes/<key>/: shared variant prefixes
WORK_DIR = ".work"                 # DIR/.work/<key>/: a running pass's checkpoints (hidden: no
                                   # variant name can start with a dot, so none clashes with it)
SEARCH_DIR = "search"              # DIR/search/: the recipe's `search:` run (its own report)
STAGE_FILE = "stage.json"          # in every cached stage dir: its key and record
RESERVED_NAMES = {"teacher", "report.json", "report.md", "report.html", "pareto.png", RUN_FILE,
                  BASELINES_DIR, BENCHMARK_DIR, PREFIXES_DIR, SEARCH_DIR}


def export_dir_name(stage_name: str, quantize_mode: str | None = None) -> str:
    """Where stage `stage_name` is deployed: an ONNX dir, or a PyTorch int8 dir (model.int8.pt)."""
    suffix = TORCH_INT8_SUFFIX if quantize_mode == "torch-dynamic-int8" else EXPORT_SUFFIX
    return f"{stage_name}{suffix}"


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class TeacherSpec(Strict):
    model: str = "minilm"                        # "minilm" (bundled) or a path to an HF model dir
    task: str | dict[str, Any]                   # built-in task name or {path, text, label, ...}
    finetune: FinetuneConfig | None = None       # omitted: use the model as it is


class DataLimits(Strict):
    max_eval_samples: int | None = Field(None, ge=1)    # test examples used for accuracy
    max_train_samples: int | None = Field(None, ge=1)   # default cap for passes that train


class BenchmarkSettings(Strict):
    """The recipe's `benchmark:` section: where and against what the models are measured."""

    profiles: list[str] = Field(default=["cpu"], min_length=1)     # names in profiles/ or YAML paths
    batch_sizes: list[int] | None = None            # default: each profile's own
    sequence_lengths: list[int | Literal["real"]] | None = None   # default: each profile's own
    iterations: int | None = Field(None, ge=1, le=MAX_ITERATIONS)   # default: each profile's own
    baselines: list[Literal[BASELINES]] = list(BASELINES)   # type: ignore[valid-type]

    @field_validator("profiles")
    @classmethod
    def _known_profiles(cls, profiles: list[str]) -> list[str]:
        from compressor.bench.profiles import load_profile
        for ref in profiles:
            try:
                load_profile(ref)
            except UserError as err:    # unknown name or a bad profile file
                raise ValueError(str(err)) from None
        return profiles

    @field_validator("baselines")
    @classmethod
    def _once_each(cls, names: list[str]) -> list[str]:
        return distinct_baselines(names)

    @field_validator("batch_sizes", "sequence_lengths", mode="before")
    @classmethod
    def _no_bool_items(cls, values: object, info: ValidationInfo) -> object:
        from compressor.bench.profiles import numbers_as_written
        return numbers_as_written(values, info)

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, sizes: list[int] | None) -> list[int] | None:
        from compressor.bench.profiles import check_batch_sizes
        return sizes if sizes is None else check_batch_sizes(sizes)

    @field_validator("sequence_lengths")
    @classmethod
    def _lengths(cls, lengths: list | None) -> list | None:
        from compressor.bench.profiles import check_sequence_lengths
        return lengths if lengths is None else check_sequence_lengths(lengths)

    @model_validator(mode="after")
    def _distinct_profiles(self) -> "BenchmarkSettings":
        from compressor.bench.profiles import load_profile
        names = [load_profile(ref).name for ref in self.profiles]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"profiles named {', '.join(map(repr, twice))} more than once: their rows could not be "
                             "told apart; expected one profile per name (rename a copied profile's `name`)")
        return self

    def profile_objects(self) -> list:
        """The profiles with this section's overrides applied."""
        from compressor.bench.profiles import load_profile, with_overrides
        overrides = {k: v for k, v in (("batch_sizes", self.batch_sizes),
                                         ("sequence_lengths", self.sequence_lengths),
                                         ("iterations", self.iterations)) if v is not None}
        return [with_overrides(load_profile(ref), overrides) for ref in self.profiles]

    def resolved_profiles(self) -> list[dict]:
        return [p.model_dump(mode="json") for p in self.profile_objects()]


class Step(Strict):
    """One pass application: the registered name and its validated config."""

    name: str
    config: BaseModel


class Recipe(Strict):
    name: str = Field(min_length=1)        # tells runs apart in an out dir (run.json)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    teacher: TeacherSpec
    data: DataLimits = DataLimits()
    variants: dict[str, list[dict[str, Any] | str]] | None = None
    passes: list[dict[str, Any] | str] | None = None     # shorthand: one variant named "main"
    export: ExportSettings | None = None                  # omitted: no export
    benchmark: BenchmarkSettings | None = None            # omitted: no benchmark
    search: SearchSettings | None = None                  # a search to a latency budget from the teacher

    @field_validator("variants", mode="before")
    @classmethod
    def _variants_with_steps(cls, variants: Any) -> Any:
        """`a:` with nothing under it is YAML's null, which pydantic would call an invalid list."""
        for name, steps in variants.items() if isinstance(variants, dict) else ():
            if steps is None:
                raise UserError(f"variants.{name}: no steps under it; {EXPECTED_STEPS}")
        return variants

    @field_validator("passes", mode="before")
    @classmethod
    def _passes_with_steps(cls, passes: Any) -> Any:
        if passes is None:        # written `passes:` with nothing under it
            raise UserError(f"passes: no steps under it; {EXPECTED_STEPS}")
        return passes

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, variants: dict | None) -> dict | None:
        # Names are compared case-folded: on a case-insensitive file system (macOS's and
        # Windows' defaults) `Int8` and `int8`, or `Teacher` and `teacher`, are one dir.
        for name in variants or {}:
            if not VARIANT_NAME.match(name) or is_reserved(name):
                raise ValueError(f"variant name {name!r} must be letters, digits, '.', '_' or '-', starting with a "
                                 f"letter or digit, and not one of {sorted(RESERVED_NAMES)} (in any case)")
            if len(name) > MAX_VARIANT_NAME:
                raise ValueError(f"variant name {name[:20]!r}... has {len(name)} characters; expected at most "
                                 f"{MAX_VARIANT_NAME} (it names dirs, with room for their suffixes)")
        names = list(variants or {})
        clash = one_dir(names)
        if clash:
            raise ValueError(differ_in_case(*(names[i] for i in clash)))
        return variants

    @field_validator("export")
    @classmethod
    def _export_dirs_free(cls, export: ExportSettings | None, info: ValidationInfo) -> ExportSettings | None:
        if export is None or not export.onnx:
            return export
        # `variants` and `passes` are declared before `export`, so they are validated by now.
        names = {"teacher", *(info.data.get("variants") or {}),
                 *(["main"] if info.data.get("passes") is not None else [])}
        folded = {name.casefold(): name for name in names}     # one dir on a case-insensitive file system
        clashes = sorted((folded[(name + suffix).casefold()], name) for name in names
                         for suffix in (EXPORT_SUFFIX, TORCH_INT8_SUFFIX) if (name + suffix).casefold() in folded)
        if clashes:
            raise ValueError(f"variant name {clashes[0][0]!r} is where {clashes[0][1]!r} may be "
                             f"exported; rename it (export dirs are <name>{EXPORT_SUFFIX}, or "
                             f"<name>{TORCH_INT8_SUFFIX} for torch-dynamic-int8)")
        return export

    @field_validator("search", mode="before")
    @classmethod
    def _compare_by_name(cls, search: Any, info: ValidationInfo) -> Any:
        """`search: {compare: [three-layers-int8]}` names this recipe's own variants; the search
        gets their steps as written, training limits included."""
        if not isinstance(search, dict) or not isinstance(search.get("compare"), list):
            return search
        variants = raw_variants(info.data.get("variants"), info.data.get("passes"))
        limits = info.data.get("data") or DataLimits()
        return {**search, "compare": {name: variant_as_written(variants, name, limits, "search.compare")
                                      for name in search["compare"]}}

    def variant_steps(self) -> dict[str, list[Step]]:
        raw = raw_variants(self.variants, self.passes)
        return {name: [parse_step(item, f"variants.{name}[{i}]") for i, item in enumerate(steps)]
                for name, steps in raw.items()}


EXPECTED_STEPS = "expected a list of steps, or [] for the teacher as it is"


def is_reserved(name: str) -> bool:
    """A name an output dir's own files and dirs take, in any case."""
    return name.casefold() in {n.casefold() for n in RESERVED_NAMES}


def one_dir(names: list[str]) -> tuple[int, int] | None:
    """Where the first two of `names` that name one dir stand, compared case-folded: on a
    case-insensitive file system (macOS's and Windows' defaults) `Int8` and `int8`, or `Teacher`
    and `teacher`, are one dir. None where each has its own."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name.casefold() in seen:
            return seen[name.casefold()], i
        seen[name.casefold()] = i
    return None


def differ_in_case(first: str, second: str) -> str:
    return (f"variant names {first!r} and {second!r} differ only in case, and name one dir on a case-insensitive "
            "file system; expected names that differ in more than case")


def raw_variants(variants: dict | None, passes: list | None) -> dict[str, list]:
    raw = dict(variants or {})
    if passes is not None:
        defined = next((name for name in raw if name.casefold() == "main"), None)
        if defined is not None:    # one of the two would be lost, or share its dir
            also = "too" if defined == "main" else f"as {defined!r} (one dir on a case-insensitive file system)"
            raise UserError(f"passes: is shorthand for a variant named main, which variants: defines {also}; "
                            "expected one of them (or another name for the variant)")
        raw["main"] = passes
    return raw


def variant_as_written(variants: dict[str, list], name: str, limits: DataLimits, where: str) -> list[dict]:
    """A variant's steps with the recipe's training cap written into each pass that trains, so
    the variant trains the same in another recipe (the search's finals cap training differently)."""
    # A UserError, not a ValueError: pydantic would put its field (`search`) before `where`.
    if not isinstance(name, str) or name not in variants:
        raise UserError(f"{where}: no variant {name!r} in the recipe; expected one of {sorted(variants)}")
    steps = []
    for i, item in enumerate(variants[name]):
        step = parse_step(item, f"variants.{name}[{i}]")
        config = config_as_written(step.config)
        trains = "max_train_samples" in type(step.config).model_fields
        if trains and step.config.max_train_samples is None and limits.max_train_samples:
            config["max_train_samples"] = limits.max_train_samples
        steps.append({step.name: config})
    return steps


def compared_variants(specs: list[str]) -> dict[str, list[dict]]:
    """The search's `--compare RECIPE:VARIANT ...`: each variant's steps as written, by name.
    Each name gets its dir in the finals: a name given twice (from two recipes) would drop one
    variant without a word, and names differing only in case would share a dir."""
    compared = [compared_variant(spec) for spec in specs]
    names = [name for name, _ in compared]
    clash = one_dir(names)
    if clash:
        first, second = clash
        if names[first] == names[second]:
            raise UserError(f"--compare {specs[second]}: variant {names[second]!r} is compared already (--compare "
                            f"{specs[first]}); expected each variant name once (the finals build one dir per name)")
        raise UserError(f"--compare {specs[first]}, --compare {specs[second]}: "
                        f"{differ_in_case(names[first], names[second])}")
    return dict(compared)


def compared_variant(spec: str) -> tuple[str, list[dict]]:
    """`RECIPE:VARIANT` (the search's --compare) -> the variant's name and its steps as written."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise UserError(f"--compare {spec!r}: expected RECIPE:VARIANT, e.g. recipes/demo.yaml:three-layers-int8")
    recipe, _ = load_recipe(path)
    return name, variant_as_written(raw_variants(recipe.variants, recipe.passes), name, recipe.data,
                                    f"--compare {spec}")


def parse_step(item: dict[str, Any] | str, where: str) -> Step:
    """`{drop-layers: {keep: [0, 2]}}` or a bare `finetune` -> Step with a typed config."""
    if isinstance(item, str):
        item = {item: {}}
    if len(item) != 1:
        raise UserError(f"{where}: a pass is a mapping with one key, the pass name "
                        f"(e.g. {{drop-layers: {{keep: [0, 2, 4]}}}}), got keys {list(item)}")
    (name, config), = item.items()
    try:
        spec = get_pass(name)
    except UserError as err:
        raise UserError(f"{where}: {err}") from None
    try:
        validated = spec.config_type.model_validate(config or {})
        refuse_bool_numbers(config or {}, validated, f"{where}.{name}")
    except ValidationError as err:
        model = validating_type(spec.config_type, config)
        raise UserError(describe_validation_error(err, f"{where}.{name}", model)) from None
    except ValueError as err:
        raise UserError(str(err)) from None
    return Step(name=name, config=validated)


def validating_type(config_type: type[BaseModel], config: Any) -> type[BaseModel]:
    """The class that validates a step's `config`, whose fields its errors are looked up on (a
    bounded integer's range, a misspelt name's nearest): a quantize step's is its mode's, to
    which QuantizeConfig hands the mapping (the base has `mode` alone)."""
    if issubclass(config_type, QuantizeConfig) and isinstance(config, dict):
        return mode_config_type(config) or config_type
    return config_type


def describe_validation_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """The first pydantic error as one line: path, what was expected, what was given; for a
    field `model` (the validated class) does not have, the nearest name it does have; for a
    value no branch of a union took, what each branch takes (`expected a mapping or a string
    (got 42)`); for a number field's value out of its bounds or of another type, what the field
    takes, both bounds said (`expected an integer from 8 to 512 (got 0)`); for a name no Literal
    takes, the names it does and the nearest (`expected one of soft, hard, ... (got 'sofft'); did
    you mean 'soft'?`)."""
    errors = err.errors()
    # An unknown field first: a misspelt required one (`nmae:`) is also reported missing, and
    # the unknown one is where the did-you-mean hint can go.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    branches = union_branches(errors, first)
    full = ".".join(p for p in (prefix, location(first["loc"])) if p) or "recipe"
    more = f" [and {err.error_count() - len(branches)} more]" if err.error_count() > len(branches) else ""
    if len(branches) > 1:
        expected = item_forms(first["loc"]) or " or ".join(dict.fromkeys(branch_expects(e) for e in branches))
        return f"{full}: expected {expected} (got {given_text(first.get('input'))}){more}"
    number = number_problem(first, field_at(model, first["loc"]))
    if number is not None:      # not pydantic's "greater than or equal to 8": 513 is refused too
        return f"{full}: {number}{more}"
    choice = choice_problem(first, choices_at(model, first["loc"]))
    if choice is not None:      # not pydantic's "Input should be 'soft', ...": which name, the nearest valid one
        # an unknown key is reported at its mapping (`weights: unknown name 'sofft'`), not as a path into it
        loc = first["loc"][:-2] if first["loc"][-1] == "[key]" else first["loc"]
        return f"{'.'.join(p for p in (prefix, location(loc)) if p)}: {choice}{more}"
    given = first.get("input")
    if first["type"] == "dict_type":    # not pydantic's "a valid dictionary": what its values take too
        return f"{full}: expected {mapping_form(field_at(model, first['loc']))} (got {given_text(given)}){more}"
    shown = "" if isinstance(given, (dict, list)) or first["type"] == "missing" else f" (got {given!r})"
    hint = field_suggestion(model, first["loc"]) if first["type"] == "extra_forbidden" else ""
    return f"{full}: {validation_message(first)}{shown}{hint}{more}"


def mapping_form(field: FieldInfo | None) -> str:
    """`a mapping, each value a number >= 0` for a mapping of numbers; `a mapping` for another."""
    values = number_range(mapping_value(field))
    return f"a mapping, each value {values}" if values else "a mapping"


# What a union's branch takes, by the error it gave (others: pydantic's message).
BRANCH_EXPECTS = {"int_parsing": "an integer", "int_type": "an integer", "int_from_float": "an integer",
                  "float_parsing": "a number", "float_type": "a number", "string_type": "a string",
                  "bool_parsing": "true or false", "bool_type": "true or false", "dict_type": "a mapping",
                  "model_type": "a mapping", "list_type": "a list"}


def union_branches(errors: list[dict], first: dict) -> list[dict]:
    """The errors of every branch of the union whose branch `first` is (pydantic reports
    each), or just `first` where it is no union's."""
    loc = first["loc"]
    if not loc or not is_type_tag(loc[-1]):
        return [first]
    return [e for e in errors if e["loc"][:-1] == loc[:-1] and e["loc"] and is_type_tag(e["loc"][-1])]


def item_forms(loc: tuple) -> str | None:
    """What the list item at `loc` takes, in words, where its union's branches say less than
    its validator checks (`ITEM_FORMS`: a sequence length is an integer >= 2, or 'real')."""
    from compressor.bench.profiles import ITEM_FORMS
    fields = [part for part in loc if isinstance(part, str) and not is_type_tag(part)]
    return ITEM_FORMS.get(fields[-1]) if fields and len(loc) >= 2 and isinstance(loc[-2], int) else None


def branch_expects(error: dict) -> str:
    if error["type"] == "literal_error":
        return str(error["ctx"]["expected"])
    return BRANCH_EXPECTS.get(error["type"], validation_message(error).removeprefix("Input should be "))


@contextlib.contextmanager
def located(where: str) -> Iterator[None]:
    """A UserError raised inside names where in the recipe it comes from, `where: ...`, as
    the recipe's validation errors do (`r.yaml: variants.a[0]: ...`); nothing is added for an
    empty `where` (a recipe with no file, run from code)."""
    try:
        yield
    except UserError as err:
        if not where:
            raise
        raise UserError(f"{where}: {err}") from None


def load_recipe(path: str | Path) -> tuple[Recipe, dict[str, list[Step]]]:
    """Parse and validate a recipe file; raise UserError with a one-line message."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"recipe {path} is a directory; expected a recipe .yaml file")
    if not path.is_file():
        raise UserError(f"recipe {path} not found")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML{yaml_problem(err)}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    return parse_recipe(with_profile_paths(raw, path.parent), source=str(path))


def with_profile_paths(raw: Any, base_dir: Path) -> Any:
    """`benchmark.profiles` files found as the recipe's other paths are: the working dir
    first, then the recipe's dir (bundled profile names stay names)."""
    from compressor.pipeline.paths import resolve_path    # paths imports this module
    bench = raw.get("benchmark") if isinstance(raw, dict) else None
    if not isinstance(bench, dict) or not isinstance(bench.get("profiles"), list):
        return raw
    profiles = [resolve_path(ref, base_dir) if isinstance(ref, str) and ref.endswith((".yaml", ".yml")) else ref
                for ref in bench["profiles"]]
    return {**raw, "benchmark": {**bench, "profiles": profiles}}


def parse_recipe(raw: Any, source: str = "recipe") -> tuple[Recipe, dict[str, list[Step]]]:
    if not isinstance(raw, dict):
        raise UserError(f"{source}: expected a mapping with name, teacher and variants or passes")
    try:
        with located(source):    # a validator's own UserError (a step search.compare parses) names the file too
            recipe = Recipe.model_validate(raw)
        refuse_bool_numbers(raw, recipe, "")
    except ValidationError as err:
        raise UserError(f"{source}: {describe_validation_error(err, model=Recipe)}") from None
    except ValueError as err:
        raise UserError(f"{source}: {err}") from None
    with located(source):
        steps = recipe.variant_steps()
    if not steps and recipe.search is None:
        raise UserError(f"{source}: no variants: add `variants:` or `passes:` (an empty list is the teacher "
                        f"itself), or a `search:` section")
    return recipe, steps
