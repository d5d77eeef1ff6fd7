"""end_with_parent: a child this tool starts does not outlive a parent killed by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def kill_left(pid: int) -> None:
    """A child the test failed to see end: killed, so that a failing test leaves no orphan."""
    if running(pid):
        os.kill(pid, signal.SIGKILL)


@linux_only
def test_a_child_ends_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "ready"      # its request made
        parent.kill()
        parent.wait(timeout=30)
        assert ended_within(child, 5)
    finally:
        kill_left(child)
        parent.stdout.close()


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
