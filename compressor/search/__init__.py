"""Search to a latency budget: a latency model per profile (latency.py, structures.py), the plans
searched (plans.py), the Optuna study and its proxies (study.py), and the whole run (run.py).

    from compressor.search import SearchSettings, run_search
    result = run_search("runs/demo/teacher", "wordnet-supersense", "cpu",
                        SearchSettings(latency_budget_ms=8, min_retention=0.97, time_budget_min=60),
                        Path("runs/search"))
"""

from compressor.search.settings import SearchSettings


def run_search(*args, **kwargs):
    """compressor.search.run.run_search (imported on use: it loads torch and Optuna)."""
    from compressor.search.run import run_search as run
    return run(*args, **kwargs)


__all__ = ["SearchSettings", "run_search"]
