"""run_recipe: a validated recipe -> its stages, in order -> report.json and the human reports."""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

from compressor.bench.baselines import OPTIMUM, check_baselines
from compressor.bundle import read_provenance, recorded_pair_task
from compressor.evaluate import check_pair_task, recorded_task_seed
from compressor.export.graph_cache import fp32_graphs
from compressor.export.onnx import calibration_rows
from compressor.passes import get_pass
from compressor.passes.registry import Known, check_pass_tokenizer, shape_after, shape_of
from compressor.pipeline.benchmark_stages import (baseline_deployable, baseline_stage, baselines_to_build,
                                                  benchmark_stage, check_batches_fit, check_sequence_lengths,
                                                  optimum_presets, variant_deployable)
from compressor.pipeline.cache import log
from compressor.pipeline.outdir import WriteError, claimed_out_dir, disk_errors
from compressor.pipeline.paths import resolve_config_paths, resolve_path, resolve_step_paths, resolve_task_paths
from compressor.pipeline.recipe import SEARCH_DIR, STAGE_FILE, WORK_DIR, Recipe, Step, located
from compressor.pipeline.report_data import build_report
from compressor.pipeline.stages import (Stage, export_stage, pass_context, config_inputs, teacher_stage,
                                       variant_stage)
from compressor.report.render import write_reports
from pretrain.atomic import check_output
from pretrain.data import TaskData, load_task, task_files
from pretrain.errors import UserError
from pretrain.models import (BUNDLED_MODELS, check_head_for, check_model_ref, load_tokenizer, read_model_type,
                            set_threads)


@dataclass(frozen=True)
class Prepared:
    """A recipe checked against its inputs before any stage runs (`prepare`)."""

    recipe: Recipe                   # its teacher's fine-tuning data paths resolved
    teacher_ref: str                 # as a model loader takes it: a bundled name or a dir
    teacher_path: Path
    steps: dict[str, list[Step]]     # each variant's steps, their paths resolved
    task: TaskData
    presets: dict[str, str]          # Optimum's preset for each measured profile
    split_seed: int                  # the seed the task's splits were drawn with (`task_split_seed`)
    notes: tuple[str, ...] = ()      # what the run does that the recipe does not say (--plan prints them)


def prepare(recipe: Recipe, steps: dict[str, list[Step]], out_dir: Path, base_dir: Path, source: str = "", *,
            scored: str | None = None) -> Prepared:
    """Every check that needs no stage: the teacher, baselines and presets, each pass against
    the teacher's family and tokenizer, the task's data, and --out against the inputs. Bad
    input stops here, before anything is written; an error of the recipe's starts with its
    `source` (the recipe file), as its validation errors do. `scored`: as for `load_task`."""
    with located(source):
        prepared = checked_against_inputs(recipe, steps, base_dir, scored)
    # Stages replace what they write under out_dir (and --force its whole contents): no
    # input may lie there, or around it.
    recipe, steps = prepared.recipe, prepared.steps
    configs = [step.config for variant_steps in steps.values() for step in variant_steps]
    configs += [recipe.teacher.finetune] if recipe.teacher.finetune is not None else []
    task_spec = resolve_task_paths(recipe.teacher.task, base_dir)
    with located(source):       # --out is the run's: its refusals name the recipe file too
        check_output(out_dir, [prepared.teacher_path, *task_files(task_spec),
                               *(p for c in configs for p in config_inputs(c))], owner_files=None)
    return prepared


def checked_against_inputs(recipe: Recipe, steps: dict[str, list[Step]], base_dir: Path,
                           scored: str | None = None) -> Prepared:
    teacher_ref = resolve_path(recipe.teacher.model, base_dir, keep=BUNDLED_MODELS)
    teacher_path = check_model_ref(teacher_ref)
    family = read_model_type(teacher_path)
    presets: dict[str, str] = {}
    if recipe.benchmark is not None:
        check_baselines(recipe.benchmark.baselines, family)
        check_sequence_lengths(recipe.benchmark, teacher_path)
        if OPTIMUM in recipe.benchmark.baselines:
            presets = optimum_presets(recipe.benchmark)     # a preset this CPU cannot run stops here
    # Paths first: a family check may read a model dir a step names (distill's teacher).
    steps = {name: [resolve_step_paths(step, base_dir) for step in variant_steps]
             for name, variant_steps in steps.items()}
    task_spec = resolve_task_paths(recipe.teacher.task, base_dir)
    split_seed, notes = task_split_seed(recipe, teacher_path, task_spec)
    with located("teacher.task"):
        task = load_task(task_spec, seed=split_seed, scored=scored)
    if recipe.benchmark is not None:
        test = task.split("test")
        scored = len(test.head(recipe.data.max_eval_samples))
        check_batches_fit(recipe.benchmark, scored, capped=scored < len(test))
    if recipe.teacher.finetune is None:
        check_head_for(teacher_path, tuple(task.label_names), task.name)
        with located("teacher.model"):   # used as saved, it must have been trained on this shape of input
            check_pair_task(recorded_pair_task(read_provenance(teacher_path), teacher_path), task, teacher_path)
    else:
        recipe = with_teacher_finetune(recipe, resolve_config_paths(recipe.teacher.finetune, base_dir))
        check_inputs_exist(recipe.teacher.finetune, "teacher.finetune")
        with located("teacher.finetune"):
            check_extra_tasks(recipe.teacher.finetune)
    check_steps_fit(steps, teacher_path, task, exports=recipe.export is not None and recipe.export.onnx,
                    max_train_samples=recipe.data.max_train_samples)
    return Prepared(recipe, teacher_ref, teacher_path, steps, task, presets, split_seed, notes)


