"""The `student` and `distill` passes: each loss, what trains, the layer map, resume, refusals."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

from compressor.bundle import ModelBundle
from compressor.passes import Context, LazyTeacher, apply_pass, check_pass_family, get_pass
from compressor.passes import distillation as distillation_module
from compressor.passes.distillation import (PROJECTION_ATTR, DistillConfig, DistillLoss, StudentShape, fresh_student,
                                            projection_attached, uniform_map)
from compressor.pipeline.recipe import parse_step
from compressor.pipeline.stages import step_key
from pretrain.batching import collate, encode
from pretrain.errors import UserError
from pretrain.models import encoder_layers
from pretrain.train import CHECKPOINT_FILE

LAYER_LOSSES = ("cosine", "hidden", "attention", "value-relation")
TINY = {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_train_samples": 48}   # 3 steps


def _ctx(task, teacher_dir, **kw) -> Context:
    return Context(task=task, seed=0, show_progress=False, teacher_source=LazyTeacher.from_dir(teacher_dir), **kw)


def _distill(**kw) -> DistillConfig:
    return DistillConfig.model_validate({**TINY, **kw})


def _student(**kw):
    return get_pass("student").config_type.model_validate(kw)


@pytest.fixture
def batch(bert_bundle, tiny_task):
    data = encode(bert_bundle.tokenizer, tiny_task.split("train").head(8))
    return collate(data, list(range(8)))


def _terms(student, teacher, batch, names, **kw) -> dict[str, float]:
    n = len(encoder_layers(student))
    out = {}
    for name in names:
        layers = (1,) if name == "progressive" else None
        loss = DistillLoss(teacher, {name: 1.0}, kw.get("layer_map", tuple(range(n))), 2.0,
                           kw.get("kind", "scores"), "mapped", layers)
        out[name] = float(loss(student, batch).detach())
    return out


@pytest.mark.parametrize("kind", ["scores", "distribution"])
def test_every_loss_is_zero_for_a_copy_and_positive_otherwise(bert_bundle, batch, kind):
    teacher = bert_bundle.model.eval()
    names = ("soft", *LAYER_LOSSES, "progressive")
    same = _terms(copy.deepcopy(teacher).eval(), teacher, batch, names, kind=kind)
    assert all(abs(v) < 1e-6 for v in same.values()), same
    other = copy.deepcopy(teacher).eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved = _terms(other, teacher, batch, names, kind=kind)
    assert all(v > 1e-4 for v in moved.values()), moved
    # hard is the task's cross-entropy, teacher or not
    hard = _terms(teacher, teacher, batch, ["hard"])["hard"]
    assert hard == pytest.approx(float(teacher(**batch).loss.detach()), rel=1e-5)


def test_gradients_reach_the_student_and_projection_only(bert_bundle, batch):
    teacher = bert_bundle.model.eval().requires_grad_(False)
    student = fresh_student(teacher, StudentShape(layers=2, hidden=16), seed=0)
    cfg = _distill(losses=["soft", "hidden", "attention", "value-relation", "cosine"])
    with projection_attached(student, teacher, cfg):
        loss = DistillLoss(teacher, {n: 1.0 for n in cfg.losses}, uniform_map(2, 4), 2.0, "scores", "mapped")
        loss(student.train(), batch).backward()
        projection = getattr(student, PROJECTION_ATTR)
        assert projection.weight.grad is not None and projection.weight.grad.abs().sum() > 0
    assert not hasattr(student, PROJECTION_ATTR)
    assert all(p.grad is None for p in teacher.parameters())
    for name, p in student.named_parameters():
        if "encoder.layer" in name and "attention" in name and name.endswith("weight"):
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_distill_trains_a_narrow_student_and_keeps_no_projection(bert_bundle, tiny_task, tiny_bert_dir, tmp_path):
    ctx = _ctx(tiny_task, tiny_bert_dir)
    bundle = bert_bundle.replace(task=tiny_task.spec)
    narrow = apply_pass(bundle, "student", _student(shape={"layers": 2, "hidden": 16}), ctx)
    teacher_before = {k: v.clone() for k, v in ctx.teacher.model.state_dict().items()}
    out = apply_pass(narrow, "distill", _distill(losses=["soft", "hidden", "attention"]), ctx)
    teacher_after = ctx.teacher.model.state_dict()
    assert all(torch.equal(teacher_before[k], teacher_after[k]) for k in teacher_before)
    assert not any(p.requires_grad for p in ctx.teacher.model.parameters())
    assert not any(PROJECTION_ATTR in k for k in out.model.state_dict())
    saved = load_file(str(out.save(tmp_path / "out") / "model.safetensors"))
    assert not any(PROJECTION_ATTR in k for k in saved)
    before, after = narrow.model.state_dict(), out.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    record = out.deploy["distill"]
    assert record["layer_map"] == [1, 3] and record["stages"][0]["steps"] == 3


def test_fresh_student_projects_the_teacher_embeddings(bert_bundle):
    teacher = bert_bundle.model
    same = fresh_student(teacher, StudentShape(layers=1), seed=0)
    assert torch.equal(same.get_input_embeddings().weight, teacher.get_input_embeddings().weight)
    narrow = fresh_student(teacher, StudentShape(layers=1, hidden=8, heads=2, ffn=16), seed=0)
    words = teacher.get_input_embeddings().weight
    _, _, vh = torch.linalg.svd(words.double(), full_matrices=False)
    expected = words.double() @ vh[:8].T
    torch.testing.assert_close(narrow.get_input_embeddings().weight.double(), expected, atol=1e-5, rtol=1e-4)
    assert narrow.config.num_hidden_layers == 1 and narrow.config.intermediate_size == 16


def test_student_from_teacher_layers_or_from_the_bundle(bert_bundle, tiny_task, tiny_bert_dir):
    ctx = _ctx(tiny_task, tiny_bert_dir)
    from_teacher = apply_pass(bert_bundle, "student", _student(layers=[0, 2]), ctx)
    layers = encoder_layers(from_teacher.model)
    assert len(layers) == 2 and all(p.requires_grad for p in from_teacher.model.parameters())
    assert torch.equal(layers[1].output.dense.weight, encoder_layers(ctx.teacher.model)[2].output.dense.weight)
    shorter = apply_pass(bert_bundle, "drop-layers", get_pass("drop-layers").config_type(keep=(3, 1)), ctx)
    from_bundle = apply_pass(shorter, "student", _student(layers=[1], **{"from": "bundle"}), ctx)
    assert torch.equal(encoder_layers(from_bundle.model)[0].output.dense.weight,
                       encoder_layers(bert_bundle.model)[1].output.dense.weight)
    assert from_bundle.history[-1]["config"]["from"] == "bundle"


def test_a_student_of_the_teachers_layers_after_other_steps_is_refused_up_front():
    """It discarded what the steps before it did (a trimmed vocabulary came back whole) while
    the variant's record still listed them."""
    from compressor.passes.registry import Known, Shape, shape_after
    shape = Shape("bert", layers=4, heads=(2,) * 4, hidden=32)
    known = shape_after("drop-layers", get_pass("drop-layers").config_type(keep=(0, 1, 2)),
                        Known(model=shape, teacher=shape))
    with pytest.raises(UserError, match=r"^student: builds from the recipe's teacher, so the steps before it "
                                        r"\(drop-layers\) would be discarded"):
        shape_after("student", _student(layers=[0, 2]), known)
    assert shape_after("student", _student(layers=[0, 2], **{"from": "bundle"}), known).model.layers == 2
    assert shape_after("student", _student(layers=[0, 2]), Known(model=shape, teacher=shape)).model.layers == 2


