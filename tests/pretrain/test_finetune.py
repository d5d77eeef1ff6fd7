"""Fine-tuning with strategies, two-stage and multi-task, on the tiny real tasks."""

from __future__ import annotations

import csv
import random

import pytest
import torch

from pretrain.data import load_task
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig, MultiTaskBatches, finetune, with_head, with_run_defaults
from pretrain.batching import encode
from pretrain.models import count_params
from pretrain.train import CHECKPOINT_FILE, Checkpointing, TrainConfig, task_loss

QUICK = dict(epochs=1, batch_size=16, lr=1e-3, warmup_ratio=0.0)


def write_task(path, texts, labels):
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(zip(texts, labels))
    return {"path": str(path)}


@pytest.fixture(scope="module")
def other_tasks(tiny_task, tmp_path_factory):
    """Same glosses, other labels: disjoint ('long'/'short'), clashing (shares 'noun.animal')."""
    root = tmp_path_factory.mktemp("other-tasks")
    texts = tiny_task.split("train").texts[:120]
    rng = random.Random(0)
    return {
        "disjoint": write_task(root / "length.csv", texts, ["long" if len(t) > 60 else "short" for t in texts]),
        "clash": write_task(root / "clash.csv", texts, [rng.choice(["noun.animal", "other"]) for _ in texts]),
    }


def changed(before: dict, model) -> set[str]:
    after = model.state_dict()
    return {k for k in before if not torch.equal(before[k], after[k])}


@pytest.mark.parametrize("strategy", ["frozen", "scalar-mix", "adapters"])
def test_strategies_train_only_their_parameters(bert_bundle, tiny_task, strategy):
    model = bert_bundle.copy_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = finetune(model, bert_bundle.tokenizer, tiny_task,
                      FinetuneConfig(**QUICK, strategy=strategy, adapter_size=8), show_progress=False)
    moved = changed(before, model)
    assert {"classifier.weight", "classifier.bias"} <= moved
    encoder_moved = {k for k in moved if k.startswith("bert.")}
    if strategy == "adapters":
        assert encoder_moved and all("LayerNorm" in k for k in encoder_moved)   # + new adapter weights
        assert any(".adapter." in n for n, _ in model.named_parameters())
    else:
        assert not encoder_moved
    assert result.total_params == count_params(model)
    assert 0 < result.trainable_params < 0.2 * result.total_params
    assert all(p.requires_grad for p in model.parameters())          # nothing left frozen afterwards


def test_new_adapters_start_from_the_runs_seed_not_from_what_ran_before(bert_bundle, tiny_task):
    """A resumed recipe skips the cached stages that ran first: the adapters it adds must not
    depend on the random numbers those stages drew."""
    cfg = FinetuneConfig(epochs=0.1, batch_size=16, lr=1e-3, strategy="adapters", adapter_size=8, seed=3)
    trained = []
    for draws_before in (0, 1000):
        torch.rand(draws_before)                      # what an earlier stage in the process used
        model = bert_bundle.copy_model()
        finetune(model, bert_bundle.tokenizer, tiny_task, cfg, show_progress=False)
        trained.append({k: v.clone() for k, v in model.state_dict().items() if ".adapter." in k})
    assert trained[0] and all(torch.equal(trained[0][k], trained[1][k]) for k in trained[0])


def test_a_frozen_word_embedding_is_not_counted_as_trainable(bert_bundle, tiny_task):
    model = bert_bundle.copy_model()
    table = model.get_input_embeddings().weight.detach().clone()
    result = finetune(model, bert_bundle.tokenizer, tiny_task,
                      FinetuneConfig(**QUICK, embedding_updates="frozen"), show_progress=False)
    assert torch.equal(table, model.get_input_embeddings().weight)
    assert result.trainable_params == count_params(model) - table.numel()


def test_full_strategy_trains_everything_and_reports_it(bert_bundle, tiny_task):
    model = bert_bundle.copy_model()
    result = finetune(model, bert_bundle.tokenizer, tiny_task, FinetuneConfig(**QUICK), show_progress=False)
    assert result.trainable_params == result.total_params == count_params(model)
    assert result.trainable_percent == 100.0 and len(result.stages) == 1


def test_two_stage_trains_the_encoder_on_the_intermediate_task_first(bert_bundle, tiny_task, other_tasks):
    model = bert_bundle.copy_model()
    head = model.classifier.weight.detach().clone()
    cfg = FinetuneConfig(**QUICK, intermediate_task=other_tasks["disjoint"])
    result = finetune(model, bert_bundle.tokenizer, tiny_task, cfg, show_progress=False)
    assert [s["task"] for s in result.stages] == ["length", "tiny"]
    assert result.stages[0]["samples"] == 96 and result.stages[1]["samples"] == 240
    assert model.classifier.out_features == len(tiny_task.label_names)   # the target's head is kept
    assert not torch.equal(head, model.classifier.weight)


