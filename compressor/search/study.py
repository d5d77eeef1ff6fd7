"""The search's Optuna study: storage, the proxy trials, and the finalists they point to.

A trial proposes a plan (compressor/search/plans.py). Its latency comes from the latency
model first: a plan predicted over the budget (plus the model's slack) is told to the study
without training (accuracy 0 by convention, and its constraint marks it infeasible, so the
sampler learns to avoid the region). The rest are trained briefly (the proxy: a short
training, scored on held-out train rows) and told as (proxy accuracy, predicted latency)
with their constraints. Plans that differ only in precision train the same model, so a
proxy is trained once per `training_key` and reused from the study by every worker.

The study lives in Optuna storage (SQLite under the out dir by default, or any URL Optuna
takes), so workers on other machines join it with the same command plus `--join`. Heartbeats
mark a killed worker's running trial failed and retry it, so a search killed at any point
resumes from its storage. What the trials depend on (teacher, task, profile, budget) is
kept in the study's user attributes and checked by whoever opens it, with the latency model
fitted on the target, which joining workers use instead of fitting their own.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from compressor.bundle import ModelBundle
from compressor.passes import Context, LazyTeacher, apply_pass
from compressor.pipeline.cache import log as progress
from compressor.pipeline.recipe import parse_step
from compressor.search.latency import LatencyModel
from compressor.search.plans import Plan, plan_steps, plan_structure, proxy_lr, suggest_plan
from compressor.search.settings import SearchSettings
from pretrain.data import Split, TaskData
from pretrain.errors import UserError
from pretrain.finetune import evaluate
from pretrain.limits import MAX_SEED

DIRECTIONS = ("maximize", "minimize")        # proxy accuracy, predicted p50
HEARTBEAT_S = 30                              # a worker silent for GRACE_S has died: its trial is retried
GRACE_S = 120
SAMPLER_STARTUP = 8                           # random trials before TPE models the space
UNTRAINED = "over budget: not trained"
SEED = "seed"                                 # the user attribute naming a queued seed plan
CONNECT_ATTEMPTS = 5
JOIN_WAIT_S = 60.0                            # how long a joining worker waits for the study to appear
WORKER = f"{socket.gethostname()}:{os.getpid()}"


def default_storage(out_dir: Path) -> str:
    return f"sqlite:///{(out_dir / 'study.db').resolve()}"


def connect(url: str) -> RDBStorage:
    """The study's storage, with heartbeats (so a killed worker's trial is retried)."""
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)   # heartbeats, multivariate TPE
    failure: Exception | None = None
    for _ in range(CONNECT_ATTEMPTS):
        try:
            return RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                              heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2))
        except Exception as err:   # driver missing, bad URL, server down: SQLAlchemy raises many types
            failure = err
            # Two workers creating one new storage at once: one loses the race to make its tables
            # (IntegrityError, or SQLite's OperationalError "table ... already exists").
            said = type(err).__name__ + str(err)
            if "IntegrityError" not in said and "already exists" not in said:
                break
            time.sleep(1.0)
    reason = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
    raise UserError(f"cannot reach the study storage {url}: {reason}; expected a URL Optuna takes "
                    f"(sqlite:///PATH, postgresql://USER@HOST/DB with its driver installed)") from None


def open_study(storage: RDBStorage, name: str, identity: dict, join: bool, seed: int) -> optuna.Study:
    """Create or resume the study (`join`: it must exist); refuse one made for another search."""
    if join and not wait_for_study(storage, name):
        raise UserError(f"no study named {name!r} in {storage.url} after {JOIN_WAIT_S:.0f} s; start the search "
                        "without --join first (it fits the latency model and creates the study)")
    study = optuna.create_study(storage=storage, study_name=name, directions=list(DIRECTIONS),
                                sampler=sampler_for(seed), load_if_exists=True)
    made_for = study.user_attrs.get("identity")
    if made_for is None and not join:
        study.set_user_attr("identity", identity)
    elif made_for is not None and any(k in made_for and made_for[k] != v for k, v in identity.items()):
        # A key the stored identity lacks was added to the identity after that study was made.
        differ = [k for k in identity if k in made_for and made_for[k] != identity[k]]
        raise UserError(f"study {name!r} in {storage.url} was made for another search ({', '.join(differ)} "
                        f"differ: {', '.join(f'{k} {made_for.get(k)!r} there, {identity[k]!r} now' for k in differ)}); expected the "
                        f"same teacher, task, profile, batch size, budget and floor, or another --study-name")
    if not join:
        retry_stopped_trials(study)
    reseed_sampler(study, seed)
    return study


def reseed_sampler(study: optuna.Study, seed: int) -> None:
    """Seed the sampler for the study's next draw with `seed` plus the draws already made. Reseeded
    after every trial (and on resume), a draw depends on how many came before it, not on which
    process made them: a search stopped and resumed proposes the plans an uninterrupted one
    does, where a sampler continuing one random stream would propose others after the stop (and
    so, with few trials, pick other finalists). Seeded as at the start, it would repeat its
    first draws."""
    study.sampler = sampler_for(seed + drawn_trials(study.get_trials(deepcopy=False)))


def drawn_trials(trials: list[FrozenTrial]) -> int:
    """Trials whose plan the sampler drew, cut short or not: not a queued seed or a retry (ours
    queue with `fixed_params`, Optuna's heartbeat retries carry `failed_trial`), nor one stopped
    before its first draw."""
    return sum(1 for t in trials if t.params and "fixed_params" not in t.system_attrs
               and "failed_trial" not in t.system_attrs)


def seed_study(study: optuna.Study, seeds: dict[str, dict]) -> None:
    """Queue each seed (its name -> its trial parameters) ahead of the sampler's draws, once per
    study: a seed that a trial already carries (queued, run or retried, by this lead earlier or
    before it was killed) is not queued again. Joining workers never seed; they run the queue."""
    queued = {t.user_attrs.get(SEED) for t in study.get_trials(deepcopy=False)}
    for name, params in seeds.items():
        if name not in queued:
            study.enqueue_trial(params, user_attrs={SEED: name})


def retry_stopped_trials(study: optuna.Study) -> None:
    """Queue again the plan of every trial a stop cut short: one interrupted (Ctrl-C, SIGTERM:
    `objective` marks it) and one left running by a killed process of this host (its pid is
    gone; a killed worker elsewhere is retried by its missing heartbeat after GRACE_S). Each is
    retried once; a plan that failed of itself is not."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(key) for t in trials for key in ("retry_of", "failed_trial")}   # ours, Optuna's
    for trial in trials:
        if trial.state == TrialState.RUNNING and dead_here(trial.user_attrs.get("worker")):
            # Optuna's public API ends only the caller's own trials; this one's process is gone.
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        elif not (trial.state == TrialState.FAIL and trial.user_attrs.get("stopped")):
            continue
        if trial.number not in retried and trial.params:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})


