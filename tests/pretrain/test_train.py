"""The shared training loop: learning, embedding update modes, schedule, seeding, step counts,
step-based batch sources, callbacks, checkpoints and exact resume."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from pretrain.batching import Encoded, collate, encode
from pretrain.data import Split
from pretrain.errors import UserError
from pretrain.train import (CHECKPOINT_FILE, Checkpointing, StepBatches, TrainConfig, task_loss, train,
                            warmup_then_linear_decay)

FILLER = ("the", "a", "small", "green", "house", "river", "walks", "slowly", "near", "old", "blue", "road")


def toy_split(n: int = 64, seed: int = 0) -> Split:
    """Label 1 iff the sentence contains 'apple', else it contains 'engine': learnable from one token."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(2, 7))]
        label = i % 2
        words.insert(rng.randint(0, len(words)), "apple" if label else "engine")
        texts.append(" ".join(words))
        labels.append(label)
    return Split(texts, labels)


@pytest.fixture(scope="module")
def toy(tokenizer):
    return encode(tokenizer, toy_split())


def cfg(**kw) -> TrainConfig:
    base = dict(epochs=1, batch_size=16, lr=1e-3, warmup_ratio=0.0, embedding_updates="dense")
    return TrainConfig(**{**base, **kw})


def word_embedding(model) -> torch.Tensor:
    return model.get_input_embeddings().weight.detach().clone()


def test_loss_decreases_on_a_learnable_task(make_tiny_bert, toy):
    model = make_tiny_bert()
    result = train(model, toy, cfg(epochs=12, lr=3e-3), show_progress=False)
    assert result.steps == 48 and len(result.losses) == 48
    first, last = np.mean(result.losses[:5]), np.mean(result.losses[-5:])
    assert last < 0.5 * first, (first, last)
    assert result.samples == 12 * 64
    assert not model.training                      # left in eval mode
    with torch.no_grad():
        batch = {k: torch.tensor(v) for k, v in [("input_ids", [toy.input_ids[0]])]}
        pred = model(**batch).logits.argmax(-1).item()
    assert pred == toy.labels[0]


def test_bf16_runs_the_products_in_bfloat16_and_keeps_fp32_weights(make_tiny_bert, toy):
    """Mixed precision: Linear outputs are bfloat16 inside the step, the weights, their gradients
    and what the optimizer updates stay fp32, and the model still learns."""
    model = make_tiny_bert()
    dtypes = set()
    hook = model.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda module, args, output: dtypes.add(output.dtype))
    grads = set()
    for param in model.parameters():
        param.register_hook(lambda grad: grads.add(grad.dtype))
    result = train(model, toy, cfg(epochs=12, lr=3e-3, precision="bf16"), show_progress=False)
    hook.remove()
    assert dtypes == {torch.bfloat16} and grads == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert np.mean(result.losses[-5:]) < 0.5 * np.mean(result.losses[:5])
    assert not torch.is_autocast_enabled("cpu")                # nothing left on after the run
    plain, dtypes = make_tiny_bert(), set()
    plain.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda module, args, output: dtypes.add(output.dtype))
    train(plain, toy, cfg(), show_progress=False)
    assert dtypes == {torch.float32}                            # fp32, the default


def test_frozen_embeddings_do_not_change(make_tiny_bert, toy):
    model = make_tiny_bert()
    before = word_embedding(model)
    head_before = model.classifier.weight.detach().clone()
    seen = []

    def loss_fn(m, batch):
        seen.append(m.get_input_embeddings().weight.requires_grad)
        return task_loss(m, batch)
    train(model, toy, cfg(embedding_updates="frozen"), loss_fn=loss_fn, show_progress=False)
    assert seen and not any(seen)                 # frozen while training
    assert torch.equal(word_embedding(model), before)
    assert not torch.equal(model.classifier.weight, head_before)   # the rest did train
    assert model.get_input_embeddings().weight.requires_grad       # restored afterwards


def test_sparse_embeddings_change_only_rows_seen_in_training(make_tiny_bert, toy):
    model = make_tiny_bert()
    embedding = model.get_input_embeddings()
    assert embedding.sparse is False
    before = word_embedding(model)
    modes = []

    def loss_fn(m, batch):
        modes.append(m.get_input_embeddings().sparse)
        return task_loss(m, batch)
    train(model, toy, cfg(embedding_updates="sparse", epochs=2), loss_fn=loss_fn, show_progress=False)
    assert modes and all(modes)                   # sparse gradients while training
    assert embedding.sparse is False              # restored afterwards
    changed = set(torch.nonzero((word_embedding(model) != before).any(dim=1)).flatten().tolist())
    seen_ids = {t for ids in toy.input_ids for t in ids}
    assert changed, "no embedding row was updated"
    assert changed <= seen_ids, f"rows of unseen tokens changed: {sorted(changed - seen_ids)[:10]}"
    assert changed == seen_ids


