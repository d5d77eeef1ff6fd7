"""Every registered pass, and every setting it takes, is in the README's pass table.

Recipes are written from that table: a pass missing from it, or a field of its config the
row never names, is a setting no user finds. Fields inherited from the fine-tuning settings
are named once, in the paragraph above the table ("the `finetune` settings")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from compressor.passes import pass_names
from compressor.passes.registry import get_pass
from pretrain.finetune import FinetuneConfig

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def table_rows() -> dict[str, str]:
    """The pass table's rows by pass name."""
    return {m[1]: m[0] for m in re.finditer(r"^\| `([a-z0-9-]+)` \|.*$", README, re.M)}


def finetune_paragraph() -> str:
    """The recipe format section up to the pass table: where the fine-tuning settings are listed."""
    return README.split("## Recipe format", 1)[1].split("Available passes", 1)[0]


def recipe_names(config: type[BaseModel], skip: set[str] = frozenset()) -> list[str]:
    """The names a recipe writes for the config's fields (aliases where a field has one)."""
    return sorted(f.alias or name for name, f in config.model_fields.items() if name not in skip)


def undocumented(config: type[BaseModel], text: str, skip: set[str] = frozenset()) -> list[str]:
    return [name for name in recipe_names(config, skip) if not re.search(rf"`{re.escape(name)}[`:]", text)]


def test_every_finetune_setting_is_listed() -> None:
    assert undocumented(FinetuneConfig, finetune_paragraph()) == []


@pytest.mark.parametrize("name", pass_names())
def test_pass_row_names_every_setting(name: str) -> None:
    row = table_rows().get(name)
    assert row is not None, f"no row for {name!r} in the README's pass table"
    config = get_pass(name).config_type
    inherited = set(FinetuneConfig.model_fields) if issubclass(config, FinetuneConfig) else set()
    assert undocumented(config, row, inherited) == []


def test_a_missing_setting_is_found() -> None:
    """The check can fail: the row with one field's name taken out wherever it appears."""
    row = table_rows()["prune-movement"].replace("scores_lr", "scores rate")
    config = get_pass("prune-movement").config_type
    assert undocumented(config, row, set(FinetuneConfig.model_fields)) == ["scores_lr"]


def adding_a_pass_examples() -> list[str]:
    """The Python blocks of the README's "Adding a pass", in order (later ones use the first's imports)."""
    section = README.split("### Adding a pass", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_adding_a_pass_examples_run_as_written(monkeypatch, bert_bundle, tiny_task, tiny_bert_dir):
    """A contributor copies them: every name they use is imported or defined there (the loss
    aside, which the README says where to find), and the passes they register run."""
    from compressor.passes import Context, LazyTeacher, apply_pass, registry
    from tests.compressor.passes.test_registry import distill_loss
    monkeypatch.setattr(registry, "_REGISTRY", {})     # the examples register names the real passes hold
    blocks = adding_a_pass_examples()
    assert len(blocks) == 2
    namespace: dict = {}
    exec(blocks[0], namespace)
    exec(blocks[1], {**namespace, "distill_loss": distill_loss})
    assert registry.pass_names() == ["drop-layers", "kd"]
    student = apply_pass(bert_bundle, "drop-layers", namespace["DropLayers"](keep=(0, 2)), Context(task=tiny_task))
    assert student.model.config.num_hidden_layers == 2
    kd = registry.get_pass("kd")
    cfg = kd.config_type(epochs=1, batch_size=16, max_train_samples=32)
    out = apply_pass(student.replace(task=tiny_task.spec), "kd", cfg,
                     Context(task=tiny_task, show_progress=False, teacher_source=LazyTeacher.from_dir(tiny_bert_dir)))
    assert out.history[-1]["pass"] == "kd"
