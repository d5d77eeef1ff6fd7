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
    out = tmp_path / "out"
    ckpt = tmp_path / "out.checkpoint"
    with claimed_checkpoint(out, {"a": 1}, False, "settings.json"):
        assert json.loads((ckpt / "settings.json").read_text()) == {"a": 1}
        with pytest.raises(UserError, match=rf"^--out {out} is in use by another command writing the same output"):
            with claimed_checkpoint(out, {"a": 1}, True, "settings.json"):
                pass
        (ckpt / "checkpoint.pt").write_bytes(b"state")
    with pytest.raises(RuntimeError):                      # released: resumable, then stopped again
        with claimed_checkpoint(out, {"a": 1}, True, "settings.json"):
            raise RuntimeError("stopped")
    assert (ckpt / "checkpoint.pt").is_file()               # a checkpoint stays for the next resume
    shutil.rmtree(ckpt)
    with pytest.raises(RuntimeError):
        with claimed_checkpoint(out, {"a": 1}, False, "settings.json"):
            raise RuntimeError("stopped before its first checkpoint")
    assert not ckpt.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == []      # nor any claim


def test_the_output_of_a_finetune_is_claimed_as_every_commands_output_is(tmp_path):
    """A finetune held only its checkpoint dir: an export (or a run) into the same --out,
    claiming the output itself, went on beside it, and the last to write replaced the other's
    output. Each now refuses the other, the one refused leaving nothing behind."""
    from pretrain.atomic import claimed_output
    from pretrain.resume import claimed_checkpoint
    out = tmp_path / "out"
    refused = rf"^--out {out} is in use by another command writing the same output; wait for it to finish"
    with claimed_output(out):                               # an export into `out`, running
        with pytest.raises(UserError, match=refused):
            with claimed_checkpoint(out, {"a": 1}, False, "settings.json"):
                pass
        assert not (tmp_path / "out.checkpoint").exists()
    with claimed_checkpoint(out, {"a": 1}, False, "settings.json"):     # a finetune into `out`, running
        with pytest.raises(UserError, match=refused):
            with claimed_output(out):
                pass
