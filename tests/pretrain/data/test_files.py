"""User task files: CSV, TSV, JSONL, their splits, and every error a user can make."""

from __future__ import annotations

import json

import pytest

from pretrain.data import load_task, whole_task
from pretrain.data import files
from pretrain.data.files import file_task
from pretrain.errors import UserError


def _csv(path, rows, header="text,label"):
    path.write_text(header + "\n" + "".join(r + "\n" for r in rows), encoding="utf-8")
    return path


def _many(n, labels=("pos", "neg")):
    return [f"sentence {i},{labels[i % len(labels)]}" for i in range(n)]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _all_texts(task):
    return [t for s in task.splits.values() for t in s.texts]


# --- reading each format ---

def test_csv_default_split_80_10_10(tmp_path):
    path = _csv(tmp_path / "reviews.csv", _many(100))
    task = load_task({"path": str(path)})
    assert task.name == "reviews"
    assert [len(task.split(n)) for n in ("train", "validation", "test")] == [80, 10, 10]
    assert sorted(_all_texts(task)) == sorted(f"sentence {i}" for i in range(100))
    assert task.label_names == ("neg", "pos")
    train = task.split("train")
    assert all(task.label_names[y] == ("pos" if int(t.split()[1]) % 2 == 0 else "neg")
               for t, y in zip(train.texts, train.labels))
    assert not task.is_pair_task
    assert task.spec == {"path": str(path)}
    json.dumps(task.spec)


