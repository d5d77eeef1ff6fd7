"""Resumable commands: a run that writes `out` keeps its checkpoint in the sibling
`<out>.checkpoint/` until the output is written, and continues from it only when asked
(`--resume`) and only with the settings that wrote it.

Both long commands use it: `compressor pretrain` and `compressor finetune`. The loop itself
(pretrain/train.py) saves and restores the training state; this module decides whether a
checkpoint found on disk may be continued, before anything is loaded or trained.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

from pretrain import distributed
from pretrain.atomic import claimed_output, write_json
from pretrain.errors import UserError
from pretrain.train import CHECKPOINT_FILE


def checkpoint_dir(out: Path) -> Path:
    """Where the command writing `out` keeps its checkpoint."""
    out = Path(out)
    return out.with_name(out.name + ".checkpoint")


@contextlib.contextmanager
def claimed_checkpoint(out: Path, settings: dict, resume: bool, settings_file: str) -> Iterator[None]:
    """Claim `out` and its checkpoint dir for this command until it ends.

    `out` first, with the claim every command writing an --out takes (`claimed_output`): a
    finetune held only its checkpoint dir, so an export or a run into the same --out went on
    beside it, and the last to write replaced the other's output. Then the checkpoint:
    `check_resume`, the settings written there under a lock on the parent dir (claims there go
    one at a time), then a lock on the checkpoint dir itself, held to the end. Locks go with the
    process. Under torchrun the main process claims, and every process stops on its refusal
    (the others checking on their own raced its settings file)."""
    ckpt = checkpoint_dir(out)
    main = distributed.world().is_main
    with contextlib.ExitStack() as claims:
        refusal = None
        if main:
            try:
                claims.enter_context(claimed_output(out))
                claims.callback(os.close, claim(ckpt, settings, resume, settings_file))
            except UserError as err:
                refusal = str(err)
        refusal = distributed.from_main(refusal)
        if refusal is not None:
            raise UserError(refusal)
        try:
            yield
        except BaseException:
            # Stopped before its first checkpoint (bad input found late, an early Ctrl-C):
            # nothing to resume, so nothing left behind.
            if main and nothing_to_resume(ckpt, settings_file):
                shutil.rmtree(ckpt, ignore_errors=True)
            raise


def claim(ckpt: Path, settings: dict, resume: bool, settings_file: str) -> int:
    """The claim itself (see claimed_checkpoint); returns the descriptor holding the lock."""
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    with locked(ckpt.parent):
        if ckpt.is_dir():
            with locked(ckpt, wait=False, busy=f"{ckpt} is in use by another command writing the same output; "
                                               "wait for it to finish, or choose another --out"):
                pass
        check_resume(settings, ckpt, resume, settings_file)
        ckpt.mkdir(exist_ok=True)
        write_json(ckpt / settings_file, settings)
        held = os.open(ckpt, os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return held


@contextlib.contextmanager
def locked(directory: Path, wait: bool = True, busy: str = "") -> Iterator[None]:
    """An exclusive lock on a dir (flock on its descriptor); `wait=False` refuses with `busy`."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise UserError(busy) from None
        yield
    finally:
        os.close(fd)


def check_resume(settings: dict, ckpt: Path, resume: bool, settings_file: str) -> None:
    """A checkpoint is continued only on `resume` and only when `settings` (JSON-ready: what
    decides what the run computes) equal the ones it was written with; never silently
    restarted or mixed."""
    if nothing_to_resume(ckpt, settings_file):
        shutil.rmtree(ckpt)
    if not ckpt.exists():
        if resume:      # nothing to continue: say so, rather than look like a resumed run
            print(f"--resume: no checkpoint at {ckpt}; starting from the first step", file=sys.stderr)
        return
    if not resume:
        raise UserError(f"{ckpt} holds the checkpoint of an unfinished run: pass --resume to "
                        "continue it, or delete it to start over")
    try:
        saved = json.loads((ckpt / settings_file).read_text())
    except (OSError, ValueError):
        raise UserError(f"{ckpt} is not a checkpoint of this command (no readable {settings_file}); "
                        "delete it to start over") from None
    if saved != settings:
        changed = differing_fields(saved, settings)
        raise UserError(f"cannot resume from {ckpt}: it was written with other settings "
                        f"({', '.join(changed)} differ); expected the same command line")


def nothing_to_resume(ckpt: Path, settings_file: str) -> bool:
    """Whether `ckpt` was left before its first checkpoint was whole: it holds the settings
    only, and perhaps the temporary of a first checkpoint write that a kill cut short (the
    checkpoint takes its name only once written whole)."""
    return ckpt.is_dir() and all(p.name == settings_file or p.name.startswith(f".{CHECKPOINT_FILE}.tmp-")
                                 for p in ckpt.iterdir())


def differing_fields(saved: dict, now: dict, prefix: str = "") -> list[str]:
    """Dotted names of the settings that differ (`config.batch_size`), down nested dicts."""
    changed = []
    for key in sorted(set(saved) | set(now)):
        old, new = saved.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += differing_fields(old, new, f"{prefix}{key}.")
        elif old != new:
            changed.append(f"{prefix}{key}")
    return changed
