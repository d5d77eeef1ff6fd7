"""`compressor run --plan`: the stages a run would build are exactly the ones it then builds."""

from __future__ import annotations

import copy
import logging
import re
import shutil

from pathlib import Path

import pytest

from compressor.cli import main
from compressor.pipeline.plan import plan_recipe
from compressor.pipeline.recipe import WORK_DIR, parse_recipe
from compressor.pipeline.stages import teacher_key, variant_key
from pretrain.data import load_task
from pretrain.errors import UserError

VARIANTS = {
    "two-layers": [{"drop-layers": {"keep": [0, 2]}}, {"finetune": {"epochs": 1}}],
    "two-layers-int8": [{"drop-layers": {"keep": [0, 2]}}, {"finetune": {"epochs": 1}},
                        {"quantize": {"mode": "dynamic-int8"}}],
    "int8": [{"quantize": {"mode": "dynamic-int8"}}],
}


def raw_recipe(model_dir, csv_path) -> dict:
    return {"name": "tiny-plan", "seed": 0,
            "teacher": {"model": str(model_dir), "task": {"path": str(csv_path)},
                        "finetune": {"epochs": 1, "batch_size": 16, "lr": 1e-3}},
            "data": {"max_train_samples": 120, "max_eval_samples": 60},
            "variants": copy.deepcopy(VARIANTS),
            "export": {"onnx": True, "optimize": True, "accuracy_tolerance": 1.0},
            "benchmark": {"profiles": ["cpu"], "batch_sizes": [2], "iterations": 5,
                          "baselines": ["pytorch-eager-fp32", "onnxruntime-fp32"]}}


def plan(raw: dict, out, **kwargs) -> dict:
    recipe, steps = parse_recipe(raw)
    return plan_recipe(recipe, steps, out, **kwargs)


def states(planned: dict) -> dict[str, str]:
    return {s["stage"]: s["state"] for s in planned["stages"]}


