"""prune-magnitude and prune-movement: exact sparsity, the cubic schedule, masks that hold
through training, straight-through scores, a plain model at the end, refusals up front.

(The contract test runs both passes through save, reload and the ONNX export gate.)"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from compressor.bundle import ModelBundle
from compressor.modeling.cost import encoder_linears, encoder_sparsity
from compressor.passes import Context, LazyTeacher, apply_pass, get_pass
from compressor.passes import sparsity as sparsity_passes
from compressor.passes.distill_losses import TeacherLogits
from compressor.passes.sparsity import CubicSchedule, Pruner
from compressor.pipeline.recipe import parse_step
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig, finetune
from pretrain.models import encoder_layers

TRAIN = {"epochs": 1, "batch_size": 32, "lr": 1e-3, "max_train_samples": 96}   # 3 steps


def _run(bundle, name, tiny_task, **config):
    cfg = get_pass(name).config_type.model_validate(config)
    return apply_pass(bundle, name, cfg, Context(task=tiny_task, seed=0, show_progress=False))


def _zeros(model) -> dict[str, int]:
    return {name: int((m.weight == 0).sum()) for name, m in encoder_linears(model).items()}


@pytest.fixture
def finetune_calls(monkeypatch) -> list[dict]:
    """The keyword arguments of every call the passes make to finetune (which still runs)."""
    calls: list[dict] = []
    real = sparsity_passes.finetune

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(sparsity_passes, "finetune", spy)
    return calls


def _stable_sort_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    keep = round((1 - sparsity) * scores.numel())
    mask = torch.zeros_like(scores)
    mask[torch.sort(scores, descending=True, stable=True).indices[:keep]] = 1
    return mask


def _scores(kind: str, n: int) -> torch.Tensor:
    """Score vectors the masks meet: weights, |weights| with pruned zeros, untrained movement
    scores (all 0), rounded values (many ties), and a vector whose strided sample misleads."""
    values = torch.randn(n, generator=torch.Generator().manual_seed(n))
    if kind == "zeros":
        values = values.abs() * (torch.arange(n) % 3 != 0)
    elif kind == "constant":
        values = torch.zeros(n)
    elif kind == "rounded":
        values = (values * 4).round()
    elif kind == "misleading":   # every sampled position holds the largest value
        values[::max(1, n // sparsity_passes.SAMPLE)] = 100.0
    return values


@pytest.mark.parametrize("n", [3_000, 147_456])   # ranked whole; bracketed by a sample
@pytest.mark.parametrize("kind", ["normal", "zeros", "constant", "rounded", "misleading"])
def test_top_k_mask_keeps_exactly_the_largest_and_the_first_of_ties(n, kind):
    scores = _scores(kind, n)
    for sparsity in (0.0, 1e-4, 0.1, 0.5, 0.9, 0.97, 0.99999):
        mask = sparsity_passes.top_k_mask(scores, sparsity)
        assert torch.equal(mask, _stable_sort_mask(scores, sparsity)), (kind, sparsity)


def test_cubic_schedule_values():
    s = CubicSchedule(initial=0.0, final=0.9, total=100, warmup=10, cooldown=20)
    assert [s(t) for t in (0, 9, 10)] == [0.0, 0.0, 0.0]
    assert s(45) == pytest.approx(0.9 - 0.9 * 0.5 ** 3)    # halfway through the 70-step ramp
    assert s(79) == pytest.approx(0.9 - 0.9 * (1 / 70) ** 3)
    assert s(80) == s(100) == 0.9
    values = [s(t) for t in range(101)]
    assert values == sorted(values)


def test_schedule_for_uses_default_shares_and_oneshot():
    cfg = sparsity_passes.MagnitudeConfig(sparsity=0.8)
    assert sparsity_passes.schedule_for(cfg, 50) == CubicSchedule(0.0, 0.8, 50, 5, 10)
    oneshot = sparsity_passes.schedule_for(cfg.model_copy(update={"schedule": "oneshot"}), 50)
    assert oneshot(0) == oneshot(25) == 0.8


@pytest.mark.parametrize("scope", ["per_layer", "global"])
def test_oneshot_reaches_the_sparsity_exactly(bert_bundle, tiny_task, scope):
    out = _run(bert_bundle, "prune-magnitude", tiny_task, sparsity=0.7, epochs=0, scope=scope)
    sizes = {n: m.weight.numel() for n, m in encoder_linears(out.model).items()}
    zeros = _zeros(out.model)
    if scope == "per_layer":
        assert zeros == {n: round(0.7 * size) for n, size in sizes.items()}
    else:
        assert sum(zeros.values()) == round(0.7 * sum(sizes.values()))
        assert len({zeros[n] / sizes[n] for n in sizes}) > 1          # matrices pruned unequally
        before = encoder_linears(bert_bundle.model)
        pruned = torch.cat([before[n].weight[m.weight == 0].abs() for n, m in encoder_linears(out.model).items()])
        kept = torch.cat([m.weight[m.weight != 0].abs() for m in encoder_linears(out.model).values()])
        assert pruned.max() <= kept.min()                               # the smallest |W| went
    # everything outside the encoder Linears is untouched
    before = bert_bundle.model.state_dict()
    assert torch.equal(out.model.state_dict()["classifier.weight"], before["classifier.weight"])
    assert torch.equal(out.model.state_dict()["bert.pooler.dense.weight"], before["bert.pooler.dense.weight"])


def test_masks_hold_through_training(bert_bundle, tiny_task):
    """After every optimizer step the pruned weights are exactly zero, at the schedule's sparsity."""
    model = bert_bundle.copy_model()
    pruner = Pruner(model, "magnitude", "per_layer")
    schedule = CubicSchedule(0.0, 0.6, total=6, warmup=1, cooldown=1)
    pruner.update(schedule(0))
    seen = []

    def check(log):
        for linear in pruner.linears.values():
            weight = linear.parametrizations.weight.original
            mask = pruner.site(linear).mask
            assert torch.all(weight[mask == 0] == 0)
            assert int((mask == 0).sum()) == round(schedule(log.step) * mask.numel())
        seen.append(encoder_sparsity_of(pruner))
    cfg = FinetuneConfig(epochs=2, batch_size=32, lr=1e-2, max_train_samples=96)
    finetune(model, bert_bundle.tokenizer, tiny_task, cfg, show_progress=False,
             callbacks=[pruner.step_callback(schedule), check])
    assert len(seen) == 6 and seen == sorted(seen) and seen[-1] == pytest.approx(0.6, abs=1e-3)