def test_dense_embeddings_train_with_dense_gradients(make_tiny_bert, toy):
    model = make_tiny_bert()
    before = word_embedding(model)
    modes = []

    def loss_fn(m, batch):
        emb = m.get_input_embeddings()
        modes.append((emb.sparse, emb.weight.requires_grad))
        return task_loss(m, batch)
    result = train(model, toy, cfg(embedding_updates="dense"), loss_fn=loss_fn, show_progress=False)
    assert modes and all(m == (False, True) for m in modes)
    assert np.isfinite(result.losses).all()
    after = word_embedding(model)
    seen_ids = sorted({t for ids in toy.input_ids for t in ids})
    assert (after[seen_ids] != before[seen_ids]).any(dim=1).all()
    assert model.get_input_embeddings().sparse is False


def test_schedule_warms_up_then_decays_linearly_to_zero():
    f = warmup_then_linear_decay(TrainConfig(warmup_ratio=0.1), total_steps=100)
    assert [f(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert f(10) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.5)
    assert f(99) == pytest.approx(1 / 90)
    assert f(100) == 0.0
    values = [f(s) for s in range(101)]
    assert values.index(max(values)) in (9, 10)
    assert all(a <= b for a, b in zip(values[:10], values[1:11]))      # rises during warm-up
    assert all(a >= b for a, b in zip(values[10:], values[11:]))       # then never rises


def test_schedule_without_warmup_starts_at_full_rate():
    f = warmup_then_linear_decay(TrainConfig(warmup_ratio=0.0), total_steps=4)
    assert [f(s) for s in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def test_same_seed_gives_identical_weights(make_tiny_bert, toy):
    def trained(seed):
        model = make_tiny_bert(seed=0)        # same initial weights; dropout is on while training
        train(model, toy, cfg(seed=seed, embedding_updates="sparse"), show_progress=False)
        return model.state_dict()
    a, b, c = trained(7), trained(7), trained(8)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("epochs, steps, samples", [(0.5, 6, 48), (1, 12, 96), (2.25, 27, 216), (0.01, 1, 8)])
def test_fractional_epochs_give_expected_steps(make_tiny_bert, tokenizer, epochs, steps, samples):
    data = encode(tokenizer, toy_split(96))            # 12 batches of 8 per epoch
    seen = []

    def loss_fn(m, batch):
        seen.append(len(batch["input_ids"]))
        return task_loss(m, batch)
    result = train(make_tiny_bert(layers=1), data, cfg(epochs=epochs, batch_size=8), loss_fn=loss_fn,
                   show_progress=False)
    assert (result.steps, result.samples) == (steps, samples)
    assert len(seen) == steps and sum(seen) == samples


def test_empty_training_data_is_an_error(make_tiny_bert):
    empty = Encoded(input_ids=[], token_type_ids=None, labels=np.zeros(0, dtype=np.int64), pad_id=0)
    with pytest.raises(ValueError, match="no training examples"):
        train(make_tiny_bert(), empty, cfg(), show_progress=False)


@pytest.mark.parametrize("bad", [{"epochs": 0}, {"batch_size": 0}, {"lr": -1}, {"warmup_ratio": 1.0},
                                 {"embedding_updates": "lazy"}, {"unknown": 1}])
def test_train_config_rejects_bad_values(bad):
    with pytest.raises(ValidationError):
        TrainConfig(**bad)

@pytest.fixture(scope="module")
def toy48(tokenizer):
    return encode(tokenizer, toy_split(48))


def resume_cfg(**kw) -> TrainConfig:
    base = dict(epochs=2, batch_size=8, lr=1e-3, warmup_ratio=0.2, embedding_updates="sparse")
    return TrainConfig(**{**base, **kw})


def test_each_epoch_ends_with_its_partial_batch_as_documented(make_tiny_bert, tokenizer):
    # 100 examples in batches of 8: 13 steps an epoch (the last of 4), so every example is
    # seen once an epoch; 2 epochs are 26 steps, not ceil(2 * 100 / 8) = 25.
    result = train(make_tiny_bert(layers=1), encode(tokenizer, toy_split(100)), cfg(epochs=2, batch_size=8),
                   show_progress=False)
    assert (result.steps, result.samples) == (26, 200)
    doc = (Path(__file__).parents[2] / "TRAIN_API.md").read_text()
    assert "`ceil(epochs * ceil(len(data) / batch_size))` steps" in doc


def random_batches(toy48, steps: int, seed: int = 3) -> StepBatches:
    """A source whose batch is a pure function of the step, like a masking objective's."""
    def make(step: int):
        rng = np.random.default_rng((seed, step))
        return collate(toy48, rng.choice(len(toy48), size=6, replace=False))
    return StepBatches(steps=steps, make=make)


def test_step_source_runs_its_step_count_and_reports_tokens(make_tiny_bert, toy48):
    logs = []
    result = train(make_tiny_bert(), random_batches(toy48, 7), resume_cfg(warmup_ratio=0.5), show_progress=False,
                   callbacks=[logs.append])
    assert result.steps == 7 and result.samples == 42
    assert [log.step for log in logs] == list(range(1, 8))
    assert all(log.total_steps == 7 for log in logs)
    expected_tokens = sum(int(random_batches(toy48, 7).batch(s)["attention_mask"].sum()) for s in range(7))
    assert result.tokens == expected_tokens == logs[-1].tokens
    assert [log.loss for log in logs] == result.losses
    assert result.initial_loss == pytest.approx(np.mean(result.losses[:10]))
    assert result.tokens_per_second > 0
    assert [log.lr for log in logs[:4]] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])   # 3 warm-up steps