def task_split_seed(recipe: Recipe, teacher_path: Path, task_spec: str | dict) -> tuple[int, tuple[str, ...]]:
    """The seed to draw the task's splits with, and a note where it is not the recipe's. A
    teacher used as is that records the seed its own fine-tuning drew this task's splits
    with keeps it: with another, rows it trained on would be scored as test rows. A teacher
    the recipe fine-tunes trains on the recipe's splits."""
    recorded = recorded_task_seed(teacher_path, task_spec) if recipe.teacher.finetune is None else None
    if recorded is None or recorded == recipe.seed:
        return recipe.seed, ()
    return recorded, (f"the teacher is used as is (no finetune) and was fine-tuned on this task's splits drawn with "
                      f"seed {recorded}: the splits are drawn with seed {recorded}, not the recipe's seed "
                      f"{recipe.seed}, so no row it trained on is scored as a test row (the recipe's seed still "
                      "seeds the passes)",)


def with_teacher_finetune(recipe: Recipe, finetune_cfg) -> Recipe:
    return recipe.model_copy(update={"teacher": recipe.teacher.model_copy(update={"finetune": finetune_cfg})})


def run_recipe(recipe: Recipe, steps: dict[str, list[Step]], out_dir: Path, *,
               base_dir: Path = Path("."), show_progress: bool = True, force: bool = False,
               rebenchmark: bool = False, held: bool = False, source: str = "", threads: int | None = None,
               deadline: float | None = None) -> dict:
    """Run every stage of a validated recipe into out_dir and return the report (`held`: the
    caller holds out_dir's lock, see `claimed_out_dir`; `source`: the recipe file, which the
    errors of its checks name; `threads`: torch's threads for training and scoring, default
    every core; `deadline`: time.monotonic() by which the benchmark ends, with fewer timed
    calls where its profiles' would run past it)."""
    set_threads(threads)
    # The report's warnings name the scored test examples whose text train holds (data_warnings).
    prepared = prepare(recipe, steps, out_dir, base_dir, source, scored="test")
    recipe, steps, task, presets = prepared.recipe, prepared.steps, prepared.task, prepared.presets
    for note in prepared.notes:
        log.info("note: %s", note)
    with claimed_out_dir(out_dir, recipe, force, held=held, source=source) as created:
        try:
            teacher = teacher_stage(recipe, prepared.teacher_ref, prepared.teacher_path, task, prepared.split_seed,
                                    out_dir, show_progress)
            ctx = pass_context(recipe, task, teacher, show_progress)
            variants: list[Stage] = []
            for name, variant_steps in steps.items():
                variants.append(variant_stage(name, variant_steps, teacher, variants, recipe, task, out_dir, ctx,
                                              source))
            exports = {}
            if recipe.export is not None and recipe.export.onnx:
                stages = [teacher, *variants]
                shared = exported_more_than_once(stages)
                with fp32_graphs() as graphs:   # a model exported twice (fp32 and int8) is traced once
                    exports = {stage.name: export_stage(stage, recipe.export, recipe, task, out_dir,
                                                        graphs if stage.name in shared else None)
                               for stage in stages}
            baselines, benchmark = [], None
            if recipe.benchmark is not None:
                baselines = [baseline_stage(name, teacher, recipe, task, out_dir, presets)
                             for name in baselines_to_build(recipe.benchmark)]
                deployables = [baseline_deployable(b) for b in baselines] + \
                    [variant_deployable(stage, exports.get(stage.name)) for stage in variants]
                benchmark = benchmark_stage(deployables, teacher, recipe, task, out_dir, rebenchmark, deadline)
        except WriteError:
            raise   # finished stages are complete and cached: keep them for the rerun
        except UserError as err:
            # Bad input only running could find (a head count against the heads an earlier
            # pruning left): the stages finished before it are whole and cost training, so
            # they stay, as after an interruption, and the corrected recipe resumes after them.
            # A dir this run created and finished nothing in goes.
            if not finished_stages(out_dir):
                if created:
                    shutil.rmtree(out_dir, ignore_errors=True)
                raise
            raise UserError(f"{err}; the stages finished before it are kept in {out_dir}: correct the recipe and "
                            "rerun to resume after them") from None
        # Every stage of this recipe is written, and each took its own checkpoints away: what
        # is left in .work belongs to settings the recipe no longer has (a run stopped, then
        # edited) and would never be resumed.
        shutil.rmtree(out_dir / WORK_DIR, ignore_errors=True)
        report = build_report(recipe, teacher, variants, exports, baselines, benchmark, task=task)
        with disk_errors(out_dir):
            write_reports(report, out_dir)
        if recipe.search is not None:
            report["search"] = recipe_search(recipe, teacher, base_dir, out_dir, show_progress)
            with disk_errors(out_dir):
                write_reports(report, out_dir)      # report.md and .html show the search too
    return report


