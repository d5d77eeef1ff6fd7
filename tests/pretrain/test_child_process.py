"""end_with_parent: a child this tool starts does not outlive a parent killed by SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# A child that asks to end with its parent, then waits (for far longer than the test).
CHILD = """
import sys, time
from pretrain.child_process import end_with_parent
end_with_parent(int(sys.argv[1]))
print("ready", flush=True)
time.sleep(600)
"""

# Its parent: starts it, says its pid, and waits for it.
PARENT = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())])
print(child.pid, flush=True)
child.wait()
"""


def running(pid: int) -> bool:
    """Alive and not a zombie (whoever adopted the orphan may not reap it at once)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def ended_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def children_running(pid: int, command: bytes) -> list[int]:
    """The processes whose parent is `pid` and whose command line holds `command`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            line = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):     # a process that ended as we looked
            continue
        if ppid == pid and command in line:
            found.append(int(stat.parent.name))
    return found


def kill_left(pid: int) -> None:
    """A child the test failed to see end: killed, so that a failing test leaves no orphan."""
    if running(pid):
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def killed_once_ready(code: str, argument: str) -> Iterator[tuple[int, IO[str]]]:
    """Run `code` (it prints its child's pid, then the child prints "ready" once its request is
    made), SIGKILL it then; yields the child's pid and the rest of the output."""
    parent = subprocess.Popen([sys.executable, "-c", code, argument], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "ready"
        parent.kill()
        parent.wait(timeout=30)
        yield child, parent.stdout
    finally:
        kill_left(child)
        parent.stdout.close()


@linux_only
def test_a_child_ends_when_its_parent_is_killed():
    with killed_once_ready(PARENT, CHILD) as (child, _):
        assert ended_within(child, 5)


# A script (as in benchmarks/) that starts a command which asks nothing itself, here one that
# says when it is told to stop (SIGTERM: compressor's orderly stop), and waits for it.
SCRIPT = """
import os, subprocess, sys
from pretrain.child_process import ends_with_this_process
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], preexec_fn=ends_with_this_process())
print(child.pid, flush=True)
child.wait()
"""
COMMAND = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("terminated", flush=True), sys.exit(0)))
print("ready", flush=True)
time.sleep(600)
"""


@linux_only
def test_a_command_a_script_starts_ends_when_the_script_is_killed():
    # The benchmarks' `compressor` children ran on, orphans, after a `kill -9` of the script.
    with killed_once_ready(SCRIPT, COMMAND) as (child, output):
        assert ended_within(child, 5)
        assert output.read().strip() == "terminated"    # by SIGTERM, its orderly stop


def test_elsewhere_than_linux_a_script_starts_commands_as_before():
    code = ("import sys; sys.platform = 'darwin'; from pretrain.child_process import ends_with_this_process; "
            "print(ends_with_this_process())")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "None\n")


@linux_only
def test_a_child_whose_parent_died_before_it_asked_ends_at_once():
    """The kernel only signals a death after the request: the child checks its parent itself.
    Here the pid it is given is not its parent's, as after an early death and adoption."""
    code = "import os; from pretrain.child_process import end_with_parent; end_with_parent(os.getppid() + 1)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, timeout=60)
    assert done.returncode == -signal.SIGKILL


def test_elsewhere_than_linux_it_does_nothing():
    code = ("import sys; sys.platform = 'darwin'; from pretrain.child_process import end_with_parent; "
            "end_with_parent(-1); print('still here')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "still here\n")


# The signal this process asked for on its parent's death after end_with_launcher (PR_GET_PDEATHSIG).
ASKED = """
import ctypes, signal
from pretrain.child_process import end_with_launcher
end_with_launcher()
asked = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(asked), 0, 0, 0)
print(asked.value)
"""


@linux_only
def test_only_a_process_torchrun_started_asks_to_end_with_its_parent():
    asked = {}
    for launched in (False, True):
        env = {**ENV, "TORCHELASTIC_RUN_ID": "none"} if launched else {k: v for k, v in ENV.items()
                                                                        if k != "TORCHELASTIC_RUN_ID"}
        done = subprocess.run([sys.executable, "-c", ASKED], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60, check=True)
        asked[launched] = int(done.stdout)
    assert asked == {False: 0, True: signal.SIGTERM}