def test_auto_map_picks_the_identical_layers_and_is_recorded(bert_bundle, tiny_task, tiny_bert_dir):
    ctx = _ctx(tiny_task, tiny_bert_dir)
    prefix = apply_pass(bert_bundle, "student", _student(layers=[0, 1]), ctx)
    out = apply_pass(prefix, "distill", _distill(losses=["soft", "hidden"], layer_map="auto", map_samples=32), ctx)
    record = out.deploy["distill"]
    assert record["layer_map"] == [0, 1] and record["layer_map_kind"] == "auto"
    assert record["layer_cka"][0][0] == pytest.approx(1.0) and record["layer_cka"][1][1] == pytest.approx(1.0)


class Interrupt(Exception):
    pass


def test_a_killed_distill_resumes_to_the_same_weights(bert_bundle, tiny_task, tiny_bert_dir, tmp_path, monkeypatch):
    cfg = _distill(losses=["soft", "hidden"], two_stage=True)   # two stages: 3 + 3 steps
    start = apply_pass(bert_bundle, "student", _student(layers=[0, 2]), _ctx(tiny_task, tiny_bert_dir))
    reference = apply_pass(start, "distill", cfg, _ctx(tiny_task, tiny_bert_dir))

    real = distillation_module.finetune
    calls = []

    def killed_in_stage_two(*args, **kw):
        calls.append(kw["checkpoint"].directory.name)
        if len(calls) == 2:
            def stop(log):
                if log.step == 2:
                    raise Interrupt
            kw = {**kw, "callbacks": [stop]}
        return real(*args, **kw)
    monkeypatch.setattr(distillation_module, "finetune", killed_in_stage_two)
    every_step = distillation_module.Checkpointing
    monkeypatch.setattr(distillation_module, "Checkpointing",
                        lambda directory: every_step(directory=directory, every_steps=1))
    ctx = _ctx(tiny_task, tiny_bert_dir, work_dir=tmp_path / "work")
    with pytest.raises(Interrupt):
        apply_pass(start, "distill", cfg, ctx)
    assert calls == ["intermediate", "prediction"]
    assert torch.load(tmp_path / "work" / "prediction" / CHECKPOINT_FILE, weights_only=True)["progress"]["step"] == 1   # killed in step 2, before its checkpoint
    resumed = apply_pass(start, "distill", cfg, ctx)
    a, b = reference.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- refusals ---

