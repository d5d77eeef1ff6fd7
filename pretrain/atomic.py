"""Write-then-rename helpers: nothing half-written is ever visible under an output dir.

Used by both sides: the training loop's checkpoints and everything the compressor writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from pretrain.errors import UserError


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling dir; on success it replaces `target` in one rename. What a
    killed writer of `target` left beside it goes first (`remove_killed_temporaries`)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_killed_temporaries(target)
    tmp, held = locked_temporary(target)
    try:
        yield tmp
        shareable(tmp)
        if target.exists():
            # rename() cannot replace a non-empty dir: move the old one aside first.
            old = set_aside(target)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(held)


# A temporary dir's writer holds a shared lock on it (a kill releases it): a temporary nobody
# holds is a killed writer's. Temporaries are made under a shared lock on their parent dir and
# looked for under an exclusive one, so one too new to be locked yet is never taken for stale.

def locked_temporary(target: Path) -> tuple[Path, int]:
    """A new temporary dir `.NAME.tmp-*` beside `target`, and the descriptor that holds its lock
    (unlocked where the filesystem has no locks: no cleanup runs there, see below)."""
    with dir_locked(target.parent, fcntl.LOCK_SH, required=False):
        tmp, held = held_temporary(target)
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; outputs are for sharing
    return tmp, held


def held_temporary(target: Path) -> tuple[Path, int]:
    """Make `.NAME.tmp-*` beside `target` and hold a shared lock on it (where the filesystem
    locks); its descriptor, open until the writer is done, is the lock. The caller holds the
    parent's lock meanwhile (see above)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    held = os.open(tmp, os.O_RDONLY)
    with contextlib.suppress(OSError):
        fcntl.flock(held, fcntl.LOCK_SH)
    return tmp, held


def remove_killed_temporaries(target: Path) -> None:
    """The temporary dirs of `target` that no live process writes (a killed `finetune` or
    `export` left a model copy beside its output for good), and the earlier `target` set aside
    by a writer killed before it deleted it (once `target` is there again). Where dirs cannot be
    locked exclusively at once (NFS, a filesystem without locks, or a writer making its
    temporary there right now), nothing is removed: a later writer cleans up, and a nested
    writer never waits on the lock its own outer writer holds."""
    pattern = f".{glob.escape(target.name)}"
    try:
        with dir_locked(target.parent, fcntl.LOCK_EX | fcntl.LOCK_NB):
            stale = [path for path in target.parent.glob(f"{pattern}.tmp-*") if path.is_dir() and not in_use(path)]
    except OSError:
        return
    stale += list(target.parent.glob(f"{pattern}.old-*")) if target.exists() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)


def in_use(directory: Path) -> bool:
    """Whether a live process holds a lock on `directory` (`locked_temporary`)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def claimed_output(out: Path, flag: str = "--out") -> Iterator[None]:
    """Hold `out` for a command until it ends: a second command writing the same output is
    refused in one line. Two exports into one --out, started together, both ran, and the last
    rename replaced the other's output, whose printed record then described nothing.

    The claim is a temporary `.NAME.tmp-*` beside `out`, locked as `atomic_dir`'s are (a killed
    command's goes in the next writer's cleanup), made under an exclusive lock on the parent
    after looking for a live one: another command's claim, or any writer's temporary of `out`.
    Every command writing an --out takes it, whichever the command (`run` and `search` beside
    their dir's .lock, `finetune` and `pretrain` beside their checkpoint's lock), so an export
    and a finetune into one --out refuse each other too. The pipeline's stages are not claimed
    (two search workers may build the same stage, and a stage's dir is written inside its run's)."""
    out = Path(out)
    place = Path(os.path.abspath(out))      # "." or "runs/x/..": the dir's own name, and its parent
    made = [d for d in (place.parent, *place.parent.parents) if not d.exists()]
    place.parent.mkdir(parents=True, exist_ok=True)
    try:
        claim, held = claim_beside(place, flag, shown=out)
    except BaseException:
        remove_empty(made)
        raise
    try:
        yield
    finally:
        os.close(held)
        shutil.rmtree(claim, ignore_errors=True)
        remove_empty(made)


def claim_beside(out: Path, flag: str, shown: Path) -> tuple[Path, int]:
    """The claim (see claimed_output) beside `out` (absolute): its dir, and the descriptor that
    holds its lock. `shown`: the output as given, which a refusal names."""
    remove_killed_temporaries(out)
    with dir_locked(out.parent, fcntl.LOCK_EX, required=False):
        if any(written_now(path) for path in out.parent.glob(f".{glob.escape(out.name)}.tmp-*")):
            raise UserError(f"{flag} {shown} is in use by another command writing the same output; wait for it to "
                            f"finish, or choose another {flag}")
        return held_temporary(out)


def written_now(temporary: Path) -> bool:
    """Whether a live process holds this temporary dir (False where it is gone by now, or
    where the filesystem has no locks to tell)."""
    try:
        return temporary.is_dir() and in_use(temporary)
    except OSError:
        return False


def remove_empty(dirs: list[Path]) -> None:
    """The dirs a claim made on the way to its output, where still empty (deepest first)."""
    for directory in dirs:
        with contextlib.suppress(OSError):
            directory.rmdir()


@contextlib.contextmanager
def dir_locked(directory: Path, operation: int, required: bool = True) -> Iterator[None]:
    """flock `operation` (LOCK_SH or LOCK_EX) on a dir, held for the block. A lock the
    filesystem refuses raises OSError, or (not `required`) the block runs without it."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, operation)
        except OSError:
            if required:
                raise
        yield
    finally:
        os.close(fd)


