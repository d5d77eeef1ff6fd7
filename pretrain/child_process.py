"""A child process that ends with its parent: every process this tool starts calls
`end_with_parent` first, a command torchrun started `end_with_launcher`, and a command a
script starts (benchmarks/: `python -m compressor ...`) is given `ends_with_this_process()`
as its preexec_fn.

A parent stopped by Ctrl-C or SIGTERM stops its child itself (subprocess.run kills it on the
way out), but one killed by SIGKILL (`kill -9`, the kernel's out-of-memory killer, a job
scheduler's last resort) cannot: the child ran on, an orphan, until its own work ended.
On Linux the child asks the kernel for a signal when its parent dies (prctl
PR_SET_PDEATHSIG); elsewhere this is a no-op.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1      # <linux/prctl.h>


def end_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """Have the kernel send this process `signum` when `parent_pid` (the process that started it,
    which passes its os.getpid()) ends; if it has already gone, send it now.

    SIGKILL suits a child with nothing of its own to tidy up; SIGTERM one that must. The kernel
    ties the request to the parent *thread* that started the child: start it from a thread that
    waits for it (subprocess.run does), or the child dies when that thread ends."""
    if not sys.platform.startswith("linux"):
        return
    ask_to_end_with(libc_prctl(), parent_pid, signum)


def ends_with_this_process(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A subprocess `preexec_fn` for a command that does not call end_with_parent itself: the
    child ends with this process, even one killed by SIGKILL (None, subprocess's default, where
    this is not Linux). SIGTERM: `compressor`'s orderly stop, temporaries removed and the last
    checkpoint kept. Start the child from the thread that waits for it (end_with_parent)."""
    if not sys.platform.startswith("linux"):
        return None
    # prctl is looked up here, before the fork: a child forked from a process of several
    # threads may deadlock loading a library (another thread may have held the loader's lock).
    return functools.partial(ask_to_end_with, libc_prctl(), os.getpid(), signum)


def libc_prctl() -> Callable[..., int]:
    import ctypes       # here: 4 ms, and the CLI imports this module before its stop handlers are in
    return ctypes.CDLL(None, use_errno=True).prctl


def ask_to_end_with(prctl: Callable[..., int], parent_pid: int, signum: int) -> None:
    if prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return      # refused (a seccomp filter): the child runs as it would have without this
    # A parent that died before the request went unnoticed by the kernel: the child has
    # already been handed to init (or a subreaper), so its parent is no longer the one it had.
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)


def end_with_launcher() -> None:
    """Under torchrun, end with its agent (this worker's parent) by SIGTERM: the orderly stop, the
    last checkpoint kept. torchrun passes its own Ctrl-C or SIGTERM on to the workers, but when it
    was killed by SIGKILL they trained on to the end, orphans. torchrun does not tell its workers
    its pid, so one that died before this call (a worker's first tenth of a second) goes unseen."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        end_with_parent(os.getppid(), signal.SIGTERM)
