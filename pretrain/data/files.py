"""User tasks from CSV, TSV or JSON-lines files.

Every problem with a user's file is a one-line UserError naming the file and, where it
helps, the line, the column or the label, so the user can fix the file without a traceback.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
import os
import re
import sys
import unicodedata
from pathlib import Path

from pretrain.data import SPLITS, WHOLE, Split, TaskData, seeded_order, split_counts
from pretrain.errors import UserError

ALLOWED_KEYS = ("path", "text", "label", "text_pair", "validation", "test", "split")
PAIR_COLUMN = "text_pair"
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)
EXTENSIONS = (".csv", ".tsv", ".jsonl", ".json")
INTEGER = re.compile(r"[+-]?[0-9]+")       # ASCII digits: int() would also take "1_0" and "١"

Row = tuple[str, str, str | None]   # (text, label, text_pair)


def file_spec(value: str | dict) -> str | dict:
    """A data file named bare (`data/x.jsonl`) as the spec `{path: data/x.jsonl}`, with the
    default columns; a built-in task name, or a spec that is already a mapping, is kept."""
    if isinstance(value, str) and Path(value).suffix.lower() in EXTENSIONS:
        return {"path": value}
    return value


def file_task(spec: dict, seed: int = 0, scored: str | None = None) -> TaskData:
    """A TaskData from {path, text?, label?, text_pair?, validation?, test?, split?}; `scored`:
    see `shared_rows_warning`."""
    _check_keys(spec)
    fractions = _fractions(spec.get("split"))
    train_path = Path(spec["path"])
    rows, has_pair = _read_files(spec)
    _split_missing(rows, fractions, seed, train_path)
    label_names = _label_order({label for _, label, _ in rows["train"]})
    if len(label_names) < 2:
        raise UserError(f"{train_path}: the train split has one label only ({label_names[0]!r}); "
                        "a classifier needs at least 2")
    for group in lookalike_labels(label_names):
        line = (f"warning: {train_path}: the labels {' and '.join(map(repr, group))} differ only in case or "
                f"spacing, so they train as {len(group)} classes; expected one spelling per label")
        _warn_once(line, line)
    for name in ("validation", "test"):
        _check_labels_seen(rows[name], label_names, name, spec.get(name), train_path)
    index = {label: i for i, label in enumerate(label_names)}
    splits = {name: _to_split(rows[name], index, has_pair, seed + i)
              for i, name in enumerate(SPLITS)}
    line = shared_rows_warning(spec, rows, has_pair, scored)
    if line is not None:
        _warn_once(json.dumps(spec_key(spec), sort_keys=True, default=str), line)
    return TaskData(train_path.stem, label_names, splits, spec=spec)


def shared_rows_warning(spec: dict, rows: dict[str, list[Row]], has_pair: bool, scored: str | None) -> str | None:
    """The load-time line for texts (text pairs) that more than one split holds; None when
    there are none. `scored` is a held-out split whose examples with a train text the loading
    command reports itself, with counts (pretrain/data/overlap.py): the texts that only train
    and it hold are left to that line, so no command says the same overlap twice."""
    left_to_scored = frozenset(("train", scored)) if scored is not None else frozenset()
    shared, in_splits = shared_texts(rows, has_pair, left_to_scored)
    if not shared:
        return None
    # the files the repeated rows are in: a split drawn from the train file is in that one
    files = list(dict.fromkeys(str(spec.get(name) or spec["path"]) for name in SPLITS if name in in_splits))
    where = files[0] if len(files) == 1 else f"across {', '.join(files)}"
    text = "text pair" if has_pair else "text"
    if scored is None:
        return (f"warning: {where}: {shared} {text}(s) occur in more than one of the train, validation and test "
                "splits (duplicate rows), so validation and test accuracy count examples seen in training; "
                "expected each once (drop the duplicate rows)")
    # What is left holds the other held-out split: a text in two splits, not only train and `scored`.
    other = next(name for name in ("validation", "test") if name != scored)
    return (f"warning: {where}: {shared} {other} {text}(s) also occur in the train or {scored} split "
            "(duplicate rows); expected each once (drop the duplicate rows)")


def shared_texts(rows: dict[str, list[Row]], has_pair: bool,
                 left_out: frozenset[str] = frozenset()) -> tuple[int, set[str]]:
    """How many distinct texts (text pairs for a pair task) more than one split holds, and
    the splits that hold them; a text that the `left_out` splits alone hold is not counted."""
    seen_in: dict[tuple, set[str]] = {}
    for name, split_rows in rows.items():
        for text, _, pair in split_rows:
            seen_in.setdefault((text, pair) if has_pair else (text,), set()).add(name)
    shared = [splits for splits in seen_in.values() if len(splits) > 1 and not splits <= left_out]
    return len(shared), set().union(*shared)


def lookalike_labels(label_names: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Labels that differ only in case or spacing ('Pos', 'pos', 'pos '): almost always one
    label spelt two ways in a user's file, silently split into classes the model must tell apart."""
    groups: dict[str, list[str]] = {}
    for label in label_names:
        groups.setdefault(" ".join(label.casefold().split()), []).append(label)
    return [tuple(group) for group in groups.values() if len(group) > 1]


