"""The pipeline from Python: the same stages, cache and report as a YAML recipe.

    from compressor import Pipeline
    from compressor.export.quantize import QuantizeConfig
    from compressor.passes.layers import DropLayers
    from pretrain.finetune import FinetuneConfig

    pipe = Pipeline("my-run", teacher="minilm", task="wordnet-supersense",
                    finetune=FinetuneConfig(epochs=2, max_train_samples=50000))
    pipe.variant("three-layers", DropLayers(keep=(0, 2, 4)), FinetuneConfig(epochs=1))
    pipe.variant("int8", QuantizeConfig(mode="dynamic-int8", per_channel=True))
    pipe.export(optimize=True).benchmark(profiles=["cpu"], batch_sizes=[1, 8])
    report = pipe.run("runs/my-run")

A pass is its config object; the registry knows which pass each config type belongs to
(a `(name, config)` pair picks one explicitly: the config a dict of its fields, or an object of
that pass's own config type; another pass's config is refused, whose fields it would misread). `pipe.to_yaml()` writes the equivalent
recipe, so a script can hand its pipeline to a colleague who prefers YAML.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from compressor.passes import config_as_written, config_type_problem, get_pass, pass_name_of
from compressor.pipeline.recipe import parse_recipe
from pretrain.errors import UserError


class Pipeline:
    """A recipe built in code. Methods return the pipeline, so calls chain."""

    def __init__(self, name: str, *, task: str | dict, teacher: str = "minilm",
                 finetune: BaseModel | dict | None = None, seed: int = 0,
                 max_eval_samples: int | None = None, max_train_samples: int | None = None) -> None:
        self._raw: dict[str, Any] = {
            "name": name, "seed": seed,
            "teacher": {"model": path_text(teacher, "teacher", "minilm or a model dir"), "task": task,
                        "finetune": as_dict(section(finetune, "finetune"))},
            "data": {"max_eval_samples": max_eval_samples, "max_train_samples": max_train_samples},
            "variants": {}}

    def variant(self, name: str, *passes: BaseModel | tuple[str, BaseModel | dict]) -> "Pipeline":
        """Add a variant: the teacher with these passes applied in order (none: the teacher).
        A name already given is refused (as a YAML recipe refuses a key given twice)."""
        if name in self._raw["variants"]:
            raise UserError(f"pipeline {self._raw['name']!r}: variant {name!r} is already defined; "
                            "expected a new name for each variant")
        steps = [step_of(name, p) for p in passes]
        self._raw["variants"][name] = [{pass_name: as_dict(config)} for pass_name, config in steps]
        return self

    def export(self, settings: BaseModel | dict | None = None, **fields: Any) -> "Pipeline":
        """ONNX export of every model (ExportSettings, or its fields as keywords)."""
        self._raw["export"] = settings_or_fields(settings, fields, "export", {"onnx": True})
        return self

    def benchmark(self, settings: BaseModel | dict | None = None, **fields: Any) -> "Pipeline":
        """Measure every model on hardware profiles (BenchmarkSettings, or its fields as keywords)."""
        self._raw["benchmark"] = settings_or_fields(settings, fields, "benchmark")
        return self

    def search(self, settings: BaseModel | dict | None = None, **fields: Any) -> "Pipeline":
        """Search to a latency budget from the teacher (SearchSettings, or its fields as keywords),
        into OUT/search/ on the benchmark's first profile."""
        self._raw["search"] = settings_or_fields(settings, fields, "search")
        return self

    def to_dict(self) -> dict:
        raw = {k: v for k, v in self._raw.items() if v is not None}
        raw["teacher"] = {k: v for k, v in raw["teacher"].items() if v is not None}
        raw["data"] = {k: v for k, v in raw["data"].items() if v is not None}
        return raw

    def to_yaml(self) -> str:
        """The equivalent recipe, validated first as `plan` and `run` do (the same UserError): a
        YAML that `compressor run` would refuse is never written."""
        self.validate()
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def validate(self):
        """The validated recipe and its steps (raises UserError like a bad YAML recipe)."""
        return parse_recipe(self.to_dict(), source=self.source)

    @property
    def source(self) -> str:
        """How its errors name the pipeline (a recipe's name its file)."""
        return f"pipeline {self._raw['name']!r}"

    def run(self, out_dir: str | Path, *, force: bool = False, rebenchmark: bool = False,
            show_progress: bool = True) -> dict:
        """Run every stage into out_dir (cached and resumable, like `compressor run`); the report.
        `force`: replace another recipe's results in out_dir (`--force`; a stage of this recipe is
        never rebuilt for it); `rebenchmark`: time the models again (`--rebenchmark`)."""
        import torch

        from compressor.pipeline import run_recipe
        out_dir = Path(path_text(out_dir, "out_dir", "a directory path"))
        recipe, steps = self.validate()
        threads = torch.get_num_threads()    # the run uses every core; the caller's setting comes back
        try:
            return run_recipe(recipe, steps, out_dir, show_progress=show_progress, force=force,
                              rebenchmark=rebenchmark, source=self.source)
        finally:
            torch.set_num_threads(threads)

    def plan(self, out_dir: str | Path, *, force: bool = False, rebenchmark: bool = False) -> dict:
        """What `run` would do into out_dir, without doing it (`compressor run --plan`): each
        stage cached or to build, with the passes a build runs. Runs and writes nothing."""
        from compressor.pipeline.plan import plan_recipe
        out_dir = Path(path_text(out_dir, "out_dir", "a directory path"))
        recipe, steps = self.validate()
        return plan_recipe(recipe, steps, out_dir, force=force, rebenchmark=rebenchmark, source=self.source)