@pytest.mark.parametrize("which, message", [("clash", "labels clash"), ("target", "target task itself")])
def test_intermediate_task_clashes_are_refused_before_training(bert_bundle, tiny_task, tiny_csv, other_tasks,
                                                               which, message):
    spec = {"path": str(tiny_csv)} if which == "target" else other_tasks[which]
    model = bert_bundle.copy_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UserError, match=message):
        finetune(model, bert_bundle.tokenizer, tiny_task, FinetuneConfig(**QUICK, intermediate_task=spec),
                 show_progress=False)
    assert not changed(before, model)


def test_multi_task_mixes_batches_and_keeps_target_steps(bert_bundle, tiny_task, other_tasks):
    model = bert_bundle.copy_model()
    cfg = FinetuneConfig(**QUICK, tasks=({"path": str(tiny_task.spec["path"])}, other_tasks["disjoint"]))
    result = finetune(model, bert_bundle.tokenizer, tiny_task, cfg, show_progress=False)
    assert result.train.steps == 15                   # 240 target examples / 16, as single-task
    assert result.train.samples == 15 * 32            # each step: 16 target + 16 other
    assert result.stages[0]["task"] == "tiny+length"


def test_multi_task_batches_hold_every_task_and_share_the_encoder(bert_bundle, tiny_task, other_tasks):
    other = load_task(other_tasks["disjoint"])
    data = [encode(bert_bundle.tokenizer, t.split("train")) for t in (tiny_task, other)]
    source = MultiTaskBatches(data, TrainConfig(**QUICK), with_token_types=True)
    batch = source.batch(3)
    assert batch["task"].tolist() == [0] * 16 + [1] * 16
    widths = {v.shape[1] for k, v in batch.items() if v.ndim == 2}
    assert len(widths) == 1
    model = bert_bundle.copy_model()
    twin = with_head(model, other.label_names, seed=1)
    assert twin.bert is model.bert and twin.classifier.out_features == 2


def test_multi_task_listing_only_the_target_is_an_error(bert_bundle, tiny_task):
    cfg = FinetuneConfig(**QUICK, tasks=(tiny_task.spec,))
    with pytest.raises(UserError, match="at least one other task"):
        finetune(bert_bundle.copy_model(), bert_bundle.tokenizer, tiny_task, cfg, show_progress=False)


def test_unknown_strategy_lists_the_known_ones():
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="full.*frozen.*scalar-mix.*adapters"):
        FinetuneConfig(strategy="lora")


def test_models_with_few_positions_fine_tune_and_evaluate_within_them(tokenizer, tiny_task):
    """An ELECTRA pretrained with --max-length 16 has 16 positions: longer glosses are cut
    to fit, not fed past the position table (which raised a size mismatch)."""
    from transformers import ElectraConfig, ElectraForSequenceClassification
    from pretrain.batching import usable_length
    from pretrain.finetune import evaluate
    torch.manual_seed(0)
    model = ElectraForSequenceClassification(ElectraConfig(
        vocab_size=len(tokenizer), embedding_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=16, num_labels=len(tiny_task.label_names)))
    assert max(len(tokenizer(t)["input_ids"]) for t in tiny_task.split("test").texts) > 16
    assert usable_length(model, 128) == 16
    result = finetune(model, tokenizer, tiny_task, FinetuneConfig(**QUICK), show_progress=False)
    assert result.train.steps > 0
    metrics, predictions = evaluate(model, tokenizer, tiny_task.split("test"))
    assert len(predictions) == len(tiny_task.split("test").labels) and 0 <= metrics["accuracy"] <= 1


# --- the run's defaults, and the target stage's hooks ---

@pytest.mark.parametrize("own, run, expected", [
    ({}, (5, 24), (5, 24)),                                        # both from the run
    ({"seed": 0, "max_train_samples": 16}, (5, 24), (0, 16)),      # the config's own win (even seed 0)
    ({}, (5, None), (5, None)),                                    # no run limit: the whole split
])
def test_run_defaults_fill_only_what_the_config_leaves_unset(own, run, expected):
    cfg = FinetuneConfig(epochs=1, **own)
    filled = with_run_defaults(cfg, *run)
    assert (filled.seed, filled.max_train_samples) == expected
    assert type(filled) is FinetuneConfig and filled.epochs == 1
    assert cfg == FinetuneConfig(epochs=1, **own)                  # the input stays as it was


def test_loss_fn_callbacks_and_checkpoint_apply_to_the_target_stage_only(bert_bundle, tiny_task, other_tasks,
                                                                         tmp_path):
    model = bert_bundle.copy_model()
    calls, logs = [], []

    def loss_fn(m, batch):
        calls.append(len(batch["labels"]))
        return task_loss(m, batch)
    cfg = FinetuneConfig(**QUICK, max_train_samples=64, intermediate_task=other_tasks["disjoint"])
    result = finetune(model, bert_bundle.tokenizer, tiny_task, cfg, show_progress=False, loss_fn=loss_fn,
                      callbacks=[logs.append], checkpoint=Checkpointing(directory=tmp_path, every_steps=2))
    assert result.stages[0]["steps"] == 4 and result.train.steps == 4     # intermediate, then target
    assert len(calls) == 4 and sum(calls) == 64                           # the target's batches only
    assert [log.step for log in logs] == [1, 2, 3, 4] and logs[0].total_steps == 4
    saved = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    assert saved["progress"]["step"] == 4 and saved["progress"]["samples"] == 64


