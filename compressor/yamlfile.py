"""YAML as recipes and profiles are read: the safe loader, with duplicate keys refused, and
the nearest field name suggested for a misspelt one.

PyYAML keeps the last of two equal keys without a word, so a recipe naming a variant twice
would lose the first one silently. Here the second is a YAML error that names both lines.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from yaml.constructor import ConstructorError

from pretrain.errors import did_you_mean, literal_values


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader whose mappings refuse a key given twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:   # the keys as written: merged ones (`<<: *base`) may be overridden
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue                     # the base class reports an unhashable key itself
            if key in first_line:
                raise ConstructorError(None, None, f"duplicate key {key!r} (first given at line {first_line[key]})",
                                       key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Parse YAML text safely; a key given twice in one mapping is a yaml.YAMLError."""
    return yaml.load(text, Loader=UniqueKeyLoader)


def yaml_problem(err: yaml.YAMLError) -> str:
    """`at line 3: expected ',' or ']', but got '<stream end>'`: where and what, on one line."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark else ""
    return f"{where}: {getattr(err, 'problem', None) or str(err).splitlines()[0]}"


def field_suggestion(model: type[BaseModel] | None, loc: tuple) -> str:
    """`; did you mean 'finetune'?` for a misspelt field at `loc` (its last part), found by
    following the model's fields down the path; empty where the path leaves the models
    (a list index, a mapping of variants) or no name is close."""
    model = model_at(model, loc[:-1])
    if model is None:
        return ""
    return did_you_mean(str(loc[-1]), [field.alias or name for name, field in model.model_fields.items()])


def choices_at(model: type[BaseModel] | None, loc: tuple) -> tuple:
    """The names a Literal at a pydantic error's `loc` takes: the field's own, its list items'
    (`losses[1]`) or its mapping's keys (`weights.sofft`, pydantic's loc ending in `[key]`)."""
    path = loc[:-2] if loc and loc[-1] == "[key]" else loc
    while path and isinstance(path[-1], int):
        path = path[:-1]
    field = field_at(model, path) if path else None
    return literal_values(field.annotation) if field is not None else ()


def field_at(model: type[BaseModel] | None, loc: tuple) -> FieldInfo | None:
    """The field a pydantic error's `loc` names, found as `field_suggestion` finds it, or what a
    value of a mapping field is (`weights.soft`: a weight, its bounds with it); None where the
    path leaves the models and their mappings (a list item, a union branch)."""
    parent = model_at(model, loc[:-1]) if loc else None
    if parent is not None and isinstance(loc[-1], str):
        return parent.model_fields.get(loc[-1])
    return mapping_value(field_at(model, loc[:-1])) if len(loc) > 1 and isinstance(loc[-1], str) else None


def mapping_value(field: FieldInfo | None) -> FieldInfo | None:
    """What each value of a mapping field is (`dict[str, Annotated[float, Field(ge=0)]]`: a float
    >= 0), as a field of its own; None for a field of another type."""
    if field is None or get_origin(field.annotation) is not dict:
        return None
    return FieldInfo.from_annotation(get_args(field.annotation)[1])


def model_at(model: type[BaseModel] | None, path: tuple) -> type[BaseModel] | None:
    """The model that following the fields along `path` from `model` leads to, if any."""
    for part in path:
        field = model.model_fields.get(str(part)) if model is not None else None
        model = model_in(field.annotation) if field is not None else None
    return model


# Pydantic names the branch of a union an error comes from, in its location, by the branch's
# type ("int", "literal['real']", "dict[str,any]", "function-after[...]"): not a field name.
TYPE_TAGS = {"int", "str", "float", "bool", "dict", "list"}


def is_type_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in TYPE_TAGS or "[" in part or part.startswith("function-"))


def location(loc: tuple) -> str:
    """A pydantic error's location as recipes write it: ("variants", "d", 0, "str") ->
    `variants.d[0]` (fields dotted, list items indexed, union branch tags left out)."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not is_type_tag(part):
            text += f".{part}" if text else str(part)
    return text


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`X`, `X | None`, ...), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((found for arg in get_args(annotation) if (found := model_in(arg)) is not None), None)


def refuse_bool_items(values: Any, expected: str = "numbers") -> Any:
    """A `mode="before"` check for a list of numbers whose own validator runs before
    refuse_bool_numbers could: `[true]` is refused as written, not as the 1 it became."""
    if isinstance(values, list) and any(isinstance(v, bool) for v in values):
        raise ValueError(f"expected {expected}, got {yaml.safe_dump(values, default_flow_style=True).strip()}")
    return values


def refuse_bool_numbers(raw: Any, validated: Any, where: str) -> None:
    """Raise ValueError where YAML's `true`/`false` stood for a number.

    Pydantic's lax mode turns `epochs: true` into 1 without a word; a recipe or profile
    wants that refused. Lax mode stays otherwise: PyYAML reads `lr: 1e-4` as a string,
    and pydantic reading it as the number the user meant is what a user expects.
    """
    if isinstance(raw, bool):
        if not isinstance(validated, bool):
            raise ValueError(f"{where}: expected a number, got {str(raw).lower()}")
    elif isinstance(raw, dict) and isinstance(validated, BaseModel):
        by_key = {field.alias or name: name for name, field in type(validated).model_fields.items()}
        by_key.update({name: name for name in type(validated).model_fields})
        for key, value in raw.items():
            if key in by_key:
                refuse_bool_numbers(value, getattr(validated, by_key[key]), f"{where}.{key}".lstrip("."))
    elif isinstance(raw, dict) and isinstance(validated, dict):
        for key, value in raw.items():
            if key in validated:
                refuse_bool_numbers(value, validated[key], f"{where}.{key}".lstrip("."))
    elif isinstance(raw, list) and isinstance(validated, (list, tuple)) and len(raw) == len(validated):
        for i, (item, kept) in enumerate(zip(raw, validated)):
            refuse_bool_numbers(item, kept, f"{where}[{i}]")
