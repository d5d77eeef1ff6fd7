"""TeacherLogits: the teacher's logits once per example, the same as running it each time."""

from __future__ import annotations

import torch

from compressor.bundle import ModelBundle
from compressor.passes.distill_losses import TeacherLogits
from pretrain.models import encoder_layers


def _teacher(tiny_bert_dir):
    return ModelBundle.load(tiny_bert_dir).model.eval()


def _batch(rows: list[list[int]], types: list[list[int]] | None = None) -> dict[str, torch.Tensor]:
    """Right-padded to the longest row (pad id 0), with a label column the teacher must not get."""
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(len(rows), dtype=torch.long)}
    if types is not None:
        batch["token_type_ids"] = torch.tensor([t + [0] * (width - len(t)) for t in types])
    return batch


def _direct(teacher, batch) -> torch.Tensor:
    with torch.no_grad():
        return teacher(**{k: v for k, v in batch.items() if k != "labels"}).logits


def _rows_run(reader) -> list[int]:
    seen: list[int] = []
    reader.register_forward_pre_hook(lambda m, args, kwargs: seen.append(len(kwargs["input_ids"])), with_kwargs=True)
    return seen


def test_each_example_runs_once_and_gets_the_teachers_logits(tiny_bert_dir):
    teacher = _teacher(tiny_bert_dir)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    logits = TeacherLogits(teacher)
    seen = _rows_run(logits.reader)
    a, b, c, d = [5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [15]
    first = _batch([a, b, c])
    torch.testing.assert_close(logits(first), _direct(teacher, first), atol=1e-5, rtol=0)
    # a later batch, padded to another width, with two known examples and two new ones
    second = _batch([d, b, [16, 17], a])
    torch.testing.assert_close(logits(second), _direct(teacher, second), atol=1e-5, rtol=0)
    assert seen == [3, 2]          # the teacher saw each example once
    assert logits(_batch([c, a])).shape == (2, teacher.config.num_labels) and seen == [3, 2]
    assert len(logits.cache) == 5
    assert "forward" in vars(encoder_layers(logits.reader)[-1])      # the first-token copy runs
    assert "forward" not in vars(encoder_layers(teacher)[-1])        # the teacher is untouched
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items())


def test_token_types_tell_examples_apart(tiny_bert_dir):
    teacher = _teacher(tiny_bert_dir)
    logits = TeacherLogits(teacher)
    batch = _batch([[5, 6, 7, 8], [5, 6, 7, 8]], types=[[0, 0, 0, 0], [0, 0, 1, 1]])
    got = logits(batch)
    torch.testing.assert_close(got, _direct(teacher, batch), atol=1e-5, rtol=0)
    assert not torch.allclose(got[0], got[1]) and len(logits.cache) == 2


def test_without_the_cache_or_the_first_token_copy(tiny_bert_dir):
    teacher = _teacher(tiny_bert_dir)
    logits = TeacherLogits(teacher, first_token=False, cache=False)
    assert logits.reader is teacher and logits.cache is None
    seen = _rows_run(teacher)
    batch = _batch([[5, 6], [7]])
    for _ in range(2):
        torch.testing.assert_close(logits(batch), _direct(teacher, batch), atol=0, rtol=0)
    assert seen == [2, 2, 2, 2]    # two calls of ours, two of _direct
