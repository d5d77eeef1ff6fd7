"""run_search: a teacher, a latency budget on a profile, a retention floor and a time budget in;
the model that meets them (trained, exported behind the gate, benchmarked beside the
baselines), the measured front of every finalist and the recipe that rebuilds it out.

Phases, all resumable with the same command:
1. the profile's latency model (reused when this machine fitted it for the teacher's shape with the
   same fitting settings);
2. proxy trials in the Optuna study until the time left is what the finals need (estimated
   from the proxies' own training times), or the study's trial limit;
3. the finals: the best few plans as variants of an ordinary recipe run (the pipeline's
   stages, cache, export gate and benchmark, with the three baselines), then the choice by
   measured latency and test accuracy. Predictions only ever decide what to train.
Workers started with `join=True` run phase 2 only, until the lead starts the finals.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import optuna
import yaml

from compressor.bench.profiles import Profile, load_profile, unavailable_reason
from compressor.bench.runners import input_batches
from compressor.bundle import ModelBundle
from compressor.evaluate import check_pair_task, label_permutation, recorded_task_seed
from compressor.passes import check_pass_family
from compressor.passes.registry import shape_of
from compressor.pipeline.cache import fingerprint, log as progress
from compressor.pipeline.outdir import claimed_out_dir, disk_errors
from compressor.pipeline.recipe import (RESERVED_NAMES, VARIANT_NAME, differ_in_case, is_reserved, one_dir,
                                       parse_recipe, parse_step)
from compressor.report.analysis import latency_model_warning, latency_row, ties_by_measurement, undominated
from compressor.report.render import write_reports
from compressor.search.budget import REPORT_S, FinalsRates, benchmark_calls, finals_seconds
from compressor.search.latency import LatencyModel
from compressor.search.plans import (Plan, largest_plans, plan_params, plan_steps, search_space, smallest_plans,
                                     theseus_depths, usable_recoveries)
from compressor.search.settings import SearchSettings
from compressor.search.structures import fit_latency_model, teacher_shape
from compressor.search.study import (ProxyRunner, completed, connect, default_storage, finalists, open_study,
                                     progress_line, proxy_trials, reseed_sampler, seed_study)
from pretrain.atomic import atomic_file, check_output
from pretrain.data import TaskData, load_task, task_files
from pretrain.errors import UserError
from pretrain.finetune import evaluate
from pretrain.models import check_model_ref, read_model_type, set_threads

RECIPE_NAME = "search"           # the out dir's owner (run.json), as for `compressor run`
LATENCY_WAIT_S = 2.0
STRUCTURES_DIR = ".latency-structures"   # the latency model's timed exports, while the search runs
PLAN_NAME = re.compile(r"^L\d+-", re.IGNORECASE)   # Plan.name's form: compared variants may not look like one
SEARCH_PASSES = ("drop-layers", "prune-heads", "prune-ffn", "finetune", "distill", "theseus")


def run_search(teacher: str | Path, task: str | dict, profile: str, settings: SearchSettings, out_dir: Path, *,
               join: bool = False, threads: int | None = None, show_progress: bool = True,
               log: Callable[[str], None] = progress.info) -> dict:
    """The search's result (the report's `search` section; for a joining worker, its tally)."""
    deadline = time.monotonic() + settings.time_budget_min * 60
    set_threads(threads)
    teacher_dir, target = check_inputs(teacher, profile, settings)
    data = load_task(task, seed=split_seed(teacher_dir, task, settings.seed, log))
    check_output(out_dir, [teacher_dir, *task_files(task)], owner_files=None)
    bundle = ModelBundle.load(teacher_dir)      # a teacher that is no classifier stops before any write
    label_permutation(tuple(bundle.label_names), data)   # nor one of another task: its plans would score chance
    check_pair_task(bundle.pair_task, data, teacher_dir)  # nor one trained on the other shape of input
    # The lead holds out_dir until its finals are written: a second lead's claim would delete
    # this one's temporaries (joining workers share it by design, and take no lock).
    lock = contextlib.nullcontext(not out_dir.exists()) if join else \
        claimed_out_dir(out_dir, SimpleNamespace(name=RECIPE_NAME), force=False)
    with lock as created:
        out_dir.mkdir(parents=True, exist_ok=True)
        # A failed trial is counted in the report; Optuna's own warning would print its traceback.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        try:
            study = study_for(settings, out_dir, teacher_dir, data, target, join)
        except UserError:
            if created:     # a storage it cannot reach, a study of another search: nothing left behind
                shutil.rmtree(out_dir, ignore_errors=True)
            raise
        runner = proxy_runner(study, bundle, teacher_dir, data, target, settings, out_dir, join, deadline, log)
        rates = finals_rates(runner, target, study)
        if study.user_attrs.get("phase") != "final":
            run_proxies(study, runner, rates, deadline, join, log)
        if join:
            return {"worker": "joined", "trials": len(proxy_trials(completed(study)))}
        return run_finals(study, runner, rates, teacher_dir, task, profile, out_dir, show_progress, deadline,
                          log, threads)


def split_seed(teacher_dir: Path, task: str | dict, seed: int, log: Callable[[str], None]) -> int:
    """The seed a teacher records beside this task, else `seed`: the teacher is used as is, and
    splits drawn with another seed would score (and select plans by) rows it trained on. The
    finals recipe keeps it the same way (pipeline/run.py `task_split_seed`)."""
    recorded = recorded_task_seed(teacher_dir, task)
    if recorded is None or recorded == seed:
        return seed
    log(f"note: the teacher was fine-tuned on this task's splits drawn with seed {recorded}: the splits are drawn "
        f"with seed {recorded}, not the search's seed {seed}, so no row it trained on is scored (the search's "
        "seed still seeds its trials)")
    return recorded


def study_for(settings: SearchSettings, out_dir: Path, teacher_dir: Path, data: TaskData, target: Profile,
              join: bool) -> optuna.Study:
    """The search's Optuna study, opened (or joined) in its storage: out_dir's own SQLite file
    unless `storage` names another."""
    storage = connect(settings.storage or default_storage(out_dir))
    identity = {"teacher": fingerprint(teacher_dir), "task": data.name, "profile": target.name,
                "batch_size": settings.batch_size, "latency_budget_ms": settings.latency_budget_ms,
                "min_retention": settings.min_retention,
                # proxies trained otherwise would not rank with the stored ones
                "proxy": [settings.proxy_train_samples, settings.proxy_lr or "scaled", settings.validation_samples]}
    return open_study(storage, settings.study_name, identity, join, sampler_seed(settings, join))


def sampler_seed(settings: SearchSettings, join: bool) -> int:
    """The study's sampler seed in this process: joiners explore elsewhere than the lead."""
    return settings.seed if not join else settings.seed + 1 + os.getpid()


