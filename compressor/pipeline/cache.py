"""The stage cache: a stage's dir is reused while its content key is unchanged.

A key hashes what a stage's output depends on: its input's key (or, for the teacher, the
content of its model dir and task data), its config (the fields that differ from their
defaults), the content of the files and dirs the config names, and the tool's version. The
test-sample limit is not in a model stage's key: it changes what is measured, not the weights
(a stage measured with another limit is re-scored, not rebuilt); exports and the benchmark
hold it in theirs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Callable, Iterator, Literal, get_args, get_origin

from compressor import __version__
from compressor.pipeline.outdir import WriteError, disk_errors, read_json
from compressor.pipeline.recipe import BASELINES_DIR, PREFIXES_DIR, STAGE_FILE
from pretrain.atomic import atomic_dir, write_json
from pretrain.data import TaskData
from pretrain.errors import UserError

BUILD_SECONDS = "build_seconds"   # in stage.json: how long the stage took to build, over all its attempts
BUILD_ATTEMPTS = "build_attempts"  # in stage.json when a build resumed stopped ones: how many builds in all
BUILD_PARTIAL = "build_seconds_partial"   # in stage.json: true when a killed attempt's time is not in it
FILES = "files"                   # in stage.json: what the stage wrote beside it (`stage_record`)

# One line per stage, reused or built, and the benchmark's and search's progress (INFO);
# `compressor run` and `search` show them on stderr unless --quiet.
log = logging.getLogger("compressor.pipeline")


def cached(path: Path, key: str, write: Callable[[Path], dict], force: bool = False,
           attempts: Path | None = None) -> dict:
    """The record of the stage at `path` if its key matches (and not `force`); else build it atomically.

    `write(tmp_dir)` fills a temporary dir and returns the record, which is saved as
    stage.json beside what it wrote (with the names of what it wrote, and `build_seconds`,
    which `compressor run --plan` shows); the dir then replaces `path` in one rename.
    `attempts`: for a stage whose rebuild resumes what a stopped build left (checkpoints, kept
    prefixes), the file where each build notes its time until the stage is written, so
    `build_seconds` covers them all (`build_time`).
    """
    record = stage_record(path)
    name = stage_label(path)
    if record.get("key") == key and not force:
        log.info("stage %s: cached", name)
        return record
    log.info("stage %s: building", name)
    with disk_errors(path.parent), build_clock(attempts) as timing, atomic_dir(path) as tmp:
        record = {"key": key, **write(tmp)}
        record[FILES] = sorted(entry.name for entry in tmp.iterdir())
        record.update(timing())
        write_json(tmp / STAGE_FILE, record)
    log.info("stage %s: built in %.1f s", name, record[BUILD_SECONDS])
    return record


@contextlib.contextmanager
def build_clock(attempts: Path | None) -> Iterator[Callable[[], dict]]:
    """Time one build; yields a function giving the timing stage.json records (`build_time`).

    With an `attempts` file, the earlier builds' seconds come from it, and this build adds its
    own there if it stops (Ctrl-C, SIGTERM, a failure the same rerun gets past). A build killed
    outright (SIGKILL, a lost machine) cannot: its entry stays null, which marks the total as
    partial. Bad input forgets the build: the corrected recipe is another key.
    """
    earlier = read_json(attempts).get("seconds", []) if attempts else []
    if attempts:
        write_json(attempts, {"seconds": [*earlier, None]})
    start = time.perf_counter()
    try:
        yield lambda: build_time(earlier, time.perf_counter() - start)
    except BaseException as err:
        if attempts:
            with contextlib.suppress(OSError):   # the build's own error is the one to show
                note_stopped_build(attempts, earlier, time.perf_counter() - start, err)
        raise
    if attempts:
        attempts.unlink(missing_ok=True)


def note_stopped_build(attempts: Path, earlier: list[float | None], seconds: float, err: BaseException) -> None:
    """Add a stopped build's seconds to `attempts`; after bad input (a UserError other than a
    refused write) leave the file as it was, or remove it, and its dir if that is left empty."""
    if isinstance(err, WriteError) or not isinstance(err, UserError):
        write_json(attempts, {"seconds": [*earlier, round(seconds, 1)]})
    elif earlier:
        write_json(attempts, {"seconds": earlier})
    else:
        attempts.unlink(missing_ok=True)
        attempts.parent.rmdir()   # made for it (raises OSError, suppressed, if it holds more)


def build_time(earlier: list[float | None], seconds: float) -> dict:
    """`build_seconds`: this build's seconds plus those of the stopped builds it resumed;
    `build_attempts` when there were such builds, and `build_seconds_partial` when one of
    them was killed before it could note its time (the total leaves that time out)."""
    record: dict = {BUILD_SECONDS: round(sum(s for s in earlier if s is not None) + seconds, 1)}
    if earlier:
        record[BUILD_ATTEMPTS] = len(earlier) + 1
    if None in earlier:
        record[BUILD_PARTIAL] = True
    return record


def stage_record(path: Path) -> dict:
    """The stage.json of the stage at `path`, or {} when a file it lists is gone (deleted by
    hand, or in part by a stopped deletion of an older version): such a stage is built again,
    not reused to crash on what it lacks. A record that lists none (older) is trusted."""
    record = read_json(path / STAGE_FILE)
    return record if all((path / name).exists() for name in record.get(FILES, ())) else {}


def stage_label(path: Path) -> str:
    """How a stage dir is named in the log: its name, under its group where it has one."""
    return f"{path.parent.name}/{path.name}" if path.parent.name in (BASELINES_DIR, PREFIXES_DIR) else path.name


def key_fields(config) -> dict:
    """A config as it enters a cache key: the fields that differ from their defaults.

    Config schemas only ever gain fields, with defaults that keep the old behaviour; leaving
    defaults out keeps such an addition from invalidating every cached stage (a 20-minute
    teacher fine-tuning among them). A default that depends on other fields (a fine-tuning
    strategy's learning rate: `derived_defaults()`) is left out likewise when the config
    holds it, so `lr: 1e-4` written out and the full strategy's default give one key.
    """
    fields = config.model_dump(mode="json", exclude_defaults=True)
    derived = config.derived_defaults() if hasattr(config, "derived_defaults") else {}
    return {**type_tags(config), **{k: v for k, v in fields.items() if k not in derived or v != derived[k]}}


def type_tags(config) -> dict:
    """The fields that name a config's type (a one-value Literal, such as a quantize mode): kept
    though they hold their default, or every mode's config at its defaults would share one key."""
    return {name: getattr(config, name) for name, info in type(config).model_fields.items()
            if get_origin(info.annotation) is Literal and len(get_args(info.annotation)) == 1}


def content_key(parts: dict) -> str:
    payload = json.dumps({"code": code_version(), **parts}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def code_version() -> str:
    """The tool's version: part of every cache key.

    A release that changes what a stage computes bumps the version, which invalidates
    cached stages. (Hashing the source itself would throw away a 20-minute teacher
    fine-tuning for every unrelated edit.)
    """
    return __version__


# What a model dir's result depends on: configs and vocabularies (.json, .txt, SentencePiece's
# .model), weights (.safetensors, .bin, a torch-int8 export's .pt, ONNX graphs and their
# external data), word vectors (.npy) and shipped model code (.py).
FINGERPRINTED = (".json", ".safetensors", ".bin", ".txt", ".model", ".pt", ".onnx", ".data", ".npy", ".py")


def fingerprint(path: Path) -> str:
    """Content hash of a model dir's (or an embeddings dir's) config, vocabulary and weights."""
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()):
        # stage.json holds a stage's scores and key, not its weights: re-scoring is no new model
        if file.is_file() and file.suffix in FINGERPRINTED and file.name != STAGE_FILE:
            digest.update(file.name.encode())
            digest.update(file_digest(file).encode())
    return digest.hexdigest()[:20]


def fingerprint_file(path: Path) -> str:
    return fingerprint(path) if path.is_dir() else file_digest(path)


def file_digest(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:20]


def inputs_fingerprint(paths) -> dict[str, str]:
    """Content hash of each input file or model dir that exists (a built-in name has no file):
    what a resumed run must find unchanged, beside its settings."""
    return {str(path): fingerprint_file(Path(path)) for path in paths
            if path is not None and Path(path).exists()}


def task_fingerprint(task: TaskData) -> str:
    digest = hashlib.sha256(json.dumps([task.name, task.label_names], default=str).encode())
    for split_name in sorted(task.splits):
        split = task.splits[split_name]
        digest.update(json.dumps([split.texts, split.text_pairs, split.labels]).encode())
    return digest.hexdigest()[:20]
