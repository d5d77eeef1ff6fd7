"""The study's choice of finalists and its progress line, on trials made by hand."""

from __future__ import annotations

import optuna
from optuna.distributions import FloatDistribution

from compressor.search.plans import Plan
from compressor.search.settings import SearchSettings
from compressor.search.study import completed, finalists, progress_line


def trial(plan: Plan, accuracy: float, predicted: float, teacher: float = 0.8) -> optuna.trial.FrozenTrial:
    attrs = {"plan": plan.model_dump(), "predicted_ms": predicted, "proxy_accuracy": accuracy,
             "proxy_retention": accuracy / teacher, "training_key": plan.training_key, "prep_seconds": 1.0,
             "train_seconds": 2.0, "constraints": [predicted - 10, 0.97 - accuracy / teacher]}
    return optuna.trial.create_trial(values=[accuracy, predicted], user_attrs=attrs,
                                     params={"x": 0.0}, distributions={"x": FloatDistribution(0, 1)})


def study_of(*trials) -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize"])
    for t in trials:
        study.add_trial(t)
    return study


def test_finalists_alternate_between_within_budget_and_within_slack():
    settings = SearchSettings(latency_budget_ms=10, finalists=3, latency_slack=0.1)
    study = study_of(trial(Plan(layers=3), 0.60, 10.8),              # best proxy, 8% over: slack only
                     trial(Plan(layers=2), 0.50, 9.0),               # best within the budget
                     trial(Plan(layers=2, ffn_removed=0.5), 0.45, 8.0),
                     trial(Plan(layers=4), 0.70, 12.0),              # too slow even with slack
                     trial(Plan(layers=1), 0.30, 5.0))
    names = [Plan.model_validate(t.user_attrs["plan"]).name for t in finalists(completed(study), 10, settings)]
    assert names == [Plan(layers=2).name, Plan(layers=3).name, Plan(layers=2, ffn_removed=0.5).name]


def test_a_proxy_above_the_floor_goes_first_and_plans_count_once():
    settings = SearchSettings(latency_budget_ms=10, finalists=2, min_retention=0.9)
    study = study_of(trial(Plan(layers=2), 0.70, 9.0), trial(Plan(layers=2), 0.70, 9.0),
                     trial(Plan(layers=3, heads_removed=0.5), 0.74, 9.5), trial(Plan(layers=1), 0.6, 4.0))
    chosen = finalists(completed(study), 10, settings)
    assert [t.user_attrs["proxy_accuracy"] for t in chosen] == [0.74, 0.70]   # 0.74 / 0.8 clears 0.9


def test_with_nothing_within_budget_the_fastest_plans_are_the_finalists():
    settings = SearchSettings(latency_budget_ms=1, finalists=2)
    study = study_of(trial(Plan(layers=3), 0.6, 9.0), trial(Plan(layers=1), 0.3, 4.0), trial(Plan(layers=2), 0.4, 6.0))
    assert [t.user_attrs["predicted_ms"] for t in finalists(completed(study), 1, settings)] == [4.0, 6.0]


def test_progress_line_names_the_best_proxy_within_budget():
    study = study_of(trial(Plan(layers=3), 0.6, 10.8), trial(Plan(layers=2), 0.5, 9.0))
    line = progress_line(completed(study), study.trials[-1], 10.0, 600)
    assert "best proxy within budget 0.5000 (L2-" in line and "2 trials, 2 trained" in line and "10.0 min left" in line


def test_a_stored_identity_is_matched_on_the_keys_it_has(tmp_path):
    """A study made before a key joined the identity resumes; a different value is refused."""
    import pytest

    from compressor.search.study import connect, open_study
    from pretrain.errors import UserError
    storage = connect(f"sqlite:///{tmp_path / 'study.db'}")
    open_study(storage, "s", {"teacher": "a", "latency_budget_ms": 5.0}, join=False, seed=0)
    resumed = open_study(storage, "s", {"teacher": "a", "latency_budget_ms": 5.0, "proxy": [2000, 1e-3, 2000]},
                         join=False, seed=0)
    assert resumed.user_attrs["identity"] == {"teacher": "a", "latency_budget_ms": 5.0}
    with pytest.raises(UserError, match="latency_budget_ms 5.0"):
        open_study(storage, "s", {"teacher": "a", "latency_budget_ms": 4.0}, join=False, seed=0)


def test_connect_retries_when_another_worker_is_making_the_tables(tmp_path, monkeypatch):
    """Two workers opening one new SQLite storage at once: the loser sees "table ... already
    exists" (or an IntegrityError) and must retry, not give up with a storage error."""
    from sqlalchemy.exc import OperationalError

    from compressor.search import study
    real, calls = study.RDBStorage, []

    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("CREATE TABLE studies", {}, Exception("table studies already exists"))
        return real(*args, **kwargs)
    monkeypatch.setattr(study, "RDBStorage", racing)
    monkeypatch.setattr(study.time, "sleep", lambda s: None)
    storage = study.connect(f"sqlite:///{tmp_path / 'study.db'}")
    assert len(calls) == 2 and storage.get_all_studies() == []


def test_a_resumed_study_does_not_propose_its_first_trials_again(tmp_path):
    """Seeded as at the start, the sampler of a resumed study would repeat its first random
    draws: trials that cost nothing to reuse, but count against max_trials."""
    from compressor.search.study import connect, open_study
    storage = connect(f"sqlite:///{tmp_path / 'study.db'}")

    def first_draws(n: int) -> list[float]:
        study = open_study(storage, "s", {"task": "t"}, join=False, seed=0)
        draws = []
        for _ in range(n):
            trial = study.ask()
            draws.append(trial.suggest_float("x", 0.0, 1.0))
            study.tell(trial, [0.5, 1.0])
        return draws
    started = first_draws(2)
    resumed = first_draws(2)
    assert not set(resumed) & set(started)


