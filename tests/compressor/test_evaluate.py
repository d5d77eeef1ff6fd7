"""compressor/evaluate.py: which seed a named task's splits are drawn with."""

from __future__ import annotations

import pytest

from compressor.evaluate import same_task_spec, split_seed


@pytest.mark.parametrize("recorded_extra", [
    {"text": "text", "label": "label"},                  # the default columns, named in a recipe
    {"text_pair": "text_pair", "split": [0.8, 0.1, 0.1]},
    {"validation": None},
])
def test_a_bare_path_is_the_recorded_task_with_its_defaults_named(tmp_path, monkeypatch, recorded_extra):
    monkeypatch.chdir(tmp_path)
    recorded = {"path": str((tmp_path / "rows.jsonl").resolve()), **recorded_extra}
    assert same_task_spec({"path": "rows.jsonl"}, recorded)
    assert split_seed(None, 7, {"path": "rows.jsonl"}, recorded) == 7


@pytest.mark.parametrize("given_extra", [{"text": "sentence"}, {"label": "gold"}, {"split": [0.6, 0.2, 0.2]},
                                         {"text_pair": "hypothesis"}])
def test_other_columns_or_fractions_are_another_task(tmp_path, monkeypatch, given_extra):
    monkeypatch.chdir(tmp_path)
    recorded = {"path": str((tmp_path / "rows.jsonl").resolve()), "text": "text", "label": "label"}
    assert not same_task_spec({"path": "rows.jsonl", **given_extra}, recorded)
    assert split_seed(None, 7, {"path": "rows.jsonl", **given_extra}, recorded) == 0
