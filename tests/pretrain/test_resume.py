"""Resumable commands: a checkpoint is continued only when asked, and only with its own settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pretrain.errors import UserError
from pretrain.resume import check_resume


def test_resume_without_a_checkpoint_says_it_starts_over(tmp_path: Path, capsys):
    check_resume({"lr": 1e-3}, tmp_path / "out.checkpoint", True, "settings.json")
    assert "no checkpoint at" in capsys.readouterr().err
    check_resume({"lr": 1e-3}, tmp_path / "out.checkpoint", False, "settings.json")
    assert capsys.readouterr().err == ""


def test_a_first_checkpoint_a_kill_cut_short_is_no_checkpoint(tmp_path: Path):
    """kill -9 during the first checkpoint write leaves its temporary, empty or truncated: it was
    taken for a checkpoint, and the rerun told to pass --resume to continue nothing."""
    ckpt = tmp_path / "out.checkpoint"
    ckpt.mkdir()
    (ckpt / "settings.json").write_text(json.dumps({"lr": 1e-3}))
    (ckpt / ".checkpoint.pt.tmp-k1ll3d").write_bytes(b"")
    check_resume({"lr": 1e-2}, ckpt, False, "settings.json")
    assert not ckpt.exists()


def test_the_refusal_names_each_differing_setting_down_nested_settings(tmp_path: Path):
    ckpt = tmp_path / "out.checkpoint"
    ckpt.mkdir()
    (ckpt / "settings.json").write_text(json.dumps({"task": "t", "config": {"batch_size": 32, "lr": 1e-3}}))
    (ckpt / "checkpoint.pt").write_bytes(b"state")
    with pytest.raises(UserError, match=r"\(config\.batch_size differ\)"):
        check_resume({"task": "t", "config": {"batch_size": 16, "lr": 1e-3}}, ckpt, True, "settings.json")
    check_resume({"task": "t", "config": {"batch_size": 32, "lr": 1e-3}}, ckpt, True, "settings.json")


def test_a_checkpoint_another_command_is_writing_is_refused(tmp_path):
    """Two commands writing one output, started together, both passed check_resume and trained
    into one checkpoint; the second is refused now, and the first's claim goes with it."""
    from pretrain.resume import claimed_checkpoint
    ckpt = tmp_path / "out.checkpoint"
    with claimed_checkpoint(ckpt, {"a": 1}, False, "settings.json"):
        assert json.loads((ckpt / "settings.json").read_text()) == {"a": 1}
        with pytest.raises(UserError, match=r"out\.checkpoint is in use by another command writing the same output"):
            with claimed_checkpoint(ckpt, {"a": 1}, True, "settings.json"):
                pass
        (ckpt / "checkpoint.pt").write_bytes(b"state")
    with pytest.raises(RuntimeError):                      # released: resumable, then stopped again
        with claimed_checkpoint(ckpt, {"a": 1}, True, "settings.json"):
            raise RuntimeError("stopped")
    assert (ckpt / "checkpoint.pt").is_file()               # a checkpoint stays for the next resume
    shutil.rmtree(ckpt)
    with pytest.raises(RuntimeError):
        with claimed_checkpoint(ckpt, {"a": 1}, False, "settings.json"):
            raise RuntimeError("stopped before its first checkpoint")
    assert not ckpt.exists()