def test_a_search_stopped_and_resumed_draws_the_plans_of_an_uninterrupted_one(tmp_path):
    """The sampler is reseeded after every trial by the draws made so far: a stop (its trial
    retried on resume) changes none of the later draws, so the finalists stay those of an
    uninterrupted search."""
    from optuna.trial import TrialState

    from compressor.search.study import connect, open_study, reseed_sampler

    def run(name: str, trials: int, stop_at: int | None = None) -> list[float]:
        study = open_study(connect(f"sqlite:///{tmp_path / name}.db"), "s", {"task": "t"}, join=False, seed=0)
        while len(study.get_trials(states=(TrialState.COMPLETE,))) < trials:
            trial = study.ask()
            x = trial.suggest_float("x", 0.0, 1.0)
            if trial.number == stop_at:
                trial.set_user_attr("stopped", True)       # as ProxyRunner.objective marks a Ctrl-C
                study.tell(trial, state=TrialState.FAIL)
                return []
            study.tell(trial, [x, 1.0])
            reseed_sampler(study, 0)                         # as run_proxies' callback does
        return sorted(t.params["x"] for t in study.get_trials(states=(TrialState.COMPLETE,)))
    uninterrupted = run("whole", 5)
    run("stopped", 5, stop_at=2)
    assert run("stopped", 5) == uninterrupted


def test_a_resumed_lead_retries_the_trials_a_stop_cut_short(tmp_path):
    """A trial interrupted (Ctrl-C, SIGTERM) or left running by a process killed on this host
    is queued again, once, with its plan; a trial that failed of itself is not."""
    import socket
    import subprocess
    import sys

    from optuna.trial import TrialState

    from compressor.search.study import connect, open_study
    storage = connect(f"sqlite:///{tmp_path / 'study.db'}")
    study = open_study(storage, "s", {"task": "t"}, join=False, seed=0)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stopped, killed, failed = (study.ask({"x": FloatDistribution(0.0, 1.0)}) for _ in range(3))
    stopped.set_user_attr("stopped", True)
    study.tell(stopped, state=TrialState.FAIL)
    killed.set_user_attr("worker", f"{socket.gethostname()}:{gone}")     # left RUNNING by a dead process
    study.tell(failed, state=TrialState.FAIL)                            # its own failure: not retried

    resumed = open_study(storage, "s", {"task": "t"}, join=False, seed=0)
    trials = resumed.get_trials()
    assert trials[killed.number].state == TrialState.FAIL
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert sorted(t.user_attrs["retry_of"] for t in waiting) == [stopped.number, killed.number]
    assert {t.system_attrs["fixed_params"]["x"] for t in waiting} == \
        {trials[stopped.number].params["x"], trials[killed.number].params["x"]}
    again = open_study(storage, "s", {"task": "t"}, join=False, seed=0)        # once only
    assert len([t for t in again.get_trials() if t.state == TrialState.WAITING]) == 2


def test_a_resumed_or_joined_study_of_the_largest_seed_gets_a_sampler(tmp_path):
    """The sampler is seeded with the run's seed plus the trials done (a resume) or plus a pid
    (a joiner); at the top of the seed range that sum left what its generator takes."""
    from optuna.storages import RDBStorage

    from compressor.search.study import open_study
    storage = RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    study = open_study(storage, "s", {"a": 1}, False, 2**32 - 1)
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)
    resumed = open_study(storage, "s", {"a": 1}, False, 2**32 - 1)
    joined = open_study(storage, "s", {"a": 1}, True, 2**32 - 1 + 1 + 4321)
    assert len(resumed.trials) == len(joined.trials) == 1


def test_a_trial_an_interrupt_cut_short_is_counted_as_stopped_not_failed():
    from optuna.trial import TrialState

    from compressor.search.run import trial_counts
    study = optuna.create_study()
    stopped, failed, done = (study.ask({"x": FloatDistribution(0.0, 1.0)}) for _ in range(3))
    stopped.set_user_attr("stopped", True)
    study.tell(stopped, state=TrialState.FAIL)
    study.tell(failed, state=TrialState.FAIL)
    study.tell(done, 1.0)
    counts = trial_counts(study.get_trials())
    assert (counts["total"], counts["complete"], counts["failed"], counts["stopped"]) == (3, 1, 1, 1)


def test_seeds_are_queued_first_and_once_per_study(tmp_path):
    """The lead queues its seed plans ahead of the sampler's draws; a resumed lead (the seeds
    waiting, run, or cut short and retried) must not queue them again."""
    from optuna.trial import TrialState

    from compressor.search.study import connect, open_study, seed_study
    storage = connect(f"sqlite:///{tmp_path / 'study.db'}")
    seeds = {"fastest": {"x": 0.1}, "largest": {"x": 0.9}}

    def resumed() -> optuna.Study:
        study = open_study(storage, "s", {"task": "t"}, join=False, seed=0)
        seed_study(study, seeds)
        return study
    study = resumed()
    first = study.ask()
    assert first.suggest_float("x", 0.0, 1.0) == 0.1 and first.user_attrs["seed"] == "fastest"
    first.set_user_attr("stopped", True)                     # cut short: retried on resume, with its plan
    study.tell(first, state=TrialState.FAIL)
    study = resumed()
    study = resumed()
    trials = study.get_trials()
    assert sorted(t.user_attrs.get("seed") for t in trials if "seed" in t.user_attrs) == ["fastest", "largest"]
    assert [t.system_attrs["fixed_params"]["x"] for t in trials if t.state == TrialState.WAITING] == [0.9, 0.1]
