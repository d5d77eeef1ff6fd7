"""The `compressor` command: commands.py (the parser, one handler per command, main) and one
module per command that does real work (finetune_command.py, export_command.py, ...)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """The command (`python -m compressor`, and the `compressor` script pyproject.toml installs).
    commands.py imports pydantic and logging before its own `main` can catch a Ctrl-C: one
    then ended in a traceback, and Python, re-raising the signal, died of it (-2), not 130."""
    try:
        from compressor.cli.commands import main as command_main
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return 130
    return command_main(argv)


__all__ = ["main"]
