"""pretrain/data/overlap.py: held-out examples whose text the train split also holds."""

from __future__ import annotations

import json

from pretrain.data import load_task
from pretrain.data.overlap import TrainOverlap, overlap_warning, scored_overlap, texts_in_train


def write_jsonl(path, rows: list[dict]):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def file_task(tmp_path, test_rows: list[dict], validation_rows: list[dict] | None = None, pair=False):
    """Train: 20 distinct texts ("t0".."t19", label i % 2), with explicit validation and test
    files, so which held-out row repeats a train text is known exactly."""
    train = [{"text": f"t{i}", "label": str(i % 2), **({"text_pair": f"p{i}"} if pair else {})} for i in range(20)]
    spec = {"path": write_jsonl(tmp_path / "train.jsonl", train),
            "test": write_jsonl(tmp_path / "test.jsonl", test_rows),
            "validation": write_jsonl(tmp_path / "validation.jsonl",
                                      validation_rows or [{"text": "v", "label": "0", **({"text_pair": "w"} if pair
                                                                                          else {})}])}
    return load_task(spec)


def test_held_out_texts_that_train_holds_are_counted_with_those_under_another_label(tmp_path):
    """Before, nothing counted the test rows a model may have trained on."""
    test = [{"text": "t3", "label": "1"},      # in train, same label
            {"text": "t4", "label": "1"},      # in train under 0
            {"text": "t4", "label": "0"},      # the same text again, its train label
            {"text": "new", "label": "0"}, {"text": "T3", "label": "1"}, {"text": "t3 ", "label": "1"}]   # exact only
    task = file_task(tmp_path, test, validation_rows=[{"text": "t7", "label": "0"}, {"text": "v", "label": "1"}])
    assert texts_in_train(task, "test") == TrainOverlap(examples=6, in_train=3, other_label=1)
    assert texts_in_train(task, "validation") == TrainOverlap(examples=2, in_train=1, other_label=1)
    line = overlap_warning("test", texts_in_train(task, "test").as_dict(), pair_task=False)
    assert line.startswith("3 of the 6 test examples scored have a text that the train split also holds, "
                           "1 of them under another label there: ") and "\n" not in line


def test_only_the_examples_scored_are_counted(tmp_path):
    rows = [{"text": text, "label": "0"} for text in ("t0", "t2", "t4", "a", "b", "c")]
    task = file_task(tmp_path, rows)
    scored = task.split("test").head(3)           # the test file is shuffled: its first three as scored
    expected = sum(text.startswith("t") for text in scored.texts)
    assert texts_in_train(task, "test", limit=3) == TrainOverlap(examples=3, in_train=expected, other_label=0)
    assert texts_in_train(task, "test").in_train == 3


def test_a_pair_task_compares_the_pair(tmp_path):
    test = [{"text": "t1", "text_pair": "p1", "label": "1"},       # the pair is in train
            {"text": "t1", "text_pair": "p2", "label": "1"},       # each text is, the pair is not
            {"text": "t2", "text_pair": "p2", "label": "1"}]       # in train under 0
    task = file_task(tmp_path, test, pair=True)
    overlap = texts_in_train(task, "test")
    assert overlap == TrainOverlap(examples=3, in_train=2, other_label=1)
    assert "have a text pair that the train split also holds" in overlap_warning("test", overlap.as_dict(), True)


def test_no_shared_text_is_zero_with_no_warning(tmp_path):
    task = file_task(tmp_path, [{"text": "a", "label": "0"}, {"text": "b", "label": "1"}])
    assert texts_in_train(task, "test") == TrainOverlap(examples=2, in_train=0, other_label=0)
    assert scored_overlap(task, "test") == {"texts_in_train": {"test": {"examples": 2, "in_train": 0,
                                                                         "other_label": 0}}}


def test_the_record_a_command_keeps_carries_its_warning(tmp_path):
    task = file_task(tmp_path, [{"text": "t4", "label": "1"}, {"text": "b", "label": "1"}])
    record = scored_overlap(task, "test")
    assert record["texts_in_train"] == {"test": {"examples": 2, "in_train": 1, "other_label": 1}}
    assert record["warnings"] == [overlap_warning("test", record["texts_in_train"]["test"], False)]


def test_wordnet_supersense_at_seed_0(supersense):
    """The README's 12 texts shared between its splits at seed 0, 7 under other labels: 5 test
    examples with a train text (3 under another label), 6 validation examples (3), and one
    text that validation and test share without train."""
    assert texts_in_train(supersense, "test") == TrainOverlap(examples=11765, in_train=5, other_label=3)
    assert texts_in_train(supersense, "validation") == TrainOverlap(examples=11765, in_train=6, other_label=3)
