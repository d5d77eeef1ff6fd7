"""Plans: their recipe steps, the structure the latency model sees, and the Optuna space."""

from __future__ import annotations

import optuna
import pytest
from pydantic import ValidationError

from compressor.pipeline.recipe import parse_step
from compressor.search.latency import TeacherShape
from compressor.search.plans import (Plan, kept_layers, largest_plans, plan_params, plan_steps, plan_structure,
                                     smallest_plans, suggest_plan, theseus_depths)

SHAPE = TeacherShape(hidden=384, head_dim=32, layers=6, heads=12, ffn=1536)


def test_kept_layers_are_evenly_spaced_from_the_first():
    assert kept_layers(6, 3) == [0, 2, 4] and kept_layers(6, 2) == [0, 3] and kept_layers(6, 6) == list(range(6))
    assert kept_layers(12, 4) == [0, 3, 6, 9] and kept_layers(6, 1) == [0]


def test_steps_of_a_pruned_distilled_int8_plan_parse_as_a_recipe_variant():
    plan = Plan(layers=3, heads_removed=0.5, ffn_removed=0.7, recovery="distill", precision="int8")
    steps = plan_steps(plan, 6, samples=30000, scoring_samples=256)
    assert [next(iter(s)) for s in steps] == ["drop-layers", "prune-heads", "prune-ffn", "distill", "quantize"]
    assert steps[0]["drop-layers"]["keep"] == [0, 2, 4]
    assert steps[1]["prune-heads"] == {"fraction": 0.5, "samples": 256}
    assert steps[3]["distill"]["max_train_samples"] == 30000 and "hard" in steps[3]["distill"]["losses"]
    parsed = [parse_step(s, "plan") for s in steps]
    assert parsed[2].config.fraction == 0.7 and parsed[4].config.mode == "dynamic-int8"


def test_whole_depth_finetune_plan_has_no_structural_steps():
    steps = plan_steps(Plan(layers=6), 6, samples=100)
    assert steps == [{"finetune": {"epochs": 1.0, "max_train_samples": 100}}]


def test_a_proxy_rate_reaches_every_recovery_and_none_keeps_the_pass_default():
    for recovery in ("finetune", "distill", "theseus"):
        steps = plan_steps(Plan(layers=2, recovery=recovery), 6, samples=10, lr=1e-3)
        (training,) = [config for step in steps for name, config in step.items()
                       if name in ("finetune", "distill", "theseus")]
        assert training["lr"] == 1e-3
    assert "lr" not in plan_steps(Plan(layers=2), 6, samples=10)[-1]["finetune"]


def test_proxy_rate_grows_with_the_layers_removed_up_to_ten_times_the_default():
    from compressor.search.plans import proxy_lr
    assert proxy_lr(Plan(layers=6), 6) == pytest.approx(1e-4)             # the whole teacher: finetune's
    assert proxy_lr(Plan(layers=2), 6) == pytest.approx(3e-4)
    assert proxy_lr(Plan(layers=1), 12) == pytest.approx(1e-3)            # capped at 10x
    assert proxy_lr(Plan(layers=3, recovery="theseus"), 6) == pytest.approx(6e-4)   # theseus's 3e-4 x 2


def test_theseus_plans_replace_blocks_and_prune_nothing():
    assert plan_steps(Plan(layers=2, recovery="theseus"), 6, samples=10)[0]["theseus"]["successor_layers"] == 2
    assert theseus_depths(6) == [1, 2, 3] and theseus_depths(4) == [1, 2] and theseus_depths(1) == []
    with pytest.raises(ValidationError, match="removes no heads"):
        Plan(layers=2, heads_removed=0.5, recovery="theseus")
    with pytest.raises(ValueError, match="divide"):
        plan_steps(Plan(layers=4, recovery="theseus"), 6, samples=10)
    with pytest.raises(ValueError, match="the teacher has 6"):
        plan_steps(Plan(layers=7), 6, samples=10)


def test_structure_keeps_the_totals_pruning_leaves():
    structure = plan_structure(Plan(layers=3, heads_removed=0.5, ffn_removed=0.75, precision="int8"), SHAPE)
    assert structure.precision == "int8" and len(structure.heads) == 3
    assert sum(structure.heads) == 18 and sum(structure.ffn) == 3 * 1536 // 4
    uneven = plan_structure(Plan(layers=4, heads_removed=0.25), SHAPE)        # 36 of 48 heads
    assert uneven.heads == (9, 9, 9, 9)
    assert plan_structure(Plan(layers=2, heads_removed=0.95), SHAPE).heads == (1, 1)   # a head per layer stays


def test_the_smallest_and_largest_plans_cover_every_recovery_and_precision_asked_for():
    smallest = smallest_plans(6, ("distill", "theseus"), ("fp32", "int8"))
    assert [(p.recovery, p.precision) for p in smallest] == [("distill", "fp32"), ("distill", "int8"),
                                                            ("theseus", "fp32"), ("theseus", "int8")]
    assert len(plan_structure(smallest[1], SHAPE).heads) == 1 and smallest[1].ffn_removed == 0.9
    assert smallest[2].layers == 1                                        # theseus: one successor
    # Every layer, nothing pruned: theseus' largest (3 of 6 layers) only where it is the one recovery.
    assert [(p.layers, p.recovery) for p in largest_plans(6, ("finetune", "theseus"), ("fp32",))] == [(6, "finetune")]
    assert [(p.layers, p.recovery) for p in largest_plans(6, ("theseus",), ("fp32",))] == [(3, "theseus")]
    assert [p.recovery for p in smallest_plans(1, ("theseus", "finetune"), ("fp32",))] == ["finetune"]


@pytest.mark.parametrize("recoveries, precisions", [(("finetune", "distill", "theseus"), ("fp32", "int8")),
                                                    (("theseus", "distill"), ("int8",))])
def test_a_plan_queued_by_its_params_is_the_plan_suggested(recoveries, precisions):
    """The search queues its seed plans as trial parameters: they must be the names and values
    suggest_plan reads, narrowed lists included, or the sampler would draw them instead."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    plans = smallest_plans(6, recoveries, precisions) + largest_plans(6, recoveries, precisions)
    for plan in plans:
        study.enqueue_trial(plan_params(plan, 6, recoveries, precisions))
    for plan in plans:
        trial = study.ask()
        assert suggest_plan(trial, 6, recoveries, precisions) == plan
        study.tell(trial, 1.0)


def test_suggested_plans_are_valid_for_the_depth():
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(60):
        trial = study.ask()
        plan = suggest_plan(trial, 6, ("finetune", "distill", "theseus"), ("fp32", "int8"))
        plan_steps(plan, 6, samples=10)                         # raises for an invalid plan
        seen.add(plan.recovery)
        study.tell(trial, [0.5, 1.0])
    assert seen == {"finetune", "distill", "theseus"}
    trial = optuna.create_study().ask()
    assert suggest_plan(trial, 1, ("theseus", "finetune"), ("fp32",)).recovery == "finetune"   # no block to replace


def test_a_resumed_study_may_narrow_the_precisions_and_recoveries():
    # Optuna refused a categorical whose choices changed within a study: a resumed search with
    # fewer --precisions (as the README allows) raised a traceback on its first trial.
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(3):
        trial = study.ask()
        study.tell(trial, len(suggest_plan(trial, 6, ("finetune", "distill", "theseus"), ("fp32", "int8")).name))
    for _ in range(5):
        trial = study.ask()
        plan = suggest_plan(trial, 6, ("finetune",), ("int8",))
        assert (plan.precision, plan.recovery) == ("int8", "finetune")
        study.tell(trial, 1.0)