def test_refusals_before_training(bert_bundle, tiny_task, tiny_bert_dir, monkeypatch):
    ctx = _ctx(tiny_task, tiny_bert_dir)
    monkeypatch.setattr(distillation_module, "finetune", lambda *a, **k: pytest.fail("trained despite bad input"))
    narrow = apply_pass(bert_bundle, "student", _student(shape={"layers": 2, "hidden": 16}), ctx)
    cases = [
        (narrow, _distill(losses=["hidden"], projection=False), "projection is off"),
        (bert_bundle, _distill(losses=["hidden"], layer_map=[0, 1]), "2 entries for a student of 4 layers"),
        (narrow, _distill(losses=["hidden"], layer_map=[0, 4]), "past the teacher's 4 layers"),
        (apply_pass(bert_bundle, "student", _student(shape={"layers": 2, "hidden": 16, "heads": 2}), ctx),
         _distill(losses=["attention"]), "2 heads and teacher layer"),
    ]
    for student, cfg, message in cases:
        with pytest.raises(UserError, match=message) as err:
            apply_pass(student, "distill", cfg, ctx)
        assert "\n" not in str(err.value)


def test_a_teacher_of_other_labels_is_refused(bert_bundle, tiny_task, tiny_bert_dir, tmp_path):
    other = bert_bundle.model.config
    other.id2label = {i: f"x{i}" for i in range(other.num_labels)}
    other.label2id = {v: k for k, v in other.id2label.items()}
    teacher_dir = ModelBundle(bert_bundle.model, bert_bundle.tokenizer, task=None).save(tmp_path / "other")
    student = ModelBundle.load(tiny_bert_dir)
    with pytest.raises(UserError, match="teacher's labels .* differ"):
        apply_pass(student, "distill", _distill(teacher=str(teacher_dir)), _ctx(tiny_task, tiny_bert_dir))
    with pytest.raises(UserError, match="labels"):
        apply_pass(student, "student", _student(layers=[0]), _ctx(tiny_task, teacher_dir))


@pytest.mark.parametrize("family, refused", [("bilm", True), ("xlnet", True), ("bart", False), ("distilbert", False)])
def test_family_check_refuses_layer_losses_a_family_cannot_give(family, refused):
    attention = _distill(losses=["soft", "attention"])
    if refused:
        with pytest.raises(UserError, match=f"{family!r} cannot give the attention loss"):
            check_pass_family("distill", attention, family)
    else:
        check_pass_family("distill", attention, family)
    check_pass_family("distill", _distill(losses=["soft", "hard"]), family)