def check_inputs(teacher: str | Path, profile: str, settings: SearchSettings) -> tuple[Path, Profile]:
    """Bad input stops here, before anything is written."""
    teacher_dir = check_model_ref(str(teacher))
    target = load_profile(profile)
    reason = unavailable_reason(target)
    if reason:
        raise UserError(f"profile {target.name} cannot be measured on this machine: {reason}; "
                        "expected a profile whose hardware is here (latency is measured on the target)")
    family = read_model_type(teacher_dir)
    depth = shape_of(teacher_dir).layers
    if not usable_recoveries(depth, settings.recoveries):
        raise UserError(f"--recoveries {','.join(settings.recoveries)}: theseus needs a teacher of two or more "
                        f"layers (this one has {depth}); expected finetune or distill among them")
    for plan in example_plans(depth, settings):
        for item in plan_steps(plan, depth, settings.proxy_train_samples, scoring_samples=settings.scoring_samples):
            step = parse_step(item, "search")
            check_pass_family(step.name, step.config, family)
    check_compared(settings.compare, family)
    return teacher_dir, target


def check_compared(compare: dict[str, list], family: str) -> None:
    """Hand-written variants for the finals: names no plan takes (in any case: each names a dir
    of the finals), passes that fit the teacher."""
    names = list(compare)
    clash = one_dir(names)
    if clash:
        raise UserError(f"compare: {differ_in_case(*(names[i] for i in clash))}")
    for name, items in compare.items():
        if PLAN_NAME.match(name) or not VARIANT_NAME.match(name) or is_reserved(name):
            raise UserError(f"compare: variant name {name!r} is taken by the search's own names (plans are "
                            f"L<layers>-..., and {sorted(RESERVED_NAMES)}, in any case); expected another name")
        for i, item in enumerate(items):
            step = parse_step(item, f"compare.{name}[{i}]")
            try:
                check_pass_family(step.name, step.config, family)
            except UserError as err:
                raise UserError(f"compare.{name}[{i}]: {err}") from None