# The keys of the load-time lines this process has printed.
_WARNED: set[str] = set()


def _warn_once(key: str, line: str) -> None:
    """A task is loaded more than once by one command (a run, then its search; a search, then
    its finals' recipe): the first load's line for `key` is printed, and no other, for the
    first load is the command's own and knows what the command scores (`scored`). Under
    torchrun every process loads it, and rank 0 speaks for them all."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)


def whole_file_task(spec: dict) -> TaskData:
    """Every row of a file task's files (train's, then validation's and test's where named) as
    one split, WHOLE, in file order: nothing is drawn or held out, so a model is scored on all
    of a held-out file (`compressor evaluate --split all`). Its labels are those its rows hold:
    a held-out file may lack some of a model's, and one label is a file, not a task to train."""
    _check_keys(spec)
    _fractions(spec.get("split"))       # unused here, but a bad value is as wrong as in file_task
    rows, has_pair = _read_files(spec)
    every = [row for file_rows in rows.values() for row in file_rows]
    label_names = _label_order({label for _, label, _ in every})
    index = {label: i for i, label in enumerate(label_names)}
    pairs = [pair for _, _, pair in every] if has_pair else None
    split = Split([text for text, _, _ in every], [index[label] for _, label, _ in every], pairs)
    return TaskData(Path(spec["path"]).stem, label_names, {WHOLE: split}, spec=spec)


def _read_files(spec: dict) -> tuple[dict[str, list[Row]], bool]:
    """The validated rows of each file a spec names (train's, validation's and test's, by
    split), and whether they are text pairs."""
    files = {"train": Path(spec["path"])} | {name: Path(spec[name]) for name in ("validation", "test")
                                             if spec.get(name) is not None}
    records = {name: _read_records(path) for name, path in files.items()}
    pair = spec.get("text_pair") or _unnamed_pair_column(records, files)
    columns = (spec.get("text", "text"), spec.get("label", "label"), pair)
    return {name: _rows(records[name], columns, path) for name, path in files.items()}, pair is not None


def spec_key(spec: dict) -> dict:
    """The spec with its defaults filled in, to compare two specs: `{path: x.csv}` and
    `{path: x.csv, text: text, label: label, split: [0.8, 0.1, 0.1]}` load the same task.

    Paths are left as given (compare absolute ones); a value this module would refuse is kept
    as it is, so such a spec equals only itself.
    """
    key = {k: v for k, v in spec.items() if v is not None}
    key.setdefault("text", "text")
    key.setdefault("label", "label")
    if key.get("text_pair") == PAIR_COLUMN:     # named or not, a text_pair column is read as the pair
        del key["text_pair"]
    split = key.get("split", DEFAULT_FRACTIONS)
    if isinstance(split, (list, tuple)) and all(isinstance(f, (int, float)) for f in split):
        key["split"] = [round(float(f), 9) for f in split]
    return key