@pytest.mark.parametrize("raw, why", [
    ({"losses": ["soft"], "two_stage": True}, "two_stage needs layer losses"),
    ({"losses": ["soft"], "weights": {"hidden": 1.0}}, "which losses does not list"),
    ({"losses": ["soft", "soft"]}, "listed twice"),
    ({"losses": ["progressive", "hidden"]}, "no other layer loss"),
    ({"losses": ["soft"], "tasks": ["wordnet-wsd"]}, "no multi-task"),
    ({"losses": ["soft"], "layer_map": [0, -1]}, ">= 0"),
    # the weight named, what a weight takes (was "loss weights must be >= 0", naming none)
    ({"losses": ["soft", "hard"], "weights": {"hard": -1}},
     r"^variants\.v\[0\]\.distill\.weights\.hard: expected a number >= 0 \(got -1\)$"),
])
def test_config_validation(raw, why):
    with pytest.raises(UserError, match=why):
        parse_step({"distill": raw}, "variants.v[0]")


@pytest.mark.parametrize("raw, why", [({}, "either layers"), ({"layers": [0], "shape": {"layers": 1}}, "not both"),
                                      ({"shape": {"layers": 1}, "from": "bundle"}, "goes with layers")])
def test_student_config_validation(raw, why):
    with pytest.raises(UserError, match=why):
        parse_step({"student": raw}, "variants.v[0]")


def test_recipe_forms_of_the_contract():
    assert parse_step({"student": {"layers": [0, 2, 4]}}, "v").config.layers == (0, 2, 4)
    step = parse_step({"distill": {"losses": ["soft", "hidden", "attention"], "epochs": 2,
                                   "max_train_samples": 20000}}, "v")
    assert step.config.losses == ("soft", "hidden", "attention") and step.config.max_train_samples == 20000
    assert parse_step({"distill": {"losses": ["soft"], "layer_map": "auto"}}, "v").config.layer_map == "auto"


@pytest.mark.parametrize("name, config", [
    ("distill", {"losses": ["soft"]}),
    ("prune-movement", {"sparsity": 0.9, "teacher_soft_targets": True}),
    ("prune-magnitude", {"sparsity": 0.9, "teacher_soft_targets": True}),
])
def test_the_cache_key_follows_the_named_teacher_content(name, config, tiny_bert_dir, tmp_path):
    teacher = ModelBundle.load(tiny_bert_dir)
    path = teacher.save(tmp_path / "teacher")
    step = parse_step({name: {**config, "teacher": str(path)}}, "v")
    before = step_key(step)
    with torch.no_grad():
        teacher.model.classifier.bias.add_(1.0)
    teacher.save(tmp_path / "teacher")
    assert step_key(step) != before
    plain = parse_step({name: config}, "v")
    assert len(step_key(plain)) == 2     # no named dir: the key is the step's config alone


def test_progressive_runs_one_phase_per_layer_with_lower_layers_frozen(bert_bundle):
    stages = distillation_module.plan_stages(_distill(losses=["progressive", "soft"]), 4)
    assert [s.name for s in stages] == ["layer-0", "layer-1", "layer-2", "layer-3", "prediction"]
    assert [s.frozen_below for s in stages] == [0, 1, 2, 3, 0] and stages[1].layers == (1,)
    assert sum(s.epochs_share for s in stages[:4]) == pytest.approx(1.0)
    model = bert_bundle.model
    with distillation_module.frozen_below(model, 2):
        assert not any(p.requires_grad for p in encoder_layers(model)[1].parameters())
        assert not model.get_input_embeddings().weight.requires_grad
        assert all(p.requires_grad for p in encoder_layers(model)[2].parameters())
    assert all(p.requires_grad for p in model.parameters())


def test_logit_losses_train_and_read_the_last_layer_on_the_first_token_only(bert_bundle, tiny_task, tiny_bert_dir,
                                                                         batch):
    ctx = _ctx(tiny_task, tiny_bert_dir)
    bundle = bert_bundle.replace(task=tiny_task.spec)
    student = apply_pass(bundle, "student", _student(layers=[0, 1]), ctx)
    teacher = ctx.teacher.model
    reader = distillation_module.teacher_reader(teacher, {"soft": 1.0, "hard": 1.0}, _distill())
    assert reader is not teacher and "forward" in vars(encoder_layers(reader)[-1])
    with torch.no_grad():
        torch.testing.assert_close(reader(**batch).logits, teacher(**batch).logits, atol=1e-5, rtol=0)
    assert distillation_module.teacher_reader(teacher, {"soft": 1.0, "hidden": 1.0}, _distill()) is teacher
    assert distillation_module.teacher_reader(teacher, {"soft": 1.0}, _distill(cls_only_last_layer=False)) is teacher
    assert DistillLoss(teacher, {"soft": 1.0, "hard": 1.0}, (0, 1), 2.0, "scores", "mapped").reads_only_logits
    assert not DistillLoss(teacher, {"soft": 1.0, "hidden": 1.0}, (0, 1), 2.0, "scores", "mapped").reads_only_logits

    logits_only = apply_pass(student, "distill", _distill(losses=["soft", "hard"]), ctx)
    with_states = apply_pass(student, "distill", _distill(losses=["soft", "hidden"]), ctx)
    assert logits_only.deploy["distill"]["stages"][0]["last_layer_skipped"] is None
    assert "more than the logits" in with_states.deploy["distill"]["stages"][0]["last_layer_skipped"]
    for model in (teacher, logits_only.model, with_states.model):
        assert "forward" not in vars(encoder_layers(model)[-1])


