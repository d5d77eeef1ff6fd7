"""Task data and corpora.

A task is labelled text split into train / validation / test. Built-in tasks come from
WordNet 3.0 (`wordnet.py`); user tasks come from CSV, TSV or JSONL files (`files.py`).
Everything downstream (fine-tuning, evaluation, passes) sees only `TaskData`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pretrain.errors import UserError

SPLITS = ("train", "validation", "test")
WHOLE = "all"       # every row of a task in one split, drawn from nothing (whole_task)


@dataclass(frozen=True)
class Split:
    """One split of a task: parallel lists, labels as indices into TaskData.label_names."""

    texts: list[str]
    labels: list[int]
    text_pairs: list[str] | None = None  # second sentence for pair tasks, else None

    def __len__(self) -> int:
        return len(self.texts)

    def head(self, n: int | None) -> "Split":
        """The first n examples (splits are already shuffled by a fixed seed)."""
        if n is not None and n < 1:
            raise UserError(f"sample limit must be a positive integer, got {n}")
        if n is None or n >= len(self):
            return self
        pairs = self.text_pairs[:n] if self.text_pairs is not None else None
        return Split(self.texts[:n], self.labels[:n], pairs)

    def tail(self, n: int) -> "Split":
        """The last n examples: held out from anything that trains on a head of the split."""
        if n < 1:
            raise UserError(f"sample limit must be a positive integer, got {n}")
        if n >= len(self):
            return self
        pairs = self.text_pairs[-n:] if self.text_pairs is not None else None
        return Split(self.texts[-n:], self.labels[-n:], pairs)


@dataclass(frozen=True)
class TaskData:
    name: str                       # "wordnet-supersense", or the user file's name
    label_names: tuple[str, ...]    # index -> label string
    splits: dict[str, Split] = field(repr=False)
    spec: Any = None                # what load_task was called with, JSON-serialisable

    @property
    def is_pair_task(self) -> bool:
        return next(iter(self.splits.values())).text_pairs is not None     # a whole task has no train

    def split(self, name: str) -> Split:
        if name not in self.splits:
            raise UserError(f"unknown split {name!r}; expected one of {', '.join(self.splits)}")
        return self.splits[name]


BUILTIN_TASKS = ("wordnet-supersense", "wordnet-wsd")
BUILTIN_CORPORA = ("wordnet",)


def load_task(spec: str | dict, *, seed: int = 0, wordnet_dir: str | None = None,
              scored: str | None = None) -> TaskData:
    """Load a built-in task by name, or a user file task from a dict spec (or a bare file path).

    A dict spec: {path, text, label, text_pair?, validation?, test?, split?} where
    validation/test name explicit split files and split = [train, validation, test]
    fractions (default [0.8, 0.1, 0.1]) applied with a seeded shuffle. `scored`: the held-out
    split whose examples with a train text the caller reports itself (overlap.scored_overlap),
    which a file task's load-time warning of duplicate rows then leaves out (files.py).
    """
    from pretrain.data.files import file_spec, file_task
    spec = file_spec(spec)          # a bare data file, as the CLI's --task takes it
    if isinstance(spec, str):
        if spec == "wordnet-supersense":
            from pretrain.data.wordnet import supersense_task
            return supersense_task(seed=seed, wordnet_dir=wordnet_dir)
        if spec == "wordnet-wsd":
            from pretrain.data.wordnet import wsd_task
            return wsd_task(seed=seed, wordnet_dir=wordnet_dir)
        raise UserError(
            f"unknown task {spec!r}; expected one of {', '.join(BUILTIN_TASKS)} "
            "or a data file (.csv, .tsv, .jsonl, .json) or spec {path, text, label}")
    if isinstance(spec, dict):
        return file_task(absolute_paths(spec), seed=seed, scored=scored)
    raise UserError(f"task must be a name or a mapping {{path, text, label}}, got {type(spec).__name__}")


def whole_task(spec: str | dict, *, wordnet_dir: str | None = None) -> TaskData:
    """Every row of a task as its one split, WHOLE: for data files, their rows as written (no
    shuffle, no split, so no split needs rows of its own); for a built-in task, its three
    splits together."""
    from pretrain.data.files import file_spec, whole_file_task
    spec = file_spec(spec)
    if isinstance(spec, dict):
        return whole_file_task(absolute_paths(spec))
    task = load_task(spec, wordnet_dir=wordnet_dir)
    parts = [task.split(name) for name in SPLITS]
    pairs = None if parts[0].text_pairs is None else [p for part in parts for p in part.text_pairs]
    whole = Split([t for part in parts for t in part.texts], [label for part in parts for label in part.labels], pairs)
    return TaskData(task.name, task.label_names, {WHOLE: whole}, spec=task.spec)


TASK_FILE_KEYS = ("path", "validation", "test")   # the fields of a file task spec that name files


def absolute_paths(spec: dict) -> dict:
    """The spec is recorded with every model trained on it: make its file paths absolute."""
    return {k: str(Path(v).resolve()) if k in TASK_FILE_KEYS and isinstance(v, str) else v
            for k, v in spec.items()}


def task_files(spec: str | dict | None) -> list[str]:
    """The data files a task spec reads; none for a built-in task."""
    if not isinstance(spec, dict):
        return []
    return [v for k, v in spec.items() if k in TASK_FILE_KEYS and isinstance(v, str)]


def seeded_order(n: int, seed: int) -> list[int]:
    """A seeded permutation of range(n), identical across machines and Python versions.

    Only random.Random.random() has a documented stable sequence (shuffle and numpy's
    Generator may change between versions), so sort the indices by random() keys.
    """
    rng = random.Random(seed)
    keys = [rng.random() for _ in range(n)]
    return sorted(range(n), key=keys.__getitem__)


def split_counts(n: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    """Sizes of train / validation / test for n items; rounding leftovers go to train."""
    # The epsilon keeps 0.1 * 10 == 1 when float error gives 0.9999999.
    n_val = int(n * fractions[1] + 1e-9)
    n_test = int(n * fractions[2] + 1e-9)
    return n - n_val - n_test, n_val, n_test


def load_corpus(name_or_path: str, *, wordnet_dir: str | None = None) -> Iterator[list[str]]:
    """Documents (lists of non-blank lines) of a built-in corpus or a plain text file.

    In a text file, blank lines separate documents. The file is streamed, not read whole.
    """
    if name_or_path == "wordnet":
        from pretrain.data.wordnet import corpus_documents
        return corpus_documents(wordnet_dir=wordnet_dir)
    path = Path(name_or_path)
    if not path.is_file():
        raise UserError(
            f"unknown corpus {name_or_path!r}: not a built-in corpus "
            f"({', '.join(BUILTIN_CORPORA)}) and no such file")
    # Checked above, before the generator starts, so a bad name fails at the call.
    return _text_file_documents(path)


def check_utf8(path: Path, chunk: int = 1 << 20) -> None:
    """Refuse (UserError, naming the line) a corpus file with a byte that is not UTF-8, by
    reading it through once: a stream reaches such a byte only when training gets there, after
    its checkpoints are written (or never, in a short run)."""
    import codecs
    decoder, lines = codecs.getincrementaldecoder("utf-8")(), 0
    with path.open("rb") as f:
        while block := f.read(chunk):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                line = lines + block[:max(e.start, 0)].count(b"\n") + 1
                raise UserError(f"{path}: line {line}: corpus file is not UTF-8 text ({e.reason}); "
                                "save it as UTF-8") from None
            lines += block.count(b"\n")
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: ends inside a character: corpus file is not UTF-8 text ({e.reason})") from None


def _text_file_documents(path: Path) -> Iterator[list[str]]:
    doc: list[str] = []
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\r\n")
                if line.strip():
                    doc.append(line)
                elif doc:
                    yield doc
                    doc = []
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: corpus file is not UTF-8 text ({e.reason})") from None
    if doc:
        yield doc
