"""The `compressor` command: commands.py (the parser, one handler per command, main) and one
module per command that does real work (finetune_command.py, export_command.py, ...)."""

from compressor.cli.commands import main

__all__ = ["main"]
