"""Other processes' share of our CPUs over a timed window (compressor/bench/contention.py)."""

from __future__ import annotations

import pytest

from compressor.bench.contention import CpuTime, busy_jiffies, contended, others_share, read_cpu_time, summary

# /proc/stat's layout: the all-CPUs line, one line per CPU (user nice system idle iowait irq
# softirq steal guest guest_nice), then other counters.
BEFORE = """cpu  2000 0 400 9000 100 0 0 0 0 0
cpu0 1000 0 200 4500 50 0 0 0 0 0
cpu1 1000 0 200 4500 50 0 0 0 0 0
intr 123 0 0
ctxt 456
"""
# One second later at 100 jiffies a second: cpu0 busy 80 jiffies (60 user, 5 nice, 10 system,
# 3 irq, 2 steal; 30 of its user is guest time, counted in user already), idle 15, iowait 5;
# cpu1 busy 100 jiffies (another process's spinning, on a CPU we may not run on).
AFTER = """cpu  2160 5 510 9015 105 3 0 2 30 0
cpu0 1060 5 210 4515 55 3 0 2 30 0
cpu1 1100 0 200 4500 50 0 0 0 0 0
intr 125 0 0
ctxt 470
"""


def reading(stat: str, wall_s: float, own_s: float, cpus: set[int], quota: float | None = None) -> CpuTime:
    return CpuTime(wall_s, busy_jiffies(stat, cpus) / 100, own_s, len(cpus), quota)


def test_others_share_is_our_cpus_busy_time_less_our_own_over_their_capacity():
    # On cpu0 alone: 0.80 s busy in 1 s, 0.30 s of it ours: others took 0.50 of it.
    window = reading(AFTER, 11.0, 2.3, {0}) - reading(BEFORE, 10.0, 2.0, {0})
    assert others_share(window) == pytest.approx(0.50)
    # On both CPUs: 1.80 s busy of 2 s capacity, 0.30 s ours.
    both = reading(AFTER, 11.0, 2.3, {0, 1}) - reading(BEFORE, 10.0, 2.0, {0, 1})
    assert others_share(both) == pytest.approx(0.75)
    # Windows add up: a second quiet second (all ours) halves the share.
    quiet = CpuTime(1.0, 1.0, 1.0, 1)
    assert others_share(window + quiet) == pytest.approx(0.25)


def test_counter_rounding_is_clamped_and_unknown_stays_unknown():
    assert others_share(CpuTime(1.0, 0.98, 1.0, 1)) == 0.0      # own time counted finer than jiffies
    assert others_share(CpuTime(1.0, 2.5, 0.0, 2)) == 1.0
    assert others_share(None) is None and others_share(CpuTime(0.0, 0.0, 0.0, 1)) is None
    assert busy_jiffies(BEFORE, {0, 5}) is None      # a CPU with no line: not a reading to trust


def test_without_proc_stat_or_an_affinity_the_reading_is_unknown(tmp_path):
    assert read_cpu_time(None) is None                               # no sched_getaffinity (not Linux)
    assert read_cpu_time({0}, tmp_path / "no-such-stat") is None     # no /proc/stat
    stat = tmp_path / "stat"
    stat.write_text(BEFORE)
    assert read_cpu_time({0, 1}, stat).busy_s == pytest.approx(24.0)


def test_a_latency_models_measurements_are_summarised_and_judged_by_their_median():
    recorded = summary([0.02, None, 0.5, 0.04123])
    assert recorded == {"median": 0.041, "worst": 0.5, "measurements": 3}
    assert not contended(recorded)                 # one structure's burst: the fit pooled them all
    assert contended(summary([0.2, 0.3, 0.01]))
    assert summary([None]) is None and not contended(None)


def test_a_cgroup_quota_under_the_affinity_is_the_capacity_and_leaves_the_rest_to_others():
    """In a container held to fewer CPUs' worth than its affinity (`--cpus 1` on 2 CPUs), the
    share was taken over both CPUs: half the contention there was, or, where others used only
    the CPU our quota leaves idle, contention that took nothing from us."""
    # Both CPUs: 1.80 s busy in 1 s, 0.30 s ours, so others 1.50 s; 1.00 s of it the CPU-second
    # our quota of 1 could never use, 0.50 s taken from the 1 CPU-second we could.
    both = reading(AFTER, 11.0, 2.3, {0, 1}, quota=1.0) - reading(BEFORE, 10.0, 2.0, {0, 1}, quota=1.0)
    assert both.usable == 1.0 and others_share(both) == pytest.approx(0.50)
    assert others_share(CpuTime(1.0, 1.8, 1.0, 2, quota=1.0)) == 0.0         # others on the spare CPU only
    assert others_share(CpuTime(1.0, 1.8, 0.3, 2, quota=4.0)) == pytest.approx(0.75)   # a quota above the affinity
    assert (both + CpuTime(1.0, 1.0, 1.0, 2, quota=1.0)).quota == 1.0


def cgroup_file(root, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_reading_records_the_quota_in_force(tmp_path):
    stat, cgroups = tmp_path / "stat", tmp_path / "cgroup"
    stat.write_text(BEFORE)
    cgroup_file(cgroups, "cpu.max", "100000 100000\n")      # the real /proc/self/cgroup names no deeper one here
    assert read_cpu_time({0, 1}, stat, cgroups).usable == 1.0
    assert read_cpu_time({0, 1}, stat, tmp_path / "no-cgroups").quota is None