def dead_here(worker: str | None) -> bool:
    """Whether `worker` ("host:pid", WORKER) ran on this host in a process that is gone."""
    host, _, pid = (worker or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)      # PermissionError would mean alive, another user's
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def sampler_for(seed: int) -> optuna.samplers.TPESampler:
    """The study's sampler. `seed` may be a run's seed plus an offset (trials done, a joiner's
    pid): the sampler's generator takes 0..2**32-1, so it wraps into that range."""
    return optuna.samplers.TPESampler(seed=seed % (MAX_SEED + 1), constraints_func=constraints, multivariate=True,
                                      group=True, n_startup_trials=SAMPLER_STARTUP)


def wait_for_study(storage: RDBStorage, name: str) -> bool:
    """A worker may start before its lead has created the study: give the lead a minute."""
    deadline = time.monotonic() + JOIN_WAIT_S
    if not study_exists(storage, name):
        progress.info(f"search: no study {name!r} in {storage.url} yet; waiting up to {JOIN_WAIT_S:.0f} s for its "
                      "lead (a search of the same settings without --join) to create it")
    while not study_exists(storage, name):
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def study_exists(storage: RDBStorage, name: str) -> bool:
    return name in {s.study_name for s in optuna.get_all_study_summaries(storage)}


def constraints(trial: FrozenTrial) -> list[float]:
    """<= 0 when met: predicted latency within the budget, proxy retention above the floor."""
    return list(trial.user_attrs.get("constraints", [1.0, 1.0]))


