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
