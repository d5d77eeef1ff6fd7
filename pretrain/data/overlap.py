"""Held-out examples whose text the train split also holds: a model scored on them is scored
on texts it may have trained on, so validation and test accuracy run high.

The splits are never changed here (every recorded accuracy rests on them); the examples are
only counted, so a report and the commands that score can say so. Texts are compared exactly,
as the task holds them (files.py reads them as written); for a pair task, the pair.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pretrain.data import Split, TaskData


@dataclass(frozen=True)
class TrainOverlap:
    """How many of a split's examples have a text (text pair) that train also holds."""

    examples: int       # the split's examples looked at (those scored)
    in_train: int       # of them, with a text some train example has
    other_label: int    # of those, labelled as no train example with that text is

    def as_dict(self) -> dict:
        return asdict(self)


def texts_in_train(task: TaskData, split: str, limit: int | None = None) -> TrainOverlap:
    """The first `limit` examples of `split` (all of it: None), as they are scored, against
    the whole train split: one pass over each, a set of train texts and one of (text, label)."""
    train = task.split("train")
    seen = set(example_keys(train))
    labelled = set(zip(example_keys(train), train.labels))
    part = task.split(split).head(limit)
    shared = [(key, label) for key, label in zip(example_keys(part), part.labels) if key in seen]
    return TrainOverlap(len(part), len(shared), sum((key, label) not in labelled for key, label in shared))


def example_keys(split: Split) -> list:
    """What makes two examples the same text: the text, or for a pair task the pair."""
    return split.texts if split.text_pairs is None else list(zip(split.texts, split.text_pairs))


def overlap_warning(split: str, overlap: dict, pair_task: bool) -> str | None:
    """One line (no `warning: ` prefix) for held-out examples that train also holds, from a
    TrainOverlap's dict (as report.json records it); None when there are none."""
    if not overlap["in_train"]:
        return None
    text = "text pair" if pair_task else "text"
    return (f"{overlap['in_train']:,} of the {overlap['examples']:,} {split} examples scored have a {text} "
            f"that the train split also holds, {overlap['other_label']:,} of them under another label there: "
            f"the {split} accuracy counts {text}s the model may have trained on (in a data file: drop the "
            "repeated rows)")


def scored_overlap(task: TaskData, split: str, limit: int | None = None) -> dict:
    """What a command that scores the first `limit` examples of `split` records beside its
    metrics: `texts_in_train` ({split: the counts}) and, when there are any, `warnings` (the
    line, for the command to print)."""
    overlap = texts_in_train(task, split, limit).as_dict()
    line = overlap_warning(split, overlap, task.is_pair_task)
    return {"texts_in_train": {split: overlap}, **({"warnings": [line]} if line is not None else {})}
