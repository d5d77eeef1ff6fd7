"""`compressor run --plan`: what a run of a recipe into DIR would do, without running it.

The plan makes the run's own checks first (so bad input stops here too, in one line), then
gives each stage the state a run would find it in: `cached` (DIR holds it under the key
the run would compute) or `build`, with the passes a variant would run, where it would
start (the teacher, a kept prefix, or an earlier variant) and the checkpoint it would
resume from. A cached model stage whose metrics were measured on another number of test
examples (data.max_eval_samples changed since) is kept but scored again: the plan says so.
Keys come from the same functions the run uses (stages.py, benchmark_stages.py). Nothing is
written, not even the lock.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from pathlib import Path

from compressor.bench.baselines import OPTIMUM, preset_for_this_cpu
from compressor.passes import get_pass
from compressor.passes.registry import pass_names
from compressor.pipeline.benchmark_stages import (baseline_dir, baseline_key, baseline_stage, baselines_to_build,
                                                  benchmark_key, baseline_deployable, variant_deployable)
from compressor.pipeline.cache import BUILD_PARTIAL, BUILD_SECONDS, stage_record
from compressor.pipeline.outdir import holder_of, make_out_dir, replaced_by_claim
from compressor.pipeline.recipe import (BENCHMARK_DIR, PREFIXES_DIR, SEARCH_DIR, WORK_DIR, Recipe, Step,
                                       export_dir_name, located)
from compressor.pipeline.run import Prepared, prepare
from compressor.pipeline.stages import (export_key, export_stage, finished_stage, recorded_quantize,
                                        scored_on_other_examples, teacher_key, variant_key)

PYTORCH_BASELINE = "pytorch-eager-fp32"   # the teacher itself: no stage of its own


@dataclass(frozen=True)
class PlannedStage:
    stage: str                       # its dir under DIR (teacher, a variant, x-onnx, baselines/x, benchmark)
    kind: str                        # teacher | variant | export | baseline | benchmark | search
    state: str                       # cached | build
    passes: list[str] = field(default_factory=list)   # what building it runs, in order
    trains: bool = False             # building it trains a model (minutes, not seconds)
    start: str | None = None         # a variant's starting model: teacher, prefixes/<key>, an earlier variant
    resumes: str | None = None       # the checkpoint dir (DIR/.work/<key>) a build continues from
    last_build_seconds: float | None = None   # how long its last build took (stage.json), if known
    last_build_partial: bool = False  # that time leaves out a build killed before it could note its own
    rescored_on: int | None = None   # a cached model stage the run scores again: on this many test examples


def plan_recipe(recipe: Recipe, steps: dict[str, list[Step]], out_dir: Path, *, base_dir: Path = Path("."),
                force: bool = False, rebenchmark: bool = False, source: str = "") -> dict:
    """The plan of `run_recipe` with the same arguments: {"out", "notes", "stages"}."""
    prepared = prepare(recipe, steps, out_dir, base_dir, source)
    notes, replaced = list(prepared.notes), False
    if out_dir.exists():
        with located(source):                     # as the run's claim refuses it
            make_out_dir(out_dir)                 # a file in its place is refused, as by the run
            replaced = bool(replaced_by_claim(out_dir, recipe, force))
        if replaced:
            notes.append(f"--force: the results of another recipe in {out_dir} would be deleted first")
        holder = holder_of(out_dir)
        if holder:
            notes.append(f"{out_dir} is in use by another run ({holder}): states are as of now")
    planner = Planner(prepared.recipe, prepared, out_dir, replaced)
    stages = planner.model_stages()
    if recipe.export is not None and recipe.export.onnx:
        stages += planner.export_stages()
    if recipe.benchmark is not None:
        stages += planner.baseline_stages()
        stages.append(planner.benchmark_stage(stages, rebenchmark))
        if recipe.benchmark.baselines and not baselines_to_build(recipe.benchmark):
            notes.append("every benchmark profile is skipped on this machine: nothing will be measured, and the "
                         f"baselines ({', '.join(recipe.benchmark.baselines)}) are not built")
    if recipe.search is not None:
        stages.append(PlannedStage(SEARCH_DIR, "search", "build", passes=["search"], trains=True))
    return {"recipe": recipe.name, "out": str(out_dir), "notes": notes, "stages": [asdict(s) for s in stages]}


@dataclass
class Planner:
    recipe: Recipe
    prepared: Prepared
    out_dir: Path
    replaced: bool                   # --force would empty the dir first: nothing in it counts

    def record(self, path: Path) -> dict:
        return {} if self.replaced else stage_record(path)

    def state(self, path: Path, key: str) -> tuple[str, dict]:
        """`cached` or `build`, and the stage's last build time as PlannedStage holds it."""
        record = self.record(path)
        return ("cached" if record.get("key") == key else "build"), last_build(record)

    def rescored_on(self, path: Path, state: str) -> int | None:
        """How many test examples the run scores a cached model stage on again, where its
        metrics are of another test-sample limit (`scored_on_other_examples`, as `model_stage`
        decides); None where it keeps them, or builds the stage."""
        limit = self.recipe.data.max_eval_samples
        if state != "cached" or not scored_on_other_examples(self.record(path), limit):
            return None
        return len(self.prepared.task.split("test").head(limit))

    def checkpoint(self, key: str) -> str | None:
        work = self.out_dir / WORK_DIR / key
        return None if self.replaced or not work.is_dir() else str(work)

    @functools.cached_property
    def teacher_key(self) -> str:
        """Hashes the teacher's weights: once per plan, not once per stage."""
        return teacher_key(self.recipe, self.prepared.teacher_path, self.prepared.task)

    def model_stages(self) -> list[PlannedStage]:
        key = self.teacher_key
        state, timing = self.state(self.out_dir / "teacher", key)
        tunes = self.recipe.teacher.finetune is not None
        stages = [PlannedStage("teacher", "teacher", state, passes=["finetune"] if tunes and state == "build" else [],
                               trains=tunes and state == "build",
                               resumes=self.checkpoint(key) if state == "build" else None,
                               rescored_on=self.rescored_on(self.out_dir / "teacher", state), **timing)]
        will_exist: dict[str, str] = {}          # model key -> where the run will find it by then
        for name, variant_steps in self.prepared.steps.items():
            stages.append(self.variant(name, variant_steps, will_exist))
        return stages

    def variant(self, name: str, steps: list[Step], will_exist: dict[str, str]) -> PlannedStage:
        """As `variant_stage` builds it: from the longest prefix an earlier stage or a kept
        prefix dir holds, keeping the prefixes after passes that train."""
        def key_of(prefix: list[Step]) -> str:
            return variant_key(self.teacher_key, self.recipe, prefix)
        key = key_of(steps)
        state, timing = self.state(self.out_dir / name, key)
        if state == "cached":
            will_exist[key] = name
            return PlannedStage(name, "variant", state, rescored_on=self.rescored_on(self.out_dir / name, state),
                                **timing)
        done, start = 0, "teacher"
        for n in range(len(steps), 0, -1):
            prefix_key = key_of(steps[:n])
            kept = f"{PREFIXES_DIR}/{prefix_key}"
            if prefix_key in will_exist or self.record(self.out_dir / kept).get("key") == prefix_key:
                done, start = n, will_exist.get(prefix_key, kept)
                break
        to_run = range(done, len(steps))
        resumes = next((c for c in (self.checkpoint(key_of(steps[:i + 1])) for i in to_run) if c), None)
        for i in to_run:
            if get_pass(steps[i].name).trains and i + 1 < len(steps):
                will_exist[key_of(steps[:i + 1])] = f"{PREFIXES_DIR}/{key_of(steps[:i + 1])}"
        will_exist[key] = name
        return PlannedStage(name, "variant", state, passes=[steps[i].name for i in to_run],
                            trains=any(get_pass(steps[i].name).trains for i in to_run), start=start,
                            resumes=resumes, **timing)

    def export_stages(self) -> list[PlannedStage]:
        """One export per model stage; a model still to build is exported after it."""
        planned = []
        for name, steps in [("teacher", []), *self.prepared.steps.items()]:
            model = finished_stage(name, self.out_dir / name, self.model_key(name, steps)) \
                if not self.replaced else None
            if model is None:
                planned.append(PlannedStage(export_dir_name(name, quantize_mode(steps)), "export", "build",
                                            passes=["export"]))
                continue
            quantize = recorded_quantize(model.path)
            path = self.out_dir / export_dir_name(name, quantize.mode if quantize else None)
            state, timing = self.state(path, export_key(model.key, self.recipe.export, quantize, self.recipe))
            planned.append(PlannedStage(path.name, "export", state, passes=["export"] if state == "build" else [],
                                        **timing))
        return planned

    def model_key(self, name: str, steps: list[Step]) -> str:
        return self.teacher_key if name == "teacher" else variant_key(self.teacher_key, self.recipe, steps)

    def baseline_stages(self) -> list[PlannedStage]:
        planned = []
        for name in baselines_to_build(self.recipe.benchmark):
            if name == PYTORCH_BASELINE:
                continue
            presets: list[str | None] = [None]
            if name == OPTIMUM:      # one build per distinct preset, as `baseline_stage` makes them
                presets = list(dict.fromkeys(self.prepared.presets.values())) or [preset_for_this_cpu()]
            for preset in presets:
                path = baseline_dir(self.out_dir, name, preset)
                state, timing = self.state(path, baseline_key(name, preset, self.teacher_key, self.recipe))
                planned.append(PlannedStage(f"{path.parent.name}/{path.name}", "baseline", state,
                                            passes=[name] if state == "build" else [], **timing))
        return planned

    def benchmark_stage(self, upstream: list[PlannedStage], rebenchmark: bool) -> PlannedStage:
        """Measured again when asked, or when any model it measures is rebuilt; else its key
        (the deployed files' content) decides, computed from the cached stages as the run does."""
        record = self.record(self.out_dir / BENCHMARK_DIR)
        timing = last_build(record)
        if rebenchmark or any(s.state == "build" for s in upstream if s.kind != "search"):
            return PlannedStage(BENCHMARK_DIR, "benchmark", "build", passes=["benchmark"], **timing)
        key = benchmark_key(self.deployables(), self.recipe)
        state = "cached" if record.get("key") == key else "build"
        return PlannedStage(BENCHMARK_DIR, "benchmark", state, passes=["benchmark"] if state == "build" else [],
                            **timing)

    def deployables(self) -> list:
        """What the run would measure, every stage being cached (so the stage functions only read)."""
        recipe, task, out_dir = self.recipe, self.prepared.task, self.out_dir
        teacher = finished_stage("teacher", out_dir / "teacher", self.teacher_key)
        variants = [finished_stage(name, out_dir / name, self.model_key(name, steps))
                    for name, steps in self.prepared.steps.items()]
        exports = {}
        if recipe.export is not None and recipe.export.onnx:
            exports = {stage.name: export_stage(stage, recipe.export, recipe, task, out_dir)
                       for stage in [teacher, *variants]}
        baselines = [baseline_stage(name, teacher, recipe, task, out_dir, self.prepared.presets)
                     for name in baselines_to_build(recipe.benchmark)]
        return [baseline_deployable(b) for b in baselines] + \
            [variant_deployable(stage, exports.get(stage.name)) for stage in variants]


