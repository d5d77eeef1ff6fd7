"""Fixtures shared by the training passes' tests."""

from __future__ import annotations

import pytest
import torch

from compressor.passes.registry import Context, apply_pass


class Stop(Exception):
    pass


@pytest.fixture
def stopped_then_resumed(monkeypatch, tmp_path):
    """run(module, name, bundle, cfg, task): the pass `name` (whose module calls `finetune`
    and checkpoints every `CHECKPOINT_EVERY` steps, here 2) stopped after step 5, then run
    again in the same work dir. Returns the checkpoint the stop left, the steps the rerun
    trained, and the rerun's bundle."""
    from pretrain.train import CHECKPOINT_FILE

    def run(module, name, bundle, cfg, task):
        monkeypatch.setattr(module, "CHECKPOINT_EVERY", 2)
        real_finetune = module.finetune
        ctx = Context(task=task, seed=0, show_progress=False, work_dir=tmp_path / "work")

        def stop_at_5(log):
            if log.step == 5:
                raise Stop
        monkeypatch.setattr(module, "finetune", lambda *a, **k: real_finetune(*a, **k, callbacks=[stop_at_5]))
        with pytest.raises(Stop):
            apply_pass(bundle, name, cfg, ctx)
        saved = torch.load(tmp_path / "work" / CHECKPOINT_FILE, weights_only=True)
        steps: list[int] = []
        monkeypatch.setattr(module, "finetune", lambda *a, **k: real_finetune(
            *a, **k, callbacks=[lambda log: steps.append(log.step)]))
        return saved, steps, apply_pass(bundle, name, cfg, ctx)
    return run
