"""The one exception type for bad user input, and pydantic's errors in the words it uses.

Anything raised as UserError is printed by the CLI as a single line on stderr with exit
code 2 and no traceback. The message must say what is wrong and what was expected.
"""

from __future__ import annotations

import difflib
import string
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence, get_args, get_origin

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo


class UserError(Exception):
    """Bad input from the user (a file, a flag, a recipe field): a one-line message."""


class AcrossFields(ValueError):
    """A config's check across its fields failed. The message names a field as `{field}` and
    a setting as `{field:value}`, so that each surface names them as its user writes them: a
    recipe (and Python) by the field, `domain_corpus`, `format: qdq` (what `str` gives); the
    command line by the flag, `--domain-corpus`, `--format qdq` (compressor/cli/flags.py)."""

    def __init__(self, template: str):
        super().__init__(template)
        self.template = template

    def worded(self, name: Callable[[str, str], str]) -> str:
        """The message with each field named by `name(field, value)` (value "" for a bare name)."""
        return FieldWords(name).format(self.template)

    def __str__(self) -> str:
        return self.worded(lambda field, value: f"{field}: {value}" if value else field)


class FieldWords(string.Formatter):
    """Fills `{field}` and `{field:value}` of an AcrossFields message by a naming function."""

    def __init__(self, name: Callable[[str, str], str]):
        super().__init__()
        self.name = name

    def get_value(self, key, args, kwargs) -> str:
        return str(key)

    def format_field(self, value: str, format_spec: str) -> str:
        return self.name(value, format_spec)


def validation_message(error: dict) -> str:
    """One pydantic error's message without pydantic's own prefix ("Value error, set without
    domain_corpus" reads "set without domain_corpus"): our validators write whole sentences."""
    message = str(error.get("msg", ""))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message


# Pydantic's errors for a number outside its field's bounds, and for a value that is no number
# (or no finite one, `allow_inf_nan=False`).
RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
NUMBER_TYPE_ERRORS = {"int_parsing", "int_type", "int_from_float", "float_parsing", "float_type", "finite_number"}


def number_problem(error: dict, field: FieldInfo | None) -> str | None:
    """A number field's error as what the field takes and what it was given, `expected an integer
    from 8 to 512 (got 0)`: both bounds, where pydantic names only the one crossed ("greater than
    or equal to 8") or none ("a valid number"). None for another error or another field."""
    if error["type"] not in RANGE_ERRORS | NUMBER_TYPE_ERRORS:
        return None
    takes = number_range(field)
    return f"expected {takes} (got {given_text(error.get('input'))})" if takes else None


def number_range(field: FieldInfo | None) -> str | None:
    """What an int or float field takes, in words, from its bounds (ge, gt, le, lt): `an
    integer from 8 to 512`, `a positive integer`, `a number in [0, 1)`, `a positive number`;
    None for a field of another type (`int | Literal['all']`: its union's branches say it)."""
    kind = number_kind(field.annotation) if field is not None else None
    if kind is None:
        return None
    bounds = field_bounds(field)
    return integer_range(bounds) if kind is int else float_range(bounds)


def field_bounds(field: FieldInfo) -> dict:
    """A field's bounds by pydantic's names: {"gt": 0, "le": 1} for `Field(gt=0, le=1)`."""
    return {key: getattr(m, key) for m in field.metadata for key in ("ge", "gt", "le", "lt")
            if getattr(m, key, None) is not None}


def number_kind(annotation: Any) -> type | None:
    """int or float for a field annotated `int`, `float` or either `| None`; else None."""
    kinds = set(get_args(annotation) or (annotation,)) - {type(None)}
    return kinds.pop() if kinds in ({int}, {float}) else None


def integer_range(bounds: dict) -> str:
    low, high = integer_limits(bounds)
    if low is not None and high is not None:
        return f"an integer from {low} to {high}"
    if low is not None:
        return "a positive integer" if low == 1 else f"an integer >= {low}"
    return f"an integer <= {high}" if high is not None else "an integer"


def integer_limits(bounds: dict) -> tuple[int | None, int | None]:
    """The least and the greatest integer `bounds` take (None: unbounded): an integer above 7
    is one from 8, so the words can name the integers themselves."""
    low = bounds["ge"] if "ge" in bounds else bounds["gt"] + 1 if "gt" in bounds else None
    high = bounds["le"] if "le" in bounds else bounds["lt"] - 1 if "lt" in bounds else None
    return low, high


def float_range(bounds: dict) -> str:
    """`a number in (0, 1]`: an interval, its brackets saying whether each end is taken."""
    low = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
    high = ("]", bounds["le"]) if "le" in bounds else (")", bounds["lt"]) if "lt" in bounds else None
    if low is not None and high is not None:
        return f"a number in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
    if low is not None:
        return "a positive number" if low == ("(", 0) else f"a number {'>=' if low[0] == '[' else '>'} {low[1]:g}"
    if high is not None:
        return f"a number {'<=' if high[0] == ']' else '<'} {high[1]:g}"
    return "a number"


def choice_problem(error: dict, names: Sequence) -> str | None:
    """A Literal field's error as the names it takes and the one given, with the nearest valid
    name for a misspelt one: `expected one of soft, hard, cosine (got 'sofft'); did you mean
    'soft'?`; for a mapping's key (`weights: {sofft: 1}`) `unknown name 'sofft'; expected one of
    ...`. None for another error, or where the names are not known."""
    if error["type"] != "literal_error" or not names:
        return None
    given = error.get("input")
    expected = f"expected one of {', '.join(map(str, names))}"
    hint = did_you_mean(given, [str(n) for n in names]) if isinstance(given, str) else ""
    if error["loc"] and error["loc"][-1] == "[key]":
        return f"unknown name {given_text(given)}; {expected}{hint}"
    return f"{expected} (got {given_text(given)}){hint}"


def did_you_mean(name: str, names: Sequence[str]) -> str:
    """`; did you mean 'soft'?` for the valid name nearest `name`, empty where none is close."""
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def literal_values(annotation: Any) -> tuple:
    """The values of the first Literal in an annotation (`X | None`, `list[X]`, a mapping's key
    `dict[X, float]`); () where it holds none."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return next((values for arg in get_args(annotation) if (values := literal_values(arg))), ())


def given_text(value: Any) -> str:
    """The value an error names: as written, but a mapping or a list by its kind (it may be long)."""
    if isinstance(value, dict):
        return "a mapping"
    return "a list" if isinstance(value, (list, tuple)) else repr(value)
