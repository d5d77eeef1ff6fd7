"""The pass context: a lazily loaded teacher, a work dir for checkpoints, and a pass that
distills from the teacher through the shared loop (finetune with its own loss) and resumes
after being interrupted.

The distillation pass is defined here, not in the registry: `registered` puts it there for
one test and takes it out again.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from pydantic import Field

from compressor.bundle import ModelBundle
from compressor.passes import registry
from compressor.passes.registry import Context, LazyTeacher, apply_pass, get_pass, pass_names
from pretrain.errors import UserError
from pretrain.finetune import FinetuneConfig, finetune, with_run_defaults
from pretrain.train import CHECKPOINT_FILE, Checkpointing, StepCallback

TEMPERATURE = 2.0


class DistillConfig(FinetuneConfig):
    alpha: float = Field(0.5, ge=0, le=1)   # weight of the soft (teacher) loss; the rest is CE
    checkpoint_every: int = Field(2, ge=1)


def distill_loss(teacher: torch.nn.Module, alpha: float):
    """alpha * T^2 * KL(teacher || student) at temperature T, plus (1 - alpha) * CE."""
    def loss_fn(model, batch):
        out = model(**batch)
        assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
        with torch.no_grad():
            soft = teacher(**{k: v for k, v in batch.items() if k != "labels"}).logits / TEMPERATURE
        kl = F.kl_div(F.log_softmax(out.logits / TEMPERATURE, dim=-1), F.log_softmax(soft, dim=-1),
                      log_target=True, reduction="batchmean")
        return alpha * TEMPERATURE ** 2 * kl + (1 - alpha) * out.loss
    return loss_fn


def distill(bundle: ModelBundle, cfg: DistillConfig, ctx: Context,
            callbacks: tuple[StepCallback, ...] = ()) -> ModelBundle:
    cfg = with_run_defaults(cfg, ctx.seed, ctx.max_train_samples)
    teacher = ctx.teacher.model
    checkpoint = None if ctx.work_dir is None else Checkpointing(directory=ctx.work_dir,
                                                                 every_steps=cfg.checkpoint_every)
    model = bundle.copy_model()
    finetune(model, bundle.tokenizer, ctx.task, cfg, desc="distill", show_progress=ctx.show_progress,
             loss_fn=distill_loss(teacher, cfg.alpha), callbacks=callbacks, checkpoint=checkpoint,
             aux_modules=[teacher])
    return bundle.replace(model=model)


@pytest.fixture
def registered():
    """register(name, fn): a pass in the registry for this test only."""
    names = []
    with pytest.MonkeyPatch.context() as mp:
        def register(name, fn, config_type=DistillConfig):
            mp.setitem(registry._REGISTRY, name, registry.PassSpec(name, config_type, fn, False, True))
            names.append(name)
        yield register
    leaked = [name for name in names if name in pass_names()]
    assert not leaked, f"test passes left in the registry: {leaked}"


class Interrupt(Exception):
    pass


def stop_after(step: int) -> StepCallback:
    def callback(log):
        if log.step == step:
            raise Interrupt
    return callback


def student(tiny_task, bert_bundle) -> ModelBundle:
    """A 2-layer student cut from the 4-layer BERT (the teacher)."""
    cfg = get_pass("drop-layers").config_type(keep=(0, 2))
    return apply_pass(bert_bundle.replace(task=tiny_task.spec), "drop-layers", cfg, Context(task=tiny_task))


DISTILL = DistillConfig(epochs=1, batch_size=16, lr=1e-3, max_train_samples=96)   # 6 steps


def run_distill(start: ModelBundle, ctx: Context, registered, callbacks=(), cfg=DISTILL) -> ModelBundle:
    registered("distill-test", functools.partial(distill, callbacks=tuple(callbacks)))
    return apply_pass(start, "distill-test", cfg, ctx)


def test_distillation_resumes_after_an_interruption_with_identical_weights(
        tiny_task, tiny_bert_dir, bert_bundle, registered, tmp_path):
    start = student(tiny_task, bert_bundle)
    teacher = LazyTeacher.from_dir(tiny_bert_dir)
    reference = run_distill(start, Context(task=tiny_task, show_progress=False, teacher_source=teacher),
                            registered)

    ctx = Context(task=tiny_task, show_progress=False, teacher_source=teacher, work_dir=tmp_path / "work")
    with pytest.raises(Interrupt):
        run_distill(start, ctx, registered, [stop_after(5)])
    saved = torch.load(tmp_path / "work" / CHECKPOINT_FILE, weights_only=True)
    assert saved["progress"]["step"] == 4                  # checkpoints every 2 steps; killed after 5

    steps: list[int] = []
    resumed = run_distill(start, ctx, registered, [lambda log: steps.append(log.step)])
    assert steps == [5, 6]
    a, b = reference.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(start.model.classifier.weight, resumed.model.classifier.weight)
    # the teacher came back as it was lent: inference only
    assert not teacher.get().model.training
    assert not any(p.requires_grad for p in teacher.get().model.parameters())


def test_the_teacher_term_changes_what_is_learned(tiny_task, tiny_bert_dir, bert_bundle, registered):
    start = student(tiny_task, bert_bundle)
    ctx = Context(task=tiny_task, show_progress=False, teacher_source=LazyTeacher.from_dir(tiny_bert_dir))
    distilled = run_distill(start, ctx, registered)
    plain = run_distill(start, ctx, registered, cfg=DISTILL.model_copy(update={"alpha": 0.0}))
    assert not torch.equal(distilled.model.classifier.weight, plain.model.classifier.weight)


def counting_teacher(tiny_bert_dir) -> tuple[LazyTeacher, list[int]]:
    loads: list[int] = []

    def load():
        loads.append(1)
        return ModelBundle.load(tiny_bert_dir)
    return LazyTeacher(load), loads


def test_a_pass_that_does_not_use_the_teacher_never_loads_it(tiny_task, tiny_bert_dir, bert_bundle):
    teacher, loads = counting_teacher(tiny_bert_dir)
    cfg = get_pass("finetune").config_type(epochs=1, batch_size=16, max_train_samples=16)
    apply_pass(bert_bundle, "finetune", cfg, Context(task=tiny_task, show_progress=False, teacher_source=teacher))
    assert loads == [] and not teacher.loaded


def test_the_teacher_loads_once_for_inference(tiny_task, tiny_bert_dir, registered):
    teacher, loads = counting_teacher(tiny_bert_dir)
    ctx = Context(task=tiny_task, teacher_source=teacher)
    first, second = ctx.teacher, Context(task=tiny_task, seed=3, teacher_source=teacher).teacher
    assert first is second and loads == [1]
    assert not first.model.training
    assert not any(p.requires_grad for p in first.model.parameters())


def test_asking_for_a_teacher_that_was_not_given_is_a_user_error(tiny_task):
    with pytest.raises(UserError, match="no teacher"):
        Context(task=tiny_task).teacher


def test_a_pass_called_without_the_teacher_it_needs_is_named(tiny_task, bert_bundle):
    # The error said "this pass": which one, among a script's apply_pass calls, was left to guess.
    cfg = get_pass("distill").config_type(epochs=1, batch_size=16, max_train_samples=16)
    with pytest.raises(UserError, match=r"^pass 'distill' learns from the teacher, but no teacher was given to it; "
                                        r"expected Context\(teacher_source="):
        apply_pass(bert_bundle, "distill", cfg, Context(task=tiny_task, show_progress=False))


def test_context_stays_frozen(tiny_task, tmp_path):
    with pytest.raises(AttributeError):
        Context(task=tiny_task).work_dir = tmp_path


@pytest.mark.parametrize("config_type, why", [
    (dict, "must be a pydantic model"),
    (type("Loose", (registry.BaseModel,), {"__annotations__": {"factor": float}}), "frozen=True and extra='forbid'"),
])
def test_a_config_type_that_would_drop_a_misspelt_field_is_refused_at_registration(config_type, why):
    with pytest.raises(TypeError, match=why):
        registry.register("loose-pass", config_type)(lambda bundle, cfg, ctx: bundle)
    assert "loose-pass" not in pass_names()


def test_apply_pass_names_the_config_type_it_takes(bert_bundle, tiny_task):
    from compressor.passes.layers import DropLayers
    with pytest.raises(UserError, match="pass 'finetune' takes a FinetuneConfig, not DropLayers"):
        apply_pass(bert_bundle, "finetune", DropLayers(keep=(0,)), Context(task=tiny_task))


def test_apply_pass_refuses_the_config_of_a_pass_whose_type_extends_its_own(bert_bundle, tiny_task):
    # QATConfig is a FinetuneConfig, but qat's: taken by `finetune`, it trained without fake
    # quantization and its history recorded qat's fields under finetune.
    from compressor.passes.quantization import QATConfig
    with pytest.raises(UserError, match="pass 'finetune' takes a FinetuneConfig, not QATConfig \\(the config of "
                                        "pass 'qat'\\)"):
        apply_pass(bert_bundle, "finetune", QATConfig(epochs=1), Context(task=tiny_task))


def test_a_training_pass_refuses_a_model_of_another_task(bert_bundle, tiny_task):
    model = bert_bundle.copy_model()
    model.config.id2label = {i: f"x{i}" for i in range(model.config.num_labels)}
    model.config.label2id = {v: k for k, v in model.config.id2label.items()}
    other = bert_bundle.replace(model=model)
    with pytest.raises(UserError, match="pass 'finetune' trains on task 'tiny' but the model's head is for other"):
        apply_pass(other, "finetune", FinetuneConfig(epochs=1), Context(task=tiny_task))


def test_a_pass_that_renumbers_layers_after_one_that_named_them_is_refused(bert_bundle, tiny_task):
    """sensitivity's float layers (and qat's ranges) name Linear modules: after drop-layers the
    export applied them to other layers, silently. Refused up front and when applied."""
    from compressor.passes.layers import DropLayers
    from compressor.passes.quantization import QATConfig, SensitivityConfig
    from compressor.passes.registry import Known, shape_after
    ranked = apply_pass(bert_bundle, "sensitivity", SensitivityConfig(samples=16), Context(task=tiny_task))
    with pytest.raises(UserError, match=r"^drop-layers: sensitivity before it recorded the model's Linear layers"):
        apply_pass(ranked, "drop-layers", DropLayers(keep=(0, 2)), Context(task=tiny_task))
    shape = registry.Shape("bert", layers=4, heads=(2,) * 4, hidden=32)
    known = shape_after("sensitivity", SensitivityConfig(), Known(model=shape, teacher=shape))
    with pytest.raises(UserError, match=r"^drop-layers: sensitivity before it"):
        shape_after("drop-layers", DropLayers(keep=(0, 2)), known)
    shape_after("drop-layers", DropLayers(keep=(0, 2)), Known(model=shape, teacher=shape))   # before it: fine
    # distill-structure builds a new model and leaves both records behind (test_shallow_students)
    assert [n for n in pass_names() if get_pass(n).renames_layers is True] == ["drop-layers", "student", "theseus"]
    with pytest.raises(UserError, match=r"^finetune: qat before it learned its record for the weights it left"):
        shape_after("finetune", FinetuneConfig(), shape_after("qat", QATConfig(), Known(model=shape, teacher=shape)))
    shape_after("finetune", FinetuneConfig(), known)          # a ranking is no training: fine-tuning after it is
    qat_known = shape_after("qat", QATConfig(), Known(model=shape, teacher=shape))
    shape_after("qat", QATConfig(), qat_known)                  # a second qat replaces the first one's ranges
    from compressor.passes.pruning import PruneHeads
    with pytest.raises(UserError, match=r"^prune-heads: sensitivity before it"):   # it may remove a layer whole
        shape_after("prune-heads", PruneHeads(per_layer=(2, 0, 0, 0), allow_drop_layers=True), known)
    shape_after("prune-heads", PruneHeads(per_layer=(1, 0, 0, 0)), known)


def test_the_history_records_a_training_pass_as_it_ran(bert_bundle, tiny_task):
    """The recipe's cap and seed apply where the step sets none: the report showed null, as if
    the pass had trained on the whole train split."""
    cfg = FinetuneConfig(epochs=1, batch_size=16)
    out = apply_pass(bert_bundle, "finetune", cfg, Context(task=tiny_task, seed=3, max_train_samples=32,
                                                            show_progress=False))
    recorded = out.history[-1]["config"]
    assert (recorded["max_train_samples"], recorded["seed"]) == (32, 3)
    own = apply_pass(bert_bundle, "finetune", cfg.model_copy(update={"max_train_samples": 16}),
                     Context(task=tiny_task, max_train_samples=32, show_progress=False))
    assert own.history[-1]["config"]["max_train_samples"] == 16              # the step's own limit wins


def test_a_step_that_would_train_a_factorized_embedding_off_its_rank_is_refused_up_front():
    """The export re-factorizes the word embedding at factorize-embedding's rank: a training
    step with the default sparse updates moved it off that rank, and the export's parity
    check failed after the training, naming neither the rank nor the remedy."""
    from compressor.passes.distillation import DistillConfig, StudentConfig
    from compressor.passes.embedding import FactorizeEmbedding
    from compressor.passes.registry import Known, shape_after
    shape = registry.Shape("bert", layers=4, heads=(2,) * 4, hidden=32, embedding=(1000, 32))
    known = shape_after("factorize-embedding", FactorizeEmbedding(rank=8), Known(model=shape, teacher=shape))
    with pytest.raises(UserError, match=r"^finetune: factorize-embedding before it left the word embedding at "
                                        r"rank 8.*sparse updates.*expected embedding_updates: frozen$"):
        shape_after("finetune", FinetuneConfig(), known)
    with pytest.raises(UserError, match="rank 8"):
        shape_after("distill", DistillConfig(losses=("soft",)), known)
    shape_after("distill", DistillConfig(losses=("soft",), embedding_updates="frozen"), known)
    # steps that leave the word embedding alone pass: a strategy on a frozen encoder, theseus
    # (only the successors train), one-shot pruning, a new network
    from compressor.passes.sparsity import MagnitudeConfig
    from compressor.passes.theseus import TheseusConfig
    shape_after("finetune", FinetuneConfig(strategy="adapters"), known)
    shape_after("theseus", TheseusConfig(successor_layers=2), known)
    shape_after("prune-magnitude", MagnitudeConfig(sparsity=0.5, epochs=0), known)
    from compressor.passes.shallow_students import DistillStructure
    shape_after("distill-structure", DistillStructure(kind="cnn"), known)
    with pytest.raises(UserError, match="rank 8"):
        shape_after("prune-magnitude", MagnitudeConfig(sparsity=0.5), known)
    # a domain MLM first trains the embedding densely whatever embedding_updates says
    with pytest.raises(UserError, match=r"its domain MLM, dense updates.*expected no domain_corpus$"):
        shape_after("finetune", FinetuneConfig(embedding_updates="frozen", domain_corpus="wordnet"), known)
    shape_after("quantize", registry.get_pass("quantize").config_type.model_validate({"mode": "fp16"}), known)
    # a student of the bundle's layers keeps the factorized embedding; one of the teacher's does not
    student = shape_after("student", StudentConfig.model_validate({"layers": [0, 2], "from": "bundle"}), known)
    with pytest.raises(UserError, match="rank 8"):
        shape_after("finetune", FinetuneConfig(), student)
    fresh = shape_after("student", StudentConfig(layers=(0, 2)), Known(model=shape, teacher=shape))
    shape_after("finetune", FinetuneConfig(), fresh)


def test_a_saved_model_s_shape_names_the_layers_that_share_their_attention(bert_bundle, tiny_task, tmp_path):
    """A teacher shared by an earlier run: its per_layer head counts are checked against its
    groups up front too (whole layers shared, or the attention sublayer alone; not the FFN)."""
    from compressor.passes.sharing import ShareLayers

    def saved(**config):
        out = apply_pass(bert_bundle, "share-layers", ShareLayers(**config), Context(task=tiny_task))
        return registry.shape_of(out.save(tmp_path / "-".join(map(str, config.values()))))
    assert saved(groups=2, mode="all").shared_attention == ((0, 1), (2, 3))
    assert saved(groups=1, mode="attention").shared_attention == ((0, 1, 2, 3),)
    assert saved(groups=1, mode="ffn").shared_attention == ()
    assert registry.shape_of(bert_bundle.save(tmp_path / "plain")).shared_attention == ()


def test_a_saved_model_s_shape_has_its_ffn_widths_and_the_layers_that_share_an_ffn(bert_bundle, tiny_task, tmp_path):
    """A teacher pruned or shared by an earlier run: sharing its layers' FFN is checked against
    their recorded widths up front."""
    from compressor.passes.pruning import PruneFFN
    from compressor.passes.sharing import ShareLayers
    ctx = Context(task=tiny_task)
    plain = registry.shape_of(bert_bundle.save(tmp_path / "plain"))
    width = bert_bundle.model.config.intermediate_size
    assert plain.ffn == (width,) * 4 and plain.shared_ffn == ()
    pruned = apply_pass(bert_bundle, "prune-ffn", PruneFFN(fraction=0.5, importance="magnitude"), ctx)
    widths = tuple(layer.intermediate.dense.out_features for layer in pruned.model.bert.encoder.layer)
    assert registry.shape_of(pruned.save(tmp_path / "pruned")).ffn == widths
    shared = apply_pass(bert_bundle, "share-layers", ShareLayers(groups=2, mode="ffn"), ctx)
    assert registry.shape_of(shared.save(tmp_path / "shared")).shared_ffn == ((0, 1), (2, 3))
    assert registry.shape_of(shared.save(tmp_path / "shared")).shared_attention == ()


def test_a_training_pass_trains_at_its_input_models_length_unless_it_sets_one(bert_bundle, tiny_task):
    """A model fine-tuned at 64 tokens: a training step trains (and its output records) 64,
    not the config's default 128; a step's own max_length wins; a pass that trains nothing
    keeps the length."""
    ctx = Context(task=tiny_task, max_train_samples=16, show_progress=False)
    start = bert_bundle.replace(max_length=64)
    cfg = FinetuneConfig(epochs=1, batch_size=16)
    out = apply_pass(start, "finetune", cfg, ctx)
    assert out.max_length == out.history[-1]["config"]["max_length"] == 64
    own = apply_pass(start, "finetune", FinetuneConfig(epochs=1, batch_size=16, max_length=32), ctx)
    assert own.max_length == own.history[-1]["config"]["max_length"] == 32
    from compressor.passes.layers import DropLayers
    assert apply_pass(start, "drop-layers", DropLayers(keep=(0, 1)), ctx).max_length == 64
    assert apply_pass(bert_bundle, "finetune", cfg, ctx).history[-1]["config"]["max_length"] == 128


def test_a_config_as_written_keeps_its_type_tag_and_leaves_defaults_out():
    from typing import Literal

    from compressor.passes.registry import PassConfig, config_as_written

    class Tagged(PassConfig):
        kind: Literal["tagged"] = "tagged"     # which type: a choice even when left at its default
        size: int = 3
        style: Literal["a", "b"] = "a"          # an option with a default, not a tag

    assert config_as_written(Tagged()) == {"kind": "tagged"}
    assert config_as_written(Tagged(size=4)) == {"kind": "tagged", "size": 4}


@pytest.mark.parametrize("kwargs, expected", [
    # a task name read as a split: drop-layers then said the train split had one row
    ({"task": "wordnet-supersense"}, "Context: task is a str; expected a TaskData, e.g. pretrain.data.load_task"),
    ({"teacher_source": "teacher-dir"}, "Context: teacher_source is a str; expected a LazyTeacher, e.g. "
                                        "LazyTeacher.from_dir"),
])
def test_a_context_of_the_wrong_kinds_is_refused_when_built(tiny_task, kwargs, expected):
    with pytest.raises(UserError, match=expected):
        Context(**{"task": tiny_task, **kwargs})


def test_apply_pass_refuses_arguments_of_the_wrong_kinds(bert_bundle, tiny_task, tiny_bert_dir):
    from compressor.passes.layers import DropLayers
    with pytest.raises(UserError, match=r"apply_pass\('drop-layers'\): got a PosixPath; expected a ModelBundle"):
        apply_pass(tiny_bert_dir, "drop-layers", DropLayers(keep=(0,)), Context(task=tiny_task))
    with pytest.raises(UserError, match=r"apply_pass\('drop-layers'\): got a TaskData; expected a Context"):
        apply_pass(bert_bundle, "drop-layers", DropLayers(keep=(0,)), tiny_task)
