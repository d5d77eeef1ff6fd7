"""Paths in a recipe: relative to the working dir first, then to the recipe's dir."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from compressor.pipeline.recipe import Step
from pretrain.data.files import file_spec


def resolve_path(ref: str, base_dir: Path, keep: tuple[str, ...] = ()) -> str:
    """A relative path in a recipe means the working dir first, then the recipe's dir.

    Paths come back absolute: they are recorded with the models, which may be used from
    another working dir later.
    """
    if ref in keep:
        return ref
    path = Path(ref)
    if not path.is_absolute() and not path.exists() and (base_dir / path).exists():
        path = base_dir / path
    return str(path.resolve()) if path.exists() else ref


def resolve_step_paths(step: Step, base_dir: Path) -> Step:
    """A pass's data paths (another task's files, a domain corpus, a teacher dir) resolved like the teacher's."""
    config = resolve_config_paths(step.config, base_dir)
    return Step(name=step.name, config=config) if config is not step.config else step


def resolve_config_paths(config: BaseModel, base_dir: Path) -> BaseModel:
    """A config (a pass's, or the teacher's fine-tuning settings) with its data paths resolved."""
    update = {}
    if getattr(config, "intermediate_task", None) is not None:
        update["intermediate_task"] = resolve_task_paths(config.intermediate_task, base_dir)
    if getattr(config, "tasks", None):
        update["tasks"] = tuple(resolve_task_paths(t, base_dir) for t in config.tasks)
    if getattr(config, "domain_corpus", None) is not None:
        update["domain_corpus"] = resolve_path(config.domain_corpus, base_dir)
    if getattr(config, "teacher", None) is not None:      # distill's own teacher (a model dir)
        update["teacher"] = resolve_path(config.teacher, base_dir)
    changed = {k: v for k, v in update.items() if v != getattr(config, k)}
    return config.model_copy(update=changed) if changed else config


def resolve_task_paths(spec: str | dict, base_dir: Path) -> str | dict:
    """A task spec with its files resolved; a bare data file (as --task takes) is `{path: ...}`."""
    spec = file_spec(spec)
    if isinstance(spec, str):
        return spec
    return {k: resolve_path(v, base_dir) if k in ("path", "validation", "test") and isinstance(v, str) else v
            for k, v in spec.items()}
