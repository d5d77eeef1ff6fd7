"""The output dir of a run: one run at a time, and a clear refusal for the second."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from compressor.pipeline import outdir
from pretrain.errors import UserError


def test_a_run_beside_one_that_makes_the_same_new_dir_first_is_told_it_is_in_use(tmp_path, monkeypatch):
    """Both found the dir absent, the other made it first, and this one's mkdir failed with a
    disk error ("File exists") instead of the refusal a dir in use gets."""
    out = tmp_path / "new-run"
    other_run = contextlib.ExitStack()
    real_mkdir = Path.mkdir

    def made_meanwhile(path, *args, **kwargs):
        if path == out and not out.exists():
            monkeypatch.setattr(Path, "mkdir", real_mkdir)
            other_run.enter_context(outdir.exclusive_use(out))    # makes the dir and holds it
        return real_mkdir(path, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", made_meanwhile)
    with other_run, pytest.raises(UserError, match=r"in use by another run"):
        with outdir.exclusive_use(out):
            pass
