"""The `compressor` command: commands.py (the parser, one handler per command, main) and one
module per command that does real work (finetune_command.py, export_command.py, ...)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from compressor.cli.stops import (first_rank, quiet_exit_after_command, stop_exit_code, stop_word, stops_as_interrupts,
                                  stops_held)
from pretrain.child_process import end_with_launcher


def main(argv: list[str] | None = None) -> int:
    """The command (`python -m compressor`, and the `compressor` script pyproject.toml installs).

    Ctrl-C and SIGTERM are caught from its first line (stops.py), before commands.py imports
    pydantic and logging and the command the libraries (torch, transformers: seconds): a SIGTERM
    before the command's own handler was in place killed the process with no line (-15)."""
    with stops_as_interrupts():
        end_with_launcher()
        try:
            command_main = imported_command()
        except KeyboardInterrupt as stop:
            with stops_held():
                if first_rank():
                    print(f"{stop_word(stop)}: nothing was written", file=sys.stderr)
                quiet_exit_after_command()
            return stop_exit_code(stop)
        return command_main(argv)


def imported_command() -> Callable[[list[str] | None], int]:
    """commands.py's main. Its own block of stops_as_interrupts (inside main's): a stop that a
    library turns into an error of its own as it imports leaves this block as the stop."""
    with stops_as_interrupts():
        from compressor.cli.commands import main as command_main
    return command_main


__all__ = ["main"]
