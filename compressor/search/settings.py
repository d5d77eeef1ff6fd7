"""What a search is asked for: the recipe's `search:` section, the `compressor search` flags,
and `compressor.search.run_search` from Python all validate through SearchSettings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from compressor.bench.baselines import BASELINES, distinct_baselines
from compressor.search.plans import PRECISIONS, RECOVERIES, Precision, Recovery
from pretrain.limits import MAX_SEED


MAX_LATENCY_STRUCTURES = 500


class SearchSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    latency_budget_ms: float = Field(gt=0)                                      # p50 at `batch_size` on the profile
    batch_size: int = Field(8, ge=1)
    min_retention: float = Field(0.97, gt=0, le=1)          # of the teacher's test accuracy
    time_budget_min: float = Field(60.0, gt=0)              # this command's wall time, all phases
    storage: str | None = None                 # an Optuna storage URL; default sqlite under the out dir
    study_name: str = Field("search", min_length=1)
    finalists: int = Field(3, ge=1)            # plans trained fully, exported and benchmarked
    proxy_train_samples: int = Field(2000, ge=1)   # a proxy trains 1 epoch on the first N train rows
    # ... at this rate; None: the recovery pass's default scaled by depth / layers kept
    # (plans.proxy_lr), since at fine-tuning's 1e-4 a 1- or 2-layer student has not moved off
    # the majority class after a proxy's ~60 steps, while the whole teacher loses at 1e-3.
    proxy_lr: float | None = Field(None, gt=0)
    validation_samples: int = Field(2000, ge=1)    # proxies are scored on the last N train rows
    train_samples: int = Field(30000, ge=1)        # a finalist trains on the first N train rows
    scoring_samples: int = Field(512, ge=1)        # pruning scores importance on the first N train rows
    epochs: float = Field(1.0, gt=0)               # ... for this many epochs
    recoveries: tuple[Recovery, ...] = Field(RECOVERIES, min_length=1)
    precisions: tuple[Precision, ...] = Field(PRECISIONS, min_length=1)
    max_trials: int | None = Field(None, ge=1)     # proxy trials of the study (every worker's) before finals
    # Plans predicted up to this share over the budget still train: the latency model errs by
    # a few percent, and measured numbers decide.
    latency_slack: float = Field(0.1, ge=0, le=1)
    # Random structures per precision the latency model is fitted on, and scored on (its error
    # is reported); each is exported and timed, a few seconds to a minute apiece.
    latency_structures: int = Field(12, ge=2, le=MAX_LATENCY_STRUCTURES)
    latency_held_out: int = Field(6, ge=1, le=MAX_LATENCY_STRUCTURES)
    max_eval_samples: int | None = Field(5000, ge=1)   # test examples the finalists are scored on
    baselines: list[Literal[BASELINES]] = list(BASELINES)    # type: ignore[valid-type]
    seed: int = Field(0, ge=0, le=MAX_SEED)
    # Hand-written variants (recipe step lists, as under a recipe's `variants:`, with their
    # training limits written out) trained and measured in the finals beside the finalists,
    # so the searched model is compared with what a user wrote in one run.
    compare: dict[str, list[dict[str, Any] | str]] = {}

    @field_validator("baselines")
    @classmethod
    def _once_each(cls, names: list[str]) -> list[str]:
        return distinct_baselines(names)

    @field_validator("recoveries", "precisions")
    @classmethod
    def _distinct(cls, values: tuple) -> tuple:
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:     # the name, not the whole list: a flag shows it as typed, a recipe where it stands
            raise ValueError(f"{', '.join(twice)} listed more than once; expected each once")
        return values