class Interrupt(Exception):
    pass


def stop_at(step: int):
    def callback(log):
        if log.step == step:
            raise Interrupt
    return callback


@pytest.mark.parametrize("source", ["epochs", "steps"])
def test_interrupted_run_resumes_exactly(make_tiny_bert, toy48, tmp_path, source):
    """Kill after step 8 (last checkpoint at 6), rerun: identical weights and losses to an
    uninterrupted run. Dropout is on, so this needs the RNG state; SparseAdam and AdamW
    moments and the schedule must come back too."""
    data = toy48 if source == "epochs" else random_batches(toy48, 12)
    reference = make_tiny_bert(seed=1)
    ref = train(reference, data, resume_cfg(), show_progress=False)
    assert ref.steps == 12

    ckpt = Checkpointing(directory=tmp_path / "ckpt", every_steps=3)
    with pytest.raises(Interrupt):
        train(make_tiny_bert(seed=1), data, resume_cfg(), show_progress=False, checkpoint=ckpt, callbacks=[stop_at(8)])
    saved = torch.load(tmp_path / "ckpt" / CHECKPOINT_FILE, weights_only=True)
    assert saved["progress"]["step"] == 6
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [CHECKPOINT_FILE]   # no temp file left

    resumed_steps = []
    model = make_tiny_bert(seed=1)
    result = train(model, data, resume_cfg(), show_progress=False, checkpoint=ckpt,
                   callbacks=[lambda log: resumed_steps.append(log.step)])
    assert resumed_steps == list(range(7, 13))
    assert result.steps == 12 and result.samples == ref.samples and result.tokens == ref.tokens
    assert result.losses == ref.losses
    a, b = reference.state_dict(), model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_of_other_settings_is_refused(make_tiny_bert, toy48, tmp_path):
    ckpt = Checkpointing(directory=tmp_path, every_steps=2)
    train(make_tiny_bert(), toy48, resume_cfg(epochs=0.5), show_progress=False, checkpoint=ckpt)
    before = (tmp_path / CHECKPOINT_FILE).read_bytes()
    with pytest.raises(UserError, match=r"other settings \(lr: 0\.001 -> 0\.0005\)") as error:
        train(make_tiny_bert(), toy48, resume_cfg(epochs=0.5, lr=5e-4), show_progress=False, checkpoint=ckpt)
    assert "\n" not in str(error.value)
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == before


def test_a_setting_the_checkpoint_lacks_is_named(make_tiny_bert, toy48, tmp_path):
    # a checkpoint of an earlier version, whose config had no dropout_masks yet
    ckpt = Checkpointing(directory=tmp_path, every_steps=2)
    train(make_tiny_bert(), toy48, resume_cfg(epochs=0.5), show_progress=False, checkpoint=ckpt)
    state = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    del state["fingerprint"]["config"]["dropout_masks"]
    torch.save(state, tmp_path / CHECKPOINT_FILE)
    with pytest.raises(UserError, match=r"dropout_masks: absent -> packed\)"):
        train(make_tiny_bert(), toy48, resume_cfg(epochs=0.5), show_progress=False, checkpoint=ckpt)