@dataclass
class ProxyRunner:
    """Everything a proxy trial needs, loaded once per worker."""

    teacher: ModelBundle
    teacher_dir: Path
    task: TaskData
    validation: Split
    teacher_accuracy: float          # on `validation`
    latency: LatencyModel
    shapes: list[tuple[int, int]]    # the benchmark's real test batches, [batch, length]
    settings: SearchSettings
    budget_ms: float                 # what plans are filtered by (the budget, or the fastest plan's)
    log: Callable[[str], None] = print

    @property
    def depth(self) -> int:
        return self.latency.teacher.layers

    def predicted_ms(self, plan: Plan) -> float:
        return self.latency.predict_p50(plan_structure(plan, self.latency.teacher), self.shapes)

    def fastest(self, plans: list[Plan]) -> Plan:
        return min(plans, key=self.predicted_ms)

    def train_proxy(self, plan: Plan) -> tuple[float, float, float]:
        """(accuracy on the validation rows, seconds before training (scoring, cutting), seconds
        of the training step) after a short training."""
        fp32 = plan.model_copy(update={"precision": "fp32"})    # precision does not change training
        steps = [parse_step(s, f"plan {plan.name}")
                 for s in plan_steps(fp32, self.depth, self.settings.proxy_train_samples,
                                     scoring_samples=self.settings.scoring_samples,
                                     lr=self.settings.proxy_lr or proxy_lr(plan, self.depth))]
        ctx = Context(task=self.task, seed=self.settings.seed, show_progress=False,
                      teacher_source=LazyTeacher.from_dir(self.teacher_dir))
        bundle, seconds = self.teacher, []
        for step in steps:
            start = time.perf_counter()
            bundle = apply_pass(bundle, step.name, step.config, ctx)
            seconds.append(time.perf_counter() - start)
        metrics, _ = evaluate(bundle.model, bundle.tokenizer, self.validation, bundle.max_length)
        return metrics["accuracy"], sum(seconds[:-1]), seconds[-1]     # the last step is the training

    def objective(self, trial: optuna.Trial) -> tuple[float, float]:
        try:
            return self.scored(trial)
        except KeyboardInterrupt:          # Ctrl-C or SIGTERM: the next run retries this plan
            trial.set_user_attr("stopped", True)
            raise

    def scored(self, trial: optuna.Trial) -> tuple[float, float]:
        plan = suggest_plan(trial, self.depth, self.settings.recoveries, self.settings.precisions)
        trial.set_user_attr("worker", WORKER)
        predicted = self.predicted_ms(plan)
        trial.set_user_attr("plan", plan.model_dump())
        trial.set_user_attr("predicted_ms", predicted)
        over = predicted - self.budget_ms
        if predicted > self.budget_ms * (1 + self.settings.latency_slack):
            trial.set_user_attr("status", UNTRAINED)
            trial.set_user_attr("constraints", [over, 1.0])
            return 0.0, predicted
        known = trained_proxy(completed(trial.study), plan.training_key)
        if known is not None:
            accuracy, prep, seconds = (known.user_attrs[k] for k in ("proxy_accuracy", "prep_seconds", "train_seconds"))
            trial.set_user_attr("status", f"proxy of trial {known.number} (same training)")
        else:
            accuracy, prep, seconds = self.train_proxy(plan)
            trial.set_user_attr("status", "proxy trained")
        retention = accuracy / self.teacher_accuracy
        trial.set_user_attr("training_key", plan.training_key)
        trial.set_user_attr("proxy_accuracy", accuracy)
        trial.set_user_attr("proxy_retention", retention)
        trial.set_user_attr("prep_seconds", prep)
        trial.set_user_attr("train_seconds", seconds)
        trial.set_user_attr("constraints", [over, self.settings.min_retention - retention])
        return accuracy, predicted


