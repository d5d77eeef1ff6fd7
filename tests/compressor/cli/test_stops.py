"""stops.py: Ctrl-C and SIGTERM as the orderly stop's exceptions, and the light import that
lets the entry point install them before anything heavy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compressor.cli.stops import Interrupted, Terminated, stop_exit_code, stop_word, stops_as_interrupts


def test_ctrl_c_and_sigterm_raise_our_stops_and_the_handlers_come_back():
    """Ctrl-C is our subclass, not Python's plain KeyboardInterrupt: a plain one cut short in an
    exec'd string made Python 3.11 end a handled stop by SIGINT (-2) instead of exit 130."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with stops_as_interrupts():
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)   # else pytest dies
        for signum, expected in ((signal.SIGINT, Interrupted), (signal.SIGTERM, Terminated)):
            with pytest.raises(KeyboardInterrupt) as stopped:
                os.kill(os.getpid(), signum)
                time.sleep(5)       # the handler runs here, at the latest
            assert type(stopped.value) is expected
            assert (stop_word(stopped.value), stop_exit_code(stopped.value)) == {
                Interrupted: ("interrupted", 130), Terminated: ("terminated", 143)}[expected]
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_an_error_a_library_makes_of_a_stop_leaves_as_the_stop():
    """Python 3.11 turns a stop raised in a __set_name__ into a RuntimeError; pyo3 into a panic."""
    class PanicException(BaseException):
        pass
    with pytest.raises(BaseException) as left:      # not only Exception: a panic that escaped would end pytest
        with stops_as_interrupts():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except BaseException:
                raise PanicException("failed to import `datetime` C API") from None
    assert type(left.value) is Terminated
    with pytest.raises(RuntimeError, match="not a stop"):       # with no stop before it, an error stays itself
        with stops_as_interrupts():
            raise RuntimeError("not a stop")


def test_the_entry_point_imports_nothing_heavy_before_its_handlers():
    """What `compressor.cli` imports runs before a stop is caught: the standard library's lightest."""
    root = Path(__file__).resolve().parents[3]
    code = ("import json, sys; before = set(sys.modules); import compressor.cli; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(root)})
    imported = {name.split(".")[0] for name in json.loads(done.stdout)}
    assert imported <= {"compressor", "pretrain", "signal", "threading", "_weakrefset", "atexit", "contextlib",
                        "collections"}