def test_csv_quoted_fields_and_custom_columns(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('id,sentence,cls\n' + "".join(f'{i},"hello, ""world"" {i}",c{i % 2}\n' for i in range(20)),
                    encoding="utf-8")
    task = file_task({"path": str(path), "text": "sentence", "label": "cls"})
    assert 'hello, "world" 0' in _all_texts(task)
    assert task.label_names == ("c0", "c1")


def test_tsv_keeps_quote_characters_literal(tmp_path):
    path = tmp_path / "d.tsv"
    rows = [f'"quoted {i} start\t{"a" if i % 2 else "b"}' for i in range(20)]
    path.write_text("text\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    task = file_task({"path": str(path)})
    # A stray '"' must not swallow the following lines: all 20 rows survive.
    assert sum(map(len, task.splits.values())) == 20
    assert '"quoted 3 start' in _all_texts(task)


def test_jsonl_pairs_with_int_labels(tmp_path):
    records = [{"premise": f"p{i}", "hypothesis": f"h{i}", "y": i % 3} for i in range(30)]
    path = _jsonl(tmp_path / "nli.jsonl", records)
    task = file_task({"path": str(path), "text": "premise", "text_pair": "hypothesis", "label": "y"})
    assert task.is_pair_task
    assert task.label_names == ("0", "1", "2")
    for split in task.splits.values():
        for text, pair, label in zip(split.texts, split.text_pairs, split.labels):
            assert pair == "h" + text[1:]
            assert task.label_names[label] == str(int(text[1:]) % 3)


def test_jsonl_numbers_that_are_equal_are_one_label(tmp_path):
    records = [{"text": f"t{i}", "label": [1, 1.0, 2, 2.5][i % 4]} for i in range(40)]
    task = file_task({"path": str(_jsonl(tmp_path / "n.jsonl", records))})
    assert task.label_names == ("1", "2", "2.5")


def test_json_extension_means_json_lines(tmp_path):
    path = _jsonl(tmp_path / "d.json", [{"text": f"t{i}", "label": "x" if i % 2 else "y"} for i in range(10)])
    assert sum(map(len, file_task({"path": str(path)}).splits.values())) == 10


def test_utf8_bom_is_ignored(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(("\ufefftext,label\n" + "\n".join(_many(10))).encode("utf-8"))
    assert len(file_task({"path": str(path)}).split("train")) == 8


# --- splits ---

def test_explicit_validation_and_test_files(tmp_path):
    train = _csv(tmp_path / "train.csv", _many(12))
    val = _csv(tmp_path / "val.csv", ["v1,pos", "v2,neg"])
    test = _csv(tmp_path / "test.csv", ["t1,neg"])
    task = file_task({"path": str(train), "validation": str(val), "test": str(test)})
    assert len(task.split("train")) == 12
    assert sorted(task.split("validation").texts) == ["v1", "v2"]
    assert task.split("test").texts == ["t1"]


def test_a_whole_file_is_every_row_as_written_in_one_split(tmp_path):
    """Nothing is drawn: a file too small to split, or with a label in one row only, is whole."""
    path = _csv(tmp_path / "heldout.csv", ["c,neg", "a,pos", "b,pos", "d,odd"])
    task = whole_task(str(path))
    assert list(task.splits) == ["all"] and task.label_names == ("neg", "odd", "pos")
    assert task.split("all").texts == ["c", "a", "b", "d"] and task.split("all").labels == [0, 2, 2, 1]
    one_label = whole_task({"path": str(_csv(tmp_path / "one.csv", ["x,pos"]))})
    assert one_label.label_names == ("pos",) and len(one_label.split("all")) == 1


def test_a_whole_task_holds_its_validation_and_test_files_and_pairs(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", [{"text": "t", "text_pair": "u", "label": "yes"}])
    test = _jsonl(tmp_path / "test.jsonl", [{"text": "v", "text_pair": "w", "label": "no"}])
    task = whole_task({"path": str(train), "test": str(test)})
    assert task.is_pair_task and task.split("all").texts == ["t", "v"] and task.split("all").text_pairs == ["u", "w"]
    with pytest.raises(UserError, match="no column 'label'"):
        whole_task(str(_jsonl(tmp_path / "bad.jsonl", [{"text": "t"}])))


@pytest.fixture
def warnings_anew():
    """Each test sees the warnings its own loads print (one process prints one a task)."""
    files._WARNED.clear()
    yield
    files._WARNED.clear()


def test_texts_shared_between_splits_are_warned_about_once_in_one_line(tmp_path, capsys, warnings_anew):
    """Duplicate rows landing in train and test inflated test accuracy without a word."""
    path = _csv(tmp_path / "twice.csv", _many(50) * 2)            # every row twice
    task = file_task({"path": str(path)})
    err = capsys.readouterr().err
    shared = len(set(task.split("train").texts) & set(task.split("validation").texts + task.split("test").texts) |
                 set(task.split("validation").texts) & set(task.split("test").texts))
    assert shared > 0 and err.count("\n") == 1
    assert err.startswith(f"warning: {path}: {shared} text(s) occur in more than one of the train, validation and "
                          "test splits (duplicate rows)")
    assert sorted(_all_texts(task)) == sorted(t.split(",")[0] for t in _many(50) * 2)     # the splits are kept
    file_task({"path": str(path)})
    assert capsys.readouterr().err == ""                            # once


def test_a_test_file_sharing_a_train_text_is_warned_about(tmp_path, capsys, warnings_anew):
    train = _csv(tmp_path / "train.csv", _many(12))
    file_task({"path": str(train), "validation": str(_csv(tmp_path / "v.csv", ["v,pos"])),
               "test": str(_csv(tmp_path / "t.csv", ["sentence 3,neg", "t,pos"]))})
    assert ": 1 text(s) occur in more than one" in capsys.readouterr().err


def test_the_warning_names_the_files_that_share_rows(tmp_path, capsys, warnings_anew):
    """Rows shared by the validation and test files only were blamed on the train file."""
    train = _csv(tmp_path / "train.csv", _many(12))
    validation, test = _csv(tmp_path / "v.csv", ["same,pos", "v,neg"]), _csv(tmp_path / "t.csv", ["same,pos"])
    file_task({"path": str(train), "validation": str(validation), "test": str(test)})
    assert capsys.readouterr().err.startswith(f"warning: across {validation}, {test}: 1 text(s) occur in more than one")
    file_task({"path": str(train), "test": str(_csv(tmp_path / "t2.csv", ["sentence 3,neg"]))})   # validation drawn
    assert capsys.readouterr().err.startswith(f"warning: across {train}, {tmp_path / 't2.csv'}: 1 text(s) occur")


def _three_files(tmp_path):
    """Train rows, one of them repeated in validation, another in test, and a row validation
    and test both hold."""
    train = _csv(tmp_path / "train.csv", _many(12))
    validation = _csv(tmp_path / "v.csv", ["sentence 1,neg", "same,pos", "v,neg"])
    test = _csv(tmp_path / "t.csv", ["sentence 3,neg", "same,pos", "t,pos"])
    return {"path": str(train), "validation": str(validation), "test": str(test)}


def test_a_command_scoring_a_split_leaves_the_texts_only_train_and_it_hold_to_its_own_line(tmp_path, capsys,
                                                                                           warnings_anew):
    """`run`, `finetune` and `evaluate` printed this line and their scored-split line
    (overlap.py) about the same train texts in test: now the load-time line says the rest."""
    spec = _three_files(tmp_path)
    where = f"across {spec['path']}, {spec['validation']}, {spec['test']}"
    file_task(spec, scored="test")
    assert capsys.readouterr().err == (f"warning: {where}: 2 validation text(s) also occur in the train or test "
                                       "split (duplicate rows); expected each once (drop the duplicate rows)\n")
    files._WARNED.clear()
    file_task(spec, scored="validation")
    assert capsys.readouterr().err == (f"warning: {where}: 2 test text(s) also occur in the train or validation "
                                       "split (duplicate rows); expected each once (drop the duplicate rows)\n")
    files._WARNED.clear()
    file_task(spec)                                                   # a command that scores no split
    assert capsys.readouterr().err.startswith(f"warning: {where}: 3 text(s) occur in more than one of the train, "
                                              "validation and test splits (duplicate rows)")
    only_test = {"path": spec["path"], "test": spec["test"].replace("t.csv", "t2.csv")}
    _csv(tmp_path / "t2.csv", ["sentence 3,neg", "t,pos"])
    file_task(only_test, scored="test")                                 # the scored-split line says it all
    assert capsys.readouterr().err == ""


def test_a_task_loaded_again_by_the_same_command_is_not_warned_about_again(tmp_path, capsys, warnings_anew):
    """A run loads its task, then its search does, which scores no split itself: its line
    would say again the train texts in test that the run's own line says."""
    spec = _three_files(tmp_path)
    file_task(spec, scored="test")
    assert "2 validation text(s)" in capsys.readouterr().err
    file_task(spec)
    load_task(spec, seed=3)                      # another draw of the same file: the same fact
    assert capsys.readouterr().err == ""


def test_a_pair_task_shares_a_row_only_when_both_texts_repeat(tmp_path, capsys, warnings_anew):
    train = _jsonl(tmp_path / "train.jsonl", [{"text": "a", "text_pair": f"b{i}", "label": i % 2} for i in range(20)])
    test = _jsonl(tmp_path / "test.jsonl", [{"text": "a", "text_pair": "new", "label": 0}])
    file_task({"path": str(train), "test": str(test)})
    assert capsys.readouterr().err == ""
    validation = _jsonl(tmp_path / "val.jsonl", [{"text": "a", "text_pair": "b1", "label": 1}])
    file_task({"path": str(train), "test": str(test), "validation": str(validation)})
    assert ": 1 text pair(s) occur in more than one" in capsys.readouterr().err


def test_under_torchrun_rank_0_alone_warns(tmp_path, capsys, warnings_anew, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    file_task({"path": str(_csv(tmp_path / "twice.csv", _many(50) * 2))})
    assert capsys.readouterr().err == ""


def test_distinct_texts_load_without_a_word(tmp_path, capsys, warnings_anew):
    file_task({"path": str(_csv(tmp_path / "d.csv", _many(100)))})
    assert capsys.readouterr().err == ""


def test_only_test_file_splits_train_by_renormalised_fractions(tmp_path):
    train = _csv(tmp_path / "train.csv", _many(90))
    test = _csv(tmp_path / "test.csv", ["t1,neg", "t2,pos"])
    task = file_task({"path": str(train), "test": str(test), "split": [0.6, 0.3, 0.1]})
    # 0.6 : 0.3 renormalised is 2/3 : 1/3 of the 90 train rows.
    assert [len(task.split(n)) for n in ("train", "validation", "test")] == [60, 30, 2]
    assert set(task.split("validation").texts).isdisjoint(task.split("train").texts)


def test_custom_fractions(tmp_path):
    path = _csv(tmp_path / "d.csv", _many(50))
    task = file_task({"path": str(path), "split": [0.5, 0.3, 0.2]})
    assert [len(task.split(n)) for n in ("train", "validation", "test")] == [25, 15, 10]


def test_split_is_seeded(tmp_path):
    path = _csv(tmp_path / "d.csv", _many(100))
    a, b, c = (file_task({"path": str(path)}, seed=s) for s in (0, 0, 1))
    assert a.split("test").texts == b.split("test").texts
    assert a.split("test").texts != c.split("test").texts


# --- errors: each names the file and the problem ---

def _error(spec) -> str:
    with pytest.raises(UserError) as err:
        file_task(spec)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_unknown_key_lists_allowed_keys(tmp_path):
    message = _error({"path": "x.csv", "labels": "y"})
    assert "labels" in message and "text_pair" in message and "validation" in message


def test_a_misspelt_key_gets_the_nearest_allowed_one(tmp_path):
    assert _error({"path": "x.csv", "splt": [0.8, 0.1, 0.1]}).endswith("; did you mean 'split'?")
    assert _error({"path": "x.csv", "labl": "y", "txt": "t"}).endswith("; did you mean 'label' for 'labl', "
                                                                       "'text' for 'txt'?")
    assert "did you mean" not in _error({"path": "x.csv", "zzzz": 1})


def test_missing_path_key():
    assert "path" in _error({"text": "t"})


def test_missing_file(tmp_path):
    path = tmp_path / "nope.csv"
    message = _error({"path": str(path)})
    assert str(path) in message and "not found" in message


def test_missing_validation_file(tmp_path):
    train = _csv(tmp_path / "train.csv", _many(10))
    message = _error({"path": str(train), "validation": str(tmp_path / "val.jsonl")})
    assert "val.jsonl" in message and "not found" in message


@pytest.mark.parametrize("content", ["", "text,label\n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.csv"
    path.write_text(content, encoding="utf-8")
    message = _error({"path": str(path)})
    assert str(path) in message and "empty" in message


def test_empty_jsonl(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    assert "empty" in _error({"path": str(path)})


def test_not_utf8_gives_byte_offset(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("text,label\ncaf\xe9,pos\n".encode("latin-1"))
    message = _error({"path": str(path)})
    assert str(path) in message and "UTF-8" in message and "line 2" in message and "offset 14" in message


def test_missing_column_names_it_and_lists_found(tmp_path):
    path = _csv(tmp_path / "d.csv", ["a,pos"], header="sentence,label")
    message = _error({"path": str(path)})
    assert "'text'" in message and "sentence" in message and str(path) in message

    assert "tab" not in message


def test_a_default_column_missing_says_where_other_names_go(tmp_path):
    # --task takes text and label only: a GLUE file's 'sentence' column got no way forward.
    path = _csv(tmp_path / "d.tsv", ["a\t1"], header="sentence\tlabel")
    assert _error({"path": str(path)}) == f"{path}: line 1 (the header): no column 'text'; columns found: " \
        "'sentence', 'label'; a recipe's task spec names other columns ({path: FILE, text: COLUMN, label: COLUMN})"


def test_a_tab_separated_file_named_csv_gets_a_hint(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text\tlabel\nhello\tpos\n", encoding="utf-8")
    message = _error({"path": str(path)})
    assert "'text'" in message and "name a tab-separated file .tsv" in message


def test_missing_pair_column_in_jsonl(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": 1}])
    message = _error({"path": str(path), "text_pair": "hypothesis"})
    assert "'hypothesis'" in message and "'text', 'label'" in message


def test_empty_text_gives_line_number(tmp_path):
    path = _csv(tmp_path / "d.csv", ["fine,pos", "  ,neg"])
    message = _error({"path": str(path)})
    assert "line 3" in message and "'text'" in message and str(path) in message


def test_empty_label_gives_line_number(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": "x"}, {"text": "b", "label": ""}])
    message = _error({"path": str(path)})
    assert "line 2" in message and "'label'" in message


def test_short_csv_row_is_an_empty_label(tmp_path):
    path = _csv(tmp_path / "d.csv", ["fine,pos", "fine,neg", "no label here"])
    assert "line 4" in _error({"path": str(path)})


def test_label_unseen_in_train(tmp_path):
    train = _csv(tmp_path / "train.csv", _many(10))
    test = _csv(tmp_path / "test.csv", ["a,neutral", "b,pos", "c,mixed", "d,other", "e,fifth"])
    message = _error({"path": str(train), "test": str(test)})
    assert "test" in message and str(test) in message
    assert "'fifth'" in message and "'mixed'" in message and "'neutral'" in message
    assert "'other'" not in message and "1 more" in message


def test_a_label_unseen_in_train_in_a_file_of_its_own_names_trains_labels(tmp_path):
    # Advising "rows enough of each label for every split" misled: nothing is carved here.
    train = _csv(tmp_path / "train.csv", _many(10))
    test = _csv(tmp_path / "test.csv", ["a,pos", "b,neutral"])
    assert _error({"path": str(train), "test": str(test)}) == \
        f"{test}: label(s) 'neutral' in the test split never occur in train; expected only labels that {train} " \
        "holds ('neg', 'pos')"


def test_label_only_in_a_carved_split(tmp_path):
    # One row of a rare label; with seed 0 the 10% train share misses it.
    path = _csv(tmp_path / "d.csv", _many(99) + ["rare,unique"])
    message = _error({"path": str(path), "split": [0.1, 0.45, 0.45]})
    assert "'unique'" in message and "never occur in train" in message and str(path) in message


def test_real_valued_labels_unseen_in_train_are_named_as_scores(tmp_path):
    # An STS-B-like file was told to add "rows enough of each label": each score is a class.
    path = _csv(tmp_path / "d.csv", [f"sentence {i},{i * 0.37:.2f}" for i in range(40)])
    assert _error({"path": str(path)}).endswith("; the labels look like real-valued scores (regression): each value "
                                                "is a class here, so bin them into a few classes first")
    rare = _csv(tmp_path / "r.csv", _many(99, labels=("1", "2")) + ["rare,3"])
    assert "real-valued" not in _error({"path": str(rare), "split": [0.1, 0.45, 0.45]})   # integer classes


def test_unsupported_extension(tmp_path):
    path = tmp_path / "d.xlsx"
    path.write_text("x", encoding="utf-8")
    message = _error({"path": str(path)})
    assert ".xlsx" in message and ".csv" in message and ".jsonl" in message


def test_malformed_json_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n\n{"text": "b", label: y}\n', encoding="utf-8")
    message = _error({"path": str(path)})
    assert "line 3" in message and "JSON" in message and str(path) in message


def test_json_line_not_an_object(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('["a", "x"]\n', encoding="utf-8")
    assert "object" in _error({"path": str(path)})


def test_fractions_must_sum_to_one(tmp_path):
    path = _csv(tmp_path / "d.csv", _many(10))
    message = _error({"path": str(path), "split": [0.8, 0.1, 0.2]})
    assert "sum to 1.1" in message


def test_fractions_must_be_three(tmp_path):
    path = _csv(tmp_path / "d.csv", _many(10))
    assert "three fractions" in _error({"path": str(path), "split": [0.9, 0.1]})


def test_split_ending_empty(tmp_path):
    path = _csv(tmp_path / "d.csv", _many(5))
    message = _error({"path": str(path)})
    assert "validation split is empty" in message and str(path) in message


def test_load_task_rejects_unknown_names_and_types():
    with pytest.raises(UserError, match="wordnet-supersense"):
        load_task("glue-sst2")
    with pytest.raises(UserError, match="list"):
        load_task(["a.csv"])


# --- rows that would be misread without a check ---

def test_a_row_with_more_fields_than_the_header_is_refused(tmp_path):
    path = _csv(tmp_path / "d.csv", ["fine,pos", "hello, world,pos", *_many(10)])
    message = _error({"path": str(path)})
    assert f"{path}: line 3: 3 fields, expected 2 (text, label); quote a text that holds a comma" in message
    tsv = tmp_path / "d.tsv"
    tsv.write_text("text\tlabel\n\"tab\tinside\"\tpos\n", encoding="utf-8")
    assert "a TSV is read without quoting" in _error({"path": str(tsv)})


def test_a_quoted_row_that_runs_on_is_reported_where_it_starts(tmp_path):
    path = _csv(tmp_path / "d.csv", ['"unclosed,pos', *_many(20)])
    assert f"{path}: line 2:" in _error({"path": str(path)})


@pytest.mark.parametrize("closing", ['"a quoted text",pos', 'a quoted" text,pos'])
def test_a_quote_left_open_does_not_swallow_the_rows_up_to_the_next_quote(tmp_path, closing):
    # Without strict parsing the rows between the two quotes loaded silently as one text.
    path = _csv(tmp_path / "d.csv", [*_many(4), '"unclosed,pos', *_many(20), closing, *_many(4)])
    message = _error({"path": str(path)})
    assert message.startswith(f"{path}: line 6: malformed ','-separated row")
    assert "a quote inside it is written twice" in message


def test_a_quote_left_open_to_the_end_is_malformed_not_an_empty_label(tmp_path):
    path = _csv(tmp_path / "d.csv", ['"unclosed,pos', *_many(20)])
    assert "unexpected end of data" in _error({"path": str(path)})


def test_a_quoted_text_over_several_lines_is_one_text(tmp_path):
    path = _csv(tmp_path / "d.csv", ['"two\nlines, with ""quotes""",pos', *_many(20)])
    assert 'two\nlines, with "quotes"' in _all_texts(load_task({"path": str(path)}))


def test_an_empty_first_line_is_an_empty_header(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("\ntext,label\n" + "".join(r + "\n" for r in _many(20)), encoding="utf-8")
    assert _error({"path": str(path)}) == \
        f"{path}: line 1: an empty header; expected the column names (text, label, ...) on the first line"


def test_a_long_text_is_a_valid_row(tmp_path):
    path = _csv(tmp_path / "d.csv", ["w" * 200_000 + ",pos", *_many(20)])
    assert max(len(t) for t in _all_texts(load_task({"path": str(path)}))) == 200_000


def test_a_column_named_twice_is_refused(tmp_path):
    path = _csv(tmp_path / "d.csv", ["a,pos,neg"], header="text,label,label")
    assert "column(s) 'label' named twice" in _error({"path": str(path)})


@pytest.mark.parametrize("indent", [None, 2])
def test_a_json_array_is_named_as_one_not_json_lines(tmp_path, indent):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"text": f"s {i}", "label": i % 2} for i in range(20)], indent=indent))
    assert _error({"path": str(path)}).endswith("; the file is one JSON array: write one object per line (JSON lines)")


def test_json_lines_break_at_newlines_only(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"text": "first line\u2028second\x85third", "label": "pos"}] + \
        [{"text": f"s {i}", "label": ("pos", "neg")[i % 2]} for i in range(20)]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert "first line\u2028second\x85third" in _all_texts(load_task({"path": str(path)}))


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_a_json_nan_is_no_value(tmp_path, value):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "fine", "label": "pos"}\n{"text": "x", "label": %s}\n' % value, encoding="utf-8")
    assert f"line 2: column 'label' is {'nan' if value == 'NaN' else 'inf'}; expected a value" in \
        _error({"path": str(path)})


def test_one_label_is_no_classification_task(tmp_path):
    path = _csv(tmp_path / "d.csv", [f"s {i},pos" for i in range(30)])
    assert "the train split has one label only ('pos'); a classifier needs at least 2" in _error({"path": str(path)})


def test_a_text_pair_column_is_read_without_being_named(tmp_path):
    path = _csv(tmp_path / "d.csv", [f"premise {i},hypothesis {i},{('yes', 'no')[i % 2]}" for i in range(20)],
                header="text,text_pair,label")
    task = load_task({"path": str(path)})
    assert task.split("train").text_pairs is not None
    assert all(p.startswith("hypothesis") for p in task.split("train").text_pairs)


def _pair_rows(n, start=0):
    return [{"text": f"premise {i}", "text_pair": f"hypothesis {i}", "label": ("yes", "no")[i % 2]}
            for i in range(start, start + n)]


def test_a_text_pair_on_later_rows_makes_a_pair_task_not_a_single_text_one(tmp_path):
    # The first row lacks the pair: it must not decide the task is single-text.
    path = _jsonl(tmp_path / "d.jsonl", [{"text": "no pair", "label": "yes"}] + _pair_rows(20))
    message = _error({"path": str(path)})
    assert "line 1: no 'text_pair'" in message and "line 2 has one" in message
    assert "on every row of a pair task" in message


def test_a_row_without_its_pair_is_refused_at_its_line(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", _pair_rows(5) + [{"text": "no pair", "label": "yes"}] + _pair_rows(5))
    assert "line 6: no 'text_pair'" in _error({"path": str(path)})


def test_a_pair_in_the_validation_file_only_is_refused_at_the_train_header(tmp_path):
    train = _csv(tmp_path / "train.csv", _many(20))
    validation = _csv(tmp_path / "dev.csv", ["p,h,pos", "q,i,neg"], header="text,text_pair,label")
    message = _error({"path": str(train), "validation": str(validation)})
    assert f"{train}: line 1 (the header): no 'text_pair'" in message and str(validation) in message


def test_labels_in_either_unicode_normal_form_are_one_label(tmp_path):
    # A test file saved decomposed (e + U+0301) was refused: 'café' "never occurs in train".
    train = _csv(tmp_path / "train.csv", _many(10, labels=("caf\u00e9", "th\u00e9")))
    test = _csv(tmp_path / "test.csv", ["a,cafe\u0301", "b,the\u0301"])
    task = file_task({"path": str(train), "test": str(test)})
    assert task.label_names == ("caf\u00e9", "th\u00e9") and sorted(task.split("test").labels) == [0, 1]


def test_labels_that_differ_only_in_case_or_spacing_are_warned_about(tmp_path, capsys, warnings_anew):
    path = _csv(tmp_path / "d.csv", _many(30, labels=("Pos", "pos", "very  good", "Very good", "neg")))
    assert file_task({"path": str(path)}).label_names == ("Pos", "Very good", "neg", "pos", "very  good")
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {path}: the labels {a!r} and {b!r} differ only in case or spacing, so they train as 2 classes; "
        "expected one spelling per label" for a, b in (("Pos", "pos"), ("Very good", "very  good"))]


def test_integer_labels_are_in_numeric_order(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"text": f"s {i}", "label": i % 12 - 1} for i in range(240)])
    task = load_task({"path": str(path)})
    assert task.label_names == tuple(str(n) for n in range(-1, 11))
    for split in task.splits.values():      # each text keeps its own label under the new order
        assert all(task.label_names[y] == str(int(t[2:]) % 12 - 1) for t, y in zip(split.texts, split.labels))


@pytest.mark.parametrize("labels,expected", [
    (("10", "9", "a"), ("10", "9", "a")),       # one label not an integer: string order for all
    (("10", "2", "1.5"), ("1.5", "10", "2")),
    (("1_0", "2", "3"), ("1_0", "2", "3")),      # int() would read "1_0" as 10
    (("b", "a", "c"), ("a", "b", "c")),
])
def test_labels_not_all_integers_keep_string_order(tmp_path, labels, expected):
    path = _csv(tmp_path / "d.csv", [f"s {i},{labels[i % 3]}" for i in range(60)])
    assert load_task({"path": str(path)}).label_names == expected


def test_spec_key_fills_in_the_defaults():
    from pretrain.data.files import spec_key
    bare = spec_key({"path": "/d/x.csv"})
    assert bare == spec_key({"path": "/d/x.csv", "text": "text", "label": "label", "text_pair": "text_pair",
                             "split": (0.8, 0.1, 0.1), "test": None})
    assert bare != spec_key({"path": "/d/x.csv", "label": "gold"})
    assert spec_key({"path": "/d/x.csv", "split": "half"})["split"] == "half"     # refused on load, kept


def test_a_bare_file_path_is_a_task_with_the_default_columns(tmp_path):
    path = _csv(tmp_path / "reviews.csv", _many(40))
    task = load_task(str(path))
    assert task.label_names == ("neg", "pos") and task.spec == {"path": str(path.resolve())}


def test_an_unknown_task_name_says_a_data_file_is_welcome():
    with pytest.raises(UserError, match=r"unknown task 'x.txt'; expected one of .* or a data file \(.csv"):
        load_task("x.txt")
