"""How much of our CPUs other processes used while we timed: a latency measured on a busy
machine runs high, and nothing in the times themselves says so.

Over a timed window, the CPUs this process may run on (its affinity) were busy for B seconds
in all (Linux /proc/stat: every non-idle, non-iowait jiffy of those CPUs, steal included,
since time the hypervisor gave another guest was not ours either) and this process used O
seconds of CPU (all its threads; the timed calls run in this process, the memory probe's
child only after the timing). The rest, B - O, went to other processes, and their share of
what those CPUs could give is

    contention = (B - O) / (cpus x wall seconds)

Only our CPUs count: work on CPUs we cannot run on takes no time from us. A cgroup CPU quota
(a container's `--cpus`) can hold us to fewer CPUs' worth of time, Q, than the affinity's N:
then we can use Q, and others take from us only what they use beyond the N - Q that our
quota leaves idle anyway, so

    contention = (B - O - (N - Q) x wall seconds) / (Q x wall seconds)

which is the formula above where no quota limits us (Q = N). Without /proc/stat or an
affinity (not Linux) the share is unknown (None).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pretrain.cpus import CGROUP_ROOT, cpu_quota

PROC_STAT = Path("/proc/stat")
# Above this share of our CPUs taken by others, latencies are flagged. Idle daemons and the
# jiffy counters' own rounding stay a few percent; a tenth of the CPUs' time gone to other
# processes is a machine that is not quiet, and its latencies (multi-threaded ones first)
# are inflated by about as much or more.
CONTENTION_WARNING = 0.10
# /proc/stat's per-CPU fields in order; guest time is already counted in user (and guest_nice
# in nice), so it is left out rather than counted twice.
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
NOT_BUSY = ("idle", "iowait")


@dataclass(frozen=True)
class CpuTime:
    """Seconds of wall clock, of busy time on `cpus` CPUs (every process's) and of this
    process's own CPU time: a reading, or the difference of two (a window), or a sum of windows.
    `quota`: the CPUs' worth of time a cgroup quota lets us use (`cpu_quota`; None: no quota)."""

    wall_s: float
    busy_s: float
    own_s: float
    cpus: int
    quota: float | None = None

    @property
    def usable(self) -> float:
        """The CPUs' worth of time we could use: min(affinity, quota)."""
        return self.cpus if self.quota is None else min(self.cpus, self.quota)

    def __sub__(self, earlier: CpuTime) -> CpuTime:
        return CpuTime(self.wall_s - earlier.wall_s, self.busy_s - earlier.busy_s, self.own_s - earlier.own_s,
                       self.cpus, self.quota)

    def __add__(self, other: CpuTime) -> CpuTime:
        # One measurement's windows share their CPUs and quota; a sum keeps the later window's.
        return CpuTime(self.wall_s + other.wall_s, self.busy_s + other.busy_s, self.own_s + other.own_s,
                       other.cpus, other.quota)


def busy_jiffies(stat: str, cpus: set[int]) -> int | None:
    """Busy jiffies of `cpus` summed, from /proc/stat's text; None if a CPU has no line."""
    busy, seen = 0, set()
    for line in stat.splitlines():
        name, *values = line.split() or [""]
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue        # the all-CPUs line, another CPU's, or not a CPU's
        counts = dict(zip(FIELDS, (int(v) for v in values)))
        busy += sum(v for k, v in counts.items() if k not in NOT_BUSY)
        seen.add(int(name[3:]))
    return busy if seen == cpus else None


def read_cpu_time(cpus: set[int] | None, stat_file: Path = PROC_STAT,
                  cgroup_root: Path = CGROUP_ROOT) -> CpuTime | None:
    """A reading now, with the cgroup quota in force (it can change while we run), or None
    where /proc/stat or the affinity is unavailable."""
    if not cpus:
        return None
    try:
        jiffies = busy_jiffies(stat_file.read_text(), cpus)
    except (OSError, ValueError):
        return None
    if jiffies is None:
        return None
    # process_time: every thread of this process, ONNX Runtime's and torch's pools included.
    return CpuTime(time.monotonic(), jiffies / os.sysconf("SC_CLK_TCK"), time.process_time(), len(cpus),
                   cpu_quota(cgroup_root))


def others_share(spent: CpuTime | None) -> float | None:
    """Other processes' share of our CPUs' capacity over `spent` (a window or a sum of
    windows), clamped to [0, 1]: the counters tick at different granularities, so a quiet
    window can come out a hair below 0. None when unknown."""
    if spent is None or spent.wall_s <= 0 or spent.usable <= 0:
        return None
    beyond_quota = (spent.cpus - spent.usable) * spent.wall_s     # others' to use: we could not
    share = (spent.busy_s - spent.own_s - beyond_quota) / (spent.usable * spent.wall_s)
    return min(1.0, max(0.0, share))


def rounded(share: float | None) -> float | None:
    """As recorded with a latency row: three decimals, None kept."""
    return None if share is None else round(share, 3)


def summary(shares: Sequence[float | None]) -> dict | None:
    """Median and worst of several measurements' shares (those known), as a latency model
    records them over its timed structures; None when none is known."""
    known = [s for s in shares if s is not None]
    if not known:
        return None
    return {"median": rounded(statistics.median(known)), "worst": rounded(max(known)), "measurements": len(known)}


def contended(recorded: dict | None) -> bool:
    """Whether a summary says its measurements were taken under contention. The median judges:
    it is what the fit pooled over all of them, while one short measurement's share is the
    noisiest (the counters tick in jiffies)."""
    return recorded is not None and recorded["median"] > CONTENTION_WARNING