def encoder_sparsity_of(pruner: Pruner) -> float:
    masks = [pruner.site(linear).mask for linear in pruner.linears.values()]
    return sum(int((m == 0).sum()) for m in masks) / sum(m.numel() for m in masks)


@pytest.mark.parametrize("name", ["prune-magnitude", "prune-movement"])
def test_gradual_pruning_leaves_a_plain_model_with_real_zeros(bert_bundle, tiny_task, tmp_path, name):
    out = _run(bert_bundle, name, tiny_task, sparsity=0.5, **TRAIN)
    state = out.model.state_dict()
    assert state.keys() == bert_bundle.model.state_dict().keys()
    assert not any(k for k in state if "parametriz" in k or "mask" in k or "score" in k or k.endswith("_orig"))
    assert not any(hasattr(m, "parametrizations") or m._forward_pre_hooks for m in out.model.modules())
    assert encoder_sparsity(out.model) == pytest.approx(0.5, abs=1e-3)
    loaded = ModelBundle.load(out.save(tmp_path / "pruned"))
    assert _zeros(loaded.model) == _zeros(out.model)


def test_movement_scores_get_the_straight_through_gradient(bert_bundle, tiny_task):
    """dL/dS = dL/dW' * W, also where the mask is 0 (a pruned weight can come back)."""
    model = bert_bundle.copy_model()
    pruner = Pruner(model, "movement", "per_layer")
    for linear in pruner.linears.values():
        torch.nn.init.normal_(pruner.site(linear).scores)
    pruner.update(0.5)
    batch = bert_bundle.tokenizer(list(tiny_task.split("train").texts[:8]), padding=True, return_tensors="pt")
    model(**batch, labels=torch.tensor(tiny_task.split("train").labels[:8])).loss.backward()
    linear = next(iter(pruner.linears.values()))
    weight, mask = linear.parametrizations.weight.original, pruner.site(linear).mask
    scores_grad, weight_grad = pruner.site(linear).scores.grad, weight.grad
    kept = mask == 1
    torch.testing.assert_close(scores_grad[kept], weight_grad[kept] * weight.detach()[kept])
    assert torch.all(weight_grad[~kept] == 0) and scores_grad[~kept].abs().sum() > 0
    assert set(pruner.score_names(model)) == {n for n, _ in model.named_parameters() if n.endswith("scores")}