def exported_more_than_once(stages: list[Stage]) -> set[str]:
    """The stages whose saved model another stage also holds (`scored_model`): only their
    exports keep an fp32 graph for the others, so a recipe of many distinct models does not
    fill the temp dir with graphs nothing reads again."""
    seen: dict[str, list[str]] = {}
    for stage in stages:
        if stage.scored_model is not None:
            seen.setdefault(stage.scored_model, []).append(stage.name)
    return {name for names in seen.values() if len(names) > 1 for name in names}


def finished_stages(out_dir: Path) -> list[Path]:
    return sorted(out_dir.glob(f"*/{STAGE_FILE}")) + sorted(out_dir.glob(f"*/*/{STAGE_FILE}"))


def recipe_search(recipe: Recipe, teacher: Stage, base_dir: Path, out_dir: Path, show_progress: bool) -> dict:
    """The recipe's `search:` from its teacher stage, into DIR/search/ (its own report there);
    on the benchmark's first profile (`cpu` without a benchmark section)."""
    from compressor.search.run import run_search
    profile = recipe.benchmark.profiles[0] if recipe.benchmark is not None else "cpu"
    result = run_search(teacher.path, resolve_task_paths(recipe.teacher.task, base_dir), profile, recipe.search,
                        out_dir / SEARCH_DIR, show_progress=show_progress)
    return {"dir": SEARCH_DIR, **{k: result[k] for k in ("met", "outcome", "chosen", "best_effort", "recipe_file")}}


def check_inputs_exist(config, label: str) -> None:
    """Files and dirs a step's config (or the teacher's fine-tuning settings) names (an
    embeddings dir, a masked LM, a teacher, a corpus): present now, or the run would stop when
    the step runs (or its cache key is computed)."""
    for path in config_inputs(config):
        if str(path) not in BUNDLED_MODELS and not Path(path).exists():
            raise UserError(f"{label}: {path} not found; expected an existing file or dir")


def check_extra_tasks(config) -> None:
    """The other tasks a training step reads (multi-task, intermediate), loaded now: a missing
    file or column stops the run before the teacher trains, not when the step runs. A domain
    corpus is checked for existence with the other inputs (check_output)."""
    for spec in (getattr(config, "intermediate_task", None), *getattr(config, "tasks", ())):
        if spec is not None:
            load_task(spec, seed=getattr(config, "seed", 0))


def check_steps_fit(steps: dict[str, list[Step]], teacher_path: Path, task: TaskData, exports: bool,
                    max_train_samples: int | None = None) -> None:
    """Refuse, before any stage runs, a step that cannot fit the model it will get: its family
    and tokenizer, its layer indices, head counts, widths and labels (the shape followed from
    the teacher's through the steps before it: passes/registry.py `Shape`), and the examples
    an exported quantize mode calibrates on."""
    tokenizer = functools.cache(lambda: load_tokenizer(teacher_path))   # only if a pass checks it
    teacher = shape_of(teacher_path, labels=tuple(task.label_names))    # fine-tuned on the task's labels
    for name, variant_steps in steps.items():
        known = Known(model=teacher, teacher=teacher, train_rows=len(task.split("train")), pair_task=task.is_pair_task,
                      max_train_samples=max_train_samples)
        for i, step in enumerate(variant_steps):
            with located(f"variants.{name}[{i}]"):
                known = shape_after(step.name, step.config, known)
                if get_pass(step.name).check_tokenizer is not None:
                    check_pass_tokenizer(step.name, step.config, tokenizer())
                if exports and step.name == "quantize":
                    calibration_rows(step.config, task)
                check_extra_tasks(step.config)
                check_inputs_exist(step.config, step.name)
