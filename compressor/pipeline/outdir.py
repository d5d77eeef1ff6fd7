"""The output dir of a run: who owns it, what a killed run left behind, and disk errors."""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from pathlib import Path
from typing import Iterator

from compressor import __version__
from compressor.pipeline.recipe import RUN_FILE, Recipe
from pretrain.atomic import write_json
from pretrain.errors import UserError


class WriteError(UserError):
    """The disk refused a write (full, read-only, permissions): finished stages stay usable."""


def claim_out_dir(out_dir: Path, recipe: Recipe, force: bool) -> bool:
    """Check that out_dir is free or holds this recipe's results; True if it is new.

    A dir holding another recipe's results (or anything not written by a run) is refused
    unless `force`, which replaces its contents.
    """
    if not out_dir.exists():
        with disk_errors(out_dir):
            out_dir.mkdir(parents=True)
            write_json(out_dir / RUN_FILE, {"recipe": recipe.name, "tool_version": __version__})
        return True
    if not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file; expected a directory for the run's results")
    remove_stale_temporaries(out_dir)
    # Dirs written before run.json existed still name their recipe in report.json.
    owner = read_json(out_dir / RUN_FILE).get("recipe") or \
        read_json(out_dir / "report.json").get("recipe", {}).get("name")
    contents = [p for p in out_dir.iterdir() if p.name != RUN_FILE]
    if contents and owner != recipe.name:
        if not force:
            holder = f"results of recipe {owner!r}" if owner else "files not written by `compressor run`"
            raise UserError(f"{out_dir} holds {holder}; refusing to mix them with recipe "
                            f"{recipe.name!r} (choose another --out, or pass --force to replace them)")
        for path in contents:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    with disk_errors(out_dir):
        write_json(out_dir / RUN_FILE, {"recipe": recipe.name, "tool_version": __version__})
    return False


def remove_stale_temporaries(out_dir: Path) -> None:
    """Temporary dirs and files a killed run left behind (hidden `.<name>.tmp-*` / `.old-*`)."""
    for pattern in (".*.tmp-*", ".*.old-*", "*/.*.tmp-*", "*/.*.old-*"):
        for path in out_dir.glob(pattern):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


# The disk refusing a write: full, over quota, read-only, or not ours to write.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


@contextlib.contextmanager
def disk_errors(out_dir: Path) -> Iterator[None]:
    """Turn an OSError while writing under out_dir into a one-line WriteError."""
    try:
        yield
    except OSError as err:
        if err.errno not in WRITE_ERRNOS:
            raise
        what = err.strerror or str(err)
        where = f" ({err.filename})" if err.filename else ""
        raise WriteError(f"cannot write under {out_dir}: {what}{where}; finished stages are "
                         "kept, fix the disk or permissions and rerun the same command to resume") from None


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
