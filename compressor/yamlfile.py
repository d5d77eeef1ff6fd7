"""YAML as recipes and profiles are read: the safe loader, with duplicate keys refused.

PyYAML keeps the last of two equal keys without a word, so a recipe naming a variant twice
would lose the first one silently. Here the second is a YAML error that names both lines.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml
from yaml.constructor import ConstructorError


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
