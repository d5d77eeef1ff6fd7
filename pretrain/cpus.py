"""The CPUs this process may use: its affinity, and a cgroup CPU quota (a container's `--cpus`).

Thread counts (torch's and ONNX Runtime's) and the benchmark's contention share both ask how
many CPUs are ours. The affinity (`taskset`) says which CPUs we may run on; a quota can hold
us to fewer CPUs' worth of time than that, and a pool with a thread per affinity CPU then
spends its time throttled.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct")     # where cgroup v1 mounts the cpu controller


def our_cpus() -> set[int] | None:
    """The CPUs this process may run on; None where the OS does not say (not Linux)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return set(getaffinity(0)) if getaffinity else None


def cpu_quota(root: Path = CGROUP_ROOT, membership: str | None = None) -> float | None:
    """The CPUs' worth of time a cgroup quota lets this process use: cgroup v2 `cpu.max`
    ("150000 100000" is 1.5; "max 100000" no quota) or v1 `cpu.cfs_quota_us` over
    `cpu.cfs_period_us` (-1: none), the tightest of its cgroup's and their ancestors' under
    `root`; None where no quota limits it or none can be read (not Linux). `membership`:
    /proc/self/cgroup's text, which names its cgroups (read when not given)."""
    if membership is None:
        try:
            membership = PROC_CGROUP.read_text()
        except OSError:
            membership = ""
    v2, v1 = cgroup_paths(membership)
    quotas = [v2_quota(d) for d in with_ancestors(root, v2)]
    quotas += [v1_quota(d) for mount in V1_CPU_MOUNTS for d in with_ancestors(root / mount, v1)]
    return min((q for q in quotas if q is not None), default=None)


def cgroup_paths(membership: str) -> tuple[str, str]:
    """This process's cgroup v2 path and its v1 cpu controller's, from /proc/self/cgroup's
    lines (`ID:controllers:path`); "/" (the mount's root, as inside a container) for one unnamed."""
    v2 = v1 = "/"
    for line in membership.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def with_ancestors(base: Path, path: str) -> list[Path]:
    """`base`/`path` and each folder above it up to `base`: a parent cgroup's quota binds too."""
    parts = [p for p in path.split("/") if p and p != ".."]
    return [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        return None if quota <= 0 else quota / int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None


def usable_cpus() -> int:
    """How many threads keep this process's CPUs busy without oversubscribing them: the
    affinity's CPUs, or fewer under a quota (its whole CPUs, at least 1: a thread per started
    CPU would be throttled in every period, stalling the pool's other threads at each barrier)."""
    cpus = our_cpus()
    count = len(cpus) if cpus else (os.cpu_count() or 1)
    quota = cpu_quota()
    return count if quota is None else max(1, min(count, int(quota)))
