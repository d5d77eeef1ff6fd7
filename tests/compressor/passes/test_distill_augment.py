"""`distill` with `augment`: noised copies from a masked LM, learnt from soft targets only."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from compressor.passes import Context, LazyTeacher, apply_pass
from compressor.passes import distill_augment
from compressor.passes.distill_augment import NO_LABEL, AugmentConfig, augment_split, with_spans_replaced
from compressor.passes.distill_losses import hard_ce
from compressor.passes.distillation import DistillConfig
from compressor.pipeline.recipe import parse_step
from pretrain.data import Split
from pretrain.errors import UserError

TINY = {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_train_samples": 32}


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory, tokenizer):
    """A tiny masked LM (random weights, but its head is a saved, loaded head) on MiniLM's vocab."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("mlm")
    BertForMaskedLM(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def test_copies_replace_known_words_with_whole_words_and_carry_no_label(mlm_dir):
    split = Split(["cat: a small domesticated carnivorous mammal", "run: move fast by using the feet"], [3, 7])
    augmented = augment_split(split, AugmentConfig(copies=3, mlm=str(mlm_dir), replace_prob=1.0), mlm_dir, seed=0)
    out = augmented.split
    assert out.texts[:2] == split.texts and out.labels == [3, 7] + [NO_LABEL] * 6
    for i, copy in enumerate(out.texts[2:]):
        original = split.texts[i % 2]
        assert copy != original and copy.count(":") == 1            # punctuation and layout kept
        assert len(copy.split()) >= len(original.split())           # word for word (a filler is one word)
    record = augmented.record
    assert record["added"] == 6 and record["share_of_words_replaced"] > 0.5
    again = augment_split(split, AugmentConfig(copies=3, mlm=str(mlm_dir), replace_prob=1.0), mlm_dir, seed=0)
    assert again.split.texts == out.texts                           # seeded: a rerun makes the same data


def test_replace_prob_sets_how_much_changes(mlm_dir):
    texts = [f"word {i}: the quick brown fox jumps over the lazy dog near the river bank" for i in range(40)]
    split = Split(texts, [0] * 40)
    low = augment_split(split, AugmentConfig(copies=1, mlm=str(mlm_dir), replace_prob=0.1), mlm_dir, seed=0)
    high = augment_split(split, AugmentConfig(copies=1, mlm=str(mlm_dir), replace_prob=0.6), mlm_dir, seed=0)
    assert 0.02 < low.record["share_of_words_replaced"] < 0.2 < 0.45 < high.record["share_of_words_replaced"] < 0.75


def test_spans_are_replaced_in_place():
    assert with_spans_replaced("a cat, a dog.", [(2, 5), (9, 12)], ["cow", "pig"]) == "a cow, a pig."
    assert with_spans_replaced("a cat, a dog.", [(2, 5), (9, 12)], ["cow"]) == "a cow, a dog."   # truncated


def test_hard_loss_skips_copies_and_a_batch_of_copies_gives_zero():
    logits = torch.randn(4, 5, requires_grad=True)
    labelled = hard_ce(logits, torch.tensor([1, NO_LABEL, 2, NO_LABEL]))
    assert torch.isclose(labelled, torch.nn.functional.cross_entropy(logits[[0, 2]], torch.tensor([1, 2])))
    none = hard_ce(logits, torch.full((4,), NO_LABEL))
    assert none.item() == 0.0 and not torch.isnan(none)
    none.backward()                                                 # still part of the graph


def test_distill_trains_on_originals_and_copies(bert_bundle, tiny_task, tiny_bert_dir, mlm_dir):
    ctx = Context(task=tiny_task, seed=0, show_progress=False, teacher_source=LazyTeacher.from_dir(tiny_bert_dir))
    cfg = DistillConfig.model_validate({**TINY, "losses": ["soft", "hard"],
                                        "augment": {"copies": 2, "mlm": str(mlm_dir)}})
    out = apply_pass(bert_bundle, "distill", cfg, ctx)
    record = out.deploy["distill"]
    assert record["augment"]["originals"] == 32 and record["augment"]["added"] == 64
    assert record["stages"][0]["samples"] == 96                     # 32 texts and 64 copies, one epoch


def test_distill_structure_trains_a_cnn_on_originals_and_teacher_labelled_copies(bert_bundle, tiny_task,
                                                                                tiny_bert_dir, mlm_dir):
    """Tang et al.'s setting: a CNN student, its transfer set grown by copies the teacher labels;
    with alpha > 0 the labels' cross-entropy sees the originals only (a copy has no label)."""
    ctx = Context(task=tiny_task, seed=0, show_progress=False, teacher_source=LazyTeacher.from_dir(tiny_bert_dir))
    cfg = parse_step({"distill-structure": {"kind": "cnn", "embedding_dim": 16, "filters": 8, "alpha": 0.5,
                                            **TINY, "augment": {"copies": 1, "mlm": str(mlm_dir)}}}, "v").config
    assert cfg.input_paths() == {"augment_mlm": mlm_dir}               # its content is in the cache key
    out = apply_pass(bert_bundle, "distill-structure", cfg, ctx)
    record = out.deploy["distill-structure"]["augment"]
    assert record["originals"] == 32 and record["added"] == 32 and out.model.config.model_type == "textcnn"
    with pytest.raises(UserError, match="alpha < 1"):
        parse_step({"distill-structure": {"kind": "cnn", "alpha": 1.0, "augment": {"copies": 1, "mlm": "x"}}}, "v")


def test_refusals(bert_bundle, tiny_task, tiny_bert_dir, monkeypatch):
    with pytest.raises(UserError, match="only the teacher's soft targets label"):
        parse_step({"distill": {"losses": ["hard"], "augment": {"copies": 1, "mlm": "x"}}}, "v")
    with pytest.raises(UserError, match="mlm"):
        parse_step({"distill": {"losses": ["soft"], "augment": {"copies": 1}}}, "v")
    ctx = Context(task=tiny_task, seed=0, show_progress=False, teacher_source=LazyTeacher.from_dir(tiny_bert_dir))
    monkeypatch.setattr(distill_augment, "fill_masks", lambda *a, **k: pytest.fail("filled without a head"))
    no_head = DistillConfig.model_validate({**TINY, "augment": {"copies": 1, "mlm": str(tiny_bert_dir)}})
    with pytest.raises(UserError, match="no trained masked-LM head") as err:
        apply_pass(bert_bundle, "distill", no_head, ctx)     # a classifier: its MLM head would be random
    assert "\n" not in str(err.value)
    missing = DistillConfig.model_validate({**TINY, "augment": {"copies": 1, "mlm": str(tiny_bert_dir / "nope")}})
    with pytest.raises(UserError, match="not a masked-LM model dir"):
        apply_pass(bert_bundle, "distill", missing, ctx)


def test_unlabeled_rows_are_the_next_train_texts_without_labels(tiny_task):
    ctx = Context(task=tiny_task, seed=0, show_progress=False)
    cfg = DistillConfig.model_validate({**TINY, "losses": ["soft", "hard"], "unlabeled_samples": 20})
    record: dict = {}
    task, applied = distill_augment.transfer_data(cfg, ctx, record)
    train, seen = tiny_task.split("train"), task.split("train")
    assert seen.texts == train.texts[:52] and applied.max_train_samples is None      # the cap was applied here
    assert seen.labels == train.labels[:32] + [NO_LABEL] * 20
    assert record == {"unlabeled": {"labelled": 32, "unlabeled": 20}}
    left = len(train) - 32
    too_many = cfg.model_copy(update={"unlabeled_samples": left + 1})
    with pytest.raises(UserError, match=f"more train texts than the {left} after the 32 labelled") as err:
        distill_augment.transfer_data(too_many, ctx, {})
    assert "\n" not in str(err.value)


def test_distill_structure_learns_unlabeled_texts_from_the_teacher(bert_bundle, tiny_task, tiny_bert_dir):
    ctx = Context(task=tiny_task, seed=0, show_progress=False, teacher_source=LazyTeacher.from_dir(tiny_bert_dir))
    cfg = parse_step({"distill-structure": {"kind": "cnn", "embedding_dim": 16, "filters": 8, "alpha": 0.5,
                                            **TINY, "unlabeled_samples": 16}}, "v").config
    out = apply_pass(bert_bundle, "distill-structure", cfg, ctx)
    assert out.deploy["distill-structure"]["unlabeled"] == {"labelled": 32, "unlabeled": 16}
    # with alpha 1 (labels alone) or without soft targets nothing would learn the unlabeled texts
    with pytest.raises(UserError, match="alpha < 1"):
        parse_step({"distill-structure": {"kind": "cnn", "alpha": 1.0, "unlabeled_samples": 8}}, "v")
    with pytest.raises(UserError, match="expected soft among the losses"):
        parse_step({"distill": {"losses": ["hard", "hidden"], "unlabeled_samples": 8}}, "v")


@pytest.mark.parametrize("name, step", [
    ("distill", {"losses": ["soft"]}),
    ("distill-structure", {"kind": "cnn"}),
])
def test_augment_is_refused_up_front_on_a_pair_task_or_a_masked_lm_without_its_head(name, step, tiny_bert_dir,
                                                                                     mlm_dir, tmp_path):
    """The refusals the run would meet when the step trains, met by its up-front check."""
    from compressor.passes.registry import Known, shape_after, shape_of
    teacher = shape_of(tiny_bert_dir)

    def check(mlm, pair_task: bool):
        config = parse_step({name: {**step, "augment": {"copies": 1, "mlm": str(mlm)}}}, "v").config
        return shape_after(name, config, Known(model=teacher, teacher=teacher, pair_task=pair_task))
    check(mlm_dir, pair_task=False)                                     # accepted
    with pytest.raises(UserError, match="^augment noises single texts; expected a single-text task"):
        check(mlm_dir, pair_task=True)
    with pytest.raises(UserError, match="no trained masked-LM head"):
        check(tiny_bert_dir, pair_task=False)                           # a classifier
    check(tmp_path / "nope", pair_task=False)       # missing: left to the run's check for missing inputs
