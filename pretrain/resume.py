"""Resumable commands: a run that writes `out` keeps its checkpoint in the sibling
`<out>.checkpoint/` until the output is written, and continues from it only when asked
(`--resume`) and only with the settings that wrote it.

Both long commands use it: `compressor pretrain` and `compressor finetune`. The loop itself
(pretrain/train.py) saves and restores the training state; this module decides whether a
checkpoint found on disk may be continued, before anything is loaded or trained.
"""

from __future__ import annotations

import json
from pathlib import Path

from pretrain.errors import UserError


def checkpoint_dir(out: Path) -> Path:
    """Where the command writing `out` keeps its checkpoint."""
    out = Path(out)
    return out.with_name(out.name + ".checkpoint")


def check_resume(settings: dict, ckpt: Path, resume: bool, settings_file: str) -> None:
    """A checkpoint is continued only on `resume` and only when `settings` (JSON-ready: what
    decides what the run computes) equal the ones it was written with; never silently
    restarted or mixed."""
    if not ckpt.exists():
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
        changed = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
        raise UserError(f"cannot resume from {ckpt}: it was written with other settings "
                        f"({', '.join(changed)} differ); expected the same command line")
