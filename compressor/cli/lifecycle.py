"""How a command starts and ends: `--version`, and what a stopped command left (the stop
itself, Ctrl-C or SIGTERM, is stops.py's).
"""

from __future__ import annotations

import argparse
import platform

# The libraries whose versions change results or speed (what a bug report needs first).
VERSIONED = ("torch", "transformers", "onnxruntime", "optimum", "optimum-onnx", "neural-compressor-pt")


def version_line() -> str:
    """`compressor 0.5.0 (python 3.11.2, torch 2.13.0+cpu, ...)`; read from package metadata."""
    from importlib.metadata import PackageNotFoundError, version

    from compressor import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    libraries = ", ".join(f"{name} {installed(name)}" for name in VERSIONED)
    return f"compressor {__version__} (python {platform.python_version()}, {libraries})"


class PrintVersion(argparse.Action):
    """`--version`: the version line, unwrapped (argparse's own action wraps it), then exit 0."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0,
                         help="print this tool's version and those of the libraries its results depend on")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def after_interrupt(args: argparse.Namespace | None) -> str:
    """What an interrupted command left, and how to go on (every output is written atomically;
    `args` None: stopped before the command line was read)."""
    command = getattr(args, "command", None)
    if command in ("run", "search"):
        return "finished stages are kept; rerun the same command to resume"
    if command in ("finetune", "pretrain"):
        from pretrain.resume import checkpoint_dir
        from pretrain.train import CHECKPOINT_FILE
        ckpt = checkpoint_dir(args.out)
        if (ckpt / CHECKPOINT_FILE).is_file():
            return f"the last checkpoint is in {ckpt}; rerun the same command with --resume to continue"
    return f"nothing was written to {args.out}" if getattr(args, "out", None) else "nothing was written"