def _the_teachers_reader(aux_modules: list, teacher) -> bool:
    """The loop's one aux module is the teacher's copy whose last layer reads the first token
    (TeacherLogits' reader), with the teacher's weights."""
    (reader,) = aux_modules
    return reader is not teacher and "forward" in vars(encoder_layers(reader)[-1]) and all(
        torch.equal(value, reader.state_dict()[key]) for key, value in teacher.state_dict().items())


def test_movement_with_soft_targets_and_its_own_score_rate(bert_bundle, tiny_task, tiny_bert_dir, finetune_calls):
    cfg = get_pass("prune-movement").config_type.model_validate(
        {"sparsity": 0.75, "teacher_soft_targets": True, "scores_lr": 0.05, **TRAIN})
    ctx = Context(task=tiny_task, show_progress=False, teacher_source=LazyTeacher.from_dir(tiny_bert_dir))
    out = apply_pass(bert_bundle, "prune-movement", cfg, ctx)
    assert encoder_sparsity(out.model) == pytest.approx(0.75, abs=1e-3)
    (kwargs,) = finetune_calls
    assert _the_teachers_reader(kwargs["aux_modules"], ctx.teacher.model)
    groups = kwargs["param_groups"](torch.nn.Module())   # names come from the model it is given
    assert groups[0]["lr"] == 0.05 and groups[0]["weight_decay"] == 0.0


def test_magnitude_learns_from_the_teachers_soft_targets(bert_bundle, tiny_task, tiny_bert_dir, finetune_calls):
    cfg = get_pass("prune-magnitude").config_type.model_validate(
        {"sparsity": 0.5, "teacher_soft_targets": True, **TRAIN})
    ctx = Context(task=tiny_task, show_progress=False, teacher_source=LazyTeacher.from_dir(tiny_bert_dir))
    out = apply_pass(bert_bundle, "prune-magnitude", cfg, ctx)
    assert encoder_sparsity(out.model) == pytest.approx(0.5, abs=1e-3)
    (kwargs,) = finetune_calls
    assert _the_teachers_reader(kwargs["aux_modules"], ctx.teacher.model) and kwargs["param_groups"] is None
    assert kwargs["loss_fn"].reads_only_logits       # so the loop may train the last layer on the first token


def test_a_named_teacher_dir_gives_the_soft_targets(bert_bundle, tiny_task, tiny_bert_dir, finetune_calls):
    cfg = get_pass("prune-movement").config_type.model_validate(
        {"sparsity": 0.5, "teacher_soft_targets": True, "teacher": str(tiny_bert_dir), **TRAIN})
    assert cfg.input_paths() == {"teacher": tiny_bert_dir}       # its content enters the stage key
    get_pass("prune-movement").check_family(cfg, "bert")
    ctx = Context(task=tiny_task, show_progress=False)           # no recipe teacher: the named one serves
    apply_pass(bert_bundle, "prune-movement", cfg, ctx)
    (teacher,) = finetune_calls[0]["aux_modules"]
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


def test_a_named_teacher_that_is_no_model_is_refused_up_front(tmp_path):
    cfg = get_pass("prune-magnitude").config_type.model_validate(
        {"sparsity": 0.5, "teacher_soft_targets": True, "teacher": str(tmp_path / "missing")})
    with pytest.raises(UserError, match="missing"):
        get_pass("prune-magnitude").check_family(cfg, "bert")


def test_soft_target_loss_is_kl_and_ce_against_an_unchanged_teacher(bert_bundle, tiny_bert_dir):
    teacher = LazyTeacher.from_dir(tiny_bert_dir).get().model
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student = bert_bundle.copy_model().eval()
    batch = {"input_ids": torch.randint(5, 90, (4, 7)), "attention_mask": torch.ones(4, 7, dtype=torch.long),
             "labels": torch.tensor([0, 1, 0, 1])}
    loss = sparsity_passes.soft_target_loss(TeacherLogits(teacher), 2.0)(student, batch)
    with torch.no_grad():
        s_logits = student(**batch).logits
        t_logits = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    kl = torch.nn.functional.kl_div(torch.log_softmax(s_logits / 2, -1), torch.softmax(t_logits / 2, -1),
                                    reduction="batchmean") * 4
    ce = torch.nn.functional.cross_entropy(s_logits, batch["labels"])
    torch.testing.assert_close(loss, 0.5 * kl + 0.5 * ce, rtol=1e-4, atol=1e-5)
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items())