def _unnamed_pair_column(records: dict[str, list], files: dict[str, Path]) -> str | None:
    """`text_pair` where any row of any file has one (the README's file layout), else None.

    Any row, not the first: a first row without a pair would otherwise load a pair task as
    single texts, silently. Once one row has a pair, every row must have one.
    """
    having = next(((path, line) for name, path in files.items()
                   for line, record in records[name] if PAIR_COLUMN in record), None)
    if having is None:
        return None
    for name, path in files.items():
        for line, record in records[name]:
            if PAIR_COLUMN not in record:
                where = "line 1 (the header)" if path.suffix.lower() in (".csv", ".tsv") else f"line {line}"
                raise UserError(f"{path}: {where}: no {PAIR_COLUMN!r}, while {having[0]} line {having[1]} "
                                f"has one; expected a {PAIR_COLUMN!r} on every row of a pair task (or on none)")
    return PAIR_COLUMN


def _label_order(labels: set[str]) -> tuple[str, ...]:
    """Labels that are all integers in numeric order (2 before 10), any others as strings sort."""
    if all(INTEGER.fullmatch(label) for label in labels):
        # "1" and "01" are two labels of one number: the string breaks the tie, stably.
        return tuple(sorted(labels, key=lambda label: (int(label), label)))
    return tuple(sorted(labels))


def _check_keys(spec: dict) -> None:
    unknown = sorted(str(k) for k in spec if k not in ALLOWED_KEYS)
    if unknown:
        raise UserError(f"unknown data spec key(s) {', '.join(unknown)}; "
                        f"allowed keys: {', '.join(ALLOWED_KEYS)}{_nearest_keys(unknown)}")
    if not spec.get("path"):
        raise UserError(f"data spec needs a 'path' to a {'/'.join(EXTENSIONS)} file")


def _nearest_keys(unknown: list[str]) -> str:
    """`; did you mean 'split'?` for a misspelt key (`splt`), as a recipe's fields get."""
    close = {key: difflib.get_close_matches(key, ALLOWED_KEYS, n=1) for key in unknown}
    close = {key: match[0] for key, match in close.items() if match}
    if not close:
        return ""
    if len(unknown) == 1:
        return f"; did you mean {next(iter(close.values()))!r}?"
    return "; did you mean " + ", ".join(f"{match!r} for {key!r}" for key, match in close.items()) + "?"


def _fractions(value) -> tuple[float, float, float]:
    if value is None:
        return DEFAULT_FRACTIONS
    if (not isinstance(value, (list, tuple)) or len(value) != 3
            or not all(isinstance(f, (int, float)) and 0 <= f <= 1 for f in value)):
        raise UserError(f"split must be three fractions [train, validation, test] "
                        f"between 0 and 1, got {value!r}")
    if not math.isclose(sum(value), 1.0, abs_tol=1e-6):
        raise UserError(f"split fractions {list(value)} sum to {sum(value):g}; they must sum to 1")
    return tuple(float(f) for f in value)


def _split_missing(rows: dict, fractions: tuple[float, float, float], seed: int, path: Path) -> None:
    """Carve the splits that have no file of their own out of train (in place)."""
    missing = [name for name in SPLITS[1:] if name not in rows]
    if missing:
        # Keep only the fractions of the splits being carved out, renormalised.
        kept = {name: f for name, f in zip(SPLITS, fractions) if name == "train" or name in missing}
        total = sum(kept.values())
        wanted = tuple(kept.get(name, 0.0) / total if total else 0.0 for name in SPLITS)
        train = rows["train"]
        order = seeded_order(len(train), seed)
        n_train, n_val, _ = split_counts(len(train), wanted)
        shuffled = [train[i] for i in order]
        parts = dict(zip(SPLITS, (shuffled[:n_train], shuffled[n_train:n_train + n_val],
                                  shuffled[n_train + n_val:])))
        rows["train"] = parts["train"]
        for name in missing:
            rows[name] = parts[name]
    for name in SPLITS:
        if not rows[name]:
            raise UserError(f"{path}: the {name} split is empty ({sum(map(len, rows.values()))} "
                            f"rows, split fractions {list(fractions)}); add rows or change split")


