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
(a `(name, config)` pair picks one explicitly). `pipe.to_yaml()` writes the equivalent
recipe, so a script can hand its pipeline to a colleague who prefers YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from compressor.passes import config_as_written, pass_name_of
from compressor.pipeline.recipe import parse_recipe
from pretrain.errors import UserError


class Pipeline:
    """A recipe built in code. Methods return the pipeline, so calls chain."""

    def __init__(self, name: str, *, task: str | dict, teacher: str = "minilm",
                 finetune: BaseModel | dict | None = None, seed: int = 0,
                 max_eval_samples: int | None = None, max_train_samples: int | None = None) -> None:
        self._raw: dict[str, Any] = {
            "name": name, "seed": seed,
            "teacher": {"model": str(teacher), "task": task, "finetune": as_dict(section(finetune, "finetune"))},
            "data": {"max_eval_samples": max_eval_samples, "max_train_samples": max_train_samples},
            "variants": {}}

    def variant(self, name: str, *passes: BaseModel | tuple[str, BaseModel | dict]) -> "Pipeline":
        """Add a variant: the teacher with these passes applied in order (none: the teacher).
        A name already given is refused (as a YAML recipe refuses a key given twice)."""
        if name in self._raw["variants"]:
            raise UserError(f"pipeline {self._raw['name']!r}: variant {name!r} is already defined; "
                            "expected a new name for each variant")
        steps = []
        for p in passes:
            if isinstance(p, tuple) and len(p) != 2:
                raise UserError(f"variant {name!r}: a step given as a tuple is (pass name, config), got {len(p)} items")
            pass_name, config = p if isinstance(p, tuple) else (pass_name_of(p), p)
            steps.append({pass_name: as_dict(config)})
        self._raw["variants"][name] = steps
        return self

    def export(self, settings: BaseModel | None = None, **fields: Any) -> "Pipeline":
        """ONNX export of every model (ExportSettings, or its fields as keywords)."""
        self._raw["export"] = as_dict(section(settings, "export")) if settings is not None else {"onnx": True, **fields}
        return self

    def benchmark(self, settings: BaseModel | None = None, **fields: Any) -> "Pipeline":
        """Measure every model on hardware profiles (BenchmarkSettings, or its fields as keywords)."""
        self._raw["benchmark"] = as_dict(section(settings, "benchmark")) if settings is not None else fields
        return self

    def search(self, settings: BaseModel | None = None, **fields: Any) -> "Pipeline":
        """Search to a latency budget from the teacher (SearchSettings, or its fields as keywords),
        into OUT/search/ on the benchmark's first profile."""
        self._raw["search"] = as_dict(section(settings, "search")) if settings is not None else fields
        return self

    def to_dict(self) -> dict:
        raw = {k: v for k, v in self._raw.items() if v is not None}
        raw["teacher"] = {k: v for k, v in raw["teacher"].items() if v is not None}
        raw["data"] = {k: v for k, v in raw["data"].items() if v is not None}
        return raw

    def to_yaml(self) -> str:
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
        """Run every stage into out_dir (cached and resumable, like `compressor run`); the report."""
        import torch

        from compressor.pipeline import run_recipe
        recipe, steps = self.validate()
        threads = torch.get_num_threads()    # the run uses every core; the caller's setting comes back
        try:
            return run_recipe(recipe, steps, Path(out_dir), show_progress=show_progress, force=force,
                              rebenchmark=rebenchmark, source=self.source)
        finally:
            torch.set_num_threads(threads)

    def plan(self, out_dir: str | Path, *, force: bool = False, rebenchmark: bool = False) -> dict:
        """What `run` would do into out_dir, without doing it (`compressor run --plan`): each
        stage cached or to build, with the passes a build runs. Runs and writes nothing."""
        from compressor.pipeline.plan import plan_recipe
        recipe, steps = self.validate()
        return plan_recipe(recipe, steps, Path(out_dir), force=force, rebenchmark=rebenchmark, source=self.source)


def section(settings: BaseModel | dict | None, field: str) -> BaseModel | dict | None:
    """`settings`, after checking a config object is of the type the recipe's section takes
    (a FinetuneConfig given to `export` would otherwise pass as an empty export section)."""
    from compressor.pipeline.recipe import Recipe, TeacherSpec
    owner = TeacherSpec if field == "finetune" else Recipe
    expected = next(t for t in getattr(owner.model_fields[field].annotation, "__args__", ())
                    if isinstance(t, type) and issubclass(t, BaseModel))
    if isinstance(settings, BaseModel) and not isinstance(settings, expected):
        raise UserError(f"{field}: expected {expected.__name__} (or a dict of its fields), "
                        f"got {type(settings).__name__}")
    return settings


def as_dict(config: BaseModel | dict | None) -> dict | None:
    """Only the fields a user set: defaults stay defaults (as in a hand-written recipe), type
    tags kept (`config_as_written`)."""
    if config is None or isinstance(config, dict):
        return config
    return config_as_written(config)
