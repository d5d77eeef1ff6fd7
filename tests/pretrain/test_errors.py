"""What a number field takes, in words, from its pydantic bounds: the forms no shipped field
has yet (an int's exclusive bound, an upper bound alone). The shipped fields' messages are
checked through real recipes in tests/compressor/pipeline/test_recipe.py. Also a check across
fields, whose message names the fields as each surface names them."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field, ValidationError, model_validator

from pretrain.errors import AcrossFields, choice_problem, number_range


class Settings(BaseModel):
    exclusive: int = Field(5, gt=0, lt=10)
    at_most: int = Field(1, le=3)
    free: int | None = None
    below: float = Field(0.0, lt=2.5)
    above: float = Field(1.0, ge=0.5)
    any_number: float = 1.0
    either: int | Literal["all"] = "all"
    name: str = "x"


@pytest.mark.parametrize("field, words", [
    ("exclusive", "an integer from 1 to 9"),      # > 0 and < 10: the integers themselves
    ("at_most", "an integer <= 3"),
    ("free", "an integer"),
    ("below", "a number < 2.5"),
    ("above", "a number >= 0.5"),
    ("any_number", "a number"),
    ("either", None),                              # a union's branches say what it takes
    ("name", None),
])
def test_number_range_words(field, words):
    assert number_range(Settings.model_fields[field]) == words


class Paired(BaseModel):
    scope: str = "ops"
    format: str = "qdq"

    @model_validator(mode="after")
    def _qdq(self) -> "Paired":
        if self.scope == "linears" and self.format != "qdq":
            raise AcrossFields("{scope:linears} writes a QDQ graph; expected {format:qdq} with it, or {scope:ops}")
        return self


def test_a_check_across_fields_names_them_as_each_surface_writes_them():
    with pytest.raises(ValidationError) as caught:
        Paired(scope="linears", format="qoperator")
    error = caught.value.errors()[0]["ctx"]["error"]
    # A recipe (and pydantic's own message) by the field, the command line by the flag.
    assert str(error) == "scope: linears writes a QDQ graph; expected format: qdq with it, or scope: ops"
    assert "scope: linears writes" in str(caught.value)
    flag = error.worded(lambda field, value: f"--{field} {value}".strip())
    assert flag == "--scope linears writes a QDQ graph; expected --format qdq with it, or --scope ops"
    assert AcrossFields("set without {domain_corpus}").worded(lambda f, v: f"--{f}") == "set without --domain_corpus"


@pytest.mark.parametrize("loc, given, message", [
    (("losses", 1), "hidn", "expected one of soft, hard, hidden (got 'hidn'); did you mean 'hidden'?"),
    (("weights", "sofft", "[key]"), "sofft", "unknown name 'sofft'; expected one of soft, hard, hidden; "
                                             "did you mean 'soft'?"),
    (("losses", 0), "zzz", "expected one of soft, hard, hidden (got 'zzz')"),       # nothing close: no guess
    (("losses", 0), 7, "expected one of soft, hard, hidden (got 7)"),
])
def test_a_name_no_literal_takes_gets_the_names_and_the_nearest(loc, given, message):
    error = {"type": "literal_error", "loc": loc, "input": given}
    assert choice_problem(error, ("soft", "hard", "hidden")) == message
    assert choice_problem({**error, "type": "string_type"}, ("soft",)) is None
    assert choice_problem(error, ()) is None