# The helpers below take the finished trials as one list: reading them from storage is a
# query per call (a round trip to a remote database), so a caller reads once and passes it on.
def completed(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def trained_proxy(done: list[FrozenTrial], training_key: str) -> FrozenTrial | None:
    return next((t for t in proxy_trials(done) if t.user_attrs.get("training_key") == training_key), None)


def proxy_trials(done: list[FrozenTrial]) -> list[FrozenTrial]:
    """Finished trials whose plan was trained (or shares a trained plan's proxy)."""
    return [t for t in done if "proxy_accuracy" in t.user_attrs]


def finalists(done: list[FrozenTrial], budget_ms: float, settings: SearchSettings) -> list[FrozenTrial]:
    """The plans to train fully, one trial per plan, taken in turn from two lists: plans
    predicted within the budget, and plans predicted within budget plus slack (the latency
    model errs by a few percent either way, and measured numbers decide). Each list is
    ordered by proxy retention clearing the floor, then proxy accuracy. With none within
    budget plus slack (a best-effort search), the fastest trained plans."""
    trained = proxy_trials(done)

    def ranked(limit: float) -> list[FrozenTrial]:
        return sorted((t for t in trained if t.user_attrs["predicted_ms"] <= limit),
                      key=lambda t: (t.user_attrs["proxy_retention"] < settings.min_retention,
                                     -t.user_attrs["proxy_accuracy"], t.user_attrs["predicted_ms"]))
    strict, slack = ranked(budget_ms), ranked(budget_ms * (1 + settings.latency_slack))
    turns = [t for pair in itertools.zip_longest(strict, slack) for t in pair if t is not None]
    if not turns:
        turns = sorted(trained, key=lambda t: t.user_attrs["predicted_ms"])
    chosen: dict[str, FrozenTrial] = {}
    for t in turns:
        chosen.setdefault(Plan.model_validate(t.user_attrs["plan"]).name, t)
        if len(chosen) == settings.finalists:
            break
    return list(chosen.values())


def progress_line(done: list[FrozenTrial], trial: FrozenTrial, budget_ms: float, seconds_left: float) -> str:
    trained = proxy_trials(done)
    within = [t for t in trained if t.user_attrs["predicted_ms"] <= budget_ms]
    best = max(within, key=lambda t: t.user_attrs["proxy_accuracy"], default=None)
    plan = Plan.model_validate(trial.user_attrs["plan"]).name if "plan" in trial.user_attrs else "?"
    acc = trial.user_attrs.get("proxy_accuracy")
    shown = f"proxy {acc:.4f}" if acc is not None else trial.user_attrs.get("status", trial.state.name.lower())
    # Proxies train briefly: their retention ranks plans, the finals' test accuracy meets the floor.
    best_text = (f"best proxy within budget {best.user_attrs['proxy_accuracy']:.4f} "
                 f"({Plan.model_validate(best.user_attrs['plan']).name}, proxy retention "
                 f"{best.user_attrs['proxy_retention']:.1%})") if best else "none within budget yet"
    return (f"search: trial {trial.number} {plan}: predicted {trial.user_attrs.get('predicted_ms', 0):.2f} ms "
            f"(budget {budget_ms:.2f}), {shown}; {len(done)} trials, {len(trained)} trained, {best_text}; "
            f"{seconds_left / 60:.1f} min left")
