"""Resumable commands: a checkpoint is continued only when asked, and only with its own settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretrain.errors import UserError
from pretrain.resume import check_resume


def test_resume_without_a_checkpoint_says_it_starts_over(tmp_path: Path, capsys):
    check_resume({"lr": 1e-3}, tmp_path / "out.checkpoint", True, "settings.json")
    assert "no checkpoint at" in capsys.readouterr().err
    check_resume({"lr": 1e-3}, tmp_path / "out.checkpoint", False, "settings.json")
    assert capsys.readouterr().err == ""


def test_the_refusal_names_each_differing_setting_down_nested_settings(tmp_path: Path):
    ckpt = tmp_path / "out.checkpoint"
    ckpt.mkdir()
    (ckpt / "settings.json").write_text(json.dumps({"task": "t", "config": {"batch_size": 32, "lr": 1e-3}}))
    (ckpt / "checkpoint.pt").write_bytes(b"state")
    with pytest.raises(UserError, match=r"\(config\.batch_size differ\)"):
        check_resume({"task": "t", "config": {"batch_size": 16, "lr": 1e-3}}, ckpt, True, "settings.json")
    check_resume({"task": "t", "config": {"batch_size": 32, "lr": 1e-3}}, ckpt, True, "settings.json")