def _check_labels_seen(rows: list, label_names: tuple[str, ...], split: str, own_file: str | None,
                       train_path: Path) -> None:
    """Refuse labels of a split that train never has: a model could not predict them. The
    remedy differs: a split of its own file must use train's labels, a carved one needs rows."""
    known = set(label_names)
    unseen = sorted({label for _, label, _ in rows if label not in known})
    if unseen:
        expected = (f"expected only labels that {train_path} holds ({_listed(label_names)})" if own_file else
                    "expected rows enough of each label for every split (or files of their own for validation "
                    "and test)")
        raise UserError(f"{own_file or train_path}: label(s) {_listed(tuple(unseen), 3)} in the {split} split "
                        f"never occur in train; {expected}{_scores_hint(label_names + tuple(unseen))}")


def _scores_hint(labels: tuple[str, ...]) -> str:
    """Real-valued labels (an STS-B-like similarity score) are each a class here, so held-out
    rows hold values train lacks: say why, rather than only asking for more rows."""
    def real(label: str) -> bool:
        try:
            return math.isfinite(float(label))
        except ValueError:
            return False
    if all(map(real, labels)) and not all(INTEGER.fullmatch(label) for label in labels):
        return ("; the labels look like real-valued scores (regression): each value is a class here, "
                "so bin them into a few classes first")
    return ""


def _listed(labels: tuple[str, ...], shown: int = 5) -> str:
    more = f" and {len(labels) - shown} more" if len(labels) > shown else ""
    return ", ".join(repr(label) for label in labels[:shown]) + more


def _to_split(rows: list, index: dict[str, int], has_pair: bool, seed: int) -> Split:
    # Split.head(n) must take a random sample, so every split is shuffled (seeded).
    rows = [rows[i] for i in seeded_order(len(rows), seed)]
    pairs = [pair for _, _, pair in rows] if has_pair else None
    return Split([text for text, _, _ in rows], [index[label] for _, label, _ in rows], pairs)


def _rows(records: list[tuple[int, dict]], columns: tuple, path: Path) -> list[Row]:
    """(text, label, text_pair) for every data row of a file, validated."""
    return [_row(record, line, columns, path) for line, record in records]


def _read_records(path: Path) -> list[tuple[int, dict]]:
    """(line, {column: value}) for every data row of a file; at least one."""
    suffix = path.suffix.lower()
    if suffix not in EXTENSIONS:
        raise UserError(f"{path}: unsupported file type {suffix or '(none)'!r}; "
                        f"use one of {', '.join(EXTENSIONS)} (.json means JSON lines)")
    if path.is_dir():
        raise UserError(f"{path}: a directory; expected a data file ({', '.join(EXTENSIONS)})")
    if not path.is_file():
        raise UserError(f"{path}: data file not found")
    raw = path.read_bytes()
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise UserError(f"{path}: line {line}: not UTF-8 text (undecodable byte at offset {e.start}); "
                        "save the file as UTF-8") from None
    records = _json_records(content, path) if suffix in (".jsonl", ".json") else \
        _table_records(content, path, "\t" if suffix == ".tsv" else ",")
    if not records:
        raise UserError(f"{path}: empty file (no data rows)")
    return records