class Foreign:
    """Not a tensor, dict or number: torch.load(weights_only=True) refuses to unpickle it."""


@pytest.mark.parametrize("write", [lambda path: path.write_bytes(b"not a checkpoint"),
                                   lambda path: torch.save({"model": Foreign()}, path)], ids=["junk", "foreign"])
def test_unreadable_checkpoint_is_one_line_naming_what_to_do(make_tiny_bert, toy48, tmp_path, write):
    # torch's own message advises weights_only=False, i.e. running the file's code: never passed on.
    write(tmp_path / CHECKPOINT_FILE)
    with pytest.raises(UserError) as caught:
        train(make_tiny_bert(), toy48, resume_cfg(), show_progress=False, checkpoint=Checkpointing(directory=tmp_path))
    message = str(caught.value)
    assert message == (f"{tmp_path / CHECKPOINT_FILE} is not a readable training checkpoint (truncated, or not "
                       f"written by this tool); expected one a run of this tool wrote: delete {tmp_path} "
                       "to start the training over")


# --- hooks for compression passes: optimizer groups of their own, auxiliary modules ---

HEAD = ["classifier.weight", "classifier.bias"]


def capture_optimizers(monkeypatch):
    """The optimizers every train() call builds, in order."""
    from pretrain import train as train_module
    built = []
    real = train_module.make_optimizers

    def spy(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]
    monkeypatch.setattr(train_module, "make_optimizers", spy)
    return built


def group_of(optimizer, param) -> dict:
    (group,) = [g for g in optimizer.param_groups if any(p is param for p in g["params"])]
    return group


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_param_groups_get_their_own_options(make_tiny_bert, toy48, monkeypatch, optimizer):
    model = make_tiny_bert()
    built = capture_optimizers(monkeypatch)
    logs = []
    train(model, toy48, resume_cfg(epochs=0.5, warmup_ratio=0.0, optimizer=optimizer, embedding_updates="sparse"),
          show_progress=False,
          param_groups=lambda m: [{"params": HEAD, "lr": 0.5, "weight_decay": 0.0}], callbacks=[logs.append])
    opt = built[0][0]
    head = group_of(opt, model.classifier.weight)
    assert head["initial_lr"] == 0.5 and head["weight_decay"] == 0.0
    assert group_of(opt, model.classifier.bias) is head
    assert len(head["params"]) == 2
    # everything else as before: the config's rate; decay on matrices (AdamW: none on biases)
    query = model.bert.encoder.layer[0].attention.self.query
    assert group_of(opt, query.weight)["initial_lr"] == 1e-3
    assert group_of(opt, query.weight)["weight_decay"] == 0.01
    assert group_of(opt, query.bias)["weight_decay"] == (0.0 if optimizer == "adamw" else 0.01)
    assert logs[0].lr == 1e-3                        # StepLog still reports the config's rate
    grouped = sum(len(g["params"]) for g in opt.param_groups)
    expected = sum(1 for p in model.parameters() if p.requires_grad)
    expected -= 1 if optimizer == "adamw" else 0     # the sparse word embedding is SparseAdam's
    assert grouped == expected                      # each parameter in exactly one group


def test_param_group_options_left_out_are_the_configs(make_tiny_bert, toy48, monkeypatch):
    model = make_tiny_bert()
    built = capture_optimizers(monkeypatch)
    train(model, toy48, resume_cfg(epochs=0.25, weight_decay=0.2), show_progress=False,
          param_groups=lambda m: [{"params": HEAD, "lr": 0.5}])
    assert group_of(built[0][0], model.classifier.weight)["weight_decay"] == 0.2


@pytest.mark.parametrize("names, why", [(["classifier.nope"], "does not have"),
                                        (HEAD + ["classifier.bias"], "twice"),
                                        (["bert.embeddings.word_embeddings.weight"], "sparse word embedding")])
def test_param_groups_that_do_not_fit_the_model_are_refused(make_tiny_bert, toy48, names, why):
    with pytest.raises(ValueError, match=why):
        train(make_tiny_bert(), toy48, resume_cfg(epochs=0.25), show_progress=False,
              param_groups=lambda m: [{"params": names, "lr": 0.1}])


