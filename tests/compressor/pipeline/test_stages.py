"""Pipeline stages: the length a model was fine-tuned at follows it into every later stage;
what a rebuilt stage makes stale goes whole."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from compressor.pipeline import stages
from compressor.pipeline.cache import content_key, fingerprint, task_fingerprint
from compressor.pipeline.outdir import remove_stale_temporaries
from compressor.pipeline.recipe import parse_recipe
from pretrain.batching import MAX_LENGTH
from pretrain.finetune import FinetuneConfig


def recipe_for(model_dir, csv_path, finetune: dict):
    return parse_recipe({"name": "tiny", "seed": 0,
                         "teacher": {"model": str(model_dir), "task": {"path": str(csv_path)}, "finetune": finetune},
                         "data": {"max_eval_samples": 8}, "variants": {"same": []}})[0]


@pytest.fixture
def scored_lengths(monkeypatch) -> list[int]:
    """The length of every scoring of a model stage on the test split, in order."""
    lengths = []
    real = stages.evaluate

    def recording(model, tokenizer, split, max_length=MAX_LENGTH):
        lengths.append(max_length)
        return real(model, tokenizer, split, max_length)
    monkeypatch.setattr(stages, "evaluate", recording)
    return lengths


def test_a_stage_is_scored_at_the_length_its_model_was_fine_tuned_at(bert_bundle, tiny_csv, tiny_task, tmp_path,
                                                                      scored_lengths):
    """The run scored every stage at 128 tokens, whatever `max_length` the teacher trained at."""
    recipe = recipe_for(bert_bundle.model.name_or_path, tiny_csv, {"max_length": 64})
    stage = stages.model_stage("teacher", "k", lambda: bert_bundle.replace(max_length=64), tiny_task, recipe, tmp_path)
    assert scored_lengths == [64]
    assert json.loads((stage.path / "compressor.json").read_text())["max_length"] == 64


def test_a_stage_of_a_model_scored_before_takes_over_its_scores(bert_bundle, tiny_csv, tiny_task, tmp_path,
                                                                 scored_lengths):
    """A variant that only records how it deploys (quantize) holds its input's weights: the
    run does not score the same model twice. One changed weight, or another length, is scored."""
    scored = scored_lengths
    recipe = recipe_for(bert_bundle.model.name_or_path, tiny_csv, {})
    teacher = stages.model_stage("teacher", "k0", lambda: bert_bundle, tiny_task, recipe, tmp_path)
    quantized = bert_bundle.replace(deploy={"quantize": {"mode": "dynamic-int8"}}, history=({"pass": "quantize"},))
    int8 = stages.model_stage("int8", "k1", lambda: quantized, tiny_task, recipe, tmp_path, scored_before=[teacher])
    assert scored == [MAX_LENGTH]
    assert int8.metrics == teacher.metrics and int8.scored_model == teacher.scored_model is not None
    np.testing.assert_array_equal(int8.predictions, teacher.predictions)
    assert json.loads((int8.path / "stage.json").read_text())["predictions"] == teacher.predictions.tolist()

    changed = bert_bundle.replace(model=bert_bundle.copy_model())
    with torch.no_grad():
        changed.model.classifier.bias[0] += 0.5
    stages.model_stage("changed", "k2", lambda: changed, tiny_task, recipe, tmp_path, scored_before=[teacher, int8])
    stages.model_stage("shorter", "k3", lambda: bert_bundle.replace(max_length=64), tiny_task, recipe, tmp_path,
                       scored_before=[teacher, int8])
    assert scored == [MAX_LENGTH, MAX_LENGTH, 64]


def test_the_teacher_records_its_fine_tuning_length_or_the_one_its_dir_records(bert_bundle, tiny_bert_dir, tmp_path):
    assert stages.teacher_length(FinetuneConfig(max_length=256), tiny_bert_dir) == 256
    assert stages.teacher_length(None, tiny_bert_dir) == MAX_LENGTH       # an HF dir records none
    bert_bundle.replace(max_length=96).save(tmp_path / "given")
    assert stages.teacher_length(None, tmp_path / "given") == 96


def test_a_teacher_fine_tuned_at_the_default_length_keeps_its_key(tiny_bert_dir, tiny_csv, tiny_task):
    """Runs at the default length reuse their cached stages; a longer length is a new key (a
    teacher cached before its length was recorded is rebuilt, so that it records it)."""
    recipe = recipe_for(tiny_bert_dir, tiny_csv, {"epochs": 1})
    cfg = stages.teacher_finetune(recipe)
    before = content_key({"model": fingerprint(tiny_bert_dir), "task": task_fingerprint(tiny_task),
                          "finetune": stages.data_keyed_fields(cfg)})
    assert stages.teacher_key(recipe, tiny_bert_dir, tiny_task) == before
    longer = recipe_for(tiny_bert_dir, tiny_csv, {"epochs": 1, "max_length": 256})
    unmarked = content_key({"model": fingerprint(tiny_bert_dir), "task": task_fingerprint(tiny_task),
                            "finetune": stages.data_keyed_fields(stages.teacher_finetune(longer))})
    assert stages.teacher_key(longer, tiny_bert_dir, tiny_task) not in (before, unmarked)


def test_a_rebuilt_model_stage_records_the_time_of_its_stopped_builds_too(bert_bundle, tiny_csv, tiny_task, tmp_path):
    """A teacher or variant rebuilt after a stop resumes its checkpoints: build_seconds counts
    the stopped build as well, and what noted its time goes with the work dirs."""
    recipe = recipe_for(bert_bundle.model.name_or_path, tiny_csv, {})

    def stopped():
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        stages.model_stage("v", "k", stopped, tiny_task, recipe, tmp_path)
    stages.model_stage("v", "k", lambda: bert_bundle, tiny_task, recipe, tmp_path)
    assert json.loads((tmp_path / "v" / "stage.json").read_text())["build_attempts"] == 2
    assert not (tmp_path / ".work").exists() or not any((tmp_path / ".work").iterdir())


def test_a_stop_while_an_export_is_retired_leaves_no_part_of_it_behind(tmp_path, monkeypatch):
    """rmtree deletes in the order the filesystem lists, creation order on btrfs or XFS: stopped
    after model.onnx, it left the export's stage.json, and a run back at the old settings took
    the export for whole and crashed on its missing graph."""
    export = tmp_path / "ft-onnx"
    export.mkdir()
    (export / "model.onnx").write_bytes(b"graph")
    (export / "stage.json").write_text(json.dumps({"key": "old"}))
    (tmp_path / "report.json").write_text(json.dumps({"exports": {"ft": {"path": str(export)}}}))
    real_rmtree = shutil.rmtree

    def stopped_after_the_first_file(path, *args, **kwargs):
        first = Path(path) / "model.onnx"
        if not first.exists():
            return real_rmtree(path, *args, **kwargs)
        first.unlink()
        raise KeyboardInterrupt
    monkeypatch.setattr(shutil, "rmtree", stopped_after_the_first_file)
    with pytest.raises(KeyboardInterrupt):
        stages.retire_what_reads(tmp_path, "ft")
    monkeypatch.undo()
    assert not export.exists() and not (tmp_path / "report.json").exists()   # which named it
    remove_stale_temporaries(tmp_path)       # the next claim of the run's dir
    assert list(tmp_path.iterdir()) == []
