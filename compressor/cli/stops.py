"""An orderly stop on Ctrl-C or SIGTERM: one line saying what was left, exit 130 or 143.

The entry point (`compressor.cli.main`) installs the handlers before anything else imports,
so this module imports only the standard library's lightest: a stop in the first fraction of
a second, while pydantic, torch and transformers import, ends as a later one does. Every
command then runs inside `stops_as_interrupts` (commands.py `main`): atomic writes remove
their temporaries, the last checkpoint stays.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Iterator     # not typing's: 2 ms more before the handlers are in


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, raised by our handler instead of Python's plain KeyboardInterrupt. Python 3.11 run
    as `python -m` ends the process by SIGINT (-2, not our 130) when the last string it `exec`ed
    was cut short by a plain KeyboardInterrupt, even one caught and handled: every @dataclass
    class is made by such an exec (pydantic's and transformers' at import), and the check that
    sets that flag (pythonrun.c) compares the exception's type exactly, so a subclass escapes it."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler, `kill`, a container stopping): the same orderly stop as Ctrl-C,
    so temporaries are removed and the last checkpoint stays, instead of dying mid-write."""


def first_rank() -> bool:
    """Under torchrun every rank sees the same error or stop: the first one says it."""
    return os.environ.get("RANK", "0") == "0"


def stop_word(stop: KeyboardInterrupt) -> str:
    return "terminated" if isinstance(stop, Terminated) else "interrupted"


def stop_exit_code(stop: KeyboardInterrupt) -> int:
    return 143 if isinstance(stop, Terminated) else 130     # the shell's codes for SIGTERM, SIGINT


@contextlib.contextmanager
def stops_as_interrupts() -> Iterator[None]:
    """While the block runs, Ctrl-C raises Interrupted and SIGTERM Terminated, and whatever leaves
    the block after one was raised leaves as that stop: a library may turn it into an error of its
    own, and that ended the command in a traceback (exit 1). Python 3.11 wraps one raised in a
    `__set_name__` in a RuntimeError; pydantic-core, cut short while it imports `datetime`,
    panics (pyo3's PanicException), the stop lost. The previous handlers are put back after
    (main may run inside another program, e.g. the tests). Only the main thread gets signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[KeyboardInterrupt] = []

    def stop(signum, frame):
        raised.append(Terminated() if signum == signal.SIGTERM else Interrupted())
        raise raised[-1]
    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except BaseException as err:
        if raised and not isinstance(err, (KeyboardInterrupt, GeneratorExit)):
            raise type(raised[-1])() from err
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