def test_aux_modules_are_lent_frozen_on_the_device_and_returned(make_tiny_bert, toy48, monkeypatch):
    model, teacher = make_tiny_bert(seed=0), make_tiny_bert(seed=1)
    teacher.train()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    built = capture_optimizers(monkeypatch)
    seen = []

    def loss_fn(m, batch):
        with torch.no_grad():
            target = teacher(**{k: v for k, v in batch.items() if k != "labels"}).logits.softmax(-1)
        seen.append((teacher.training, any(p.requires_grad for p in teacher.parameters()),
                     next(teacher.parameters()).device == batch["input_ids"].device))
        return torch.nn.functional.cross_entropy(m(**batch).logits, target)
    train(model, toy48, resume_cfg(epochs=0.5), loss_fn=loss_fn, show_progress=False, aux_modules=[teacher])
    assert seen and all(s == (False, False, True) for s in seen)
    teacher_params = {id(p) for p in teacher.parameters()}
    in_optimizers = {id(p) for opt in built[0] for g in opt.param_groups for p in g["params"]}
    assert not teacher_params & in_optimizers
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
    # lent, not kept: its mode and flags come back
    assert teacher.training and all(p.requires_grad for p in teacher.parameters())


def test_an_aux_module_that_is_part_of_the_model_is_refused(make_tiny_bert, toy48):
    model = make_tiny_bert()
    with pytest.raises(ValueError, match="shares parameters"):
        train(model, toy48, resume_cfg(epochs=0.25), show_progress=False, aux_modules=[model.classifier])
    assert model.classifier.weight.requires_grad


def test_a_diverged_run_stops_with_one_line_instead_of_saving_nan_weights(make_tiny_bert, toy):
    from pretrain.errors import UserError
    model = make_tiny_bert()
    diverging = lambda m, batch: m(**batch).loss * float("nan")     # noqa: E731
    with pytest.raises(UserError, match="the loss is nan at step 1 of 4: training diverged; expected a smaller"):
        train(model, toy, cfg(), loss_fn=diverging, show_progress=False)


@pytest.mark.parametrize("lr", [float("inf"), float("nan")])
def test_a_learning_rate_that_is_no_number_is_refused(lr):
    from pydantic import ValidationError
    with pytest.raises(ValidationError):
        cfg(lr=lr)


@pytest.mark.parametrize("field", ["epochs", "lr", "weight_decay", "max_grad_norm", "domain_lr", "adapter_init_std"])
def test_fine_tuning_settings_that_are_no_number_are_refused(field):
    """inf passed every `gt=0` bound and crashed mid-run (epochs: OverflowError counting steps)."""
    from pydantic import ValidationError

    from pretrain.finetune import FinetuneConfig
    extra = {"domain_corpus": "wordnet"} if field == "domain_lr" else {}
    for value in (float("inf"), float("nan")):
        with pytest.raises(ValidationError, match="finite number"):
            FinetuneConfig(**{field: value, **extra})


def test_sgd_trains_sparse_embeddings_under_default_weight_decay(make_tiny_bert, toy, monkeypatch):
    # SGD's weight decay adds a dense tensor to each gradient, which a sparse one refuses:
    # the sparse word embedding goes without decay (as under SparseAdam), the rest keeps it.
    model = make_tiny_bert()
    built = capture_optimizers(monkeypatch)
    before = word_embedding(model)
    result = train(model, toy, cfg(optimizer="sgd", embedding_updates="sparse", lr=0.1), show_progress=False)
    assert result.steps == 4 and all(np.isfinite(result.losses))
    (opt,) = built[0]
    assert group_of(opt, model.get_input_embeddings().weight)["weight_decay"] == 0.0
    assert group_of(opt, model.classifier.weight)["weight_decay"] == TrainConfig().weight_decay > 0
    changed = set(torch.nonzero((word_embedding(model) != before).any(dim=1)).flatten().tolist())
    assert changed == {t for ids in toy.input_ids for t in ids}


def test_clipping_through_fused_adamws_grad_scale_matches_scaling_the_gradients(make_tiny_bert, toy, monkeypatch):
    import pretrain.train as train_module

    def trained(max_grad_norm, fold=True):
        monkeypatch.setattr(train_module, "takes_grad_scale", lambda opt: fold and opt.defaults.get("fused", False))
        model = make_tiny_bert()
        train(model, toy, cfg(epochs=2, max_grad_norm=max_grad_norm), show_progress=False)
        return torch.cat([p.detach().flatten() for p in model.parameters()])
    folded, scaled, unclipped = trained(0.05), trained(0.05, fold=False), trained(None)
    assert not torch.allclose(folded, unclipped, atol=1e-4)     # the norm 0.05 does clip
    assert torch.allclose(folded, scaled, atol=1e-6)