def last_build(record: dict) -> dict:
    """A stage record's build time, as the PlannedStage fields that hold it."""
    return {"last_build_seconds": record.get(BUILD_SECONDS), "last_build_partial": bool(record.get(BUILD_PARTIAL))}


def quantize_mode(steps: list[Step]) -> str | None:
    """The quantize mode a variant's passes will record (it names the export dir)."""
    modes = [step.config.mode for step in steps if step.name == "quantize"]
    return modes[-1] if modes else None


def plan_lines(plan: dict) -> list[str]:
    """The plan as `compressor run --plan` prints it: one line per stage, then a summary."""
    rows = [("stage", "state", "what a run does")]
    for s in plan["stages"]:
        work = ", ".join(p + ("*" if trains_pass(p) else "") for p in s["passes"])
        if s["kind"] == "teacher" and s["state"] == "build" and not s["passes"]:
            work = "the teacher as is (no fine-tuning), saved and scored"
        elif s["start"] and not s["passes"]:      # its steps are all done by then: it is that model
            work = "the teacher as is" if s["start"] == "teacher" else f"a copy of {s['start']} (the same steps)"
        elif s["start"] and s["start"] != "teacher":
            work += f" (from {s['start']})"
        if s["rescored_on"] is not None:
            work = f"re-scored on {s['rescored_on']} test examples (its metrics are of another data.max_eval_samples)"
        if s["resumes"]:
            work += f"; resumes from {s['resumes']}"
        if s["last_build_seconds"] is not None:
            work += ("; " if work else "") + last_built(s)
        rows.append((s["stage"], s["state"], work))
    width = max(len(r[0]) for r in rows)
    lines = [f"plan: recipe {plan['recipe']!r} into {plan['out']} (nothing was run or written)"]
    lines += [f"note: {note}" for note in plan["notes"]]
    lines += [f"  {stage:<{width}}  {state:<6}  {work}".rstrip() for stage, state, work in rows]
    to_build = [s for s in plan["stages"] if s["state"] == "build"]
    training = sum(1 for s in to_build if s["trains"])
    rescored = sum(1 for s in plan["stages"] if s["rescored_on"] is not None)
    lines.append(f"{len(to_build)} of {len(plan['stages'])} stages to build, {training} of them train (* trains)"
                 + (f"; {rescored} cached to re-score" if rescored else ""))
    return lines


def last_built(stage: dict) -> str:
    """How long a stage took when last built; a partial time (a build killed outright, whose
    time no one noted, was resumed) is only a lower bound, and reads as one."""
    if stage["last_build_partial"]:
        return f"last built in at least {stage['last_build_seconds']:.0f} s (a killed build's time is not counted)"
    return f"last built in {stage['last_build_seconds']:.0f} s"


def trains_pass(name: str) -> bool:
    """Whether a planned step trains: a registered pass that does, or the search."""
    return name == "search" or (name in pass_names() and get_pass(name).trains)
