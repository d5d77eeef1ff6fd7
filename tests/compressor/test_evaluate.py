"""compressor/evaluate.py: which seed a named task's splits are drawn with; a whole file scored."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from compressor.evaluate import (evaluate_path, load_predictor, predict_classes, same_task_spec, split_seed,
                                 task_or_recorded)
from pretrain.batching import encode
from pretrain.data import WHOLE, whole_task
from pretrain.errors import UserError


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


def test_the_task_scored_is_the_given_one_else_the_recorded_one_whose_files_must_be_there(tmp_path):
    here, gone = tmp_path / "here.csv", tmp_path / "gone.csv"
    here.write_text("text,label\n")
    assert task_or_recorded("wordnet-wsd", {"path": str(gone)}, "m") == "wordnet-wsd"
    assert task_or_recorded(None, {"path": str(here)}, "m") == {"path": str(here)}
    assert task_or_recorded(None, None, "m") is None
    with pytest.raises(UserError, match=f"^m records its task's data file {gone}, which is not there"):
        task_or_recorded(None, {"path": str(here), "test": str(gone)}, "m")


def held_out_file(path, tiny_task, rows: int, labels=None):
    """The tiny task's first test texts written out as a held-out file of `rows` rows."""
    test = tiny_task.split("test")
    names = labels or [tiny_task.label_names[label] for label in test.labels[:rows]]
    path.write_text("".join(json.dumps({"text": text, "label": label}) + "\n"
                            for text, label in zip(test.texts[:rows], names)))
    return path


def test_split_all_scores_every_row_of_a_held_out_file(tiny_bert_dir, tiny_task, tmp_path):
    """Given a held-out file, evaluate split it 80/10/10 and scored its test tenth only."""
    path = held_out_file(tmp_path / "heldout.jsonl", tiny_task, 25)
    whole = evaluate_path(str(tiny_bert_dir), str(path), "all")
    assert whole["samples"] == 25 and whole["split"] == "all"
    assert evaluate_path(str(tiny_bert_dir), str(path), "all", max_samples=7)["samples"] == 7
    assert evaluate_path(str(tiny_bert_dir), str(path))["samples"] == 2       # the default: its test tenth


def test_split_all_takes_a_file_lacking_some_of_the_model_labels_but_none_it_lacks(tiny_bert_dir, tiny_task,
                                                                                     tmp_path):
    """Labelled with the model's own predictions (a random model predicts few of its labels),
    a file is scored 1.0: its labels are numbered the model's way, not the file's."""
    predicted = predict_classes(load_predictor(tiny_bert_dir), tiny_task.split("test").head(20), tiny_task)
    assert len(set(predicted)) < len(tiny_task.label_names)
    agreeing = held_out_file(tmp_path / "agreeing.jsonl", tiny_task, 20,
                             labels=[tiny_task.label_names[label] for label in predicted])
    assert evaluate_path(str(tiny_bert_dir), str(agreeing), "all")["accuracy"] == 1.0
    unknown = held_out_file(tmp_path / "unknown.jsonl", tiny_task, 5, labels=["noun.nothing"] * 5)
    with pytest.raises(UserError, match=r"1 label\(s\) the model lacks \(e.g. \['noun.nothing'\]\)"):
        evaluate_path(str(tiny_bert_dir), str(unknown), "all")