def built_by(run_raw, raw: dict, out, caplog) -> set[str]:
    """The stages a run really builds, from its 'X: building' log lines (kept prefixes aside:
    the plan names them as where a variant starts, not as stages)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="compressor.pipeline"):
        run_raw(raw, out)
    built = {m.group(1) for r in caplog.records if (m := re.match(r"stage (\S+): building$", r.getMessage()))}
    return {name for name in built if not name.startswith("prefixes/")}


@pytest.fixture(scope="module")
def done(tiny_bert_dir, tiny_csv, tmp_path_factory, run_raw):
    out = tmp_path_factory.mktemp("plan") / "run"
    raw = raw_recipe(tiny_bert_dir, tiny_csv)
    planned = plan(raw, out)
    assert not out.exists()              # a plan writes nothing, not even the dir
    run_raw(raw, out)
    return raw, out, planned


def test_a_fresh_dir_plans_every_stage_and_what_builds_it(done):
    _, _, planned = done
    by_stage = {s["stage"]: s for s in planned["stages"]}
    assert set(states(planned).values()) == {"build"}
    assert list(by_stage) == ["teacher", "two-layers", "two-layers-int8", "int8", "teacher-onnx", "two-layers-onnx",
                              "two-layers-int8-onnx", "int8-onnx", "baselines/onnxruntime-fp32", "benchmark"]
    assert by_stage["teacher"]["passes"] == ["finetune"] and by_stage["teacher"]["trains"]
    assert by_stage["two-layers"]["passes"] == ["drop-layers", "finetune"]
    # The int8 variant starts from the model two-layers will have made: only its quantize runs.
    assert by_stage["two-layers-int8"]["passes"] == ["quantize"] and by_stage["two-layers-int8"]["start"] == "two-layers"
    assert not by_stage["two-layers-int8"]["trains"] and not by_stage["int8"]["trains"]


def test_after_a_run_everything_is_cached(done):
    raw, out, _ = done
    again = plan(raw, out)
    assert set(states(again).values()) == {"cached"}
    assert all(s["last_build_seconds"] is not None for s in again["stages"])


def test_the_plan_names_exactly_the_stages_a_changed_recipe_rebuilds(done, tmp_path, run_raw, caplog):
    raw, out, _ = done
    copy_dir = tmp_path / "run"
    shutil.copytree(out, copy_dir)
    changed = copy.deepcopy(raw)
    changed["variants"]["two-layers-int8"][1]["finetune"]["epochs"] = 2    # its own trained prefix now
    changed["variants"]["int8"][0]["quantize"]["per_channel"] = True
    planned = plan(changed, copy_dir)
    to_build = {name for name, state in states(planned).items() if state == "build"}
    assert to_build == {"two-layers-int8", "int8", "two-layers-int8-onnx", "int8-onnx", "benchmark"}
    by_stage = {s["stage"]: s for s in planned["stages"]}
    # drop-layers does not train, so no prefix was kept after it: the variant starts over.
    assert by_stage["two-layers-int8"]["passes"] == ["drop-layers", "finetune", "quantize"]
    assert by_stage["two-layers-int8"]["start"] == "teacher" and by_stage["two-layers-int8"]["trains"]
    assert built_by(run_raw, changed, copy_dir, caplog) == to_build
    assert set(states(plan(changed, copy_dir)).values()) == {"cached"}


def test_a_cached_model_scored_on_another_test_sample_reads_as_re_scored(done, tmp_path, run_raw, caplog):
    """A changed data.max_eval_samples keeps every model's weights (not in their keys), but the
    run scores each again on the new test examples: the plan said a plain `cached`."""
    from compressor.pipeline.plan import plan_lines
    raw, out, _ = done
    copy_dir = tmp_path / "run"
    shutil.copytree(out, copy_dir)
    changed = copy.deepcopy(raw)
    changed["data"]["max_eval_samples"] = 20
    planned = plan(changed, copy_dir)
    models = {"teacher", *VARIANTS}
    by_stage = {s["stage"]: s for s in planned["stages"]}
    assert {name: (by_stage[name]["state"], by_stage[name]["rescored_on"]) for name in models} == \
        dict.fromkeys(models, ("cached", 20))
    assert all(s["rescored_on"] is None for s in planned["stages"] if s["stage"] not in models)
    lines = plan_lines(planned)
    assert any(re.fullmatch(r"\s+two-layers\s+cached\s+re-scored on 20 test examples \(its metrics are of another "
                            r"data\.max_eval_samples\); last built in \d+ s", line) for line in lines), lines
    assert lines[-1].endswith("; 4 cached to re-score")
    to_build = {name for name, state in states(planned).items() if state == "build"}
    # What the run then does: builds those, and re-scores exactly the stages the plan named.
    assert built_by(run_raw, changed, copy_dir, caplog) == to_build
    rescored = {m.group(1) for r in caplog.records
                if (m := re.match(r"stage (\S+): cached; evaluating it on the recipe's test examples$", r.getMessage()))}
    assert rescored == models
    again = plan(changed, copy_dir)
    assert set(states(again).values()) == {"cached"} and all(s["rescored_on"] is None for s in again["stages"])


def test_a_checkpoint_left_by_an_interrupted_step_is_named_as_resumed(done, tmp_path):
    raw, out, _ = done
    copy_dir = tmp_path / "run"
    shutil.copytree(out, copy_dir)
    changed = copy.deepcopy(raw)
    changed["variants"]["two-layers"][1]["finetune"]["epochs"] = 2
    recipe, steps = parse_recipe(changed)
    teacher = teacher_key(recipe, Path(raw["teacher"]["model"]), load_task(recipe.teacher.task, seed=0))
    two = next(s for s in plan(changed, copy_dir)["stages"] if s["stage"] == "two-layers")
    assert two["state"] == "build" and two["resumes"] is None
    work = copy_dir / WORK_DIR / variant_key(teacher, recipe, steps["two-layers"])   # the finetune step's dir
    work.mkdir(parents=True)
    two = next(s for s in plan(changed, copy_dir)["stages"] if s["stage"] == "two-layers")
    assert two["resumes"] == str(work)


def test_bad_input_stops_the_plan_as_it_stops_the_run(done, tmp_path):
    raw, _, _ = done
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="neither `compressor run` nor `compressor search` wrote"):
        plan(raw, users)
    assert sorted(p.name for p in users.iterdir()) == ["notes.txt"]
    other = copy.deepcopy(raw)
    other["teacher"]["task"] = {"path": str(tmp_path / "missing.csv")}
    with pytest.raises(UserError, match="missing.csv"):
        plan(other, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_force_over_another_recipes_dir_plans_everything(done, tmp_path):
    raw, out, _ = done
    copy_dir = tmp_path / "run"
    shutil.copytree(out, copy_dir)
    renamed = {**copy.deepcopy(raw), "name": "another"}
    with pytest.raises(UserError, match="--force"):
        plan(renamed, copy_dir)
    forced = plan(renamed, copy_dir, force=True)
    assert set(states(forced).values()) == {"build"} and forced["notes"]


def test_the_command_prints_the_plan_and_writes_nothing(done, tmp_path, capsys):
    import yaml
    raw, out, _ = done
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert main(["run", str(recipe_file), "--out", str(out), "--plan"]) == 0
    printed = capsys.readouterr().out
    assert "nothing was run or written" in printed
    assert re.search(r"^\s+two-layers\s+cached", printed, re.M)
    assert "0 of 10 stages to build" in printed
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before



def test_a_variant_whose_steps_an_earlier_one_ran_reads_as_a_copy_of_it():
    from dataclasses import asdict

    from compressor.pipeline.plan import PlannedStage, plan_lines
    stages = [PlannedStage("same", "variant", "build", start="teacher"),
              PlannedStage("a", "variant", "build", passes=["drop-layers"], start="teacher"),
              PlannedStage("b", "variant", "build", start="a"),
              PlannedStage("c", "variant", "build", passes=["quantize"], start="b")]
    lines = plan_lines({"recipe": "r", "out": "out", "notes": [], "stages": [asdict(s) for s in stages]})
    assert lines[2:6] == ["  same   build   the teacher as is", "  a      build   drop-layers",
                          "  b      build   a copy of a (the same steps)", "  c      build   quantize (from b)"]


def test_a_build_time_that_leaves_out_a_killed_build_reads_as_a_lower_bound(done, tmp_path, capsys):
    import json

    import yaml
    raw, out, _ = done
    copy_dir = tmp_path / "run"
    shutil.copytree(out, copy_dir)
    record_file = copy_dir / "two-layers" / "stage.json"
    record = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**record, "build_seconds": 412.3, "build_attempts": 2,
                                       "build_seconds_partial": True}))
    by_stage = {s["stage"]: s for s in plan(raw, copy_dir)["stages"]}
    assert by_stage["two-layers"]["last_build_partial"] and not by_stage["teacher"]["last_build_partial"]
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["run", str(recipe_file), "--out", str(copy_dir), "--plan"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^\s+two-layers\s+cached\s+last built in at least 412 s \(a killed build's time is not counted\)$",
                     printed, re.M)
    assert not re.search(r"^\s+teacher\s+.*at least", printed, re.M)


def test_a_teacher_used_as_is_says_what_building_it_does(tiny_bert_dir, tiny_csv, tmp_path):
    from compressor.pipeline.plan import plan_lines
    raw = raw_recipe(tiny_bert_dir, tiny_csv)
    del raw["teacher"]["finetune"]
    planned = plan(raw, tmp_path / "run")
    teacher = next(s for s in planned["stages"] if s["stage"] == "teacher")
    assert teacher["state"] == "build" and teacher["passes"] == [] and not teacher["trains"]
    assert any(re.fullmatch(r"\s+teacher\s+build\s+the teacher as is \(no fine-tuning\), saved and scored", line)
               for line in plan_lines(planned))


def test_an_out_dir_the_plan_refuses_is_named_after_the_recipe_file(done, tmp_path):
    raw, out, _ = done
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(UserError, match=r"^recipes/r.yaml: --out .*a-file is a file; expected a directory"):
        plan(raw, tmp_path / "a-file", source="recipes/r.yaml")
    with pytest.raises(UserError, match=r"^recipes/r.yaml: .*run holds results of recipe 'tiny-plan'; refusing"):
        plan({**raw, "name": "another"}, out, source="recipes/r.yaml")
