"""The output dir of a run: who owns it, what a killed run left behind, and disk errors."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Iterator

from compressor import __version__
from compressor.pipeline.recipe import RESERVED_NAMES, RUN_FILE, STAGE_FILE, WORK_DIR, Recipe, located
from pretrain.atomic import claimed_output, remove_dir, write_failure, write_json
from pretrain.errors import UserError


LOCK_FILE = ".lock"       # held by the run using the dir (`exclusive_use`)


class WriteError(UserError):
    """The disk refused a write (full, read-only, permissions): finished stages stay usable."""


@contextlib.contextmanager
def exclusive_use(out_dir: Path) -> Iterator[bool]:
    """Hold out_dir for this process (a lock on DIR/.lock, created with the dir if need be);
    yields whether the dir is new. A second run into a dir in use is refused in one line: its
    claim would delete this run's temporaries. The lock goes with the process, so a killed
    run never leaves the dir locked.

    The dir is also claimed as every command claims its --out (`claimed_output`): an export or
    a finetune into it, started beside the run, went on, and its last rename replaced the
    run's dir, finished stages and all. The lock comes first, so a second run still names the
    first one's pid; a run refused by another command's claim leaves neither its lock file nor
    a dir it made."""
    created = make_out_dir(out_dir)
    with disk_errors(out_dir):
        lock = open(out_dir / LOCK_FILE, "a+")
    with lock, contextlib.ExitStack() as claim:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise UserError(f"{out_dir} is in use by another run ({holder}); wait for it to finish, "
                            "or choose another --out") from None
        try:
            claim.enter_context(output_claim(out_dir))
        except UserError:
            (out_dir / LOCK_FILE).unlink(missing_ok=True)
            if created:
                with contextlib.suppress(OSError):
                    out_dir.rmdir()
            raise
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        yield created


def output_claim(out_dir: Path) -> contextlib.AbstractContextManager:
    """`claimed_output` on out_dir, where its parent can hold the claim. A run writes only
    inside its dir, so one whose parent is read-only runs unclaimed, as it always could: no
    other command can write that dir then (each renames its output into the parent)."""
    parent = Path(os.path.abspath(out_dir)).parent
    if not os.access(parent, os.W_OK | os.X_OK):
        return contextlib.nullcontext()
    return claimed_output(out_dir)


@contextlib.contextmanager
def claimed_out_dir(out_dir: Path, recipe: Recipe, force: bool, *, held: bool = False,
                    source: str = "") -> Iterator[bool]:
    """out_dir held by this run (`exclusive_use`: one run at a time, since a second one's claim
    would delete this one's temporaries and train the same stages twice) and claimed for
    `recipe` (`claim_out_dir`); yields whether the dir is new. A dir refused keeps nothing of
    this run, not even the lock file. `held`: the caller holds the lock already (a search
    running its finals), so it is only claimed. `source`: the recipe file a refusal starts
    with, as the recipe's other errors do (not the errors of the run the claim holds)."""
    with contextlib.ExitStack() as held_until_done:
        with located(source):
            if held:
                created = make_out_dir(out_dir)
            else:
                created = held_until_done.enter_context(exclusive_use(out_dir))
            try:
                claim_out_dir(out_dir, recipe, force)
            except UserError:
                if not held:
                    (out_dir / LOCK_FILE).unlink(missing_ok=True)
                raise
        yield created


def make_out_dir(out_dir: Path) -> bool:
    """Create out_dir if it is absent; True if this call made it. A file in its place is refused."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file; expected a directory for the run's results")
    if out_dir.exists():
        return False
    with disk_errors(out_dir):
        try:
            out_dir.mkdir(parents=True)
        except FileExistsError:     # made since the check by a run starting beside this one: its lock says so
            return False
        except OSError as err:
            if write_failure(err) is not None:
                raise               # disk_errors words it
            # Not a refused write: a place no dir can be made (under /proc, say).
            raise UserError(f"--out {out_dir}: cannot make the directory there ({err.strerror or err}); "
                            "expected a path where a directory can be made") from None
    return True


def claim_out_dir(out_dir: Path, recipe: Recipe, force: bool) -> None:
    """Check that out_dir is new, empty or holds this recipe's results, and mark it as this
    recipe's (created if absent).

    A dir holding another recipe's results is refused unless `force`, which replaces them.
    Anything else there (a user's files) is never deleted: such a dir is refused, forced or
    not. Temporaries of a killed run are cleared only in a dir that is ours.
    """
    make_out_dir(out_dir)
    for path in replaced_by_claim(out_dir, recipe, force):
        remove_dir(path) if path.is_dir() else path.unlink()
    remove_stale_temporaries(out_dir)
    with disk_errors(out_dir):
        write_json(out_dir / RUN_FILE, {"recipe": recipe.name, "tool_version": __version__})


def replaced_by_claim(out_dir: Path, recipe: Recipe, force: bool) -> list[Path]:
    """What claiming an existing out_dir for `recipe` deletes: nothing in a dir of this recipe,
    another recipe's results with `force`. Refused (UserError): another recipe's results
    without `force`, and a user's files always. Reads only."""
    # Dirs written before run.json existed still name their recipe in report.json.
    owner = read_json(out_dir / RUN_FILE).get("recipe") or \
        read_json(out_dir / "report.json").get("recipe", {}).get("name")
    contents = [p for p in out_dir.iterdir() if p.name not in (RUN_FILE, LOCK_FILE)]
    if not contents or owner == recipe.name:
        return []
    foreign = sorted(p.name for p in contents if not run_output(p))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UserError(f"{out_dir} holds files that neither `compressor run` nor `compressor search` wrote "
                        f"({shown}); they are never deleted, not even by `run --force`: choose another --out")
    if not force:
        holder = f"results of recipe {owner!r}" if owner else "results of a run that names no recipe"
        raise UserError(f"{out_dir} holds {holder}; refusing to mix them with recipe "
                        f"{recipe.name!r} (choose another --out, or pass --force to replace them)")
    return contents


def holder_of(out_dir: Path) -> str | None:
    """Who holds out_dir now (`exclusive_use`'s lock), without taking it; None if nobody does."""
    try:
        lock = open(out_dir / LOCK_FILE)
    except OSError:
        return None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return lock.read().strip() or "another process"
    return None


def run_output(path: Path) -> bool:
    """Whether a run wrote this entry of its out dir: a name a run reserves, a stage dir (it
    holds stage.json), its checkpoints, or a temporary a killed run left."""
    if path.name in RESERVED_NAMES or path.name == WORK_DIR:
        return True
    if path.name.startswith(".") and (".tmp-" in path.name or ".old-" in path.name):
        return True
    return path.is_dir() and (path / STAGE_FILE).is_file()


def remove_stale_temporaries(out_dir: Path) -> None:
    """Temporary dirs and files a killed run left behind (hidden `.<name>.tmp-*` / `.old-*`)."""
    for pattern in (".*.tmp-*", ".*.old-*", "*/.*.tmp-*", "*/.*.old-*"):
        for path in out_dir.glob(pattern):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


# The disk refusing a write: full, over quota, read-only, or not ours to write.
@contextlib.contextmanager
def disk_errors(out_dir: Path) -> Iterator[None]:
    """Turn a refused write under out_dir (`write_failure`) into a one-line WriteError."""
    try:
        yield
    except Exception as err:      # safetensors' error is no OSError
        what = write_failure(err)
        if what is None:
            raise
        # shutil's copies name their source first: the file being written is the second.
        written = getattr(err, "filename2", None) or getattr(err, "filename", None)
        where = f" ({written})" if written else ""
        raise WriteError(f"cannot write under {out_dir}: {what}{where}; finished stages are "
                         "kept, fix the disk or permissions and rerun the same command to resume") from None


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