def remove_dir(path: Path) -> None:
    """Delete a dir so that a stop midway never leaves part of it under its own name.

    rmtree deletes in the order the filesystem lists, which on some (btrfs, XFS) is creation
    order: a stage's weights went before its stage.json, and a stop between left a record of
    files that were gone. Renamed aside first, the rest of a stopped deletion is a hidden
    `.NAME.old-*` that the cleanups of temporaries remove.
    """
    if path.exists():
        shutil.rmtree(set_aside(path), ignore_errors=True)


def set_aside(path: Path) -> Path:
    """Rename `path` to the hidden sibling `.NAME.old-<pid>`, its new path returned."""
    aside = path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)     # left by a stopped process that had this pid
    path.rename(aside)
    return aside


SCRATCH_PREFIX = "compressor-"     # scratch dirs in the system's temp dir: compressor-<use>-<pid>-...


def scratch_dir(use: str) -> tempfile.TemporaryDirectory:
    """A temporary dir for work in progress (an ONNX graph before it is gated), named with this
    process's id: one that a hard kill (kill -9, a lost machine) left behind, of a process that
    is gone, is removed here, so repeated kills do not fill the temp dir with model copies."""
    remove_orphan_scratch()
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{use}-{os.getpid()}-")


def remove_orphan_scratch() -> None:
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*-*"):
        pid = path.name.split("-")[2]
        if path.is_dir() and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # another user's process: alive
        return True
    return True


def shareable(directory: Path) -> None:
    """Give files written with private modes (safetensors writes 0600) the modes an ordinary
    file gets under the umask, as every other output has."""
    mode = 0o666 & ~current_umask()
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600 and mode != 0o600:
            os.chmod(path, mode)


def check_output(out: Path, inputs: Iterable[Path | str | None], *, owner_files: tuple[str, ...] | None = (),
                 flag: str = "--out") -> None:
    """Refuse, before any work starts, an output whose writing would lose something.

    `atomic_dir` replaces its target whole, so `out` may not be one of the command's `inputs`,
    hold one (replacing it would delete the input) or lie inside one (inputs are never
    modified). With `owner_files`, `out` is a dir: new, empty, or an earlier output of the same
    command, recognized by holding every one of those files; anything else there (a user's own
    dir, another tool's output) is refused rather than deleted. `owner_files=None` checks the
    inputs only (callers that own the dir's contents another way, or write a file)."""
    out = Path(out)
    check_writable(out, flag)
    target = out.resolve()
    for given in inputs:
        if given is None:
            continue
        source = Path(given).resolve()
        if not source.exists():      # a built-in name ("minilm", "wordnet"): nothing on disk to lose
            continue
        if target == source or target in source.parents:
            what = "is" if target == source else "holds"     # replacing a dir that holds it deletes it
            raise UserError(f"{flag} {out} {what} the input {given}: the output would replace the input, which "
                            f"is never modified; expected an output path outside it")
        if source in target.parents:
            raise UserError(f"{flag} {out} lies inside the input {given}, which is never modified; "
                            f"expected an output path outside it")
    if owner_files is None:
        return
    if out.name in ("", ".", ".."):      # ".", "..", "/": replaced whole, it would be renamed away
        raise UserError(f"{flag} {out} names a dir by a relative step, not by its name; expected the path of "
                        f"the dir to write (e.g. runs/model)")
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"{flag} {out} is a file; expected a directory (new, empty, or an earlier output "
                        f"of this command)")
    if any(out.iterdir()) and not all((out / name).is_file() for name in owner_files):
        raise UserError(f"{flag} {out} holds files this command did not write (it lacks "
                        f"{', '.join(owner_files)}); expected a new or empty dir, or an earlier output to replace")