def _table_records(content: str, path: Path, delimiter: str) -> list[tuple[int, dict]]:
    # TSV is read without quote handling (as GLUE-style files are written): with it, one stray
    # '"' at the start of a text would silently swallow the lines after it.
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    csv.field_size_limit(sys.maxsize)      # a long text is a valid row (encoding truncates it)
    # strict: a quote left open runs on to the next quote character anywhere below; without it
    # the csv module glues what follows that quote on and reads the swallowed rows as one text.
    reader = csv.DictReader(io.StringIO(content, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    header = reader.fieldnames or []
    if content.strip() and not any(name.strip() for name in header):
        raise UserError(f"{path}: line 1: an empty header; expected the column names (text, label, ...) "
                        "on the first line")
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise UserError(f"{path}: line 1: column(s) {', '.join(map(repr, twice))} named twice in the header; "
                        "expected each column once")
    records, start = [], 2
    try:
        for record in reader:
            # A row is reported at its first line: an unclosed quote makes it run on.
            records.append((start, record))
            if None in record:          # more fields than the header names: a separator inside a text
                raise UserError(f"{path}: line {start}: {len(header) + len(record[None])} fields, expected "
                                f"{len(header)} ({', '.join(header)}); {SEPARATOR_HINT[delimiter]}")
            start = reader.line_num + 1
    except csv.Error as e:
        raise UserError(f"{path}: line {start}: malformed {delimiter!r}-separated row ({e}){QUOTING_HINT[delimiter]}") \
            from None
    return records


QUOTING_HINT = {",": '; a quoted text ends with a quote before the separator, and a quote inside it is written '
                     'twice ("said ""hi""")', "\t": ""}
SEPARATOR_HINT = {",": "quote a text that holds a comma (\"like, this\")",
                  "\t": "a TSV is read without quoting (GLUE's layout), so a text may not hold a tab"}


def _json_records(content: str, path: Path) -> list[tuple[int, dict]]:
    records = []
    # Lines end at \n only: str.splitlines would also break at U+2028 or U+0085 inside a string.
    for line_number, line in enumerate(content.split("\n"), start=1):
        if not line.strip():
            continue
        # A file that opens with '[' is one JSON array (a common .json), not JSON lines.
        array = "; the file is one JSON array: write one object per line (JSON lines)" \
            if not records and line.lstrip().startswith("[") else ""
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: line {line_number}: malformed JSON ({e.msg}); "
                            f"expected one JSON object per line{array}") from None
        if not isinstance(record, dict):
            raise UserError(f"{path}: line {line_number}: expected a JSON object, "
                            f"got {type(record).__name__}{array}")
        records.append((line_number, record))
    return records


def _row(record: dict, line: int, columns: tuple, path: Path) -> Row:
    text_col, label_col, pair_col = columns
    text = _field(record, text_col, line, path)
    # NFC: a label typed as 'é' and one decomposed as 'e' + U+0301 (as some tools save text)
    # look the same and must be one label, not two that an error could only name identically.
    label = unicodedata.normalize("NFC", _field(record, label_col, line, path).strip())
    pair = _field(record, pair_col, line, path) if pair_col is not None else None
    return text, label, pair


def _field(record: dict, column: str, line: int, path: Path) -> str:
    if column not in record:
        found = ", ".join(repr(k) for k in record if k is not None)
        # A one-column header holding tabs: a tab-separated file under a .csv name.
        hint = "; the header holds tabs: name a tab-separated file .tsv" \
            if path.suffix.lower() == ".csv" and any("\t" in str(k) for k in record) else ""
        # --task takes the default names only (a GLUE file's is 'sentence'): say where others go.
        if not hint and column in ("text", "label", PAIR_COLUMN):
            hint = "; a recipe's task spec names other columns ({path: FILE, text: COLUMN, label: COLUMN})"
        # A csv/tsv row has every header column: one missing is missing from the header.
        where = "line 1 (the header)" if path.suffix.lower() in (".csv", ".tsv") else f"line {line}"
        raise UserError(f"{path}: {where}: no column {column!r}; columns found: {found}{hint}")
    value = record[column]
    # JSON numbers and booleans are fine as labels; csv gives None for a short row. 1 and 1.0
    # are one number in JSON, so one label ("1").
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{path}: line {line}: column {column!r} is {value}; expected a value (a missing one "
                        "is no example)")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (int, float)):
        value = str(value)
    if value is not None and not isinstance(value, str):
        raise UserError(f"{path}: line {line}: column {column!r} must be a string, "
                        f"got {type(value).__name__}")
    if value is None or not value.strip():
        quoted = path.suffix.lower() == ".tsv" and any(str(v).startswith('"') for v in record.values() if v)
        hint = "; a TSV is read without quoting (GLUE's layout): write it unquoted, or as .csv" if quoted else ""
        raise UserError(f"{path}: line {line}: empty {column!r}{hint}")
    return value