def test_split_all_on_the_command_line(tiny_bert_dir, tiny_task, tmp_path, capsys):
    from compressor.cli.commands import main
    path = held_out_file(tmp_path / "heldout.jsonl", tiny_task, 12)
    assert main(["evaluate", "--model", str(tiny_bert_dir), "--task", str(path), "--split", "all"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 12


def test_max_length_overrides_the_length_a_model_records(tiny_bert_dir, tiny_task):
    """evaluate had no --max-length: a model was always scored at the length it records."""
    recorded = load_predictor(tiny_bert_dir)
    assert recorded.max_length == 128
    test = tiny_task.split("test")
    cut = recorded.logits(encode(recorded.tokenizer, test, 6)).argmax(axis=1)
    result = evaluate_path(str(tiny_bert_dir), tiny_task.spec, max_length=6)
    assert result["max_length"] == 6 and result["accuracy"] == pytest.approx((cut == np.asarray(test.labels)).mean())
    assert evaluate_path(str(tiny_bert_dir), tiny_task.spec)["max_length"] == 128


@pytest.mark.parametrize("value", [0, -3, 129])
def test_a_max_length_the_model_cannot_run_at_is_refused(tiny_bert_dir, value):
    with pytest.raises(UserError, match=rf"^--max-length {value}: expected a positive number of tokens, at most the "
                                        "128 position embeddings of "):
        load_predictor(tiny_bert_dir, value)


def test_a_max_length_without_room_for_a_text_token_is_refused(tiny_bert_dir, tiny_task, tmp_path):
    """Below its special tokens plus one, the tokenizer cut nothing: `--max-length 1` scored
    whole texts while the result said 1. A pair task's third special token counts too."""
    with pytest.raises(UserError, match=r"^--max-length 2: expected at least 3 tokens for .* on task 'tiny' \(its "
                                        r"tokenizer adds 2 special tokens to each text, "):
        evaluate_path(str(tiny_bert_dir), tiny_task.spec, max_length=2)
    assert evaluate_path(str(tiny_bert_dir), tiny_task.spec, max_length=3)["max_length"] == 3
    test = tiny_task.split("test")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"text": text, "text_pair": text, "label": tiny_task.label_names[label]}) + "\n"
                             for text, label in zip(test.texts[:10], test.labels)))
    with pytest.raises(UserError, match=r"^--max-length 3: expected at least 4 tokens .* to each text pair"):
        evaluate_path(str(tiny_bert_dir), str(pairs), "all", max_length=3)
    assert evaluate_path(str(tiny_bert_dir), str(pairs), "all", max_length=4)["max_length"] == 4