def test_a_custom_loss_with_partner_tasks_is_refused(bert_bundle, tiny_task, other_tasks):
    cfg = FinetuneConfig(**QUICK, tasks=(other_tasks["disjoint"],))
    with pytest.raises(ValueError, match="custom loss_fn"):
        finetune(bert_bundle.copy_model(), bert_bundle.tokenizer, tiny_task, cfg, show_progress=False,
                 loss_fn=lambda m, b: task_loss(m, b))


# Written out, not read from DEFAULT_LR: a changed default must fail here and be re-justified.
EXPECTED_DEFAULT_LR = {"full": 1e-4, "adapters": 1e-3, "frozen": 3e-2, "scalar-mix": 3e-2}


@pytest.mark.parametrize("strategy", sorted(EXPECTED_DEFAULT_LR))
def test_unset_lr_is_the_strategys_default(strategy):
    cfg = FinetuneConfig(strategy=strategy)
    assert cfg.lr == EXPECTED_DEFAULT_LR[strategy]
    assert FinetuneConfig(strategy=strategy, lr=None).lr == EXPECTED_DEFAULT_LR[strategy]
    assert cfg.model_dump()["lr"] == EXPECTED_DEFAULT_LR[strategy]          # what metrics.json's config shows
    assert FinetuneConfig.model_validate(cfg.model_dump(mode="json")) == cfg   # a dump validates back the same


def test_heads_on_frozen_features_get_more_than_the_rate_that_left_them_at_the_majority_class():
    # at 1e-3 frozen and scalar-mix predicted the majority class (benchmarks/README.md)
    assert FinetuneConfig(strategy="frozen").lr > 1e-3 and FinetuneConfig(strategy="scalar-mix").lr > 1e-3


@pytest.mark.parametrize("strategy", ["full", "adapters", "frozen"])
def test_an_explicit_lr_wins_over_the_strategys_default(strategy):
    assert FinetuneConfig(strategy=strategy, lr=3e-4).lr == 3e-4
    assert FinetuneConfig(strategy=strategy, lr=1e-4).lr == 1e-4


def test_finetune_trains_at_the_resolved_rate(bert_bundle, tiny_task, trained_rates):
    cfg = FinetuneConfig(epochs=1, batch_size=16, strategy="frozen", max_train_samples=16)
    finetune(bert_bundle.copy_model(), bert_bundle.tokenizer, tiny_task, cfg, show_progress=False)
    assert trained_rates == [EXPECTED_DEFAULT_LR["frozen"]]


def without_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_prob"):
            module.dropout_prob = 0.0
    return model


def test_the_last_layer_trains_on_the_first_token_to_the_same_weights(bert_bundle, tiny_task):
    """Same batches, no dropout: the first-token last layer changes the cost, not the result."""
    trained = {}
    for first_token in (True, False):
        model = without_dropout(bert_bundle.copy_model())
        result = finetune(model, bert_bundle.tokenizer, tiny_task,
                          FinetuneConfig(**QUICK, cls_only_last_layer=first_token), show_progress=False)
        trained[first_token] = (model.state_dict(), result)
        assert "forward" not in vars(model.bert.encoder.layer[-1])     # the model's own layer is back
    (first, on), (whole, off) = trained[True], trained[False]
    assert on.last_layer_skipped is None and "not asked" in off.last_layer_skipped
    assert on.train.steps == off.train.steps and on.train.steps > 1
    for name in whole:
        torch.testing.assert_close(first[name], whole[name], atol=2e-5, rtol=1e-4)
    assert any(not torch.equal(first[n], bert_bundle.model.state_dict()[n]) for n in first)


@pytest.mark.parametrize("strategy, reason", [("scalar-mix", "scalar-mix"), ("adapters", None)])
def test_strategies_whose_head_reads_more_keep_the_whole_last_layer(bert_bundle, tiny_task, strategy, reason):
    model = bert_bundle.copy_model()
    result = finetune(model, bert_bundle.tokenizer, tiny_task, FinetuneConfig(**QUICK, strategy=strategy, adapter_size=8),
                      show_progress=False)
    assert (result.last_layer_skipped is None) if reason is None else (reason in result.last_layer_skipped)
    assert "forward" not in vars(model.bert.encoder.layer[-1])


def test_a_custom_loss_keeps_the_whole_last_layer(bert_bundle, tiny_task):
    seen = []

    def reads_hidden_states(model, batch):
        out = model(**batch, output_hidden_states=True)
        seen.append(out.hidden_states[-1].shape[1])
        return out.loss
    result = finetune(bert_bundle.copy_model(), bert_bundle.tokenizer, tiny_task, FinetuneConfig(**QUICK),
                      show_progress=False, loss_fn=reads_hidden_states)
    assert "loss" in result.last_layer_skipped and min(seen) > 1