def test_rerun_resumes_from_the_work_dir(bert_bundle, tiny_task, tmp_path):
    cfg = get_pass("prune-movement").config_type.model_validate({"sparsity": 0.5, **TRAIN})
    ctx = Context(task=tiny_task, show_progress=False, work_dir=tmp_path / "work")
    first = apply_pass(bert_bundle, "prune-movement", cfg, ctx)
    assert (tmp_path / "work" / "prune-movement" / "checkpoint.pt").is_file()
    again = apply_pass(bert_bundle, "prune-movement", cfg, ctx)    # resumes at the last step
    for key, value in first.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[key]), key


@pytest.mark.parametrize("config, why", [
    ({"sparsity": 1.0}, "less than 1"),
    ({"sparsity": -0.1}, "greater than or equal to 0"),
    ({"sparsity": 0.5, "initial_sparsity": 0.6}, "only prunes more"),
    ({"sparsity": 0.5, "strategy": "adapters"}, "strategy full"),
    ({"sparsity": 0.5, "teacher_soft_targets": True, "epochs": 0}, "expected epochs > 0"),
    ({"sparsity": 0.5, "teacher": "runs/teacher"}, "expected teacher_soft_targets: true"),
])
@pytest.mark.parametrize("name", ["prune-magnitude", "prune-movement"])
def test_bad_config_is_refused(name, config, why):
    with pytest.raises(ValidationError, match=why):
        get_pass(name).config_type.model_validate(config)
    with pytest.raises(UserError, match=rf"v\[0\]\.{name}"):
        parse_step({name: config}, "v[0]")


@pytest.mark.parametrize("config", [{"epochs": 0}, {"schedule": "oneshot"}])
def test_movement_needs_training(config):
    with pytest.raises(ValidationError, match="learns its scores"):
        get_pass("prune-movement").config_type.model_validate({"sparsity": 0.5, **config})


def test_inconsistent_schedule_is_refused_before_training(bert_bundle, tiny_task, monkeypatch):
    monkeypatch.setattr(sparsity_passes, "finetune", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(UserError, match="no step to prune in; the run has 3 steps"):
        _run(bert_bundle, "prune-magnitude", tiny_task, sparsity=0.5, sparsity_warmup_steps=2,
             sparsity_cooldown_steps=1, **TRAIN)


@pytest.mark.parametrize("family", ["bilm", "xlnet"])
def test_families_without_linear_projections_are_refused(family):
    with pytest.raises(UserError, match=f"'{family}' does not have; supported families: bert"):
        get_pass("prune-magnitude").check_family(sparsity_passes.MagnitudeConfig(sparsity=0.5), family)


@pytest.mark.parametrize("name", ["prune-magnitude", "prune-movement"])
def test_the_recipe_form_parses(name):
    step = parse_step({name: {"sparsity": 0.9, "epochs": 1, "max_train_samples": 20000}}, "v[0]")
    assert step.name == name and step.config.sparsity == 0.9 and step.config.max_train_samples == 20000
    assert step.config.scope == "per_layer" and step.config.schedule == "cubic"


@pytest.mark.parametrize("method", ["prune-magnitude", "prune-movement"])
def test_a_teacher_of_another_task_with_as_many_labels_is_refused(method, bert_bundle, tiny_task, tiny_csv,
                                                                  tiny_bert_dir, tmp_path, finetune_calls):
    other = tmp_path / "other-task"
    model = bert_bundle.copy_model()
    model.config.id2label = {i: f"x{i}" for i in range(model.config.num_labels)}
    model.config.label2id = {v: k for k, v in model.config.id2label.items()}
    ModelBundle(model, bert_bundle.tokenizer, task=None).save(other)
    cfg = get_pass(method).config_type.model_validate(
        {"sparsity": 0.5, "teacher_soft_targets": True, "teacher": str(other), **TRAIN})
    from compressor import Pipeline
    pipe = Pipeline("other", teacher=str(tiny_bert_dir), task={"path": str(tiny_csv)}).variant("v", cfg)
    with pytest.raises(UserError, match=rf"variants\.v\[0\]: {method}: the teacher's labels \(x0, x1, x2, \.\.\. 4\)"):
        pipe.plan(tmp_path / "out")      # the run's up-front checks
    with pytest.raises(UserError, match=f"{method}: the teacher's labels"):
        apply_pass(bert_bundle, method, cfg, Context(task=tiny_task, show_progress=False))
    assert not finetune_calls