# A name's bytes, less the room the temporary names beside it take (".NAME.tmp-XXXXXXXX",
# a fine-tuning's "NAME.checkpoint" and its own temporary): the filesystem's limit is 255.
MAX_OUT_NAME = 215
# What the disk says when it refuses a write (full, read-only, permissions, a file where a
# dir must be, a name too long).
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                errno.ENAMETOOLONG, errno.EEXIST}


def check_writable(out: Path, flag: str = "--out") -> None:
    """Refuse, before any work, an output the disk will refuse at the end (an export's or a
    benchmark's minutes lost): a name too long, a file where a dir must be, a read-only or
    forbidden place."""
    # os.path.exists, not Path.exists: a name too long for the filesystem is "not there", not an error
    existing = next(p for p in [out.absolute(), *out.absolute().parents] if os.path.exists(p))
    # Only the output's own name gets temporary names beside it; dirs made on the way, the
    # filesystem's 255 bytes.
    new_dirs = [p.name for p in out.absolute().parents if p not in existing.parents and p != existing]
    for name, limit in [(out.name, MAX_OUT_NAME), *((n, 255) for n in new_dirs)]:
        if len(os.fsencode(name)) > limit:
            raise UserError(f"{flag} {out}: the name {name[:20]!r}... has {len(os.fsencode(name))} bytes; expected "
                            f"at most {limit}" + (" (with room for the temporary names beside it)"
                                                  if limit == MAX_OUT_NAME else ""))
    if existing != out.absolute() and not existing.is_dir():
        raise UserError(f"{flag} {out}: {existing} is a file; expected a directory there")
    place = existing if existing.is_dir() else existing.parent
    if not os.access(place, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {out}: cannot write in {place} (read-only or no permission); expected a "
                        "writable place")


def write_failure(err: BaseException) -> str | None:
    """What the disk refused, in words, when `err` is a refused write; else None. Besides
    OSError: safetensors' own error ("... (os error 28)"), and torch.save's to a path, whose
    writer says only "file write failed"."""
    if isinstance(err, OSError):
        return err.strerror or str(err) if err.errno in WRITE_ERRNOS else None
    text = str(err)
    if type(err).__name__ == "SafetensorError" and "(os error " in text:
        number = int(text.rsplit("(os error ", 1)[1].split(")")[0])
        return os.strerror(number) if number in WRITE_ERRNOS else None
    if isinstance(err, RuntimeError) and "PytorchStreamWriter failed writing" in text:
        return "a file could not be written whole (is the disk full?)"
    return None


def write_json(path: Path, data: Any) -> None:
    """Write JSON to a temporary file in the same dir, then rename over `path`."""
    atomic_file(path, json_bytes(data))


def json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, default=str) + "\n").encode()


def atomic_file(path: Path, content: bytes) -> None:
    """Write bytes to a temporary file in the same dir, then rename over `path`."""
    atomic_write(path, lambda f: f.write(content))


def atomic_files(directory: Path, contents: dict[str, bytes | None]) -> None:
    """Replace files that belong together (a report.json and its renderings), the last one
    given being the one tools read (report.json). Each is written to a temporary first; then
    the earlier set goes, that last file first, and the new files are renamed into place in
    the order given, the last one last (a name given None is only removed).

    So a stop at any point leaves the earlier set whole (stopped while the temporaries are
    written), the new set whole, or files without the last one, which no finished set lacks
    (stopped while replacing: whoever wrote the set writes it again, as a rerun of `compressor
    run` does). The last file is only ever beside the rest of its own set: renamed one by one
    over the earlier files, a stop between renames left a new report.md beside the report.json
    of the run before."""
    written: list[tuple[Path, Path]] = []
    try:
        for name, content in contents.items():
            if content is not None:
                fd, tmp = temporary_beside(directory / name)
                written.append((Path(tmp), directory / name))
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
        for name in reversed(contents):
            (directory / name).unlink(missing_ok=True)
        for tmp, path in written:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """`write(f)` fills a temporary file in the same dir, which then replaces `path` in one
    rename: a kill never leaves half a file (e.g. `lambda f: torch.save(state, f)`)."""
    path = Path(path)
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        # torch.save turns an exception in the file's write() (a full disk; Ctrl-C or SIGTERM
        # arriving mid-write) into its own RuntimeError ("unexpected pos ..."), the real one
        # kept as its context: raise that, so a stop is a stop and a full disk says so.
        if isinstance(err, RuntimeError) and isinstance(err.__context__, (OSError, KeyboardInterrupt)):
            raise err.__context__ from None
        raise


def temporary_beside(path: Path) -> tuple[int, str]:
    """A new hidden file `.NAME.tmp-*` in path's dir (made if need be), open for writing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600
    return fd, tmp


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
