"""What a flag's value must be, said as recipes say it.

A number flag's argparse type refuses what its config field would, in the same words
(`argument --epochs: expected a positive number (got 'x')`), the value shown as typed; a
config built from flags names the flag the user typed in its error (`--domain-steps: ...`),
not the field, and so does a check across fields (`--domain-lr: set without --domain-corpus`).
Only light imports here: commands.py imports this before the libraries are quieted.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

from pydantic import BaseModel, ValidationError

from pretrain.errors import (AcrossFields, UserError, choice_problem, field_bounds, float_range, integer_limits,
                             number_kind, number_problem, validation_message)
from pretrain.limits import MAX_SEED, MAX_THREADS

MAX_COUNT = 2**31 - 1      # steps, sizes, samples: past this the libraries fail with a traceback


def bounded_int(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high`, else a one-line error naming the range."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = low - 1
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"expected {what} from {low} to {high} (got {written(value)})")
        return number
    return parse


positive_int = bounded_int(1, MAX_COUNT, "a positive integer")
seed_value = bounded_int(0, MAX_SEED, "a seed")
thread_count = bounded_int(1, MAX_THREADS, "a thread count")


def bounded_float(bounds: dict) -> Callable[[str], float]:
    """An argparse type: a finite number within pydantic-style `bounds` ({"gt": 0, "le": 1}),
    else a one-line error saying the interval (`expected a number in (0, 1] (got 2)`)."""
    takes = float_range(bounds)

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and within(number, bounds)):
            raise argparse.ArgumentTypeError(f"expected {takes} (got {written(value)})")
        return number
    return parse


def within(number: float, bounds: dict) -> bool:
    return (number >= bounds.get("ge", -math.inf) and number > bounds.get("gt", -math.inf)
            and number <= bounds.get("le", math.inf) and number < bounds.get("lt", math.inf))


def config_number(config: type[BaseModel], name: str) -> Callable[[str], int | float]:
    """The argparse type of the flag that sets number field `name` of `config`: the field's own
    bounds, so the flag refuses what the config would, as its words say (an integer also at most
    MAX_COUNT, where the libraries stop)."""
    field = config.model_fields[name]
    bounds = field_bounds(field)
    if number_kind(field.annotation) is float:
        return bounded_float(bounds)
    low, high = integer_limits(bounds)
    low = -MAX_COUNT if low is None else low
    return bounded_int(low, MAX_COUNT if high is None else min(high, MAX_COUNT),
                       "a positive integer" if low == 1 else "an integer")


def written(value: str) -> str:
    """A flag's value as typed: a number bare (`0`, `1e-5`), anything else quoted (`'x'`)."""
    try:
        float(value)
    except ValueError:
        return repr(value)
    return value


def validated(config_type: type[BaseModel], values: dict, flags: dict | None = None):
    """`config_type` from flag values, or a one-line error naming the flag the value came from:
    `--parity-tolerance: expected a positive number (got 0.0)`, `--baselines: expected one of
    ... (got 'teacher')`; a check across fields names every flag it concerns (`--domain-steps:
    set without --domain-corpus; ...`). `flags`: fields whose flag is not --<field>, None for
    an error of no one field (export's: `{"mode": "--quantize", None: "--quantize"}`)."""
    try:
        return config_type.model_validate(values)
    except ValidationError as err:
        raise UserError(flag_error(err, config_type, values, flags or {})) from None


def flag_error(err: ValidationError, config_type: type[BaseModel], values: dict, flags: dict) -> str:
    # Imported here: the recipe module loads the passes (and torch), and this module must stay light.
    from compressor.pipeline.recipe import validating_type
    from compressor.yamlfile import choices_at, field_at
    first = err.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else None
    across = first.get("ctx", {}).get("error")
    if isinstance(across, AcrossFields):    # the value is not what is wrong, and it parsed from other text
        problem = across.worded(lambda name, value: f"{flag_of(name, flags, values)} {value}".strip())
        return f"{flag_of(field, flags, values)}: {problem}" if field else problem
    model = validating_type(config_type, values)
    problem = (number_problem(first, field_at(model, first["loc"]))
               or choice_problem(first, choices_at(model, first["loc"]))
               or f"{validation_message(first)} (got {as_typed(first.get('input'))})")
    return f"{flag_of(field, flags, values) if field else flags.get(None, 'settings')}: {problem}"


def flag_of(field: str | None, flags: dict, values: dict) -> str:
    """The flag that sets `field` as typed: `--domain-corpus`, `--no-per-channel` for a field
    set False, or its own name in `flags`."""
    if field in flags:
        return flags[field]
    return f"--{'no-' if values.get(field) is False else ''}{str(field).replace('_', '-')}"


def as_typed(value) -> str:
    """A value a flag gave, as it was typed: a list as the comma-separated text it came from."""
    return repr(",".join(map(str, value)) if isinstance(value, (list, tuple)) else value)