def test_distill_passes_of_one_run_run_the_recipes_teacher_once_per_example(bert_bundle, tiny_task, tiny_bert_dir,
                                                                            monkeypatch):
    """Two variants distilling soft targets from the recipe's teacher on the same texts: the
    second reads the first one's logits; a teacher named by path is not shared."""
    rows = []
    real = distillation_module.dl.TeacherLogits.__call__

    def counting(self, batch):
        before = len(self.cache)
        out = real(self, batch)
        rows.append(len(self.cache) - before)    # examples the teacher ran on for this batch
        return out
    monkeypatch.setattr(distillation_module.dl.TeacherLogits, "__call__", counting)
    ctx = _ctx(tiny_task, tiny_bert_dir)
    bundle = bert_bundle.replace(task=tiny_task.spec)
    student = apply_pass(bundle, "student", _student(layers=[0, 1]), ctx)
    apply_pass(student, "distill", _distill(losses=["soft", "hard"]), ctx)
    assert sum(rows) == TINY["max_train_samples"]       # every train example once
    other = apply_pass(bundle, "student", _student(layers=[1, 3]), ctx)
    rows.clear()
    apply_pass(other, "distill", _distill(losses=["soft", "hard"], epochs=2), ctx)
    assert rows and sum(rows) == 0                     # all of them known already
    rows.clear()
    apply_pass(other, "distill", _distill(losses=["soft", "hard"], teacher=str(tiny_bert_dir)), ctx)
    assert sum(rows) == TINY["max_train_samples"]       # a named teacher keeps its own


def _plan(teacher_dir, csv, tmp_path, *steps):
    from compressor import Pipeline
    return Pipeline("vocab", teacher=str(teacher_dir), task={"path": str(csv)}).variant("v", *steps) \
        .plan(tmp_path / "out")


@pytest.mark.parametrize("name, learner", [
    ("distill", lambda: _distill(losses=["soft"])),
    ("distill-structure", lambda: get_pass("distill-structure").config_type(kind="cnn", epochs=1)),
])
def test_trimming_before_learning_from_the_whole_vocabulary_is_refused_before_anything_runs(
        name, learner, tiny_bert_dir, tiny_csv, tmp_path):
    trim = get_pass("trim-vocab").config_type()
    with pytest.raises(UserError, match=rf"variants\.v\[1\]: {name}: trim-vocab before it cut") as err:
        _plan(tiny_bert_dir, tiny_csv, tmp_path, trim, learner())
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()
    assert _plan(tiny_bert_dir, tiny_csv, tmp_path, learner(), trim)["stages"]   # trimming after is fine


def test_a_named_teacher_of_another_vocabulary_is_refused_before_anything_runs(bert_bundle, tiny_bert_dir, tiny_csv,
                                                                                tmp_path):
    other = tmp_path / "other-vocab"
    bert_bundle.model.save_pretrained(str(other))
    tokenizer = copy.deepcopy(bert_bundle.tokenizer)
    tokenizer.add_tokens(["zzzunseenword"])
    tokenizer.save_pretrained(str(other))
    with pytest.raises(UserError, match=r"variants\.v\[0\]: distill: the teacher's tokenizer has another vocabulary"):
        _plan(tiny_bert_dir, tiny_csv, tmp_path, _distill(losses=["soft"], teacher=str(other)))
    assert _plan(tiny_bert_dir, tiny_csv, tmp_path, _distill(losses=["soft"], teacher=str(tiny_bert_dir)))["stages"]