def step_of(variant: str, step: Any) -> tuple[str, BaseModel | dict | None]:
    """A variant's step as (pass name, config). A config object under a name is checked against
    that pass's config type: written under another pass's name, its fields would be read as
    that pass's (a FinetuneConfig given as `distill` would run a distillation)."""
    if isinstance(step, type):
        raise UserError(f"variant {variant!r}: a step is {described(step)}")
    if not isinstance(step, tuple):
        return pass_name_of(step), step
    if len(step) != 2:
        raise UserError(f"variant {variant!r}: a step given as a tuple is (pass name, config), got {len(step)} items")
    name, config = step
    if not isinstance(name, str):
        raise UserError(f"variant {variant!r}: a step's pass name is a {type(name).__name__}; "
                        "expected a string, e.g. ('drop-layers', {'keep': [0, 2]})")
    if config is None or isinstance(config, dict):
        return name, config
    try:
        expected = get_pass(name).config_type.__name__
    except UserError as err:
        raise UserError(f"variant {variant!r}: {err}") from None
    if not isinstance(config, BaseModel):
        raise UserError(f"variant {variant!r}: pass {name!r} takes a {expected} or a dict of its fields, "
                        f"not {described(config)}")
    problem = config_type_problem(name, config)
    if problem:
        raise UserError(f"variant {variant!r}: {problem}; expected a {expected} or a dict of its fields")
    return name, config


def settings_or_fields(settings: BaseModel | dict | None, fields: dict[str, Any], field: str,
                       defaults: dict[str, Any] | None = None) -> dict | None:
    """A section given as a settings object (or dict), or as keyword fields: not both, since the
    keywords would be dropped without a word."""
    if settings is not None and fields:
        raise UserError(f"{field}: given both a settings object and the fields {', '.join(fields)}; "
                        "expected one of them")
    return as_dict(section(settings, field)) if settings is not None else {**(defaults or {}), **fields}


def section(settings: BaseModel | dict | None, field: str) -> BaseModel | dict | None:
    """`settings`, after checking a config object is of the type the recipe's section takes
    (a FinetuneConfig given to `export` would otherwise pass as an empty export section)."""
    from compressor.pipeline.recipe import Recipe, TeacherSpec
    owner = TeacherSpec if field == "finetune" else Recipe
    expected = next(t for t in getattr(owner.model_fields[field].annotation, "__args__", ())
                    if isinstance(t, type) and issubclass(t, BaseModel))
    if settings is not None and not isinstance(settings, (dict, expected)):
        raise UserError(f"{field}: expected {expected.__name__} (or a dict of its fields), "
                        f"got {described(settings)}")
    return settings


def path_text(value: Any, what: str, expected: str) -> str:
    """A path argument as the recipe writes it; anything but a str or path-like is refused
    (str() would turn a number into a name that exists nowhere)."""
    if isinstance(value, str) or isinstance(value, os.PathLike):
        return os.fspath(value)
    raise UserError(f"{what}: expected {expected} (a str or Path), got {described(value)}")


def described(value: Any) -> str:
    """A wrong argument, named for the error: a class given where its instance was meant says so."""
    if isinstance(value, type):
        return f"the class {value.__name__} (expected an instance: {value.__name__}(...))"
    return f"{type(value).__name__} {value!r}" if isinstance(value, (str, int, float)) else type(value).__name__


def as_dict(config: BaseModel | dict | None) -> dict | None:
    """Only the fields a user set: defaults stay defaults (as in a hand-written recipe), type
    tags kept (`config_as_written`)."""
    if config is None or isinstance(config, dict):
        return config
    return config_as_written(config)