def test_split_all_takes_a_reference_with_other_labels_that_hold_the_files(tiny_bert_dir, tiny_task, tokenizer,
                                                                           tmp_path):
    """The reference had to have exactly the model's labels, and its refusal described the
    model's: a file of 3 labels scored by a 4-label model against a 3-label one was refused
    as "the model lacks 1 of the task's 4 labels". It is held to the model's rule: the file's
    labels among its own, predictions compared by name."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    test = tiny_task.split("test")
    three = tiny_task.label_names[:3]
    rows = [(text, tiny_task.label_names[label]) for text, label in zip(test.texts, test.labels)
            if tiny_task.label_names[label] in three]
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"text": text, "label": label}) + "\n" for text, label in rows))
    torch.manual_seed(1)
    reference = tmp_path / "reference"
    config = BertConfig.from_pretrained(str(tiny_bert_dir), num_labels=3, id2label=dict(enumerate(three[::-1])),
                                        label2id={name: i for i, name in enumerate(three[::-1])})
    BertForSequenceClassification(config).save_pretrained(str(reference))
    tokenizer.save_pretrained(str(reference))

    def names(model_dir):
        predictor = load_predictor(model_dir)
        logits = predictor.logits(encode(predictor.tokenizer, whole_task(str(path)).split(WHOLE), 128))
        return np.asarray(predictor.label_names)[logits.argmax(axis=1)]
    result = evaluate_path(str(tiny_bert_dir), str(path), WHOLE, reference=str(reference))
    assert result["samples"] == len(rows)
    assert result["agreement"] == pytest.approx((names(tiny_bert_dir) == names(reference)).mean())
    with pytest.raises(UserError, match=r"^--reference .*: model labels do not match task 'tiny': its rows hold 1 "
                                        rf"label\(s\) the model lacks \(e.g. \['{tiny_task.label_names[3]}'\]\)"):
        evaluate_path(str(tiny_bert_dir), tiny_task.spec["path"], WHOLE, reference=str(reference))


def test_scored_held_out_texts_that_train_holds_are_counted(tiny_bert_dir, tiny_csv, tiny_task, tmp_path):
    """evaluate scored test rows the model may have trained on without a word."""
    train, names = tiny_task.split("train"), tiny_task.label_names
    test = tmp_path / "test.jsonl"         # train's first two texts (the second under another label), one new
    test.write_text("".join(json.dumps({"text": text, "label": names[label]}) + "\n" for text, label in [
        (train.texts[0], train.labels[0]), (train.texts[1], (train.labels[1] + 1) % len(names)), ("new", 0)]))
    validation = tmp_path / "validation.jsonl"
    validation.write_text("".join(json.dumps({"text": f"v{i}", "label": names[i % 4]}) + "\n" for i in range(5)))
    spec = {"path": str(tiny_csv), "test": str(test), "validation": str(validation)}
    result = evaluate_path(str(tiny_bert_dir), spec)
    assert result["texts_in_train"] == {"test": {"examples": 3, "in_train": 2, "other_label": 1}}
    (line,) = result["warnings"]
    assert line.startswith("2 of the 3 test examples scored have a text that the train split also holds, 1 of them "
                           "under another label there: ")
    assert evaluate_path(str(tiny_bert_dir), spec, max_samples=1)["texts_in_train"]["test"]["examples"] == 1
    validation = evaluate_path(str(tiny_bert_dir), spec, "validation")
    assert validation["texts_in_train"] == {"validation": {"examples": 5, "in_train": 0, "other_label": 0}}
    assert "warnings" not in validation
    assert "texts_in_train" not in evaluate_path(str(tiny_bert_dir), spec, "train")   # nothing held out


def test_distinct_splits_record_no_shared_text_and_no_warning(tiny_bert_dir, tiny_task):
    result = evaluate_path(str(tiny_bert_dir), tiny_task.spec)
    assert result["texts_in_train"] == {"test": {"examples": result["samples"], "in_train": 0, "other_label": 0}}
    assert "warnings" not in result


SHAPE_REFUSALS = {
    "pairs": "{model} was fine-tuned on text pairs (text, text_pair); task 'tiny' gives single texts: expected a task "
             "with a text_pair column, or a model fine-tuned on single texts",
    "single": "{model} was fine-tuned on single texts; task 'tiny-pairs' gives text pairs (text, text_pair): expected "
              "a task without a text_pair column, or a model fine-tuned on text pairs",
}


@pytest.mark.parametrize("trained, other", [("pairs", "single"), ("single", "pairs")])
def test_a_task_of_the_other_shape_than_the_model_was_fine_tuned_on_is_refused(trained, other, shape_tuned, tiny_csv,
                                                                               tiny_pairs_csv, capsys):
    """Same labels, other shape: a pair model fed single texts (or the reverse) predicted, and
    its meaningless score was printed with exit 0."""
    from compressor.cli.commands import main
    files = {"single": tiny_csv, "pairs": tiny_pairs_csv}
    model = shape_tuned[trained]
    assert main(["evaluate", "--model", str(model), "--task", str(files[other])]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {SHAPE_REFUSALS[trained].format(model=model)}\n" and captured.out == ""
    assert main(["evaluate", "--model", str(shape_tuned[other]), "--task", str(files[other]),
                 "--reference", str(model), "--max-samples", "4"]) == 2
    assert capsys.readouterr().err == f"error: --reference {model}: {SHAPE_REFUSALS[trained].format(model=model)}\n"
    assert main(["evaluate", "--model", str(model), "--task", str(files[trained]), "--max-samples", "4"]) == 0


def test_evaluate_takes_max_eval_samples_as_the_other_commands_name_it(tiny_bert_dir, tiny_csv, capsys):
    from compressor.cli.commands import main
    outputs = []
    for flag in ("--max-samples", "--max-eval-samples"):
        assert main(["evaluate", "--model", str(tiny_bert_dir), "--task", str(tiny_csv), flag, "4"]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and outputs[0]["samples"] == 4


def test_a_model_that_records_no_input_shape_is_scored_on_either(shape_tuned, tiny_bert_dir, tiny_csv, tmp_path,
                                                                  capsys):
    """A dir written before the record (or a plain HF dir) says nothing of its input: not refused."""
    from compressor.cli.commands import main
    older = tmp_path / "older"
    shutil.copytree(shape_tuned["pairs"], older)
    record = json.loads((older / "compressor.json").read_text())
    assert record.pop("pair_task") is True
    (older / "compressor.json").write_text(json.dumps(record))
    for model in (older, tiny_bert_dir):
        assert main(["evaluate", "--model", str(model), "--task", str(tiny_csv), "--max-samples", "4"]) == 0
    capsys.readouterr()
