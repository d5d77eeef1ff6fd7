"""compressor/pipeline/paths.py: a recipe's paths, relative to the working dir, then the recipe's dir."""

from __future__ import annotations

from compressor.pipeline.paths import resolve_task_paths


def test_a_bare_data_file_is_a_task_spec_resolved_against_the_recipe_dir(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "x.jsonl").write_text('{"text": "a", "label": "b"}\n')
    monkeypatch.chdir(tmp_path)                             # not the recipe's dir
    expected = {"path": str((tmp_path / "recipes" / "x.jsonl").resolve())}
    assert resolve_task_paths("x.jsonl", tmp_path / "recipes") == expected
    assert resolve_task_paths({"path": "x.jsonl"}, tmp_path / "recipes") == expected
    assert resolve_task_paths("wordnet-wsd", tmp_path / "recipes") == "wordnet-wsd"
