"""What a number field takes, in words, from its pydantic bounds: the forms no shipped field
has yet (an int's exclusive bound, an upper bound alone). The shipped fields' messages are
checked through real recipes in tests/compressor/pipeline/test_recipe.py."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from pretrain.errors import number_range


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
