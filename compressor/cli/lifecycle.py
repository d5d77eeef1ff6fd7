"""How a command starts and ends: `--version`, and an orderly stop on Ctrl-C or SIGTERM.

`main` (commands.py) runs every command inside `sigterm_as_interrupt`, so a job scheduler's
SIGTERM stops it the way Ctrl-C does: atomic writes remove their temporaries, the last
checkpoint stays, and one line says what was left and how to go on.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import platform
import signal
import threading
from typing import Iterator

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


def first_rank() -> bool:
    """Under torchrun every rank sees the same error or stop: the first one says it."""
    return os.environ.get("RANK", "0") == "0"


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler, `kill`, a container stopping): the same orderly stop as Ctrl-C,
    so temporaries are removed and the last checkpoint stays, instead of dying mid-write."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a command runs, SIGTERM raises Terminated; the previous handler is put back after
    (main may run inside another program, e.g. the tests). Only the main thread gets signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Terminated
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM ignored for the block, the handlers put back after (main thread only:
    only it may set them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def quiet_exit_after_command() -> None:
    """Once the command is over, ignore Ctrl-C and SIGTERM while the interpreter exits: it takes
    seconds to unload torch and ONNX Runtime (about 3 s after a `bench`), and a stop arriving
    then, with the output written and its line printed, ended the process by the signal, with
    no line and a status saying it was stopped (-2 or -15; 130 in a shell). Registered as the
    command ends, so it is the first at-exit call (before the unloading); a program calling
    main() keeps its handlers until it exits."""
    atexit.unregister(ignore_stops)     # one entry however often main runs in one process
    atexit.register(ignore_stops)


def ignore_stops() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


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
