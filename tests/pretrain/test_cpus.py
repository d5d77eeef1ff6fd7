"""The CPUs this process may use: affinity and cgroup quota (pretrain/cpus.py)."""

from __future__ import annotations

import pytest

from pretrain import cpus
from pretrain.cpus import cpu_quota, usable_cpus


def cgroup_file(root, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cpu_quota_reads_cgroup_v2_cpu_max(tmp_path):
    assert cpu_quota(tmp_path, "0::/\n") is None                              # no cgroup files: not limited
    cgroup_file(tmp_path, "cpu.max", "max 100000\n")
    assert cpu_quota(tmp_path, "0::/\n") is None                              # unlimited
    cgroup_file(tmp_path, "cpu.max", "150000 100000\n")
    assert cpu_quota(tmp_path, "0::/\n") == 1.5
    cgroup_file(tmp_path, "box/job/cpu.max", "max 100000\n")                 # unlimited itself, bound by its parent's
    assert cpu_quota(tmp_path, "0::/box/job\n") == 1.5
    cgroup_file(tmp_path, "box/job/cpu.max", "50000 100000\n")               # the tightest binds
    assert cpu_quota(tmp_path, "0::/box/job\n") == 0.5
    cgroup_file(tmp_path, "cpu.max", "garbage\n")
    assert cpu_quota(tmp_path, "0::/\n") is None


@pytest.mark.parametrize("mount", ["cpu", "cpu,cpuacct"])
def test_cpu_quota_reads_cgroup_v1_cfs_quota_over_period(tmp_path, mount):
    membership = "4:memory:/x\n3:cpu,cpuacct:/\n0::/\n"
    cgroup_file(tmp_path, f"{mount}/cpu.cfs_period_us", "100000\n")
    cgroup_file(tmp_path, f"{mount}/cpu.cfs_quota_us", "-1\n")
    assert cpu_quota(tmp_path, membership) is None
    cgroup_file(tmp_path, f"{mount}/cpu.cfs_quota_us", "250000\n")
    assert cpu_quota(tmp_path, membership) == 2.5


@pytest.mark.parametrize("affinity, quota, threads", [({0, 1, 2, 3}, None, 4), ({0, 1, 2, 3}, 2.5, 2),
                                                      ({0, 1, 2, 3}, 0.5, 1), ({0}, 8.0, 1)])
def test_usable_cpus_is_the_affinity_or_the_quota_whole_cpus(monkeypatch, affinity, quota, threads):
    monkeypatch.setattr(cpus, "our_cpus", lambda: affinity)
    monkeypatch.setattr(cpus, "cpu_quota", lambda: quota)
    assert usable_cpus() == threads


def test_thread_counts_follow_the_quota(monkeypatch):
    # A container held to 1.5 CPUs on a 4-CPU affinity: torch's threads and a profile's
    # `threads: cores` take one thread, not one per CPU of the host.
    import torch
    from compressor.bench.profiles import load_profile
    from pretrain.models import set_threads
    monkeypatch.setattr(cpus, "our_cpus", lambda: {0, 1, 2, 3})
    monkeypatch.setattr(cpus, "cpu_quota", lambda: 1.5)
    before = torch.get_num_threads()
    try:
        set_threads(None)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert load_profile("cpu").model_copy(update={"threads": "cores"}).thread_count() == 1
