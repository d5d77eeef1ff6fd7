"""Passes from other packages, found through an entry point.

A distribution that declares, in its pyproject.toml,

    [project.entry-points."encoder_compressor.passes"]
    my-passes = "my_package.my_passes"

has that module imported when `compressor.passes` is: its `register(...)` calls then make its
passes known to recipes, `compressor run`, `--plan` and the Python API alike, exactly as the
built-in ones (the registry is the one extension point; recipes never import code).
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

GROUP = "encoder_compressor.passes"


def load_plugins() -> list[str]:
    """Import every module the group names; the names of those that loaded. One that fails is
    reported in one line and skipped: the built-in passes still work, and a recipe that uses
    the missing pass is refused as naming an unknown one."""
    loaded = []
    for point in entry_points(group=GROUP):
        try:
            point.load()
        except Exception as err:     # a plugin's bug must not take the tool down with it
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            print(f"warning: pass plugin {point.name!r} ({point.value}) did not load: {reason}", file=sys.stderr)
            continue
        loaded.append(point.name)
    return loaded