def example_plans(depth: int, settings: SearchSettings) -> list[Plan]:
    """One plan per recovery the search may use, with every structural pass: the passes it
    will run, for the family check."""
    plans = [Plan(layers=max(1, depth // 2), heads_removed=0.5, ffn_removed=0.5, recovery=r)
             for r in settings.recoveries if r != "theseus"]
    if "theseus" in settings.recoveries and theseus_depths(depth):
        plans.append(Plan(layers=theseus_depths(depth)[-1], recovery="theseus"))
    return plans


def proxy_runner(study: optuna.Study, bundle: ModelBundle, teacher_dir: Path, data, target: Profile,
                 settings: SearchSettings, out_dir: Path, join: bool, deadline: float, log) -> ProxyRunner:
    """The latency model and teacher scores the proxies use: made by the lead and kept in the
    study, read from it by joining workers (so every prediction is the target's)."""
    validation = data.split("train").tail(settings.validation_samples)
    if not join and "latency_model" not in study.user_attrs:
        model = fit_latency_model(bundle, data, target, [settings.batch_size], work=out_dir / STRUCTURES_DIR,
                                  cache=latency_cache(target, bundle, settings),
                                  fit_count=settings.latency_structures,
                                  held_out_count=settings.latency_held_out, precisions=settings.precisions,
                                  seed=settings.seed, log=log, deadline=deadline)
        model.save(out_dir / "latency_model.json")
        study.set_user_attr("latency_model", model.model_dump(mode="json"))
        # The timed structure exports (hundreds of MB) served the model, now saved here, in
        # the study and in the cache: nothing later reads them, even if the search fails.
        shutil.rmtree(out_dir / STRUCTURES_DIR, ignore_errors=True)
        start = time.perf_counter()
        metrics, _ = evaluate(bundle.model, bundle.tokenizer, validation, bundle.max_length)
        # The teacher's PyTorch speed here: the finals score and time it as a baseline (budget.py).
        study.set_user_attr("teacher_validation_seconds", time.perf_counter() - start)
        study.set_user_attr("teacher_validation_accuracy", metrics["accuracy"])
    while "latency_model" not in study.user_attrs or "teacher_validation_accuracy" not in study.user_attrs:
        if time.monotonic() > deadline:
            raise UserError("the lead never finished fitting the latency model within this worker's time budget")
        log("search: waiting for the lead to fit the latency model")
        time.sleep(LATENCY_WAIT_S)      # user_attrs reads the storage afresh each time
    latency = LatencyModel.model_validate(study.user_attrs["latency_model"])
    if (contended := latency_model_warning(latency.contention)) is not None:
        print(f"warning: {contended}", file=sys.stderr)     # also in the report's warnings
    missing = [p for p in settings.precisions if p not in latency.coefficients]
    if missing:     # a resumed study with more precisions than its model was fitted for
        raise UserError(f"the study's latency model was fitted for {', '.join(latency.coefficients)} and has no "
                        f"{', '.join(missing)} measurements; expected --precisions within those (as the search "
                        "was started), or another --study-name for a new search")
    test = data.split("test").head(settings.max_eval_samples)
    shapes = [tuple(b["input_ids"].shape) for b in input_batches(bundle.tokenizer, test, settings.batch_size, "real",
                                                                 max_length=bundle.usable_length)]
    runner = ProxyRunner(teacher=bundle, teacher_dir=teacher_dir, task=data, validation=validation,
                         teacher_accuracy=study.user_attrs["teacher_validation_accuracy"], latency=latency,
                         shapes=shapes, settings=settings, budget_ms=settings.latency_budget_ms, log=log)
    fastest = runner.predicted_ms(runner.fastest(smallest_plans(runner.depth, settings.recoveries,
                                                                settings.precisions)))
    if fastest > settings.latency_budget_ms:
        log(f"search: the latency budget {settings.latency_budget_ms:.2f} ms is below what the fastest plan "
            f"reaches ({fastest:.2f} ms predicted); searching the fastest plans instead")
        runner.budget_ms = fastest
    return runner


def latency_cache(target: Profile, bundle: ModelBundle, settings: SearchSettings) -> Path:
    """One latency model per profile, teacher shape and fitting settings on this machine, reused
    by later searches (the file's key checks the machine and settings, so a copied cache is
    refitted, not trusted). The name holds every setting the fit depends on, so that searches
    with other settings keep their own file instead of overwriting each other's."""
    shape = teacher_shape(bundle)
    root = Path(os.environ.get("COMPRESSOR_CACHE", Path.home() / ".cache" / "compressor"))
    fitting = (f"{'.'.join(sorted(settings.precisions))}-b{settings.batch_size}"
               f"-n{settings.latency_structures}.{settings.latency_held_out}-s{settings.seed}")
    teacher = f"L{shape.layers}-H{shape.hidden}-h{shape.heads}-f{shape.ffn}"
    return root / "latency" / f"{target.name}-{teacher}-{fitting}.json"


def finals_rates(runner: ProxyRunner, target: Profile, study: optuna.Study) -> FinalsRates:
    """What this search measured that the finals' cost is estimated from (budget.py): the
    teacher's per-call times, exported (the latency model's prediction) and in PyTorch (its
    validation scoring, timed when the lead scored it; as exported in a study made before
    that was recorded)."""
    teacher = Plan(layers=runner.depth)
    onnx = {p: runner.predicted_ms(teacher.model_copy(update={"precision": p})) for p in runner.latency.coefficients}
    onnx.setdefault("fp32", max(onnx.values()))     # a model fitted for int8 only
    seconds = study.user_attrs.get("teacher_validation_seconds")
    torch_ms = seconds / len(runner.validation) * runner.settings.batch_size * 1e3 if seconds else onnx["fp32"]
    return FinalsRates(benchmark_calls=benchmark_calls(target), scoring_calls=len(runner.shapes),
                       teacher_torch_ms=torch_ms, teacher_onnx_ms=onnx)


def run_proxies(study: optuna.Study, runner: ProxyRunner, rates: FinalsRates, deadline: float, join: bool,
                log) -> None:
    settings = runner.settings
    compared = compared_training_samples(settings)      # parsed once, not at every trial

    def out_of_time(done: list) -> bool:
        reserve = 0.0 if join else finals_reserve(done, runner, rates, compared)
        return time.monotonic() + reserve >= deadline

    def enough(study: optuna.Study, trial) -> None:
        reseed_sampler(study, sampler_seed(settings, join))
        done = completed(study)          # read once per trial, used for all below
        log(progress_line(done, trial, runner.budget_ms, deadline - time.monotonic()))
        if out_of_time(done) or study.user_attrs.get("phase") == "final" or \
                (settings.max_trials is not None and len(done) >= settings.max_trials):
            study.stop()

    if not join:
        seed_study(study, {name: plan_params(plan, runner.depth, settings.recoveries, settings.precisions)
                           for name, plan in seed_plans(runner).items()})
    if not out_of_time(completed(study)):
        study.optimize(runner.objective, callbacks=[enough], catch=(UserError,))


def seed_plans(runner: ProxyRunner) -> dict[str, Plan]:
    """The plans the lead queues before the sampler draws, in this order: the fastest the latency
    model predicts (the budget is never below it, so however few the trials, a plan is trained),
    then the largest (every layer, nothing pruned: plans.largest_plans) it predicts fastest (the
    accuracy end of the space, free when predicted over the budget: it is not trained)."""
    settings = runner.settings
    space = (runner.depth, settings.recoveries, settings.precisions)
    return {"fastest": runner.fastest(smallest_plans(*space)), "largest": runner.fastest(largest_plans(*space))}


def finals_reserve(done: list, runner: ProxyRunner, rates: FinalsRates, compared_samples: list[float]) -> float:
    """Seconds the finals of the finalists `done` points to will take (budget.finals_seconds);
    `compared_samples` is each compared variant's training examples (compared_training_samples)."""
    return finals_seconds(finalists(done, runner.budget_ms, runner.settings), runner.settings, rates,
                          compared_samples)


def fitting_finalists(picks: list, settings: SearchSettings, rates: FinalsRates, compared_samples: list[float],
                      deadline: float) -> tuple[list, float]:
    """The best of `picks` whose finals fit the time left (the first one always), and their
    estimated seconds. A stop at the first proxies' estimate, a slower machine since, or a
    resumed search with little time leave fewer finalists, not an overrun."""
    kept = list(picks)
    while True:
        seconds = finals_seconds(kept, settings, rates, compared_samples, count=len(kept))
        if len(kept) == 1 or time.monotonic() + seconds <= deadline:
            return kept, seconds
        kept.pop()


def compared_training_samples(settings: SearchSettings) -> list[float]:
    return [training_samples(items, settings.train_samples) for items in settings.compare.values()]


def training_samples(items: list, default: int) -> float:
    """Examples a variant's passes train on, epochs counted (a pass without a cap takes the finals' cap)."""
    total = 0.0
    for i, item in enumerate(items):
        config = parse_step(item, f"compare[{i}]").config
        if "max_train_samples" in type(config).model_fields:
            total += (config.max_train_samples or default) * getattr(config, "epochs", 1)
    return total


def run_finals(study: optuna.Study, runner: ProxyRunner, rates: FinalsRates, teacher_dir: Path, task: str | dict,
               profile: str, out_dir: Path, show_progress: bool, deadline: float, log,
               threads: int | None = None) -> dict:
    from compressor.pipeline.run import run_recipe
    settings = runner.settings
    found = finalists(completed(study), runner.budget_ms, settings)
    if not found:
        raise UserError(no_plan_trained(study, settings, deadline,
                                        finals_seconds([], settings, rates, compared_training_samples(settings))))
    study.set_user_attr("phase", "final")     # joined workers stop after their current trial
    picks, estimate = fitting_finalists(found, settings, rates, compared_training_samples(settings), deadline)
    plans = [Plan.model_validate(t.user_attrs["plan"]) for t in picks]
    dropped = [Plan.model_validate(t.user_attrs["plan"]).name for t in found[len(picks):]]
    left = deadline - time.monotonic()
    log(f"search: finals: {', '.join(p.name for p in plans)} ({left / 60:.1f} min left, estimated "
        f"{estimate / 60:.1f} min)" + (f"; left out to keep the time budget: {', '.join(dropped)}" if dropped else ""))
    raw = finals_recipe(plans, teacher_dir, task, profile, settings, runner.depth)
    recipe, steps = parse_recipe(raw, source="the search's finals")
    started = time.monotonic()
    # The benchmark ends in time for the report; run_search holds out_dir.
    report = run_recipe(recipe, steps, out_dir, show_progress=show_progress, held=True, threads=threads,
                        deadline=deadline - REPORT_S)
    timing = {"finals_estimated_min": estimate / 60, "finals_min": (time.monotonic() - started) / 60,
              "minutes_left_at_finals": left / 60, "finalists_dropped": dropped,
              "benchmark_time_limited": "time_limited" in report.get("benchmark", {})}
    section = search_section(report, picks, plans, study, runner, settings, timing)
    report["search"] = section
    if (contended := latency_model_warning(runner.latency.contention)) is not None:
        report["warnings"].append(contended)
    for model in report["models"]:
        if model["name"] in section["predicted_p50_ms"]:
            model["predicted_p50_ms"] = section["predicted_p50_ms"][model["name"]]
    with disk_errors(out_dir):
        write_reports(report, out_dir)
        picked = section["chosen"] or section["best_effort"]
        if picked:
            atomic_file(out_dir / section["recipe_file"], yaml.safe_dump(
                {**raw, "variants": {picked: raw["variants"][picked]}}, sort_keys=False).encode())
    shutil.rmtree(out_dir / STRUCTURES_DIR, ignore_errors=True)   # left by a search of an earlier version
    return section


def no_plan_trained(study: optuna.Study, settings: SearchSettings, deadline: float, finals_s: float) -> str:
    """Why the finals have no plan: the time ran out (the finals' fixed part, `finals_s`, said
    how much they need), or every trial was predicted over the budget."""
    predicted = [t.user_attrs.get("predicted_ms") for t in study.trials if t.user_attrs.get("predicted_ms")]
    if time.monotonic() < deadline and predicted:
        return (f"no plan was trained: all {len(predicted)} trials (--max-trials {settings.max_trials}) were predicted "
                f"over the {settings.latency_budget_ms:g} ms budget (the fastest {min(predicted):.2f} ms); expected a "
                f"budget of at least {min(predicted):.2f} ms or more trials")
    return (f"no plan was trained within the time budget ({settings.time_budget_min:g} min): the finals' teacher, "
            f"baselines and benchmark alone are estimated at {finals_s / 60:.1f} min on this machine; expected enough "
            "time for at least one proxy and the finals: give a larger time budget (or a profile with fewer "
            "iterations, or fewer --baselines)")


def finals_recipe(plans: list[Plan], teacher_dir: Path, task: str | dict, profile: str, settings: SearchSettings,
                  depth: int) -> dict:
    """An ordinary recipe: the teacher as it is, each finalist a variant, the baselines beside them."""
    return {"name": RECIPE_NAME, "seed": settings.seed,
            "teacher": {"model": str(teacher_dir.resolve()), "task": task},
            "data": {"max_eval_samples": settings.max_eval_samples, "max_train_samples": settings.train_samples},
            "export": {"onnx": True, "optimize": True},
            "benchmark": {"profiles": [profile], "batch_sizes": [settings.batch_size],
                          "baselines": list(settings.baselines)},
            "variants": {**{p.name: plan_steps(p, depth, settings.train_samples, settings.epochs, settings.scoring_samples)
                            for p in plans}, **settings.compare}}


def measured_p50(entry: dict, profile: str, batch_size: int) -> float | None:
    """p50 on the profile at the search's batch size, real test batches."""
    row = latency_row(entry, (profile, batch_size, "real"))
    return row["p50_ms"] if row else None


def trial_counts(trials: list[optuna.trial.FrozenTrial]) -> dict[str, int]:
    """The report's tally of the study's trials. A trial Ctrl-C or SIGTERM cut short (retried
    once on resume) is counted as stopped, not as a failed plan; a queued trial no worker
    started (a seed or a retry the trial limit left) is not counted."""
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    stopped = [t for t in trials if t.user_attrs.get("stopped")]
    started = [t for t in trials if t.state != optuna.trial.TrialState.WAITING]
    return {"total": len(started), "complete": len(done), "trained": len(proxy_trials(done)),
            "not_trained_over_budget": sum(1 for t in done if "proxy_accuracy" not in t.user_attrs),
            "failed": sum(1 for t in trials if t.state == optuna.trial.TrialState.FAIL
                          and not t.user_attrs.get("stopped")),
            "stopped": len(stopped)}


def trial_table(trials: list[optuna.trial.FrozenTrial]) -> list[dict]:
    """One row per trial started (study.db holds the rest): its plan, what it was predicted
    and scored, and what became of it."""
    rows = []
    for t in trials:
        if t.state == optuna.trial.TrialState.WAITING:
            continue
        plan = Plan.model_validate(t.user_attrs["plan"]).name if "plan" in t.user_attrs else None
        status = "stopped" if t.user_attrs.get("stopped") else t.user_attrs.get("status", t.state.name.lower())
        rows.append({"number": t.number, "plan": plan, "state": t.state.name.lower(), "status": status,
                     "predicted_p50_ms": t.user_attrs.get("predicted_ms"),
                     "proxy_accuracy": t.user_attrs.get("proxy_accuracy"),
                     "proxy_retention": t.user_attrs.get("proxy_retention")})
    return rows


def search_section(report: dict, picks, plans: list[Plan], study: optuna.Study, runner: ProxyRunner,
                   settings: SearchSettings, timing: dict) -> dict:
    """What the search did and found: budget, the space searched, latency model, trials (their
    tally and each one), the time the finals took (`timing`), every finalist measured, the
    measured front, the choice (or which constraint failed and by how much)."""
    by_name = {m["name"]: m for m in report["models"]}
    profile = report["benchmark"]["profiles"][0]["name"]
    rows = []
    for trial, plan in zip(picks, plans):
        entry = by_name[plan.name]
        p50 = measured_p50(entry, profile, settings.batch_size)
        rows.append({"name": plan.name, "trial": trial.number, "plan": plan.model_dump(),
                     "proxy_accuracy": trial.user_attrs["proxy_accuracy"],
                     "proxy_retention": trial.user_attrs["proxy_retention"],
                     "predicted_p50_ms": trial.user_attrs["predicted_ms"], "measured_p50_ms": p50,
                     "accuracy": entry["accuracy"], "retention": entry["retention"],
                     "meets_budget": p50 is not None and p50 <= settings.latency_budget_ms,
                     "meets_retention": entry["retention"] >= settings.min_retention})
    good = [r for r in rows if r["meets_budget"] and r["meets_retention"]]
    chosen = max(good, key=lambda r: (r["accuracy"], -r["measured_p50_ms"]), default=None)
    best_effort = None if chosen else best_effort_pick(rows)
    compared = compared_rows(by_name, report, settings, chosen or best_effort)
    trials = study.get_trials(deepcopy=False)
    latency = runner.latency
    return {
        "budget": {"latency_ms": settings.latency_budget_ms, "batch_size": settings.batch_size,
                   "min_retention": settings.min_retention, "time_budget_min": settings.time_budget_min,
                   "searched_for_ms": runner.budget_ms},
        "space": {**search_space(runner.depth, settings.recoveries, settings.precisions),
                  "max_trials": settings.max_trials, "finalists": settings.finalists,
                  "latency_slack": settings.latency_slack},
        "latency_model": {"key": latency.key, "points": latency.points,
                          "held_out": {k: v for k, v in (latency.held_out or {}).items() if k != "rows"},
                          "contention": latency.contention},
        "trials": {**trial_counts(trials),
                   "teacher_validation_accuracy": runner.teacher_accuracy,
                   "validation_samples": settings.validation_samples,
                   "proxy_train_samples": settings.proxy_train_samples, "proxy_lr": settings.proxy_lr},
        "trial_table": trial_table(trials),
        "time": timing,
        "finalists": rows,
        "front": measured_front(rows, ties_by_measurement(report["benchmark"]["rankings"]).get(
            (profile, settings.batch_size, "real"), ())),
        "compared": compared,
        "predicted_p50_ms": {r["name"]: r["predicted_p50_ms"] for r in rows},
        "chosen": chosen["name"] if chosen else None,
        "best_effort": best_effort["name"] if best_effort else None,
        "met": chosen is not None,
        "outcome": outcome(chosen, best_effort, settings),
        "recipe_file": "chosen.yaml" if chosen else "best-effort.yaml",
    }


def compared_rows(by_name: dict, report: dict, settings: SearchSettings, picked: dict | None) -> list[dict]:
    """Each hand-written variant measured in the same run, and whether the searched model is at
    least as accurate and at least as fast (`dominated`: both)."""
    rows = []
    for name in settings.compare:
        entry = by_name[name]
        p50 = measured_p50(entry, report["benchmark"]["profiles"][0]["name"], settings.batch_size)
        row = {"name": name, "measured_p50_ms": p50, "accuracy": entry["accuracy"], "retention": entry["retention"]}
        if picked and p50 is not None and picked["measured_p50_ms"] is not None:
            row["searched"] = picked["name"]
            row["searched_as_accurate"] = picked["accuracy"] >= entry["accuracy"]
            row["searched_as_fast"] = picked["measured_p50_ms"] <= p50
            row["searched_speedup"] = p50 / picked["measured_p50_ms"]
            row["dominated"] = row["searched_as_accurate"] and row["searched_as_fast"]
        rows.append(row)
    return rows


def best_effort_pick(rows: list[dict]) -> dict | None:
    """Without a plan meeting both: the most accurate within budget, else the fastest."""
    within = [r for r in rows if r["meets_budget"]]
    if within:
        return max(within, key=lambda r: r["accuracy"])
    measured = [r for r in rows if r["measured_p50_ms"] is not None]
    return min(measured, key=lambda r: r["measured_p50_ms"], default=None)


def outcome(chosen: dict | None, best_effort: dict | None, settings: SearchSettings) -> str:
    if chosen:
        return (f"met: {chosen['name']} at {chosen['measured_p50_ms']:.2f} ms (budget {settings.latency_budget_ms:.2f}) "
                f"and {chosen['retention']:.1%} of the teacher (floor {settings.min_retention:.0%})")
    if best_effort is None:
        return "not met: no finalist was measured"
    failed = []
    if not best_effort["meets_budget"]:
        over = best_effort["measured_p50_ms"] / settings.latency_budget_ms - 1
        failed.append(f"latency {best_effort['measured_p50_ms']:.2f} ms is {over:.1%} over the "
                      f"{settings.latency_budget_ms:.2f} ms budget")
    if not best_effort["meets_retention"]:
        short = (settings.min_retention - best_effort["retention"]) * 100
        failed.append(f"retention {best_effort['retention']:.1%} is {short:.1f} points under the "
                      f"{settings.min_retention:.0%} floor")
    return f"not met: best effort {best_effort['name']}: {'; '.join(failed)}"


def measured_front(rows: list[dict], ties=()) -> list[str]:
    """Finalists no other beats on both measured accuracy and measured latency, finalists whose
    timings tie (`ties`, the benchmark's pairs) counting as equally fast."""
    return undominated([(r["name"], r["accuracy"], r["measured_p50_ms"]) for r in rows
                        if r["measured_p50_ms"] is not None], ties)
